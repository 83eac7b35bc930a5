"""The MNS emulator, driven by the real ``aliyun-mns-sdk`` client.

Most tests talk to the subprocess from the ``mns_server`` fixture. Tests that
need time to pass (retention, delays, a handle outliving its visibility) use an
in-process :class:`MnsEmulator` with a hand-moved clock instead of sleeping.
Status codes and headers the SDK does not surface are checked with raw requests
signed by the SDK's own signer.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from mns.account import Account
from mns.message_property import MessagePropertyValue, PropertyType
from mns.mns_client import MNSClient
from mns.mns_exception import MNSServerException
from mns.mns_http import RequestInternal, ResponseInternal
from mns.queue import Message, Queue, QueueMeta

from leasekit.emulators.mns import (
    DEFAULT_ACCESS_KEY_ID,
    DEFAULT_ACCESS_KEY_SECRET,
    MnsEmulator,
)
from leasekit.emulators.mns.server import MAX_REQUEST_BODY

# aliyun-mns-sdk 1.3.0 warns on every GetQueueAttributes that the message counts
# will be removed from a later SDK; the emulator still serves them.
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated function:DeprecationWarning")

# --------------------------------------------------------------------- helpers


def server_error(call: Callable[[], object]) -> MNSServerException:
    """Run ``call`` and return the MNSServerException it must raise."""
    with pytest.raises(MNSServerException) as info:
        call()
    return info.value


def raw_request(
    endpoint: str,
    key_id: str,
    secret: str,
    method: str,
    uri: str,
    data: bytes = b"",
) -> ResponseInternal:
    """Send one request signed by the SDK's signer and return the raw response."""
    client = MNSClient(endpoint, key_id, secret)
    request = RequestInternal(method, uri)
    request.data = data if data else ""
    client.build_header(SimpleNamespace(request_id=None), request)
    response: ResponseInternal = client.http.send_request(request)
    client.close_connection()
    return response


def header(response: ResponseInternal, name: str) -> str | None:
    """Return a response header, matched case-insensitively."""
    for key, value in response.header.items():
        if key.lower() == name.lower():
            return str(value)
    return None


def meta(**attributes: int) -> QueueMeta:
    """Build a QueueMeta from MNS attribute names in snake case."""
    queue_meta = QueueMeta()
    setters = {
        "visibility_timeout": queue_meta.set_visibilitytimeout,
        "maximum_message_size": queue_meta.set_maximum_message_size,
        "message_retention_period": queue_meta.set_message_retention_period,
        "delay_seconds": queue_meta.set_delay_seconds,
        "polling_wait_seconds": queue_meta.set_polling_wait_seconds,
    }
    for name, value in attributes.items():
        setters[name](value)
    return queue_meta


@dataclass
class Env:
    """An endpoint with credentials, and the queues a test created there."""

    endpoint: str
    key_id: str
    secret: str
    created: list[Queue] = field(default_factory=list)

    def account(self, key_id: str | None = None, secret: str | None = None) -> Account:
        return Account(self.endpoint, key_id or self.key_id, secret or self.secret)

    def queue(self, **attributes: int) -> Queue:
        """Create a uniquely named queue and return the SDK handle for it."""
        queue = self.account().get_queue(f"t-{uuid.uuid4().hex[:12]}")
        queue.create(meta(**attributes))
        self.created.append(queue)
        return queue

    def raw(self, method: str, uri: str, data: bytes = b"", secret: str | None = None) -> Any:
        return raw_request(self.endpoint, self.key_id, secret or self.secret, method, uri, data)


@pytest.fixture
def env(mns_server: Any) -> Iterator[Env]:
    environment = Env(mns_server.endpoint, mns_server.access_key_id, mns_server.access_key_secret)
    yield environment
    for queue in environment.created:
        queue.delete()


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeTimeEnv(Env):
    clock: ManualClock = field(default_factory=ManualClock)
    emulator: MnsEmulator | None = None


@pytest.fixture
def fake_env() -> Iterator[FakeTimeEnv]:
    clock = ManualClock()
    with MnsEmulator(clock=clock) as emulator:
        yield FakeTimeEnv(
            emulator.endpoint,
            DEFAULT_ACCESS_KEY_ID,
            DEFAULT_ACCESS_KEY_SECRET,
            clock=clock,
            emulator=emulator,
        )


