"""Service Bus sessions as leasekit's ordered groups, on the emulator (``sessions=true``).

The ordered conformance section runs on a ``RequiresSession`` queue, sync and
through ``leasekit.aio``; the rest checks what only sessions have: the queue is
created sessionful, a session lock is renewed once per session for all its
leases, a lost session loses each of its leases once, the last settle releases
the session, group state, and the Consumer's group order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import leasekit
import leasekit.aio
from leasekit import InvalidArgument, LeaseKeeper, LeaseLost, UnsupportedOperation
from leasekit.conformance import AsyncUrlHarness, CountingDriver, OrderedSuite, UrlHarness
from leasekit.queue import Queue

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton", reason="the Service Bus emulator needs python-qpid-proton")

#: Service Bus' shortest LockDuration: a session is accepted on a connection of its
#: own (about 0.5 s on loopback), so the ordered suite's steps need a few seconds of lock.
LOCK = 5.0
SHORT_LOCK = 2.0
MAX_WAIT = 15.0


def _harness_options(server: Any) -> dict[str, Any]:
    return {
        "connection_string": server.connection_string,
        "lock_duration": LOCK,
        "admin_port": server.http_port,
        "sessions": True,
    }


class TestServiceBusSessionsOrdered(OrderedSuite):
    conformance_backend = "ServiceBusSessions"

    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, servicebus_server: Any) -> Iterator[UrlHarness]:
        harness = UrlHarness("azure-service-bus", **_harness_options(servicebus_server))
        yield harness
        harness.close()


class TestServiceBusSessionsOrderedThroughAsyncio(OrderedSuite):
    conformance_backend = "ServiceBusSessionsAsyncio"

    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, servicebus_server: Any) -> Iterator[AsyncUrlHarness]:
        harness = AsyncUrlHarness("azure-service-bus", **_harness_options(servicebus_server))
        yield harness
        harness.close()


def _open(server: Any, name: str | None = None, **options: Any) -> Queue:
    settings = {**_harness_options(server), **options}
    return leasekit.open(
        "azure-service-bus",
        queue=name or server.queue_name("s"),
        create=settings.pop("create", True),
        **settings,
    )


@pytest.fixture
def sessions(servicebus_server: Any) -> Iterator[Queue]:
    queue = _open(servicebus_server)
    try:
        yield queue
    finally:
        queue.delete_queue()
        queue.close()


def test_create_makes_a_requires_session_queue(sessions: Queue, servicebus_server: Any) -> None:
    assert sessions.capabilities.ordered and sessions.capabilities.group_state
    with servicebus_server.admin_client() as admin:
        assert admin.get_queue(sessions.name).requires_session is True


def test_an_existing_queue_must_be_opened_with_its_session_mode(servicebus_server: Any) -> None:
    plain = servicebus_server.create_queue(lock_duration=LOCK)
    with pytest.raises(InvalidArgument, match="sessions=false"):
        _open(servicebus_server, plain)
    sessionful = servicebus_server.create_queue(lock_duration=LOCK, requires_session=True)
    with pytest.raises(InvalidArgument, match="sessions=true"):
        _open(servicebus_server, sessionful, sessions=False)
    # The URL form takes the option too.
    url = f"azure-service-bus://{servicebus_server.host}:{servicebus_server.port}/{sessionful}"
    with leasekit.open(
        url + f"?sessions=true&lock_duration={LOCK:g}&admin_port={servicebus_server.http_port}",
        connection_string=servicebus_server.connection_string,
    ) as queue:
        assert queue.capabilities.ordered


def test_a_message_without_a_group_is_refused_before_any_call(sessions: Queue) -> None:
    counting = CountingDriver.install(sessions.driver)
    try:
        with pytest.raises(InvalidArgument, match="requires sessions"):
            sessions.send(b"x")
        with pytest.raises(InvalidArgument, match="requires sessions"):
            sessions.send_many([b"x", b"y"])
    finally:
        counting.uninstall()
    assert counting.calls == []


def test_group_state_is_the_session_state(sessions: Queue) -> None:
    sessions.send_many([b"a1", b"a2"], group="order-17")
    [first, second] = sessions.lease(10, wait=MAX_WAIT)
    assert first.group_state() is None
    first.set_group_state(b"\x00paid\xff")
    assert second.group_state() == b"\x00paid\xff"
    with pytest.raises(InvalidArgument):
        first.set_group_state("text")  # type: ignore[arg-type]
    sessions.complete_many([first, second])
    with pytest.raises(leasekit.LeaseStateError):
        first.group_state()
    # The state outlives the session's messages and its lock.
    sessions.send(b"a3", group="order-17")
    [third] = sessions.lease(1, wait=MAX_WAIT)
    assert third.group_state() == b"\x00paid\xff"
    third.set_group_state(None)
    assert third.group_state() is None
    third.complete()


def test_group_state_where_the_backend_has_none_is_unsupported(servicebus_server: Any) -> None:
    queue = _open(servicebus_server, sessions=False)
    try:
        queue.send(b"x")
        [lease] = queue.lease(1, wait=MAX_WAIT)
        with pytest.raises(UnsupportedOperation):
            lease.group_state()
        lease.complete()
    finally:
        queue.delete_queue()
        queue.close()


def test_the_last_settle_releases_the_session(sessions: Queue, servicebus_server: Any) -> None:
    sessions.send_many([b"a1", b"a2"], group="A")
    [a1] = sessions.lease(1, wait=MAX_WAIT)
    with _open(servicebus_server, sessions.name) as other:
        assert other.lease(10, wait=1) == [], "a2 was handed out while a1 was leased"
        a1.complete()
        started = time.monotonic()
        [a2] = other.lease(1, wait=MAX_WAIT)
        # Released at once, not when the session lock would have ended.
        assert time.monotonic() - started < LOCK - 1
        assert a2.message.body == b"a2" and a2.message.delivery_count == 1
        a2.complete()


def test_keeper_renews_each_session_once_for_all_its_leases(servicebus_server: Any) -> None:
    queue = _open(servicebus_server, lock_duration=SHORT_LOCK)
    renewals: list[int] = []
    driver: Any = queue.driver
    sessions = driver._sessions
    original = sessions.renew

    def counting_renew(receipts: Any) -> Any:
        renewals.append(len(receipts))
        return original(receipts)

    sessions.renew = counting_renew
    calls: list[str] = []
    try:
        queue.send_many([b"a1", b"a2", b"a3"], group="A")
        leases = queue.lease(10, wait=MAX_WAIT)
        assert [lease.message.body for lease in leases] == [b"a1", b"a2", b"a3"]
        [session] = sessions._sessions
        sdk_session = session.receiver.session
        sdk_renew = sdk_session.renew_lock

        def spy(**kwargs: Any) -> Any:
            calls.append(session.session_id)
            return sdk_renew(**kwargs)

        sdk_session.renew_lock = spy
        first_expiry = leases[0].expires_at
        with LeaseKeeper() as keeper:
            keeper.add_many(leases)
            deadline = time.monotonic() + 3 * SHORT_LOCK
            while time.monotonic() < deadline:
                time.sleep(0.1)  # letting the keeper renew, not synchronising
            assert all(lease.expires_at > first_expiry for lease in leases)
            assert not any(lease.lost.is_set() for lease in leases)
            queue.complete_many(leases)
        # Every renewal covered the three leases in one renew-session-lock call.
        assert calls and len(calls) == len(renewals)
        assert set(renewals) == {3}
    finally:
        queue.delete_queue()
        queue.close()


def test_a_lost_session_loses_each_of_its_leases_once(servicebus_server: Any) -> None:
    queue = _open(servicebus_server, lock_duration=SHORT_LOCK)
    try:
        queue.send_many([b"a1", b"a2"], group="A")
        leases = queue.lease(10, wait=MAX_WAIT)
        assert len(leases) == 2
        lost: list[tuple[bytes, LeaseLost]] = []
        for lease in leases:
            lease.on_lost(lambda lease, error: lost.append((lease.message.body, error)))
        deadline = time.monotonic() + MAX_WAIT
        while any(lease.expires_at.timestamp() > time.time() for lease in leases):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)  # past the broker's lock end, not synchronisation
        results = queue.renew_many(leases)
        assert all(isinstance(r, LeaseLost) for r in results)
        assert sorted(body for body, _ in lost) == [b"a1", b"a2"]  # each once
        again = queue.lease(10, wait=MAX_WAIT)
        assert [lease.message.body for lease in again] == [b"a1", b"a2"]
        assert [lease.message.delivery_count for lease in again] == [2, 2]
        queue.complete_many(again)
        assert len(lost) == 2
    finally:
        queue.delete_queue()
        queue.close()


@pytest.mark.parametrize("face", ["threads", "asyncio"])
def test_consumer_keeps_group_order_on_sessions(servicebus_server: Any, face: str) -> None:
    queue = _open(servicebus_server)
    try:
        groups = {g: [f"{g}{i}".encode() for i in range(6)] for g in ("a", "b", "c")}
        for group, bodies in groups.items():
            queue.send_many(bodies, group=group)
        seen: list[bytes] = []
        lock = threading.Lock()
        failed = threading.Event()

        def handler(message: leasekit.Message) -> None:
            with lock:
                seen.append(message.body)
            if message.body == b"a2" and not failed.is_set():
                failed.set()
                raise RuntimeError("a2 fails once")

        options: dict[str, Any] = {
            "concurrency": 3,
            "backoff_base": 0.0,
            "handle_signals": False,
        }
        if face == "threads":
            stats = leasekit.Consumer(queue, handler, **options).run(until_idle=True)
        else:

            async def call(message: leasekit.Message) -> None:
                handler(message)

            async def main() -> leasekit.ConsumerStats:
                own = _open(servicebus_server, queue.name)
                async with leasekit.aio.AsyncQueue(own) as aqueue:
                    return await leasekit.aio.AsyncConsumer(aqueue, call, **options).run(
                        until_idle=True
                    )

            stats = asyncio.run(main())
        for group, bodies in groups.items():
            handled = [body for body in seen if body.startswith(group.encode())]
            expected = bodies if group != "a" else [*bodies[:3], b"a2", *bodies[3:]]
            assert handled == expected, f"group {group}: {handled}"
        assert stats.completed == 18
    finally:
        queue.delete_queue()
        queue.close()


def test_session_option_leases_only_the_named_session(
    sessions: Queue, servicebus_server: Any
) -> None:
    sessions.send_many([b"a1"], group="A")
    sessions.send_many([b"b1", b"b2"], group="B")
    with _open(servicebus_server, sessions.name, session="B") as only_b:
        assert only_b.driver.session == "B"  # type: ignore[attr-defined]
        leases = only_b.lease(10, wait=MAX_WAIT)
        assert [lease.message.body for lease in leases] == [b"b1", b"b2"]
        # Held by this lease: the named session is not available (an empty lease).
        assert only_b.lease(10, wait=1) == []
        only_b.complete_many(leases)
        assert only_b.lease(10, wait=1) == []  # A is not its session
    [a1] = sessions.lease(1, wait=MAX_WAIT)
    assert a1.message.body == b"a1"
    a1.complete()
    with pytest.raises(InvalidArgument, match="sessions=true"):
        _open(servicebus_server, sessions.name, sessions=False, session="B", create=False)
    with pytest.raises(InvalidArgument, match="session must be"):
        _open(servicebus_server, sessions.name, session="has space", create=False)


def test_group_state_through_asyncio(sessions: Queue, servicebus_server: Any) -> None:
    async def main() -> tuple[bytes | None, bytes | None]:
        # A handle of its own (closing the AsyncQueue closes it; the fixture's stays open).
        own = _open(servicebus_server, sessions.name)
        async with leasekit.aio.AsyncQueue(own) as aqueue:
            await aqueue.send(b"a1", group="A")
            [lease] = await aqueue.lease(1, wait=MAX_WAIT)
            before = await lease.group_state()
            await lease.set_group_state(b"done")
            after = await lease.group_state()
            await lease.complete()
            return before, after

    assert asyncio.run(main()) == (None, b"done")


def _attach_sent(receivers: list[Any]) -> bool:
    """Whether one of the SDK session receivers has sent its attach (it waits for a session)."""
    for receiver in receivers:
        link = getattr(getattr(receiver, "_handler", None), "_link", None)
        if getattr(getattr(link, "state", None), "name", None) == "ATTACH_SENT":
            return True
    return False


def test_a_reset_loses_the_holders_session_before_a_rival_receives_it(
    servicebus_server: Any, fault_proxy: Any, record_property: Any, monkeypatch: Any
) -> None:
    """Issue 33, item 3: the holder of group g learns of a reset no later than a rival
    is handed g.

    Service Bus releases a session whose connection is gone ("the lock is dropped
    since Service Bus does not support recovery of existing AMQP links on a
    different connection", Message transfers, locks, and settlement), without
    counting a delivery of its messages (Message sessions, "Impact of delivery
    count": a session closed with messages not completed does not increment it).
    So a rival may take the whole group at once; what leasekit guarantees is that
    the holder's lease is lost by then.
    """
    import leasekit.backends.azure_service_bus.sessions as sessions_module
    from leasekit.emulators.servicebus import connection_string

    # Observe (not change) the session receivers the driver opens: the rival's accept
    # must be waiting at the service when the reset comes, as a busy rival's would.
    opened: list[Any] = []
    open_handler = sessions_module._open_handler

    def observed(receiver: Any, timeout: float) -> None:
        opened.append(receiver)
        open_handler(receiver, timeout)

    monkeypatch.setattr(sessions_module, "_open_handler", observed)
    lock = 3.0
    proxy = fault_proxy(servicebus_server.port)
    name = servicebus_server.queue_name("reset")
    direct = _open(servicebus_server, name, lock_duration=lock)
    holder = _open(
        servicebus_server,
        name,
        create=False,
        lock_duration=lock,
        connection_string=connection_string(proxy.host, proxy.port),
    )
    # One accept that waits at the service (not one a second): handed g the moment it is free.
    rival = _open(servicebus_server, name, create=False, lock_duration=lock, max_wait=MAX_WAIT)
    got: list[leasekit.Lease] = []
    got_at: list[float] = []
    lost_at: list[float] = []

    def take() -> None:
        got.extend(rival.lease(6, wait=MAX_WAIT))
        got_at.append(time.monotonic())

    try:
        direct.send_many([b"g%d" % i for i in range(6)], group="g")
        [head] = holder.lease(1, wait=MAX_WAIT)
        assert head.message.body == b"g0"
        head.on_lost(lambda lease, error: lost_at.append(time.monotonic()))
        with LeaseKeeper() as keeper, keeper.hold(head):
            opened.clear()
            taker = threading.Thread(target=take, daemon=True)
            taker.start()
            # The rival's accept waits at the service for a session (g is held).
            deadline = time.monotonic() + MAX_WAIT
            while not _attach_sent(opened):
                assert time.monotonic() < deadline, "the rival never asked for a session"
                time.sleep(0.01)
            holder_deadline = time.monotonic() + head.time_left
            reset = time.monotonic()
            proxy.drop()
            taker.join(MAX_WAIT)
        assert got_at and got, "the rival was not handed the released session"
        assert head.lost.wait(1), "the holder's lease was not lost"
        record_property("holder_lost_after_reset_s", round(lost_at[0] - reset, 3))
        record_property("rival_received_after_reset_s", round(got_at[0] - reset, 3))
        record_property(
            "rival_received_before_holder_deadline_s", round(holder_deadline - got_at[0], 3)
        )
        early = lost_at[0] - got_at[0]
        assert early <= 0, f"the rival received g {early:.3f} s before the holder's lease was lost"
        # The whole group, in order, g0 with no failed delivery counted (the service's rule).
        assert [lz.message.body for lz in got] == [b"g%d" % i for i in range(6)]
        assert got[0].message.delivery_count == 1
        with pytest.raises(LeaseLost):
            head.complete()
        assert rival.complete_many(got) == [None] * 6
    finally:
        proxy.pass_()
        holder.close()
        rival.close()
        direct.delete_queue()
        direct.close()
