"""The Service Bus emulator's management API, driven by the real ``ServiceBusAdministrationClient``.

The emulator serves the REST/ATOM API the SDK's ``azure.servicebus.management``
client calls, on its second port, with the real service's answers (a missing
queue is an empty feed on GET, ``404`` on DELETE, an existing one ``409`` on
create). What it cannot honour is refused ``501``, naming it.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")

from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

MAX_WAIT = 10.0


def test_create_get_update_list_runtime_and_delete_a_queue(servicebus_server: Any) -> None:
    name = servicebus_server.queue_name("admin")
    with servicebus_server.admin_client() as admin:
        created = admin.create_queue(
            name,
            lock_duration=datetime.timedelta(seconds=2),
            max_delivery_count=3,
            dead_lettering_on_message_expiration=True,
        )
        assert (created.name, created.lock_duration, created.max_delivery_count) == (
            name,
            datetime.timedelta(seconds=2),
            3,
        )
        assert created.dead_lettering_on_message_expiration is True
        assert created.default_message_time_to_live > datetime.timedelta(days=10000)  # never

        got = admin.get_queue(name.upper())  # entity names are case-insensitive
        assert got.lock_duration == datetime.timedelta(seconds=2)
        got.max_delivery_count = 5
        admin.update_queue(got)
        admin.update_queue(admin.get_queue(name), lock_duration=datetime.timedelta(seconds=4))
        updated = admin.get_queue(name)
        assert (updated.max_delivery_count, updated.lock_duration.total_seconds()) == (5, 4)

        assert name in [q.name for q in admin.list_queues()]
        _fill(servicebus_server, name)
        runtime = admin.get_queue_runtime_properties(name)
        assert (runtime.active_message_count, runtime.scheduled_message_count) == (1, 1)
        assert runtime.dead_letter_message_count == 1
        assert runtime.total_message_count == 3 and runtime.size_in_bytes > 0

        admin.delete_queue(name)
        assert name not in [q.name for q in admin.list_queues()]
        with pytest.raises(ResourceNotFoundError):
            admin.get_queue(name)


def _fill(server: Any, name: str) -> None:
    """One active, one scheduled and one dead-lettered message."""
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_sender(name, keep_alive=0) as sender:
            sender.send_messages([ServiceBusMessage(b"active"), ServiceBusMessage(b"dead")])
            later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
            sender.schedule_messages(ServiceBusMessage(b"later"), later)
        with client.get_queue_receiver(name) as receiver:
            deadline = time.monotonic() + MAX_WAIT
            while time.monotonic() < deadline:
                got = receiver.receive_messages(1, max_wait_time=1)
                if got:
                    receiver.dead_letter_message(got[0], reason="test")
                    break
            # the other message goes back at once, uncounted
        with client.get_queue_receiver(
            name, sub_queue=ServiceBusSubQueue.DEAD_LETTER, prefetch_count=1, keep_alive=0
        ) as dlq:
            assert len(dlq.peek_messages(5, sequence_number=1)) == 1


def test_answers_are_the_real_services(servicebus_server: Any) -> None:
    with servicebus_server.admin_client() as admin:
        name = servicebus_server.create_queue()
        with pytest.raises(ResourceExistsError):
            admin.create_queue(name)
        missing = servicebus_server.queue_name("missing")
        with pytest.raises(ResourceNotFoundError):
            admin.get_queue(missing)  # an empty feed, which the SDK turns into not-found
        with pytest.raises(ResourceNotFoundError):
            admin.delete_queue(missing)
        with pytest.raises(HttpResponseError, match="LockDuration") as too_long:
            admin.create_queue(missing, lock_duration=datetime.timedelta(minutes=6))
        assert too_long.value.status_code == 400
        admin.delete_queue(name)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda admin, name: admin.create_queue(name, requires_duplicate_detection=True), "Dup"),
        (lambda admin, name: admin.create_queue(name, forward_to="elsewhere"), "ForwardTo"),
        (lambda admin, name: admin.create_topic(name), "Topics"),
        (lambda admin, name: admin.get_subscription(name, "sub"), "Topics"),
        (lambda admin, name: admin.create_subscription(name, "sub"), "Topics"),
    ],
    ids=["duplicate-detection", "forwarding", "topic", "subscription", "new-subscription"],
)
def test_what_the_emulator_cannot_honour_is_refused_501(
    servicebus_server: Any, call: Any, match: str
) -> None:
    name = servicebus_server.queue_name("refused")
    with servicebus_server.admin_client() as admin:
        started = time.monotonic()
        with pytest.raises(HttpResponseError, match=match) as refused:
            call(admin, name)
        assert refused.value.status_code == 501
        assert time.monotonic() - started < 1.0
        with pytest.raises(ResourceNotFoundError):
            admin.get_queue(name)  # nothing was created


def test_health_and_namespace(servicebus_server: Any) -> None:
    import urllib.request

    url = f"http://{servicebus_server.host}:{servicebus_server.http_port}/health"
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
    with servicebus_server.admin_client() as admin:
        namespace = admin.get_namespace_properties()
    assert (namespace.name, namespace.messaging_sku) == ("sbemulatorns", "Standard")


def _runtime_counts(admin: Any, name: str) -> tuple[int, int, int, int]:
    runtime = admin.get_queue_runtime_properties(name)
    return (
        runtime.active_message_count,
        runtime.scheduled_message_count,
        runtime.dead_letter_message_count,
        runtime.total_message_count,
    )


def test_runtime_counts_follow_locks_settlement_and_schedules(servicebus_server: Any) -> None:
    """Counted as the service counts: a locked (or deferred) message is still active."""
    name = servicebus_server.create_queue(lock_duration=30)
    with (
        ServiceBusClient.from_connection_string(servicebus_server.connection_string) as client,
        servicebus_server.admin_client() as admin,
    ):
        with client.get_queue_sender(name, keep_alive=0) as sender:
            sender.send_messages([ServiceBusMessage(b"a"), ServiceBusMessage(b"b")])
            soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
            sender.schedule_messages(ServiceBusMessage(b"soon"), soon)
        assert _runtime_counts(admin, name) == (2, 1, 0, 3)
        with client.get_queue_receiver(name, keep_alive=0) as receiver:
            locked = receiver.receive_messages(2, max_wait_time=5)
            if len(locked) < 2:
                locked += receiver.receive_messages(1, max_wait_time=2)
            assert len(locked) == 2
            assert _runtime_counts(admin, name) == (2, 1, 0, 3)  # no count of locked ones
            receiver.complete_message(locked[0])
            receiver.defer_message(locked[1])
            assert _runtime_counts(admin, name) == (1, 1, 0, 2)  # deferred: active
        deadline = time.monotonic() + MAX_WAIT
        while _runtime_counts(admin, name) != (2, 0, 0, 2) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the counters until the schedule comes due
        assert _runtime_counts(admin, name) == (2, 0, 0, 2)
        admin.delete_queue(name)