# ---------------------------------------------------------------- queue admin


def test_queue_create_get_set_list_and_delete(env: Env) -> None:
    queue = env.queue(visibility_timeout=7, polling_wait_seconds=2)
    attrs = queue.get_attributes()
    assert (attrs.queue_name, attrs.visibility_timeout, attrs.polling_wait_seconds) == (
        queue.queue_name,
        7,
        2,
    )
    assert attrs.maximum_message_size == 65536
    assert attrs.message_retention_period == 345600
    assert attrs.delay_seconds == 0
    assert attrs.create_time == pytest.approx(time.time(), abs=5)

    queue.set_attributes(meta(visibility_timeout=9, message_retention_period=60))
    attrs = queue.get_attributes()
    assert (attrs.visibility_timeout, attrs.message_retention_period) == (9, 60)
    assert attrs.polling_wait_seconds == 2  # untouched

    urls, marker = env.account().list_queue(prefix=queue.queue_name)
    assert urls == [f"{env.endpoint}/queues/{queue.queue_name}"]
    assert marker == ""

    queue.delete()
    env.created.remove(queue)
    assert server_error(queue.get_attributes).type == "QueueNotExist"
    queue.delete()  # deleting a missing queue is not an error in MNS


def test_list_queue_pages_with_marker(env: Env) -> None:
    prefix = f"p-{uuid.uuid4().hex[:8]}"
    account = env.account()
    for suffix in "abc":
        queue = account.get_queue(f"{prefix}-{suffix}")
        queue.create(QueueMeta())
        env.created.append(queue)
    first, marker = account.list_queue(prefix=prefix, ret_number=2)
    assert [u.rsplit("/", 1)[1] for u in first] == [f"{prefix}-a", f"{prefix}-b"]
    rest, marker = account.list_queue(prefix=prefix, ret_number=2, marker=marker)
    assert [u.rsplit("/", 1)[1] for u in rest] == [f"{prefix}-c"]
    assert marker == ""


def test_recreate_identical_is_204_and_different_attributes_is_409(env: Env) -> None:
    queue = env.queue(visibility_timeout=10)
    body = b'<Queue xmlns="http://mns.aliyuncs.com/doc/v1/"><VisibilityTimeout>10</VisibilityTimeout></Queue>'
    same = env.raw("PUT", f"/queues/{queue.queue_name}", body)
    assert same.status == 204
    assert header(same, "Location") == f"{env.endpoint}/queues/{queue.queue_name}"
    assert queue.create(meta(visibility_timeout=10)).endswith(queue.queue_name)  # SDK accepts 204

    different = env.raw("PUT", f"/queues/{queue.queue_name}", body.replace(b"10", b"11"))
    assert different.status == 409
    assert "<Code>QueueAlreadyExist</Code>" in different.data
    assert server_error(lambda: queue.create(meta(visibility_timeout=11))).type == (
        "QueueAlreadyExist"
    )


@pytest.mark.parametrize(
    "attributes",
    [
        {"visibility_timeout": 43201},
        {"message_retention_period": 59},
        {"message_retention_period": 604801},
        {"maximum_message_size": 1023},
        {"maximum_message_size": 65537},
        {"polling_wait_seconds": 31},
        {"delay_seconds": 604801},
    ],
)
def test_queue_attributes_outside_documented_ranges_are_invalid_argument(
    env: Env, attributes: dict[str, int]
) -> None:
    queue = env.account().get_queue(f"t-{uuid.uuid4().hex[:12]}")
    assert server_error(lambda: queue.create(meta(**attributes))).type == "InvalidArgument"
    assert server_error(queue.get_attributes).type == "QueueNotExist"


# -------------------------------------------------------- send, receive, peek


