"""The ``fault_target`` fixture: each backend with a fault-injecting proxy in front of it.

Parametrized over the backends the fault scenarios run on (the MNS emulator,
moto's SQS, Azurite, leasekit's Service Bus and Pub/Sub emulators, a real PostgreSQL): one
table, so a backend cannot skip a promise the others keep. Each gives a way to open a queue
*through* the proxy (the consumer under test) and *directly* (a rival consumer,
or the test checking what the server holds), both on the same fresh queue.

A scenario asks for the lease it uses (``queues(lease=4)``): where the lease is
a property of the queue (Service Bus's LockDuration) the queue is made with
that lock; elsewhere each call chooses its lease. Rivals and checks lease with
the queue's default duration.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest

import leasekit
from leasekit import Queue
from leasekit.emulators.postgres import LocalPostgres
from leasekit.emulators.redis import LocalRedis

from .azurite import Azurite
from .fault_proxy import FaultProxy, MakeProxy

__all__ = ["FAULT_BACKENDS", "QUEUE_VISIBILITY", "FaultTarget"]

#: Seconds a queue hides a received message where the queue, not the receive,
#: sets it (MNS): at most the fault scenarios' leases.
QUEUE_VISIBILITY = 5


@dataclass
class FaultTarget:
    """A backend with a proxy in front of it."""

    name: str
    proxy: FaultProxy
    #: Open the named queue with ``**options`` through the proxy / straight to the server.
    open_proxied: Callable[..., Queue]
    open_direct: Callable[..., Queue]
    #: Whether the backend refuses a stale receipt (SQS does not).
    detects_stale: bool = True
    #: A call waits, within its deadline, for the connection pool to reconnect, so a
    #: cut shorter than the call timeout fails no call (PostgreSQL).
    waits_out_short_cuts: bool = False
    #: Called with each new queue's name after it is created (queue settings).
    prepare: Callable[[str], None] | None = None
    #: Whether the lease is the queue's (Service Bus: its LockDuration), set at creation.
    fixed_lease: bool = False
    pairs: list[tuple[Queue, Queue]] = field(default_factory=list)

    def queues(
        self, *, lease: float | None = None, blackholed: bool = False, **options: Any
    ) -> tuple[Queue, Queue]:
        """A fresh queue opened through the proxy (with ``options``) and directly.

        ``lease``: the lease the scenario takes; where the queue fixes it, the
        queue's lock. Created first; deleted when the test ends. ``blackholed``:
        the proxy blackholes before the proxied handle is opened, so that
        handle's first call into the server meets the partition.
        """
        name = f"fault-{uuid.uuid4().hex[:12]}"
        if self.fixed_lease and lease is not None:
            options = {"lock_duration": lease, **options}
        fixed = {"lock_duration": options["lock_duration"]} if "lock_duration" in options else {}
        direct = self.open_direct(name, create=True, **fixed)
        if self.prepare is not None:
            self.prepare(name)
        if blackholed:
            self.proxy.blackhole()
        proxied = self.open_proxied(name, **options)
        self.pairs.append((proxied, direct))
        return proxied, direct

    def close(self) -> None:
        """Back to ``pass``; delete the queues made and close every handle."""
        self.proxy.pass_()
        for proxied, direct in self.pairs:
            try:
                direct.delete_queue()
            except leasekit.LeaseError:
                pass
            finally:
                proxied.close()
                direct.close()


def _port(endpoint: str) -> int:
    port = urlsplit(endpoint).port
    assert port is not None
    return port


def _mns(make: MakeProxy, request: pytest.FixtureRequest) -> FaultTarget:
    server = request.getfixturevalue("mns_server")
    proxy = make(_port(server.endpoint))
    keys = {"access_key_id": server.access_key_id, "access_key_secret": server.access_key_secret}

    def proxied(name: str, **options: Any) -> Queue:
        return leasekit.open("aliyun-mns", queue=name, endpoint=proxy.endpoint(), **keys, **options)

    def direct(name: str, **options: Any) -> Queue:
        return leasekit.open("aliyun-mns", queue=name, endpoint=server.endpoint, **keys, **options)

    def prepare(name: str) -> None:
        # A receive hides messages for the queue's VisibilityTimeout (30 s by default)
        # until core sets the lease: keep it short, so a receive whose answer a fault
        # swallowed gives its messages back soon.
        from mns.account import Account
        from mns.queue import QueueMeta

        meta = QueueMeta()
        meta.set_visibilitytimeout(QUEUE_VISIBILITY)
        account = Account(server.endpoint, *keys.values())
        try:
            account.get_queue(name).set_attributes(meta)
        finally:
            account.mns_client.close_connection()

    return FaultTarget("aliyun-mns", proxy, proxied, direct, prepare=prepare)


def _sqs(make: MakeProxy, request: pytest.FixtureRequest) -> FaultTarget:
    server = request.getfixturevalue("moto_server")
    proxy = make(_port(server.endpoint))

    def proxied(name: str, **options: Any) -> Queue:
        merged = {**server.options, "endpoint_url": proxy.endpoint(), **options}
        return leasekit.open("aws-sqs", queue=name, **merged)

    def direct(name: str, **options: Any) -> Queue:
        return leasekit.open("aws-sqs", queue=name, **{**server.options, **options})

    return FaultTarget("aws-sqs", proxy, proxied, direct, detects_stale=False)


def _azure(make: MakeProxy, request: pytest.FixtureRequest) -> FaultTarget:
    server: Azurite = request.getfixturevalue("azurite")
    proxy = make(server.port)
    via_proxy = Azurite(host=proxy.host, port=proxy.port)

    def open_with(connection_string: str) -> Callable[..., Queue]:
        def opener(name: str, **options: Any) -> Queue:
            return leasekit.open(
                "azure-storage-queue",
                queue=name,
                connection_string=connection_string,
                **options,
            )

        return opener

    return FaultTarget(
        "azure-storage-queue",
        proxy,
        open_with(via_proxy.connection_string),
        open_with(server.connection_string),
    )


def _servicebus(make: MakeProxy, request: pytest.FixtureRequest, receivers: int = 1) -> FaultTarget:
    """The Service Bus emulator; ``receivers``: the driver's receive links (connections)."""
    from leasekit.emulators.servicebus import connection_string

    server = request.getfixturevalue("servicebus_server")
    proxy = make(server.port)

    def open_with(host: str, port: int) -> Callable[..., Queue]:
        def opener(name: str, **options: Any) -> Queue:
            return leasekit.open(
                "azure-service-bus",
                queue=name,
                connection_string=connection_string(host, port),
                admin_port=server.http_port,  # management (queue admin) goes straight there
                receivers=receivers,
                **options,
            )

        return opener

    return FaultTarget(
        "azure-service-bus",
        proxy,
        open_with(proxy.host, proxy.port),
        open_with(server.host, server.port),
        fixed_lease=True,
    )


