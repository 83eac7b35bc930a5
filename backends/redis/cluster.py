"""Redis Cluster routing for the Redis / Valkey driver (``?cluster=1``).

Every key of a queue shares one ``{hash tag}``, so a queue lives on one slot and
each script touches that slot only. :class:`ClusterServer` sends each call to
the node that serves the slot of the queue's keys: it reads the slot map
(``CLUSTER SLOTS``) from a node it knows on first use, follows ``MOVED`` (and
remembers the slot's new node) and ``ASK`` (``ASKING`` then the command, on one
connection), and reads the map again after a node fails to answer or the
cluster says ``CLUSTERDOWN``. Each node has the same clients a single server
has (one connection pool per socket-timeout step), so every call is still
bounded by core's deadline; redirections are followed within it, at most
:data:`REDIRECTS` per call. ``TRYAGAIN`` (a multi-key script during the slot's
migration), ``CLUSTERDOWN`` and lost nodes go back to core as retryable errors:
core's retry policy decides, as for one server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.crc import key_slot

from leasekit.deadline import call_timeout
from leasekit.spi import DriverError, ErrorCode

from .driver import DEFAULT_TIMEOUT, _Server

__all__ = ["REDIRECTS", "ClusterServer"]

T = TypeVar("T")

#: Most redirections (``MOVED``/``ASK``) one call follows before it reports the
#: cluster as unavailable (retryable): a slot moves once per reshard step.
REDIRECTS = 5
#: Slots of a Redis Cluster.
SLOTS = 16384

Address = tuple[str, int]


class ClusterServer(_Server):
    """A Redis Cluster reached through a seed node: one :class:`_Server` per node, routed by slot.

    Shares :class:`_Server`'s script cache and first-use checks (the
    eviction-policy warning, ``XACKDEL``), made on the first node a call reaches.
    """

    def __init__(self, params: dict[str, Any], where: str, connect: float) -> None:
        super().__init__(params, where, connect)
        #: Every node known (the seed, then those the map and redirections
        #: named), in the order to ask for the map: one that failed goes last.
        self._order: list[Address] = [(params["host"], int(params["port"]))]
        self._nodes: dict[Address, _Server] = {}
        #: The node of each slot, as last learnt (``None``: not known yet).
        self._slots: list[Address | None] = [None] * SLOTS
        self._mapped = False
        self._map_lock = threading.Lock()

    def node(self, address: Address) -> _Server:
        """The clients of one node (made on first use)."""
        found = self._nodes.get(address)
        if found is None:
            with self._map_lock:
                found = self._nodes.get(address)
                if found is None:
                    host, port = address
                    found = _Server(
                        {**self.params, "host": host, "port": port}, self.where, self.connect
                    )
                    self._nodes[address] = found
        return found

    def client(self, timeout: float | None) -> redis.Redis:
        """A client of the first node that answers (for calls that name no key)."""
        return self.node(self._known()[0]).client(timeout)

    def _known(self) -> list[Address]:
        """Every node known, the seed first until it fails (see :meth:`_lost`)."""
        return list(self._order)

    def _learn(self, addresses: list[Address]) -> None:
        with self._map_lock:
            for address in addresses:
                if address not in self._order:
                    self._order.append(address)

    def slot_map(self, timeout: float | None = None) -> list[Address | None]:
        """Read the slot map from the first node that answers (``CLUSTER SLOTS``)."""
        error: BaseException | None = None
        for address in self._known():
            try:
                client = self.node(address).client(
                    call_timeout(DEFAULT_TIMEOUT) if timeout is None else timeout
                )
                rows: Any = client.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
            except redis.exceptions.ResponseError as exc:
                if "cluster support disabled" in str(exc):
                    raise DriverError(
                        ErrorCode.INVALID_ARGUMENT,
                        f"redis {self.where}: cluster=1, but the server is not a cluster node "
                        "(cluster support disabled): drop ?cluster=1",
                        backend_code="ERR",
                    ) from exc
                error = exc
                continue
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                error = exc
                self._to_end(address)
                continue
            slots: list[Address | None] = [None] * SLOTS
            named: list[Address] = []
            for row in rows:
                start, end = int(row[0]), int(row[1])
                # The master, then its replicas (asked for the map only, never sent a call).
                nodes = [(_text(n[0]) or address[0], int(n[1])) for n in row[2:]]
                nodes = [(address[0] if host == "?" else host, port) for host, port in nodes]
                slots[start : end + 1] = [nodes[0]] * (end - start + 1)
                named += nodes
            self._learn(named)
            with self._map_lock:
                self._slots = slots
                self._mapped = True
            return slots
        assert error is not None
        raise error

    def _to_end(self, address: Address) -> None:
        """Ask ``address`` last next time (it failed to answer)."""
        with self._map_lock:
            if address in self._order:
                self._order.remove(address)
            self._order.append(address)

    def _lost(self, address: Address) -> None:
        """A node did not answer, or the cluster is down: read the map again on the next call."""
        self._to_end(address)
        with self._map_lock:
            self._mapped = False

    def call(self, key: str, fn: Callable[[redis.Redis], T], timeout: float | None = None) -> T:
        """``fn(client)`` on the node serving ``key``'s slot, following ``MOVED`` and ``ASK``."""
        slot = key_slot(key.encode())
        if not self._mapped:
            self.slot_map(timeout)
        address = self._slots[slot] or self._known()[0]
        asking = False
        last: BaseException | None = None
        for _ in range(REDIRECTS + 1):
            node = self.node(address)
            client = node.client(call_timeout(DEFAULT_TIMEOUT) if timeout is None else timeout)
            try:
                if not asking:
                    return fn(client)
                # ASK: one connection, each command let in by an ASKING before it.
                one = _Asking(connection_pool=client.connection_pool, single_connection_client=True)
                try:
                    return fn(one)
                finally:
                    one.close()
            except redis.exceptions.MovedError as exc:
                last = exc
                address = (exc.host or address[0], int(exc.port))
                self._slots[int(exc.slot_id)] = address
                self._learn([address])
                asking = False
            except redis.exceptions.AskError as exc:
                last = exc
                address = (exc.host or address[0], int(exc.port))
                asking = True
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                self._lost(address)
                raise
            except redis.exceptions.ClusterDownError:
                self._lost(address)
                raise
        raise DriverError(
            ErrorCode.UNAVAILABLE,
            f"redis {self.where}: slot {slot} was redirected {REDIRECTS} times in one call "
            "(the cluster is resharding); retried",
            backend_code="MOVED",
        ) from last

    @property
    def used(self) -> bool:
        """Whether any call was made (a node's client exists)."""
        return any(node.used for node in list(self._nodes.values()))

    def close(self) -> None:
        with self._map_lock:
            nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            node.close()
        super().close()


class _Asking(redis.Redis):
    """A one-connection client sending ``ASKING`` before each command (to an ``ASK``'s target).

    ``ASKING`` lets in only the next command, and a call may make several
    (``TYPE`` then ``XRANGE``; ``EVALSHA``, ``SCRIPT LOAD``, ``EVALSHA``).
    """

    def execute_command(self, *args: Any, **options: Any) -> Any:
        super().execute_command("ASKING")  # type: ignore[no-untyped-call]
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