def test_binary_body_round_trips_through_base64(env: Env) -> None:
    queue = env.queue()
    payload = bytes(range(256)) + b"\xff\xfe\x00 not utf-8 \x80"
    wire_body = base64.b64encode(payload).decode("ascii")
    sender = env.account().get_queue(queue.queue_name)
    sender.set_encoding(False)  # send pre-encoded bytes; the receiver decodes base64
    before = time.time()
    sent = sender.send_message(Message(wire_body))
    assert sent.message_body_md5 == hashlib.md5(wire_body.encode()).hexdigest().upper()

    got = queue.receive_message()
    assert got.message_body == payload
    assert got.message_id == sent.message_id
    assert got.message_body_md5 == sent.message_body_md5
    assert got.dequeue_count == 1
    assert got.priority == 8
    assert before * 1000 - 5 <= got.enqueue_time <= got.first_dequeue_time
    assert got.next_visible_time == pytest.approx(got.first_dequeue_time + 30_000, abs=50)
    assert got.receipt_handle


def test_text_body_round_trips_with_sdk_default_encoding(env: Env) -> None:
    queue = env.queue()
    queue.send_message(Message("héllo ✓ <&>"))
    assert queue.receive_message().message_body == "héllo ✓ <&>".encode()

    plain = env.account().get_queue(queue.queue_name)
    plain.set_encoding(False)
    plain.send_message(Message("<xml> & 'quotes'"))
    assert plain.receive_message().message_body == "<xml> & 'quotes'"


def test_user_properties_round_trip(env: Env) -> None:
    queue = env.queue()
    message = Message("body")
    message.add_user_property("color", MessagePropertyValue(PropertyType.STRING, "blue"))
    queue.send_message(message)
    got = queue.receive_message()
    assert got.get_user_properties()["color"].get_string_value_by_type() == "blue"


def test_peek_does_not_change_the_message(env: Env) -> None:
    queue = env.queue()
    sent = [queue.send_message(Message(f"m{i}")).message_id for i in range(3)]
    peeked = queue.peek_message()
    assert (peeked.message_id, peeked.dequeue_count) == (sent[0], 0)
    assert [m.message_id for m in queue.batch_peek_message(16)] == sent
    assert queue.get_attributes().active_messages == 3
    got = queue.receive_message()
    assert (got.message_id, got.dequeue_count) == (sent[0], 1)
    assert [m.message_id for m in queue.batch_peek_message(16)] == sent[1:]


def test_priority_one_is_delivered_first(env: Env) -> None:
    queue = env.queue()
    queue.send_message(Message("low", priority=16))
    queue.send_message(Message("default"))
    queue.send_message(Message("high", priority=1))
    got = queue.batch_receive_message(16)
    assert [(m.message_body, m.priority) for m in got] == [
        (b"high", 1),
        (b"default", 8),
        (b"low", 16),
    ]
    assert server_error(lambda: queue.send_message(Message("x", priority=17))).type == (
        "InvalidArgument"
    )


def test_empty_queue_receive_and_peek_are_message_not_exist(env: Env) -> None:
    queue = env.queue()
    assert server_error(queue.receive_message).type == "MessageNotExist"
    assert server_error(queue.peek_message).type == "MessageNotExist"
    response = env.raw("GET", f"/queues/{queue.queue_name}/messages")
    assert response.status == 404
    assert "<Code>MessageNotExist</Code>" in response.data


# -------------------------------------------------------------------- batches


def test_batch_send_receive_and_delete_with_per_handle_errors(env: Env) -> None:
    queue = env.queue()
    sent = queue.batch_send_message([Message(f"b{i}") for i in range(5)])
    assert len({m.message_id for m in sent}) == 5
    got = queue.batch_receive_message(16)
    assert sorted(m.message_id for m in got) == sorted(m.message_id for m in sent)

    deleted = got[0].receipt_handle
    queue.delete_message(deleted)
    well_formed_stale = deleted
    malformed = "not-a-handle"
    handles = [m.receipt_handle for m in got[1:]] + [well_formed_stale, malformed]
    error = server_error(lambda: queue.batch_delete_message(handles))
    assert error.type == "MessageNotExist"
    assert error.sub_errors == [
        {
            "ErrorCode": "MessageNotExist",
            "ErrorMessage": "Message not exist.",
            "ReceiptHandle": well_formed_stale,
        },
        {
            "ErrorCode": "ReceiptHandleError",
            "ErrorMessage": "The receipt handle you provide is not valid.",
            "ReceiptHandle": malformed,
        },
    ]
    attrs = queue.get_attributes()  # the valid handles in the batch were deleted
    assert (attrs.active_messages, attrs.inactive_messages) == (0, 0)

    queue.send_message(Message("last"))
    last = queue.receive_message()
    queue.batch_delete_message([last.receipt_handle])  # all succeed: 204, no exception


