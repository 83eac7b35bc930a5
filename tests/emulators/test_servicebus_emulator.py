"""The Service Bus emulator driven by the real azure-servicebus SDK, sync and aio.

Expected behaviour is Azure Service Bus' documented behaviour, not any leasekit
adapter's. Note on delivery counts: Service Bus puts the number of *failed*
deliveries in the AMQP header (0 on the first receive); the .NET and Java SDKs add
one, the Python SDK shows the raw header, so ``delivery_count`` is 0 on the first
receive here, 1 after one abandon or lock expiry.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

azure_servicebus = pytest.importorskip("azure.servicebus")

from azure.servicebus import (  # noqa: E402
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient  # noqa: E402
from azure.servicebus.exceptions import (  # noqa: E402
    MessageLockLostError,
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
)

SHORT_LOCK = 1.0  # seconds; the emulator allows below Service Bus' 5 s minimum
MAX_WAIT = 10.0  # deadline for anything expected to happen


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@pytest.fixture(scope="module")
def client(servicebus_server: Any) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(servicebus_server.connection_string) as sb:
        yield sb


# The SDK joins a keep-alive thread (or task) that sleeps 1 s at a time when a handler
# closes; keep_alive=0 turns it off. PeekLock receivers without prefetch always start
# one, so checks that need no PeekLock semantics (peek, DLQ reads) use prefetch 1.


def sender_for(client: Any, queue: str) -> Any:
    return client.get_queue_sender(queue, keep_alive=0)


def aux_receiver(client: Any, queue: str, **kwargs: Any) -> Any:
    return client.get_queue_receiver(queue, prefetch_count=1, keep_alive=0, **kwargs)


def send(client: ServiceBusClient, queue: str, *messages: ServiceBusMessage) -> None:
    with sender_for(client, queue) as sender:
        sender.send_messages(list(messages))


def receive_until(
    receiver: Any, count: int, deadline: float = MAX_WAIT
) -> list[ServiceBusReceivedMessage]:
    """Receive until ``count`` messages arrived or ``deadline`` seconds passed."""
    got: list[ServiceBusReceivedMessage] = []
    end = time.monotonic() + deadline
    while len(got) < count and time.monotonic() < end:
        got += receiver.receive_messages(
            max_message_count=count - len(got), max_wait_time=min(1.0, end - time.monotonic())
        )
    return got


def body(message: ServiceBusReceivedMessage) -> bytes:
    return b"".join(message.body)


# -- sending and PeekLock receive ------------------------------------------------------------


def test_send_single_and_batch_then_peek_lock_receive(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = servicebus_server.create_queue()
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage(b"one", message_id="m-1"))
        batch = sender.create_message_batch()
        for i in (2, 3, 4):
            batch.add_message(
                ServiceBusMessage(
                    f"item-{i}".encode(), message_id=f"m-{i}", application_properties={"i": i}
                )
            )
        sender.send_messages(batch)
    before = utcnow()
    with client.get_queue_receiver(queue) as receiver:
        peeked = receiver.peek_messages(3, sequence_number=1)
        assert [body(m) for m in peeked] == [b"one", b"item-2", b"item-3"]
        assert all(m.lock_token is None and m.delivery_count == 0 for m in peeked)
        assert [m.sequence_number for m in receiver.peek_messages(9, sequence_number=3)] == [3, 4]

        messages = receive_until(receiver, 4)  # peeking locked nothing
        assert [body(m) for m in messages] == [b"one", b"item-2", b"item-3", b"item-4"]
        assert [m.message_id for m in messages] == ["m-1", "m-2", "m-3", "m-4"]
        assert [m.sequence_number for m in messages] == [1, 2, 3, 4]
        assert messages[2].application_properties == {b"i": 3}
        assert len({m.lock_token for m in messages}) == 4
        for m in messages:
            assert isinstance(m.lock_token, uuid.UUID)
            assert m.lock_token == uuid.UUID(bytes_le=m._delivery_tag)
            assert m.delivery_count == 0  # raw AMQP header: no failed delivery yet
            assert abs((m.enqueued_time_utc - before).total_seconds()) < 5
            remaining = (m.locked_until_utc - utcnow()).total_seconds()
            assert 50 < remaining <= 61  # default LockDuration 60 s
        [locked] = receiver.peek_messages(1, sequence_number=1)
        assert locked.locked_until_utc == messages[0].locked_until_utc
        for m in messages:
            receiver.complete_message(m)
        assert receiver.peek_messages(10, sequence_number=1) == []


def test_receive_and_delete_round_trips_binary_bodies(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = servicebus_server.create_queue()
    payloads = [b"", bytes(range(256)), b"\xff\xfe\x00not utf-8", b"x" * 200_000]
    send(client, queue, *(ServiceBusMessage(p) for p in payloads))
    with aux_receiver(
        client, queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        got = receive_until(receiver, len(payloads))
        assert [body(m) for m in got] == payloads
        with pytest.raises(ValueError):
            receiver.complete_message(got[0])
        assert receiver.peek_messages(10, sequence_number=1) == []


def test_abandon_redelivers_then_max_delivery_count_dead_letters(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = servicebus_server.create_queue(max_delivery_count=3)
    send(client, queue, ServiceBusMessage(b"poison", message_id="p"))
    with client.get_queue_receiver(queue) as receiver:
        counts, sequence_numbers, tokens = [], set(), set()
        for _ in range(3):
            [message] = receive_until(receiver, 1)
            counts.append(message.delivery_count)
            sequence_numbers.add(message.sequence_number)
            tokens.add(message.lock_token)
            receiver.abandon_message(message)
        assert counts == [0, 1, 2]
        assert sequence_numbers == {1}
        assert len(tokens) == 3
        assert receiver.peek_messages(5, sequence_number=1) == []
    with aux_receiver(
        client,
        queue,
        sub_queue=ServiceBusSubQueue.DEAD_LETTER,
        receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
    ) as dlq:
        [dead] = receive_until(dlq, 1)
        assert (dead.message_id, body(dead)) == ("p", b"poison")
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert "3" in (dead.dead_letter_error_description or "")


def test_dead_letter_is_readable_from_the_dlq(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = servicebus_server.create_queue()
    send(client, queue, ServiceBusMessage(b"poison", message_id="p"))
    with client.get_queue_receiver(queue) as receiver:
        [message] = receive_until(receiver, 1)
        receiver.dead_letter_message(message, reason="BadInput", error_description="cannot parse")
        assert receiver.peek_messages(5, sequence_number=1) == []
    with aux_receiver(client, queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        [dead] = receive_until(dlq, 1)
        assert (dead.message_id, body(dead)) == ("p", b"poison")
        assert dead.dead_letter_reason == "BadInput"
        assert dead.dead_letter_error_description == "cannot parse"
        assert dead.sequence_number == message.sequence_number
        dlq.complete_message(dead)
        assert dlq.peek_messages(5, sequence_number=1) == []


def test_defer_then_receive_deferred(client: ServiceBusClient, servicebus_server: Any) -> None:
    queue = servicebus_server.create_queue()
    send(client, queue, ServiceBusMessage(b"later"))
    with client.get_queue_receiver(queue) as receiver:
        [message] = receive_until(receiver, 1)
        receiver.defer_message(message)
        assert receiver.receive_messages(max_wait_time=0.2) == []
        [peeked] = receiver.peek_messages(1, sequence_number=1)
        assert peeked.state == ServiceBusMessageState.DEFERRED
        [deferred] = receiver.receive_deferred_messages([message.sequence_number])
        assert body(deferred) == b"later"
        receiver.complete_message(deferred)  # settled over $management
        assert receiver.peek_messages(5, sequence_number=1) == []


# -- locks --------------------------------------------------------------------------------------


def test_renew_moves_locked_until_and_keeps_token(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = servicebus_server.create_queue(lock_duration=SHORT_LOCK)
    send(client, queue, ServiceBusMessage(b"a"), ServiceBusMessage(b"b"))
    with client.get_queue_receiver(queue) as receiver:
        first, second = receive_until(receiver, 2)
        token, until = first.lock_token, first.locked_until_utc
        assert receiver.renew_message_lock(first) >= until
        assert first.lock_token == token
        # Several tokens in one renew-lock request (the SDK's internal multi-token call).
        reply = receiver._renew_locks(str(first.lock_token), str(second.lock_token))
        expirations = reply[b"expirations"]
        assert len(expirations) == 2
        assert all(e / 1000 > time.time() for e in expirations)
        # Keep renewing past the original expiry: still locked, nobody else gets them.
        with aux_receiver(client, queue) as other:
            while utcnow() < until + datetime.timedelta(seconds=0.3):
                receiver.renew_message_lock(first)
                receiver.renew_message_lock(second)
                assert other.receive_messages(max_wait_time=0.1) == []
        assert first.lock_token == token
        receiver.complete_message(first)
        receiver.complete_message(second)


def test_lock_expiry_redelivers_in_sequence_order(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = servicebus_server.create_queue(lock_duration=SHORT_LOCK)
    send(
        client, queue, *(ServiceBusMessage(f"m{i}".encode(), message_id=f"m{i}") for i in range(3))
    )
    with client.get_queue_receiver(queue) as receiver:
        first = receive_until(receiver, 3)
        assert [m.message_id for m in first] == ["m0", "m1", "m2"]
        first_tokens = {m.lock_token for m in first}
        receiver.complete_message(first[1])  # completed: never comes back
        again = receive_until(receiver, 2)  # the other locks expire
        assert [m.message_id for m in again] == ["m0", "m2"]
        peeked = receiver.peek_messages(5, sequence_number=1)
        assert [m.sequence_number for m in peeked] == [1, 3]
        assert [m.sequence_number for m in again] == [1, 3]
        assert all(m.delivery_count == 1 for m in again)
        assert {m.lock_token for m in again}.isdisjoint(first_tokens)
        for m in again:
            receiver.complete_message(m)


def _wait_for_lock_loss(message: ServiceBusReceivedMessage) -> None:
    """Wait (by the clock) until a little after the message's lock ended."""
    end = message.locked_until_utc + datetime.timedelta(milliseconds=50)
    deadline = time.monotonic() + MAX_WAIT
    while utcnow() <= end and time.monotonic() < deadline:
        time.sleep(0.02)  # polling a clock, not synchronising with the server


