"""The Service Bus driver with several receive links (``receivers=N``), on the emulator.

Each SDK receiver is its own AMQP connection with one receive link, so the tests
look at what the driver promises per link: a message is settled and renewed on
the receiver that received it, receives spread round robin over the links, a
settle on one link does not wait for another link's turn, and ``close()`` closes
every connection (counted as this process's sockets to the emulator's port) and
ends every SDK thread. The turn-taking itself (:mod:`leasekit.backends.azure_service_bus.links`)
is tested without the SDK at the end.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import leasekit
from leasekit import InvalidArgument, InvalidURL
from leasekit.conformance import ConformanceSuite, UrlHarness
from leasekit.deadline import DeadlineExceeded
from leasekit.queue import Queue
from leasekit.url import parse_url

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton", reason="the Service Bus emulator needs python-qpid-proton")

from leasekit.backends.azure_service_bus import MAX_RECEIVERS, ServiceBusDriver
from leasekit.backends.azure_service_bus.links import Gate, ReceiveLinks

#: The LockDuration of the test queues (as in test_azure_service_bus.py).
LOCK = 2.0
#: Links in these tests: more than two, so round robin is seen to go past the second.
LINKS = 3


def _open(server: Any, name: str | None = None, **options: Any) -> Queue:
    return leasekit.open(
        "azure-service-bus",
        queue=name or server.queue_name("links"),
        create=True,
        connection_string=server.connection_string,
        lock_duration=LOCK,
        admin_port=server.http_port,
        **options,
    )


class TestServiceBusConformanceThreeLinks(ConformanceSuite):
    """The whole conformance suite on a driver whose receives spread over three links."""

    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, servicebus_server: Any) -> Iterator[UrlHarness]:
        harness = UrlHarness(
            "azure-service-bus",
            connection_string=servicebus_server.connection_string,
            lock_duration=LOCK,
            admin_port=servicebus_server.http_port,
            receivers=LINKS,
        )
        yield harness
        harness.close()


@pytest.fixture
def queue(servicebus_server: Any) -> Iterator[Queue]:
    q = _open(servicebus_server, receivers=LINKS)
    try:
        yield q
    finally:
        q.delete_queue()
        q.close()


def _driver(q: Queue) -> ServiceBusDriver:
    driver = q.driver
    assert isinstance(driver, ServiceBusDriver)
    return driver


def _one_per_link(q: Queue) -> list[leasekit.Lease]:
    """One lease from each link: consecutive receives take the links in turn."""
    q.send_many([b"m%d" % i for i in range(LINKS)])
    leases: list[leasekit.Lease] = []
    deadline = time.monotonic() + 10
    while len(leases) < LINKS and time.monotonic() < deadline:
        leases.extend(q.lease(1, wait=1))
    assert len(leases) == LINKS
    return leases


def _link_of(q: Queue, lease: leasekit.Lease) -> int:
    return _driver(q)._held[lease.receipt].link.index


class Recorder:
    """Wraps one method of a real SDK receiver and records the lock tokens it was given."""

    def __init__(self, receiver: Any, name: str) -> None:
        self.tokens: list[str] = []
        real = getattr(receiver, name)

        def record(*args: Any, **kwargs: Any) -> Any:
            for arg in args:
                token = getattr(arg, "lock_token", arg)
                self.tokens.append(str(token))
            return real(*args, **kwargs)

        setattr(receiver, name, record)


def test_receives_spread_over_the_links_and_each_is_renewed_and_settled_on_its_own(
    queue: Queue,
) -> None:
    leases = _one_per_link(queue)
    links = _driver(queue)._links.links
    assert sorted(_link_of(queue, lz) for lz in leases) == list(range(LINKS))
    receivers = {link.index: link.receiver for link in links}
    assert len({id(r) for r in receivers.values()}) == LINKS  # three SDK receivers
    assert len({id(r._handler._connection) for r in receivers.values()}) == LINKS
    renewals = {i: Recorder(r, "_renew_locks") for i, r in receivers.items()}
    completes = {i: Recorder(r, "complete_message") for i, r in receivers.items()}
    abandons = {i: Recorder(r, "abandon_message") for i, r in receivers.items()}
    before = [lz.expires_at for lz in leases]
    assert queue.renew_many(leases, LOCK) == [None] * LINKS
    assert all(lz.expires_at >= b for lz, b in zip(leases, before, strict=True))
    for lease in leases:
        index = _link_of(queue, lease)
        assert renewals[index].tokens == [lease.receipt]  # renewed by its own receiver
    kept, dropped = leases[:-1], leases[-1]
    dropped_link = _link_of(queue, dropped)
    indexes = [_link_of(queue, lz) for lz in kept]
    assert queue.complete_many(kept) == [None] * len(kept)
    dropped.abandon()
    for lease, index in zip(kept, indexes, strict=True):
        assert completes[index].tokens == [lease.receipt]
    assert abandons[dropped_link].tokens == [dropped.receipt]
    # The service took each settle: only the abandoned message comes back, once.
    again = queue.lease(LINKS, wait=3)
    assert [lz.message.id for lz in again] == [dropped.message.id]
    assert again[0].message.delivery_count == 2
    again[0].complete()
    assert queue.lease(1, wait=0.5) == []


def test_a_settle_does_not_wait_for_another_links_turn(queue: Queue) -> None:
    leases = _one_per_link(queue)
    links = _driver(queue)._links.links
    lease = leases[0]
    busy = next(link for link in links if link.index != _link_of(queue, lease))
    assert busy.gate.try_turn()  # another link held, as by a receive that never ends
    try:
        started = time.monotonic()
        lease.complete()
        assert time.monotonic() - started < 2.0
    finally:
        busy.gate.end_turn()
    assert queue.complete_many(leases[1:]) == [None] * (LINKS - 1)


def _sockets_to(port: int) -> set[str]:
    """This process's TCP sockets whose remote end is ``port`` on loopback, not yet closed."""
    inodes: dict[str, int] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table, encoding="ascii") as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                    inodes[fields[9]] = remote_port
        except FileNotFoundError:
            continue
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and inodes.get(target[8:-1]) == port:
            found.add(target)
    return found