def test_batch_limits_are_sixteen(env: Env) -> None:
    queue = env.queue()
    queue.batch_send_message([Message(f"x{i}") for i in range(16)])
    for call in (
        lambda: queue.batch_send_message([Message("y")] * 17),
        lambda: queue.batch_receive_message(17),
        lambda: queue.batch_peek_message(17),
        lambda: queue.batch_delete_message(["1-" + "A" * 24] * 17),
    ):
        assert server_error(call).type == "InvalidArgument"
    assert len(queue.batch_receive_message(16)) == 16


# --------------------------------------------------------------- long polling


def test_long_poll_returns_as_soon_as_a_message_arrives(env: Env) -> None:
    queue = env.queue()
    sender = env.account().get_queue(queue.queue_name)
    timer = threading.Timer(0.5, lambda: sender.send_message(Message("late")))
    started = time.monotonic()
    timer.start()
    try:
        got = queue.receive_message(wait_seconds=10)
    finally:
        timer.join()
    elapsed = time.monotonic() - started
    assert got.message_body == b"late"
    assert 0.4 <= elapsed < 3, elapsed


def test_blocked_receiver_is_woken_by_send(fake_env: FakeTimeEnv) -> None:
    # In-process, so the test can see the receiver is blocked before it sends.
    assert fake_env.emulator is not None
    store = fake_env.emulator.store
    queue = fake_env.queue()
    result: dict[str, Any] = {}

    def receive() -> None:
        started = time.monotonic()
        result["message"] = queue.batch_receive_message(16, wait_seconds=20)
        result["elapsed"] = time.monotonic() - started

    receiver = threading.Thread(target=receive)
    receiver.start()
    deadline = time.monotonic() + 5
    while store.waiting(queue.queue_name) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.waiting(queue.queue_name) == 1
    fake_env.account().get_queue(queue.queue_name).send_message(Message("wake"))
    receiver.join(timeout=5)
    assert not receiver.is_alive()
    assert [m.message_body for m in result["message"]] == [b"wake"]
    assert result["elapsed"] < 5


def test_long_poll_without_messages_waits_then_message_not_exist(env: Env) -> None:
    queue = env.queue()
    started = time.monotonic()
    assert server_error(lambda: queue.receive_message(wait_seconds=1)).type == "MessageNotExist"
    assert 0.9 <= time.monotonic() - started < 3


def test_queue_polling_wait_seconds_is_the_default_wait(env: Env) -> None:
    queue = env.queue(polling_wait_seconds=1)
    started = time.monotonic()
    assert server_error(queue.receive_message).type == "MessageNotExist"
    assert 0.9 <= time.monotonic() - started < 3
    assert server_error(lambda: queue.receive_message(wait_seconds=31)).type == "InvalidArgument"


def test_deleting_a_queue_wakes_its_long_pollers(fake_env: FakeTimeEnv) -> None:
    assert fake_env.emulator is not None
    store = fake_env.emulator.store
    queue = fake_env.queue()
    errors: list[str] = []
    receiver = threading.Thread(
        target=lambda: errors.append(server_error(lambda: queue.receive_message(20)).type)
    )
    receiver.start()
    deadline = time.monotonic() + 5
    while store.waiting(queue.queue_name) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    fake_env.account().get_queue(queue.queue_name).delete()
    fake_env.created.remove(queue)
    receiver.join(timeout=5)
    assert errors == ["QueueNotExist"]


# ---------------------------------------------------- visibility and handles


