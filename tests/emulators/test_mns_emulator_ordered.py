"""The MNS emulator's ordered (FIFO) queues, driven by Alibaba's own SDKs.

Queues are created the one documented way, the control-plane OpenAPI's
``CreateQueue`` with ``QueueType=fifo`` (``alibabacloud-mns-open20220119``);
messages go through the data-plane SDK (``aliyun-mns-sdk``) with
``MessageGroupId``. One test per documented behaviour (Alibaba's *Ordered
messages* page, quoted in docs/ordering.md), then the emulator's stated
assumptions where that page is silent. Expiry uses an in-process emulator with a
hand-moved clock instead of sleeping.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mns.account import Account
from mns.mns_exception import MNSServerException
from mns.queue import Message, Queue, QueueMeta

from leasekit.emulators.mns import DEFAULT_ACCESS_KEY_ID, DEFAULT_ACCESS_KEY_SECRET, MnsEmulator

openapi_client = pytest.importorskip("alibabacloud_mns_open20220119.client")
openapi_models = pytest.importorskip("alibabacloud_mns_open20220119.models")
tea_models = pytest.importorskip("alibabacloud_tea_openapi.models")
tea_exceptions = pytest.importorskip("alibabacloud_tea_openapi.exceptions")

pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated function:DeprecationWarning")


def control(endpoint: str, key_id: str, secret: str) -> Any:
    """The OpenAPI client (``alibabacloud-mns-open20220119``) pointed at ``endpoint``."""
    host = endpoint.split("://", 1)[1]
    config = tea_models.Config(
        access_key_id=key_id,
        access_key_secret=secret,
        endpoint=host,
        protocol="http",
        region_id="cn-hangzhou",
    )
    return openapi_client.Client(config)


class Env:
    """An emulator endpoint, the two SDK clients on it, and the queues a test made."""

    def __init__(self, endpoint: str, key_id: str, secret: str) -> None:
        self.endpoint = endpoint
        self.account = Account(endpoint, key_id, secret)
        self.control = control(endpoint, key_id, secret)
        self.created: list[str] = []

    def create(self, queue_type: str | None = "fifo", **attributes: int) -> Queue:
        name = f"o-{uuid.uuid4().hex[:12]}"
        request = openapi_models.CreateQueueRequest(
            queue_name=name, queue_type=queue_type, **attributes
        )
        self.control.create_queue(request)
        self.created.append(name)
        queue = self.account.get_queue(name)
        queue.set_encoding(False)  # bodies as plain text both ways
        return queue

    def queue_type(self, name: str) -> str:
        request = openapi_models.GetQueueAttributesRequest(queue_name=name)
        return str(self.control.get_queue_attributes(request).body.data.queue_type)


@pytest.fixture
def env(mns_server: Any) -> Iterator[Env]:
    environment = Env(mns_server.endpoint, mns_server.access_key_id, mns_server.access_key_secret)
    yield environment
    for name in environment.created:
        environment.account.get_queue(name).delete()


def send(queue: Queue, body: str, group: str | None) -> None:
    queue.send_message(Message(body, message_group_id=group or ""))


def receive(queue: Queue, count: int = 16) -> list[Message]:
    """BatchReceiveMessage without waiting; [] when MNS says MessageNotExist."""
    try:
        return list(queue.batch_receive_message(count, 0))
    except MNSServerException as exc:
        assert exc.type == "MessageNotExist"
        return []


def bodies(messages: list[Message]) -> list[tuple[str, str]]:
    return [(m.message_body, m.message_group_id) for m in messages]


def server_error(call: Callable[[], object]) -> MNSServerException:
    with pytest.raises(MNSServerException) as info:
        call()
    return info.value


# ------------------------------------------------------------- documented


def test_openapi_create_queue_makes_a_fifo_queue_and_get_attributes_says_so(env: Env) -> None:
    # "QueueType: normal: standard queue. fifo: FIFO queue." (CreateQueue, 2022-01-19)
    fifo = env.create("fifo")
    standard = env.create("normal")
    default = env.create(None)
    assert env.queue_type(fifo.queue_name) == "fifo"
    assert env.queue_type(standard.queue_name) == "normal"
    assert env.queue_type(default.queue_name) == "normal"


def test_the_xml_api_creates_standard_queues(env: Env) -> None:
    queue = env.account.get_queue(f"x-{uuid.uuid4().hex[:12]}")
    queue.create(QueueMeta())
    env.created.append(queue.queue_name)
    assert env.queue_type(queue.queue_name) == "normal"


def test_send_without_a_group_to_a_fifo_queue_is_fifo_missing_message_group_id(
    env: Env,
) -> None:
    # "若不携带MessageGroupId，将返回错误码FifoMissingMessageGroupId"
    queue = env.create()
    error = server_error(lambda: queue.send_message(Message("no group")))
    assert error.type == "FifoMissingMessageGroupId"
    batch = [Message("a", message_group_id="A"), Message("b")]
    assert server_error(lambda: queue.batch_send_message(batch)).type == (
        "FifoMissingMessageGroupId"
    )
    assert receive(queue) == [], "a refused batch enqueued nothing"


def test_receive_returns_the_message_group_id(env: Env) -> None:
    # "使用ReceiveMessage拉取，返回体包含MessageGroupId"
    queue = env.create()
    send(queue, "a1", "order-17")
    message = queue.receive_message(0)
    assert (message.message_body, message.message_group_id) == ("a1", "order-17")


def test_a_received_message_blocks_the_rest_of_its_group_until_deleted(env: Env) -> None:
    # The group lock: the next message of the group "can be pulled" only after the
    # current one is deleted or its visibility timeout expires.
    queue = env.create()
    for body in ("a1", "a2", "a3"):
        send(queue, body, "A")
    [first] = receive(queue)
    assert first.message_body == "a1"
    assert receive(queue) == []
    queue.delete_message(first.receipt_handle)
    [second] = receive(queue)
    assert second.message_body == "a2"
    queue.delete_message(second.receipt_handle)
    assert bodies(receive(queue)) == [("a3", "A")]


def test_a_batch_receive_returns_one_message_per_group_each_groups_first(env: Env) -> None:
    queue = env.create()
    queue.batch_send_message(
        [Message(f"{g}{i}", message_group_id=g) for i in (1, 2, 3) for g in ("A", "B")]
    )
    first = receive(queue)
    assert sorted(bodies(first)) == [("A1", "A"), ("B1", "B")]
    assert receive(queue) == []


def test_groups_are_consumed_in_parallel(env: Env) -> None:
    # "以MessageGroupId为并发单元，组内串行，组间并行"
    queue = env.create()
    send(queue, "a1", "A")
    send(queue, "a2", "A")
    [a1] = receive(queue)
    send(queue, "b1", "B")
    assert bodies(receive(queue)) == [("b1", "B")], "group B waited for group A"
    queue.delete_message(a1.receipt_handle)
    assert bodies(receive(queue)) == [("a2", "A")]


def test_messages_of_a_group_come_in_arrival_order(env: Env) -> None:
    # "在同一MessageGroupId内，消息的消费顺序必须严格按照到达服务端的时间进行"
    queue = env.create()
    sent = [f"m{i:02d}" for i in range(20)]
    for start in range(0, len(sent), 16):
        queue.batch_send_message([Message(b, message_group_id="G") for b in sent[start:][:16]])
    seen = []
    for _ in sent:
        [message] = receive(queue)
        seen.append(message.message_body)
        queue.delete_message(message.receipt_handle)
    assert seen == sent


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clocked() -> Iterator[tuple[Env, ManualClock, MnsEmulator]]:
    clock = ManualClock()
    with MnsEmulator(clock=clock) as emulator:
        yield (
            Env(emulator.endpoint, DEFAULT_ACCESS_KEY_ID, DEFAULT_ACCESS_KEY_SECRET),
            clock,
            emulator,
        )


def test_an_expired_head_comes_back_first_with_its_dequeue_count_raised(
    clocked: tuple[Env, ManualClock, MnsEmulator],
) -> None:
    # "仅在当前消息被确认删除或可见性超时到期后，同一分组的下一条消息方可被拉取";
    # the head, visible again, is still the group's earliest message.
    env, clock, _ = clocked
    queue = env.create(visibility_timeout=1)
    send(queue, "a1", "A")
    send(queue, "a2", "A")
    [first] = receive(queue)
    clock.now += 1.5
    [again] = receive(queue)
    assert (again.message_body, again.dequeue_count) == ("a1", 2)
    assert receive(queue) == []
    queue.delete_message(again.receipt_handle)
    assert bodies(receive(queue)) == [("a2", "A")]
    assert first.receipt_handle != again.receipt_handle


def test_changing_the_heads_visibility_keeps_the_group_locked(
    clocked: tuple[Env, ManualClock, MnsEmulator],
) -> None:
    env, clock, _ = clocked
    queue = env.create(visibility_timeout=1)
    send(queue, "a1", "A")
    send(queue, "a2", "A")
    [head] = receive(queue)
    changed = queue.change_message_visibility(head.receipt_handle, 30)
    clock.now += 5
    assert receive(queue) == []
    queue.delete_message(changed.receipt_handle)
    assert bodies(receive(queue)) == [("a2", "A")]


def test_a_long_poll_returns_the_next_message_when_the_head_is_deleted(
    clocked: tuple[Env, ManualClock, MnsEmulator],
) -> None:
    env, _, emulator = clocked
    queue = env.create()
    send(queue, "a1", "A")
    send(queue, "a2", "A")
    [head] = receive(queue)
    waiter_queue = Account(env.endpoint, DEFAULT_ACCESS_KEY_ID, DEFAULT_ACCESS_KEY_SECRET)
    waiting_on = waiter_queue.get_queue(queue.queue_name)
    waiting_on.set_encoding(False)
    got: list[Message] = []
    waiter = threading.Thread(target=lambda: got.extend(waiting_on.batch_receive_message(16, 10)))
    started = time.monotonic()
    waiter.start()
    deadline = time.monotonic() + 5
    while emulator.store.waiting(queue.queue_name) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # poll with a deadline until the long poll is parked
    assert emulator.store.waiting(queue.queue_name) == 1
    queue.delete_message(head.receipt_handle)
    waiter.join(15)
    assert bodies(got) == [("a2", "A")]
    assert time.monotonic() - started < 5, "the waiter slept out its long poll"


# ------------------------------------------- the emulator's stated assumptions


def test_create_queue_of_another_type_is_queue_already_exist(env: Env) -> None:
    queue = env.create("fifo")
    request = openapi_models.CreateQueueRequest(queue_name=queue.queue_name, queue_type="normal")
    with pytest.raises(tea_exceptions.ClientException) as info:
        env.control.create_queue(request)
    assert (info.value.code, info.value.status_code) == ("QueueAlreadyExist", 409)
    same = openapi_models.CreateQueueRequest(queue_name=queue.queue_name, queue_type="fifo")
    env.control.create_queue(same)  # identical: no error


def test_a_group_id_on_a_standard_queue_is_ignored(env: Env) -> None:
    queue = env.create("normal")
    send(queue, "a1", "A")
    send(queue, "a2", "A")
    got = receive(queue)
    assert sorted(bodies(got)) == [("a1", ""), ("a2", "")]


def test_priorities_do_not_reorder_a_group(env: Env) -> None:
    queue = env.create()
    queue.send_message(Message("low", priority=16, message_group_id="A"))
    queue.send_message(Message("high", priority=1, message_group_id="A"))
    [head] = receive(queue)
    assert head.message_body == "low"


def test_peek_shows_only_the_heads(env: Env) -> None:
    queue = env.create()
    for body, group in (("a1", "A"), ("a2", "A"), ("b1", "B")):
        send(queue, body, group)
    peeked = queue.batch_peek_message(16)
    assert sorted(m.message_body for m in peeked) == ["a1", "b1"]


def test_openapi_requests_must_be_signed_with_the_right_secret(mns_server: Any) -> None:
    wrong = control(mns_server.endpoint, mns_server.access_key_id, "not-the-secret")
    request = openapi_models.GetQueueAttributesRequest(queue_name="anything")
    with pytest.raises(tea_exceptions.ClientException) as info:
        wrong.get_queue_attributes(request)
    assert (info.value.code, info.value.status_code) == ("SignatureDoesNotMatch", 403)
    unknown = control(mns_server.endpoint, "nobody", mns_server.access_key_secret)
    with pytest.raises(tea_exceptions.ClientException) as info:
        unknown.get_queue_attributes(request)
    assert info.value.code == "InvalidAccessKeyId"


def test_openapi_get_attributes_of_a_missing_queue_is_queue_not_exist(env: Env) -> None:
    request = openapi_models.GetQueueAttributesRequest(queue_name="no-such-queue")
    with pytest.raises(tea_exceptions.ClientException) as info:
        env.control.get_queue_attributes(request)
    assert (info.value.code, info.value.status_code) == ("QueueNotExist", 404)


def test_openapi_delete_queue_removes_it(env: Env) -> None:
    queue = env.create()
    env.control.delete_queue(openapi_models.DeleteQueueRequest(queue_name=queue.queue_name))
    assert server_error(lambda: queue.send_message(Message("x"))).type == "QueueNotExist"