def test_close_closes_every_link_and_ends_the_sdk_threads(servicebus_server: Any) -> None:
    name = servicebus_server.create_queue(lock_duration=LOCK)
    gc.collect()  # sockets earlier tests left to the collector: closed before, not during
    # What this queue opens, by identity (an earlier test's socket or thread may end meanwhile).
    threads, sockets = set(threading.enumerate()), _sockets_to(servicebus_server.port)
    q = _open(servicebus_server, name, receivers=LINKS)
    leases = _one_per_link(q)
    receivers = [link.receiver for link in _driver(q)._links.links]
    assert all(r is not None for r in receivers)
    # One connection per link, and the sender's.
    assert len(_sockets_to(servicebus_server.port) - sockets) == LINKS + 1
    assert set(threading.enumerate()) - threads
    q.close()
    assert _sockets_to(servicebus_server.port) - sockets == set()
    assert set(threading.enumerate()) - threads == set()
    assert all(r._handler is None and not r._running for r in receivers)
    assert all(link.receiver is None for link in _driver(q)._links.links)
    # The locks the closed links held are not settled: the messages come back.
    with _open(servicebus_server, name) as again:
        back = again.lease(LINKS, wait=LOCK + 3)
        while len(back) < LINKS:
            more = again.lease(LINKS, wait=LOCK + 3)
            assert more, "a message of a closed link did not come back"
            back.extend(more)
        assert sorted(lz.message.id for lz in back) == sorted(lz.message.id for lz in leases)
        assert again.complete_many(back) == [None] * LINKS
    servicebus_server.delete_queue(name)


def test_one_link_is_the_default_and_bad_counts_are_refused_before_any_call(
    servicebus_server: Any,
) -> None:
    with _open(servicebus_server) as q:
        assert len(_driver(q)._links) == 1
    for bad in (0, -1, MAX_RECEIVERS + 1, 1.5, "two", True):
        with pytest.raises((InvalidArgument, InvalidURL, ValueError)):
            ServiceBusDriver(
                "q",
                connection_string=servicebus_server.connection_string,
                receivers=bad,  # type: ignore[arg-type]
            )
    url = "azure-service-bus://127.0.0.1:1/q?receivers=2&lock_duration=2"
    options = ServiceBusDriver.options_from_url(parse_url(url))
    assert options["receivers"] == "2"


# ------------------------------------------------- turns, without the SDK


def test_a_waiting_settle_goes_before_a_receive_and_wakes_in_order() -> None:
    links = ReceiveLinks(1)
    [link] = links.links
    assert links.take_turn(0) is link
    order: list[str] = []
    settle_waiting = threading.Event()

    def settle() -> None:
        settle_waiting.set()
        with link.gate.priority(5):
            order.append("settle")

    def receive() -> None:
        taken = links.take_turn(5)
        assert taken is link
        order.append("receive")
        link.gate.end_turn()

    settler = threading.Thread(target=settle)
    settler.start()
    settle_waiting.wait(5)
    deadline = time.monotonic() + 5
    while not link.gate._waiting and time.monotonic() < deadline:
        time.sleep(0.001)  # until the settle is queued on the gate
    receiver = threading.Thread(target=receive)
    receiver.start()
    link.gate.end_turn()
    settler.join(5)
    receiver.join(5)
    assert order == ["settle", "receive"]


def test_receives_take_the_links_round_robin_and_wait_for_any_to_come_free() -> None:
    links = ReceiveLinks(3)
    taken = [links.take_turn(0) for _ in range(3)]
    assert [link.index for link in taken if link is not None] == [0, 1, 2]
    assert links.take_turn(0.01) is None  # all three busy
    result: list[Any] = []
    waiting = threading.Thread(target=lambda: result.append(links.take_turn(5)))
    waiting.start()
    assert taken[1] is not None
    taken[1].gate.end_turn()  # the middle one frees first
    waiting.join(5)
    assert [link.index for link in result] == [1]
    for link in (taken[0], taken[2], result[0]):
        assert link is not None
        link.gate.end_turn()
    assert [links.take_turn(0).index for _ in range(3)] == [2, 0, 1]  # type: ignore[union-attr]


def test_a_settle_that_cannot_get_the_connection_in_time_fails_on_time() -> None:
    gate = Gate()
    assert gate.take_turn(0)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded), gate.priority(0.05):
        pass
    assert 0.04 <= time.monotonic() - started < 2.0
    gate.end_turn()
    with gate.priority(0):  # free: no wait at all
        assert not gate.try_turn()
    assert gate.try_turn()