def test_visibility_expiry_redelivers_with_new_handle_and_count(env: Env) -> None:
    queue = env.queue(visibility_timeout=1)
    sent = queue.send_message(Message("again"))
    first = queue.receive_message()
    assert first.dequeue_count == 1
    assert server_error(queue.receive_message).type == "MessageNotExist"  # hidden now

    deadline = time.monotonic() + 5
    second = None
    while second is None and time.monotonic() < deadline:
        try:
            second = queue.receive_message(wait_seconds=1)
        except MNSServerException as exc:
            assert exc.type == "MessageNotExist"
    assert second is not None, "message was not redelivered within 5 s"
    assert second.message_id == sent.message_id
    assert second.dequeue_count == 2
    assert second.first_dequeue_time == first.first_dequeue_time
    assert second.receipt_handle != first.receipt_handle
    assert server_error(lambda: queue.delete_message(first.receipt_handle)).type == (
        "MessageNotExist"
    )
    queue.delete_message(second.receipt_handle)
    assert server_error(queue.peek_message).type == "MessageNotExist"


def test_change_visibility_rotates_the_receipt_handle(env: Env) -> None:
    queue = env.queue()
    queue.send_message(Message("lease"))
    got = queue.receive_message()
    before = time.time()
    changed = queue.change_message_visibility(got.receipt_handle, 120)
    assert changed.receipt_handle != got.receipt_handle
    assert int(changed.next_visible_time) == pytest.approx((before + 120) * 1000, abs=2000)

    old = got.receipt_handle
    assert server_error(lambda: queue.delete_message(old)).type == "MessageNotExist"
    assert server_error(lambda: queue.change_message_visibility(old, 10)).type == (
        "MessageNotExist"
    )
    again = queue.change_message_visibility(changed.receipt_handle, 60)
    queue.delete_message(again.receipt_handle)
    assert server_error(queue.peek_message).type == "MessageNotExist"


def test_change_visibility_outside_1_to_43200_is_invalid_argument(env: Env) -> None:
    queue = env.queue()
    queue.send_message(Message("x"))
    handle = queue.receive_message().receipt_handle
    assert server_error(lambda: queue.change_message_visibility(handle, 0)).type == (
        "InvalidArgument"
    )
    # The SDK refuses 43201 itself, so send it raw.
    uri = f"/queues/{queue.queue_name}/messages?ReceiptHandle={handle}&VisibilityTimeout=43201"
    response = env.raw("PUT", uri)
    assert response.status == 400
    assert "<Code>InvalidArgument</Code>" in response.data
    queue.delete_message(handle)  # the refused calls left the handle valid


def test_malformed_receipt_handle_is_receipt_handle_error(env: Env) -> None:
    queue = env.queue()
    queue.send_message(Message("x"))
    queue.receive_message()
    for bad in ("garbage", "1-short", "1-" + "!" * 24):
        assert server_error(lambda b=bad: queue.delete_message(b)).type == "ReceiptHandleError"
        assert server_error(lambda b=bad: queue.change_message_visibility(b, 10)).type == (
            "ReceiptHandleError"
        )
    response = env.raw("DELETE", f"/queues/{queue.queue_name}/messages?ReceiptHandle=garbage")
    assert response.status == 400


def test_receipt_handles_need_no_url_encoding(env: Env) -> None:
    queue = env.queue()
    queue.batch_send_message([Message(f"u{i}") for i in range(16)])
    for message in queue.batch_receive_message(16):
        handle = message.receipt_handle
        assert all(c.isalnum() or c in "-_" for c in handle), handle
        queue.delete_message(handle)


def test_expired_handle_without_redelivery_is_message_not_exist(fake_env: FakeTimeEnv) -> None:
    # Documented for DeleteMessage: the handle expires at NextVisibleTime.
    queue = fake_env.queue(visibility_timeout=30)
    queue.send_message(Message("x"))
    handle = queue.receive_message().receipt_handle
    fake_env.clock.advance(29)
    handle = queue.change_message_visibility(handle, 5).receipt_handle
    fake_env.clock.advance(5)
    assert server_error(lambda: queue.delete_message(handle)).type == "MessageNotExist"
    assert server_error(lambda: queue.change_message_visibility(handle, 5)).type == (
        "MessageNotExist"
    )
    again = queue.receive_message()
    assert again.dequeue_count == 2
    queue.delete_message(again.receipt_handle)


# ----------------------------------------------------------- time-based state


