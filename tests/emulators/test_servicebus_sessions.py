"""Service Bus message sessions on the emulator, driven by the azure-servicebus SDK.

Each test does what the SDK's session samples and documentation do and asserts
what Azure Service Bus documents (quoted in ``emulators/servicebus/sessions.py``).
The SDK's own session samples (``session_send_receive``, ``session_pool_receive``
and their async twins) run unchanged as subprocesses at the end.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")

from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
)
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

SHORT_LOCK = 1.0  # seconds; the emulator allows locks below Service Bus' 5 s minimum
LOCK = 5.0  # Service Bus' shortest lock, where a test must not race the lock
MAX_WAIT = 10.0  # deadline for anything expected to happen
SAMPLE_DEADLINE = 180.0  # one sample's run (the pool samples send 200 messages one by one)


@pytest.fixture(scope="module")
def client(servicebus_server: Any) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(
        servicebus_server.connection_string, retry_total=0
    ) as sb:
        yield sb


def session_queue(server: Any, lock: float = LOCK) -> str:
    return str(server.create_queue(requires_session=True, lock_duration=lock))


def send(client: ServiceBusClient, queue: str, session_id: str, *bodies: str) -> None:
    with client.get_queue_sender(queue, keep_alive=0) as sender:
        sender.send_messages([ServiceBusMessage(b, session_id=session_id) for b in bodies])


def receive_until(receiver: Any, count: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + MAX_WAIT
    while len(got) < count and time.monotonic() < deadline:
        got += receiver.receive_messages(max_message_count=count - len(got), max_wait_time=1)
    return got


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def test_next_available_session_is_accepted_with_its_id_and_lock(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = session_queue(servicebus_server)
    send(client, queue, "order-17", "a1", "a2", "a3")
    before = utcnow()
    with client.get_queue_receiver(
        queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5, keep_alive=0
    ) as receiver:
        # The attach answer names the session and its lock (com.microsoft:locked-until-utc).
        assert receiver.session.session_id == "order-17"
        locked_until = receiver.session.locked_until_utc
        assert locked_until is not None
        assert before + datetime.timedelta(seconds=LOCK - 1) < locked_until
        assert locked_until < utcnow() + datetime.timedelta(seconds=LOCK + 1)
        messages = receive_until(receiver, 3)
        assert [str(m) for m in messages] == ["a1", "a2", "a3"]
        assert {m.session_id for m in messages} == {"order-17"}
        for message in messages:
            receiver.complete_message(message)


def test_a_held_session_is_not_handed_to_a_second_receiver(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = session_queue(servicebus_server)
    send(client, queue, "A", "a1", "a2")
    send(client, queue, "B", "b1")
    with (
        client.get_queue_receiver(
            queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5, keep_alive=0
        ) as first,
        client.get_queue_receiver(
            queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5, keep_alive=0
        ) as second,
    ):
        assert first.session.session_id == "A"  # the oldest message's session first
        assert second.session.session_id == "B"
        assert [str(m) for m in receive_until(second, 1)] == ["b1"]
        # A named session another receiver holds cannot be locked.
        with (
            pytest.raises(SessionCannotBeLockedError),
            client.get_queue_receiver(queue, session_id="A", keep_alive=0) as third,
        ):
            third.receive_messages(max_wait_time=1)


def test_no_available_session_times_out_as_the_service_does(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    # "If there are no unlocked sessions with Active messages, then the call will
    # timeout" (.NET AcceptNextSessionAsync); the SDK raises OperationTimeoutError.
    queue = session_queue(servicebus_server)
    started = time.monotonic()
    with (
        pytest.raises(OperationTimeoutError),
        client.get_queue_receiver(
            queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1, keep_alive=0
        ),
    ):
        pass
    assert 0.9 < time.monotonic() - started < MAX_WAIT


def test_a_waiting_receiver_gets_a_session_as_soon_as_one_has_messages(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = session_queue(servicebus_server)
    with ServiceBusClient.from_connection_string(
        servicebus_server.connection_string, retry_total=0
    ) as other:
        import threading

        sent = threading.Timer(0.5, lambda: send(other, queue, "late", "l1"))
        sent.start()
        try:
            with client.get_queue_receiver(
                queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=8, keep_alive=0
            ) as receiver:
                assert receiver.session.session_id == "late"
                [message] = receive_until(receiver, 1)
                receiver.complete_message(message)
        finally:
            sent.join()


def test_named_session_can_be_accepted_empty_and_keeps_its_state(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = session_queue(servicebus_server)
    with client.get_queue_receiver(queue, session_id="empty", keep_alive=0) as receiver:
        assert receiver.session.get_state() is None
        receiver.session.set_state(b"\x00step-3\xff")
        assert receiver.session.get_state() == b"\x00step-3\xff"
        assert receiver.receive_messages(max_wait_time=0.5) == []
    # The state outlives the receiver (the session has no messages).
    with client.get_queue_receiver(queue, session_id="empty", keep_alive=0) as receiver:
        assert receiver.session.get_state() == b"\x00step-3\xff"
        receiver.session.set_state(None)
        assert receiver.session.get_state() is None


def test_renew_session_lock_extends_it(client: ServiceBusClient, servicebus_server: Any) -> None:
    queue = session_queue(servicebus_server, lock=2)
    send(client, queue, "A", "a1")
    with client.get_queue_receiver(queue, session_id="A", keep_alive=0) as receiver:
        [message] = receive_until(receiver, 1)
        first = receiver.session.locked_until_utc
        assert first is not None
        time.sleep(0.3)  # so the renewed lock visibly ends later (not a synchronisation)
        renewed = receiver.session.renew_lock()
        assert renewed > first
        # Past the first lock's end, the renewed lock still settles the message.
        while utcnow() < first + datetime.timedelta(seconds=0.2):
            time.sleep(0.05)
        receiver.complete_message(message)


def test_auto_lock_renewer_keeps_a_session_past_its_lock(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = session_queue(servicebus_server, lock=LOCK)
    send(client, queue, "A", "a1")
    failures: list[Any] = []
    renewer = AutoLockRenewer(on_lock_renew_failure=lambda _s, error: failures.append(error))
    with client.get_queue_receiver(queue, session_id="A", keep_alive=0) as receiver:
        renewer.register(receiver, receiver.session, max_lock_renewal_duration=30)
        [message] = receive_until(receiver, 1)
        first = receiver.session.locked_until_utc
        assert first is not None
        while utcnow() < first + datetime.timedelta(seconds=0.5):
            time.sleep(0.05)  # letting the renewer's thread run, not synchronising
        receiver.complete_message(message)
    renewer.close()
    assert failures == []


def test_expired_session_lock_is_lost_and_its_messages_come_back_counted(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = session_queue(servicebus_server, lock=SHORT_LOCK)
    send(client, queue, "A", "a1", "a2")
    with client.get_queue_receiver(queue, session_id="A", keep_alive=0) as receiver:
        messages = receive_until(receiver, 2)
        assert [m.delivery_count for m in messages] == [0, 0]
        deadline = time.monotonic() + MAX_WAIT
        while receiver.session.locked_until_utc > utcnow() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # past the broker's lock end (clock resolution), not synchronisation
        with pytest.raises(SessionLockLostError):
            receiver.complete_message(messages[0])
    # "the lock expires and the session is made available to other clients".
    with client.get_queue_receiver(
        queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5, keep_alive=0
    ) as again:
        assert again.session.session_id == "A"
        back = receive_until(again, 2)
        assert [str(m) for m in back] == ["a1", "a2"]
        assert [m.delivery_count for m in back] == [1, 1]
        for message in back:
            again.complete_message(message)


def test_abandoned_message_comes_back_first_to_the_session_holder(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = session_queue(servicebus_server)
    send(client, queue, "A", "a1", "a2")
    with client.get_queue_receiver(queue, session_id="A", keep_alive=0) as receiver:
        [head] = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(head) == "a1"
        receiver.abandon_message(head)
        back = receive_until(receiver, 2)
        assert [str(m) for m in back] == ["a1", "a2"]
        assert back[0].delivery_count == 1
        for message in back:
            receiver.complete_message(message)


def test_closing_a_session_receiver_releases_the_session(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = session_queue(servicebus_server)
    send(client, queue, "A", "a1")
    with client.get_queue_receiver(queue, session_id="A", keep_alive=0) as receiver:
        assert [str(m) for m in receive_until(receiver, 1)] == ["a1"]
    with client.get_queue_receiver(
        queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5, keep_alive=0
    ) as again:
        assert again.session.session_id == "A"
        [message] = receive_until(again, 1)
        again.complete_message(message)


def test_a_session_whose_connection_is_reset_is_released_at_once_uncounted(
    client: ServiceBusClient, servicebus_server: Any, fault_proxy: Any
) -> None:
    """What Service Bus documents for a broken connection, with the real SDK.

    "If the reason is a broken network connection, the lock is dropped since
    Service Bus does not support recovery of existing AMQP links on a different
    connection" (Message transfers, locks, and settlement), and the session lock is
    released when the receiver's link closes, not only when the lock expires;
    "Session is accepted, the messages within the session aren't completed (even if
    they are locked), and the session is closed": the delivery count is not
    incremented (Message sessions, "Impact of delivery count"). So another receiver
    accepts the session at once, long before the lock would end, and gets its
    messages in order with no failed delivery counted.
    """
    from leasekit.emulators.servicebus import connection_string

    queue = session_queue(servicebus_server)  # a 5 s lock: a rival in time cannot be expiry
    send(client, queue, "A", "a1", "a2")
    proxy = fault_proxy(servicebus_server.port)
    with ServiceBusClient.from_connection_string(
        connection_string(proxy.host, proxy.port), retry_total=0
    ) as through:
        holder = through.get_queue_receiver(queue, session_id="A", keep_alive=0)
        holder.__enter__()
        try:
            assert [m.delivery_count for m in receive_until(holder, 2)] == [0, 0]
            locked_until = holder.session.locked_until_utc
            proxy.drop()
            with client.get_queue_receiver(
                queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=MAX_WAIT, keep_alive=0
            ) as rival:
                assert rival.session.session_id == "A"
                back = receive_until(rival, 2)
                assert utcnow() < locked_until - datetime.timedelta(seconds=2)
                assert [str(m) for m in back] == ["a1", "a2"]
                assert [m.delivery_count for m in back] == [0, 0]
                for message in back:
                    rival.complete_message(message)
        finally:
            proxy.pass_()
            holder.close()


def test_session_queue_refuses_a_message_without_session_id(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = session_queue(servicebus_server)
    with (
        client.get_queue_sender(queue, keep_alive=0) as sender,
        pytest.raises(ServiceBusError, match="SessionId was not set"),
    ):
        sender.send_messages(ServiceBusMessage(b"no session"))
    with client.get_queue_receiver(queue, session_id="any", keep_alive=0) as receiver:
        assert receiver.peek_messages(5, sequence_number=1) == []


def test_peek_on_a_session_receiver_shows_only_its_session(
    client: ServiceBusClient, servicebus_server: Any
) -> None:
    queue = session_queue(servicebus_server)
    send(client, queue, "A", "a1")
    send(client, queue, "B", "b1")
    with client.get_queue_receiver(queue, session_id="B", keep_alive=0) as receiver:
        assert [str(m) for m in receiver.peek_messages(5, sequence_number=1)] == ["b1"]


# -- the SDK's own session samples, unchanged ---------------------------------------------------

SAMPLES = {
    "sync_samples/session_send_receive.py": ["Session state: b'START'", "Receive is done."],
    "async_samples/session_send_receive_async.py": ["Session state: b'END'", "Receive is done."],
    "sync_samples/session_pool_receive.py": ["Received total 200 messages across 10 sessions."],
    "async_samples/session_pool_receive_async.py": ["no non-empty sessions remaining"],
}


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_sdk_session_sample_runs_unchanged(servicebus_server: Any, sample: str) -> None:
    from _fixtures.sdk_samples import servicebus_samples

    path = servicebus_samples() / sample
    queue = session_queue(servicebus_server)
    env = dict(
        os.environ,
        SERVICEBUS_CONNECTION_STR=servicebus_server.connection_string,
        SERVICEBUS_SESSION_QUEUE_NAME=queue,
        SERVICEBUS_SESSION_ID="sample-session",
    )
    done = subprocess.run(
        [sys.executable, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=SAMPLE_DEADLINE,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for line in SAMPLES[sample]:
        assert line in done.stdout, done.stdout[-3000:]
    if "session_send_receive" in sample:
        # 21 messages sent to one session; the sample receives (and completes) one batch.
        received = done.stdout.count("Session Message") + done.stdout.count("Single session")
        assert received >= 1
        assert "Session state: b'END'" in done.stdout
    if "pool_receive_async" in sample:
        assert done.stdout.count("Message: Sample message no.") == 5 * 20