def _postgresql(make: MakeProxy, request: pytest.FixtureRequest) -> FaultTarget:
    server: LocalPostgres = request.getfixturevalue("postgres_server")
    proxy = make(server.port)

    def proxied(name: str, **options: Any) -> Queue:
        url = f"postgresql://postgres@{proxy.host}:{proxy.port}/postgres"
        return leasekit.open(url, queue=name, **options)

    def direct(name: str, **options: Any) -> Queue:
        return leasekit.open(server.url(), queue=name, **options)

    return FaultTarget("postgresql", proxy, proxied, direct, waits_out_short_cuts=True)


def _redis(make: MakeProxy, request: pytest.FixtureRequest) -> FaultTarget:
    server: LocalRedis = request.getfixturevalue("redis_server")
    proxy = make(server.port)

    def proxied(name: str, **options: Any) -> Queue:
        return leasekit.open(f"redis://{proxy.host}:{proxy.port}/0", queue=name, **options)

    def direct(name: str, **options: Any) -> Queue:
        return leasekit.open(server.url(), queue=name, **options)

    return FaultTarget("redis", proxy, proxied, direct)


def _pubsub(make: MakeProxy, request: pytest.FixtureRequest) -> FaultTarget:
    """leasekit's Pub/Sub emulator (gRPC over HTTP/2), an exactly-once subscription."""
    server = request.getfixturevalue("pubsub_server")
    port = server.address.rpartition(":")[2]
    proxy = make(int(port))

    def open_at(address: str) -> Callable[..., Queue]:
        def opener(name: str, **options: Any) -> Queue:
            # The subscription's shortest deadline (10 s): a pull whose answer a
            # fault swallowed gives its messages back soon.
            return leasekit.open(
                "gcp-pubsub",
                project=server.project,
                queue=name,
                endpoint=address,
                ack_deadline=10,
                dead_letter_topic="fault-dead-letters",  # for exact delivery counts
                **options,
            )

        return opener

    return FaultTarget(
        "gcp-pubsub", proxy, open_at(f"{proxy.host}:{proxy.port}"), open_at(server.address)
    )


#: The backends the fault scenarios run on, by scheme.
FAULT_BACKENDS: dict[str, Callable[[MakeProxy, pytest.FixtureRequest], FaultTarget]] = {
    "aliyun-mns": _mns,
    "aws-sqs": _sqs,
    "azure-service-bus": _servicebus,
    # Three receive links, so three connections through the proxy: a cut resets them all.
    "azure-service-bus-3-links": functools.partial(_servicebus, receivers=3),
    "azure-storage-queue": _azure,
    "gcp-pubsub": _pubsub,
    "postgresql": _postgresql,
    "redis": _redis,
}


@pytest.fixture(params=sorted(FAULT_BACKENDS))
def fault_target(request: pytest.FixtureRequest, fault_proxy: MakeProxy) -> Iterator[FaultTarget]:
    """Each fault backend in turn, behind a proxy of its own."""
    made = FAULT_BACKENDS[request.param](fault_proxy, request)
    try:
        yield made
    finally:
        made.close()