def test_retention_period_removes_messages_in_any_state(fake_env: FakeTimeEnv) -> None:
    queue = fake_env.queue(message_retention_period=60, visibility_timeout=600)
    queue.send_message(Message("received"))
    held = queue.receive_message().receipt_handle
    queue.send_message(Message("waiting"))
    fake_env.clock.advance(59)
    attrs = queue.get_attributes()
    assert (attrs.active_messages, attrs.inactive_messages) == (1, 1)
    fake_env.clock.advance(1.5)
    attrs = queue.get_attributes()
    assert (attrs.active_messages, attrs.inactive_messages) == (0, 0)
    assert server_error(queue.peek_message).type == "MessageNotExist"
    assert server_error(queue.receive_message).type == "MessageNotExist"
    assert server_error(lambda: queue.delete_message(held)).type == "MessageNotExist"


def test_delay_seconds_hide_new_messages(fake_env: FakeTimeEnv) -> None:
    queue = fake_env.queue(delay_seconds=30)
    queue.send_message(Message("queue delay"))
    queue.send_message(Message("own delay", delay_seconds=5))
    queue.send_message(Message("no delay", delay_seconds=0))
    attrs = queue.get_attributes()
    assert (attrs.active_messages, attrs.delay_messages) == (1, 2)
    assert queue.receive_message().message_body == b"no delay"
    fake_env.clock.advance(5)
    assert queue.receive_message().message_body == b"own delay"
    assert server_error(queue.receive_message).type == "MessageNotExist"
    fake_env.clock.advance(25)
    assert queue.receive_message().message_body == b"queue delay"


# --------------------------------------------------------------------- errors


def test_missing_queue_is_queue_not_exist(env: Env) -> None:
    queue = env.account().get_queue(f"missing-{uuid.uuid4().hex[:8]}")
    for call in (
        queue.get_attributes,
        lambda: queue.set_attributes(meta(visibility_timeout=5)),
        lambda: queue.send_message(Message("x")),
        queue.receive_message,
        queue.peek_message,
        lambda: queue.delete_message("1-" + "A" * 24),
        lambda: queue.change_message_visibility("1-" + "A" * 24, 10),
    ):
        assert server_error(call).type == "QueueNotExist"
    response = env.raw("GET", f"/queues/{queue.queue_name}/messages")
    assert response.status == 404
    assert "<Code>QueueNotExist</Code>" in response.data


def test_wrong_secret_is_signature_does_not_match(env: Env) -> None:
    queue = env.queue()
    impostor = env.account(secret="not-the-secret").get_queue(queue.queue_name)
    assert server_error(impostor.get_attributes).type == "SignatureDoesNotMatch"
    assert server_error(lambda: impostor.send_message(Message("x"))).type == (
        "SignatureDoesNotMatch"
    )
    response = env.raw("GET", f"/queues/{queue.queue_name}", secret="not-the-secret")
    assert response.status == 403
    assert "not-the-secret" not in response.data
    assert queue.get_attributes().active_messages == 0


def test_unknown_access_key_is_invalid_access_key_id(env: Env) -> None:
    stranger = env.account(key_id="nobody", secret="whatever").get_queue("any")
    assert server_error(stranger.get_attributes).type == "InvalidAccessKeyId"
    response = raw_request(env.endpoint, "nobody", "whatever", "GET", "/queues")
    assert response.status == 403


def test_tampered_body_is_invalid_digest(env: Env) -> None:
    queue = env.queue()
    client = MNSClient(env.endpoint, env.key_id, env.secret)
    request = RequestInternal("POST", f"/queues/{queue.queue_name}/messages")
    request.data = (
        b'<Message xmlns="http://mns.aliyuncs.com/doc/v1/"><MessageBody>a</MessageBody></Message>'
    )
    client.build_header(SimpleNamespace(request_id=None), request)
    request.data = request.data.replace(b">a<", b">b<")  # signed headers, different body
    response = client.http.send_request(request)
    client.close_connection()
    assert response.status == 400
    assert "<Code>InvalidDigest</Code>" in response.data


def test_body_over_maximum_message_size_is_invalid_argument(env: Env) -> None:
    queue = env.queue(maximum_message_size=1024)
    plain = env.account().get_queue(queue.queue_name)
    plain.set_encoding(False)  # the limit applies to the body text as sent
    plain.send_message(Message("a" * 1024))
    error = server_error(lambda: plain.send_message(Message("a" * 1025)))
    assert error.type == "InvalidArgument"
    assert "1024" in error.message
    error = server_error(lambda: plain.batch_send_message([Message("ok"), Message("b" * 1025)]))
    assert error.type == "InvalidArgument"
    assert queue.get_attributes().active_messages == 1  # neither refused request enqueued