def test_settle_and_renew_after_lock_lost_raise(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = servicebus_server.create_queue(lock_duration=SHORT_LOCK)
    send(client, queue, ServiceBusMessage(b"x"), ServiceBusMessage(b"y"))
    with client.get_queue_receiver(queue) as receiver:
        stale_x, stale_y = receive_until(receiver, 2)
        redelivered = receive_until(receiver, 2)  # the locks expired and moved on
        assert [body(m) for m in redelivered] == [b"x", b"y"]
        # Client-side check (locked_until is in the past).
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(stale_x)
        # Renew is checked by the service (410 com.microsoft:message-lock-lost).
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock(stale_x)
        # Server-side check on the receiver link: pretend the client's clock is behind,
        # so the SDK sends the disposition and the emulator must refuse it.
        stale_y._expiry = utcnow() + datetime.timedelta(minutes=5)
        with pytest.raises(MessageLockLostError):
            receiver.abandon_message(stale_y)
        # A copy of a settled message: the link no longer knows the delivery, the SDK
        # falls back to $management update-disposition, which reports the lock lost.
        copied = copy.copy(redelivered[0])
        receiver.complete_message(redelivered[0])
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(copied)
        # The new holder's lock was not disturbed by the stale attempts.
        receiver.renew_message_lock(redelivered[1])
        receiver.complete_message(redelivered[1])
        assert receiver.peek_messages(5, sequence_number=1) == []


# -- configuration and expiry ------------------------------------------------------------------


def test_config_declared_queue_dead_letters_after_lock_expiries(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    from _fixtures.servicebus import DECLARED_QUEUE  # LockDuration PT1S, MaxDeliveryCount 2

    send(client, DECLARED_QUEUE, ServiceBusMessage(b"slow", message_id="slow"))
    with client.get_queue_receiver(DECLARED_QUEUE) as receiver:
        [first] = receive_until(receiver, 1)
        assert first.delivery_count == 0
        [second] = receive_until(receiver, 1)  # after the first lock expired
        assert second.delivery_count == 1
        _wait_for_lock_loss(second)
    with aux_receiver(
        client,
        DECLARED_QUEUE,
        sub_queue=ServiceBusSubQueue.DEAD_LETTER,
        receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
    ) as dlq:
        [dead] = receive_until(dlq, 1)  # the second expiry exhausted MaxDeliveryCount
        assert dead.message_id == "slow"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"


def test_ttl_expiry(client: ServiceBusClient, servicebus_server: Any) -> None:
    dropping = servicebus_server.create_queue()
    dead_lettering = servicebus_server.create_queue(dead_lettering_on_message_expiration=True)
    short = datetime.timedelta(seconds=1)
    for queue in (dropping, dead_lettering):
        send(
            client,
            queue,
            ServiceBusMessage(b"short", message_id="s", time_to_live=short),
            ServiceBusMessage(b"long", message_id="l"),
        )
    with (
        aux_receiver(client, dropping) as r1,
        aux_receiver(client, dead_lettering) as r2,
    ):
        deadline = time.monotonic() + MAX_WAIT
        while any(len(r.peek_messages(5, sequence_number=1)) > 1 for r in (r1, r2)):
            assert time.monotonic() < deadline, "the message did not expire"
        for receiver in (r1, r2):
            [only] = receive_until(receiver, 1)
            assert only.message_id == "l"
            receiver.complete_message(only)
    with aux_receiver(client, dropping, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        assert dlq.peek_messages(5, sequence_number=1) == []
    with aux_receiver(client, dead_lettering, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        [dead] = dlq.peek_messages(5, sequence_number=1)
        assert dead.message_id == "s"
        assert dead.dead_letter_reason == "TTLExpiredException"


def test_scheduled_messages_appear_at_their_time(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = servicebus_server.create_queue()
    with (
        client.get_queue_receiver(queue) as receiver,
        sender_for(client, queue) as sender,
    ):
        receiver.peek_messages(1)  # open both links before scheduling
        sender.send_messages([])
        at = utcnow() + datetime.timedelta(seconds=1)
        [seq] = sender.schedule_messages(ServiceBusMessage(b"later"), at)
        [cancelled] = sender.schedule_messages(ServiceBusMessage(b"never"), at)
        sender.cancel_scheduled_messages(cancelled)
        sender.send_messages(ServiceBusMessage(b"annotated", scheduled_enqueue_time_utc=at))
        assert receiver.receive_messages(max_wait_time=0.2) == []
        got = receive_until(receiver, 2)
        assert utcnow() >= at
        assert sorted(body(m) for m in got) == [b"annotated", b"later"]
        # "As the message transitions to the active state, the message is appended to
        # the queue as if had been enqueued at the current instant, which includes
        # assigning a new SequenceNumber" (Microsoft Learn, Message sequencing).
        assert all(m.sequence_number > max(seq, cancelled) for m in got)
        for m in got:
            receiver.complete_message(m)
        assert receiver.peek_messages(5, sequence_number=1) == []


def test_missing_entity_raises_not_found(client: ServiceBusClient, servicebus_server: Any) -> None:
    missing = servicebus_server.queue_name("missing")
    with (
        pytest.raises(MessagingEntityNotFoundError),
        aux_receiver(client, missing) as receiver,
    ):
        receiver.receive_messages(max_wait_time=1)
    with pytest.raises(MessagingEntityNotFoundError):
        send(client, missing, ServiceBusMessage(b"x"))


def test_deleted_queue_detaches_its_links(client: ServiceBusClient, servicebus_server: Any) -> None:
    queue = servicebus_server.create_queue()
    with aux_receiver(client, queue) as receiver:
        assert receiver.receive_messages(max_wait_time=0.1) == []  # link attached
        servicebus_server.delete_queue(queue)
        with pytest.raises(MessagingEntityNotFoundError):
            receiver.receive_messages(max_wait_time=1)
    with pytest.raises(MessagingEntityNotFoundError):
        send(client, queue, ServiceBusMessage(b"x"))


def test_receive_timeout_returns_empty_promptly(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = servicebus_server.create_queue()
    with client.get_queue_receiver(queue) as receiver:
        receiver.receive_messages(max_wait_time=0.2)  # open the link first
        started = time.monotonic()
        assert receiver.receive_messages(max_message_count=5, max_wait_time=0.5) == []
        assert time.monotonic() - started < 3  # prompt, not a hang
        # The credit left outstanding still works: a message sent now is received.
        send(client, queue, ServiceBusMessage(b"late"))
        [message] = receive_until(receiver, 1)
        receiver.complete_message(message)
        started = time.monotonic()
    # Closing drains the link (flow drain=true) and releases; it must not hang.
    assert time.monotonic() - started < 3


# -- aio ------------------------------------------------------------------------------------------


def test_aio_end_to_end(servicebus_server: Any) -> None:
    asyncio.run(_aio_end_to_end(servicebus_server))


async def _aio_end_to_end(server: Any) -> None:
    queue = server.create_queue(lock_duration=SHORT_LOCK)
    async with AsyncServiceBusClient.from_connection_string(server.connection_string) as sb:
        async with sender_for(sb, queue) as sender:
            await sender.send_messages(ServiceBusMessage(b"a", message_id="a"))
            batch = await sender.create_message_batch()
            batch.add_message(ServiceBusMessage(b"b", message_id="b"))
            batch.add_message(ServiceBusMessage(b"c", message_id="c"))
            await sender.send_messages(batch)

        async with sb.get_queue_receiver(queue) as receiver:
            got: list[ServiceBusReceivedMessage] = []
            deadline = time.monotonic() + MAX_WAIT
            while len(got) < 3 and time.monotonic() < deadline:
                got += await receiver.receive_messages(
                    max_message_count=3 - len(got), max_wait_time=1
                )
            a, b, c = got
            assert [m.message_id for m in got] == ["a", "b", "c"]
            assert [m.sequence_number for m in got] == [1, 2, 3]
            assert all(m.delivery_count == 0 for m in got)
            assert a.lock_token == uuid.UUID(bytes_le=a._delivery_tag)

            peeked = await receiver.peek_messages(5, sequence_number=1)
            assert [m.message_id for m in peeked] == ["a", "b", "c"]

            until = a.locked_until_utc
            token = a.lock_token
            assert await receiver.renew_message_lock(a) >= until
            assert a.lock_token == token
            await receiver.complete_message(a)
            await receiver.abandon_message(b)
            await receiver.dead_letter_message(c, reason="why", error_description="because")

            [b2] = await receiver.receive_messages(max_wait_time=MAX_WAIT)
            assert (b2.message_id, b2.delivery_count) == ("b", 1)

            # Let the lock lapse: renew and settle must report MessageLockLostError.
            end = b2.locked_until_utc + datetime.timedelta(milliseconds=50)
            while utcnow() <= end:
                await asyncio.sleep(0.02)  # polling a clock, not synchronising
            with pytest.raises(MessageLockLostError):
                await receiver.renew_message_lock(b2)
            with pytest.raises(MessageLockLostError):
                await receiver.complete_message(b2)
            [b3] = await receiver.receive_messages(max_wait_time=MAX_WAIT)
            assert (b3.message_id, b3.delivery_count) == ("b", 2)
            # Server-side refusals: a disposition for a lock that is gone (client clock
            # pretended behind), and a stale copy settled over $management.
            b2._expiry = utcnow() + datetime.timedelta(minutes=5)
            b2._settled = False
            with pytest.raises(MessageLockLostError):
                await receiver.abandon_message(b2)
            stale = copy.copy(b3)
            await receiver.complete_message(b3)
            with pytest.raises(MessageLockLostError):
                await receiver.complete_message(stale)

            started = time.monotonic()
            assert await receiver.receive_messages(max_wait_time=0.5) == []
            assert time.monotonic() - started < 3  # prompt, not a hang

        async with aux_receiver(sb, queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            [dead] = await dlq.receive_messages(max_wait_time=MAX_WAIT)
            assert (dead.message_id, dead.dead_letter_reason) == ("c", "why")
            assert dead.dead_letter_error_description == "because"
            await dlq.complete_message(dead)

        async with sender_for(sb, queue) as sender:
            await sender.send_messages(ServiceBusMessage(b"d"))
        async with aux_receiver(
            sb, queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as rd:
            [d] = await rd.receive_messages(max_wait_time=MAX_WAIT)
            assert b"".join(d.body) == b"d"
            assert await rd.receive_messages(max_wait_time=0.3) == []

        with pytest.raises(MessagingEntityNotFoundError):
            async with aux_receiver(sb, server.queue_name("missing")) as missing:
                await missing.receive_messages(max_wait_time=1)


# -- limits, drain and process lifecycle ------------------------------------------------------


def test_oversize_message_is_rejected(client: ServiceBusClient, servicebus_server: Any) -> None:
    queue = servicebus_server.create_queue()
    with sender_for(client, queue) as sender:
        with pytest.raises(MessageSizeExceededError):
            sender.send_messages(ServiceBusMessage(b"x" * 300_000))
        assert sender.create_message_batch().max_size_in_bytes == 256 * 1024
    with aux_receiver(client, queue) as receiver:
        assert receiver.peek_messages(5, sequence_number=1) == []


def test_drain_is_answered_with_the_credit_given_back(servicebus_server: Any) -> None:
    """A receiver asking to drain on an empty queue gets its credit back at once."""
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    queue = servicebus_server.create_queue()
    address = f"{servicebus_server.host}:{servicebus_server.port}"

    class Drainer(MessagingHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(prefetch=0)
            self.drained = False

        def on_start(self, event: Any) -> None:
            conn = event.container.connect(address, allowed_mechs="ANONYMOUS")
            event.container.create_receiver(conn, queue)
            event.container.schedule(MAX_WAIT, self)  # give up if never answered

        def on_link_opened(self, event: Any) -> None:
            if event.receiver is not None:
                event.receiver.drain(5)

        def on_link_flow(self, event: Any) -> None:
            receiver = event.receiver
            if receiver is not None and not receiver.draining() and receiver.credit == 0:
                self.drained = True
                event.connection.close()
                event.container.stop()

        def on_timer_task(self, event: Any) -> None:
            event.container.stop()

    handler = Drainer()
    started = time.monotonic()
    Container(handler).run()
    assert handler.drained
    assert time.monotonic() - started < 4  # answered, not given up on at MAX_WAIT


def test_emulator_process_stops_cleanly_on_sigterm(tmp_path: Any) -> None:
    from leasekit.emulators._process import ServerProcess, free_port, python_module

    config = tmp_path / "queues.json"
    config.write_text('{"Queues": [{"Name": "a", "Properties": {"LockDuration": "PT5S"}}]}')
    port = free_port()
    argv = python_module(
        "leasekit.emulators.servicebus",
        "--port",
        str(port),
        "--http-port",
        str(free_port()),
        "--config",
        str(config),
    )
    process = ServerProcess(argv, port, name="servicebus-sigterm").start()
    process.stop(grace=5)
    assert process._proc is not None and process._proc.returncode == 0


def test_bad_config_exits_with_an_error(tmp_path: Any) -> None:
    import subprocess
    import sys

    config = tmp_path / "queues.json"
    config.write_text('{"Queues": [{"Name": "a", "Properties": {"LockDuration": "PT10M"}}]}')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "leasekit.emulators.servicebus",
            "--port",
            "1",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "LockDuration" in result.stderr


# -- broker semantics without the network (explicit clock) ----------------------------------------


def test_broker_rules_with_an_explicit_clock() -> None:
    from leasekit.emulators.servicebus import Broker, LockLost, QueueProperties
    from leasekit.emulators.servicebus.config import EmulatorConfig

    broker = Broker(EmulatorConfig(auto_create=False))
    queue = broker.create_queue("q", QueueProperties(lock_duration=10, max_delivery_count=2))
    active = queue.active
    for payload in ("a", "b"):
        active.enqueue(payload, now=0.0)
    a = active.receive(1.0, lock=True)
    assert a is not None and a.payload == "a" and a.locked_until == 11.0
    token = a.lock_token
    assert token is not None
    assert active.renew(token, 5.0) == 15.0  # from now, same token
    assert a.lock_token == token
    b = active.receive(5.0, lock=True)
    assert b is not None and b.payload == "b"
    assert active.receive(5.0, lock=True) is None
    # Both locks end at 15 (b taken at 5, a renewed at 5): both return, in sequence order.
    assert queue.expire(15.0)
    again = active.receive(15.0, lock=True)
    assert again is a and a.delivery_count == 1 and a.lock_token != token
    with pytest.raises(LockLost):
        active.complete(token, 15.0)  # the old token is stale
    assert a.lock_token is not None
    active.abandon(a.lock_token, 16.0)  # second failed delivery: MaxDeliveryCount 2
    assert a in queue.dead_letter.peek(1, 10, 16.0)
    assert a.dead_letter_properties["DeadLetterReason"] == "MaxDeliveryCountExceeded"


def test_config_parsing() -> None:
    from leasekit.emulators.servicebus.config import parse_config, parse_duration

    assert parse_duration("PT1M") == 60
    assert parse_duration("PT0.5S") == 0.5
    assert parse_duration("P1DT2H3M4S") == 86400 + 7200 + 180 + 4
    assert parse_duration(30) == 30
    with pytest.raises(ValueError):
        parse_duration("PT")
    config = parse_config(
        {
            "UserConfig": {
                "Namespaces": [
                    {
                        "Name": "ns",
                        "Queues": [
                            {
                                "Name": "orders",
                                "Properties": {
                                    "LockDuration": "PT2S",
                                    "MaxDeliveryCount": 3,
                                    "DefaultMessageTimeToLive": "PT1H",
                                    "DeadLetteringOnMessageExpiration": True,
                                },
                            }
                        ],
                    }
                ]
            },
            "Emulator": {"AutoCreateQueues": "^auto-.*"},
        }
    )
    orders = config.queues["orders"]
    assert (orders.lock_duration, orders.max_delivery_count, orders.default_ttl) == (2, 3, 3600)
    assert orders.dead_lettering_on_message_expiration
    assert config.may_auto_create("auto-1") and not config.may_auto_create("other")