def test_every_response_has_content_length_and_request_id(env: Env) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    body = b'<Message xmlns="http://mns.aliyuncs.com/doc/v1/"><MessageBody>aGk=</MessageBody></Message>'
    responses = [
        env.raw("PUT", f"/queues/{name}"),  # 201
        env.raw("POST", f"/queues/{name}/messages", body),  # 201
        env.raw("GET", f"/queues/{name}/messages"),  # 200
        env.raw("GET", f"/queues/{name}/messages"),  # 404
        env.raw("DELETE", f"/queues/{name}"),  # 204
        env.raw("GET", "/topics"),  # 400 InvalidRequestURL: topics are not emulated
    ]
    assert [r.status for r in responses] == [201, 201, 200, 404, 204, 400]
    for response in responses:
        assert header(response, "Content-Length") == str(len(response.data.encode()))
        assert header(response, "x-mns-request-id")
        assert header(response, "x-mns-version") == "2015-06-06"


# ------------------------------------------- oversize and stalled requests


def signed_head(env: Env, method: str, uri: str, data: bytes, content_length: int) -> bytes:
    """A request line and headers signed by the SDK's signer, announcing ``content_length``."""
    client = MNSClient(env.endpoint, env.key_id, env.secret)
    request = RequestInternal(method, uri)
    request.data = data
    client.build_header(SimpleNamespace(request_id=None), request)
    lines = [f"{method} {uri} HTTP/1.1", f"Content-Length: {content_length}"]
    lines += [f"{name}: {value}" for name, value in request.header.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def raw_exchange(env: Env, head: bytes, body: bytes = b"") -> tuple[int, str, bytes]:
    """Send ``head`` and ``body`` on a new connection; return the status, the body of the
    answer and what follows it before the server closes the connection.
    """
    host, port = env.endpoint.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(head + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        payload = response.read().decode()
        return response.status, payload, sock.recv(1)


def test_huge_content_length_is_refused_unread_and_the_server_stays_healthy(env: Env) -> None:
    queue = env.queue()
    uri = f"/queues/{queue.queue_name}/messages"
    xml = b'<Message xmlns="http://mns.aliyuncs.com/doc/v1/"><MessageBody>a</MessageBody></Message>'
    huge = 10**12
    started = time.monotonic()
    status, payload, after = raw_exchange(env, signed_head(env, "POST", uri, xml, huge), xml * 50)
    assert time.monotonic() - started < 2  # answered at once, not after reading 1 TB
    assert status == 400
    assert "<Code>InvalidArgument</Code>" in payload
    assert f"Content-Length should between 0 and {MAX_REQUEST_BODY} bytes" in payload
    assert after == b""  # and the connection is closed: the body was never read

    unsigned = f"POST {uri} HTTP/1.1\r\nContent-Length: {huge}\r\n\r\n".encode()
    status, payload, after = raw_exchange(env, unsigned, xml)
    assert status == 400
    assert "<Code>MissingAuthorizationHeader</Code>" in payload  # refused before its size
    assert after == b""

    queue.send_message(Message("still serving"))
    assert queue.receive_message().message_body == b"still serving"


def test_batches_over_64_kb_are_refused_with_invalid_argument_on_a_usable_connection(
    env: Env,
) -> None:
    queue = env.account().get_queue(env.queue().queue_name)
    queue.set_encoding(False)
    over_64_kb = [Message("m" * 5000) for _ in range(16)]  # 80,000 bytes of body text
    error = server_error(lambda: queue.batch_send_message(over_64_kb))
    assert (error.type, error.message) == (
        "InvalidArgument",
        "The value of Messages should between 1 and 65536 bytes.",
    )
    over_request_limit = [Message("m" * 9000) for _ in range(16)]  # a 144 KB request
    error = server_error(lambda: queue.batch_send_message(over_request_limit))
    assert error.type == "InvalidArgument"
    assert "Content-Length" in error.message
    queue.batch_send_message([Message("m" * 4096) for _ in range(16)])  # exactly 64 KiB
    assert queue.get_attributes().active_messages == 16


def test_stalled_clients_do_not_block_others_and_are_closed_after_the_idle_timeout() -> None:
    """300 connections stall (idle, half the headers, half the body); an SDK client is
    served at once meanwhile, and the server closes every stalled one after its idle timeout.
    """
    from leasekit.emulators._process import ServerProcess, free_port, python_module

    idle_timeout = 1.0
    port = free_port()
    argv = python_module(
        "leasekit.emulators.mns", "--port", str(port), "--idle-timeout", str(idle_timeout)
    )
    with ServerProcess(argv, port, name="mns-idle-timeout"):
        env = Env(f"http://127.0.0.1:{port}", DEFAULT_ACCESS_KEY_ID, DEFAULT_ACCESS_KEY_SECRET)
        queue = env.queue()
        xml = b'<Message xmlns="http://mns.aliyuncs.com/doc/v1/"><MessageBody>aGk=</MessageBody></Message>'
        head = signed_head(env, "POST", f"/queues/{queue.queue_name}/messages", xml, len(xml))
        stalls = [
            b"",  # connected, never sends
            head[: len(head) // 2],  # half the headers
            head + xml[:10],  # the headers and part of the body
        ]
        opened = time.monotonic()
        stalled = []
        for index in range(300):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(stalls[index % 3])
            stalled.append(sock)

        queue.send_message(Message("served"))  # a real SDK client, served meanwhile
        assert queue.receive_message().message_body == b"served"
        assert time.monotonic() - opened < idle_timeout  # all 300 were still open then

        for sock in stalled:
            sock.settimeout(idle_timeout + 5)
            assert sock.recv(1) == b""  # closed by the server, unanswered
            sock.close()
        closed = time.monotonic() - opened
        assert idle_timeout * 0.9 <= closed < idle_timeout + 5
        assert queue.get_attributes().active_messages == 0  # no stalled send got through
    with pytest.raises(ValueError, match="idle_timeout"):
        MnsEmulator(idle_timeout=0)


# ---------------------------------------------------------------- concurrency


def test_concurrent_receivers_never_share_an_invisible_message(env: Env) -> None:
    queue = env.queue(visibility_timeout=60)
    total = 64
    for start in range(0, total, 16):
        queue.batch_send_message([Message(f"c{i}") for i in range(start, start + 16)])
    received: list[str] = []
    lock = threading.Lock()
    failures: list[BaseException] = []

    def consume() -> None:
        own = env.account().get_queue(queue.queue_name)  # one connection per thread
        try:
            while True:
                try:
                    batch = own.batch_receive_message(3)
                except MNSServerException as exc:
                    if exc.type == "MessageNotExist":
                        return
                    raise
                with lock:
                    received.extend(m.message_id for m in batch)
        except BaseException as exc:
            failures.append(exc)

    workers = [threading.Thread(target=consume) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=15)
    assert not failures
    assert len(received) == total
    assert len(set(received)) == total
    assert queue.get_attributes().inactive_messages == total


def test_emulator_process_exits_zero_on_sigterm_during_a_long_poll() -> None:
    """SIGTERM stops the server promptly even while a receive is parked in a long poll."""
    from leasekit.emulators._process import ServerProcess, free_port, python_module

    port = free_port()
    argv = python_module("leasekit.emulators.mns", "--port", str(port), "--log-level", "WARNING")
    process = ServerProcess(argv, port, name="mns-sigterm").start()
    try:
        account = Account(
            f"http://127.0.0.1:{port}", DEFAULT_ACCESS_KEY_ID, DEFAULT_ACCESS_KEY_SECRET
        )
        queue = account.get_queue("sigterm")
        queue.create(QueueMeta())
        polling = threading.Event()

        def long_poll() -> None:
            polling.set()
            with contextlib.suppress(Exception):
                queue.receive_message(30)

        threading.Thread(target=long_poll, daemon=True).start()
        assert polling.wait(5)
        started = time.monotonic()
    finally:
        process.stop(grace=5)
    assert process._proc is not None and process._proc.returncode == 0
    assert time.monotonic() - started < 5
