"""leasekit's Pub/Sub emulator driven by the official ``google-cloud-pubsub`` client.

The calls are those of the python-pubsub repository's ``samples/snippets``
(publisher.py, subscriber.py, quickstart/, iam.py), written again here as our own
tests. Most tests use the session's emulator subprocess (``pubsub_server``);
the ones that need time to pass use an in-process emulator on a manual clock.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pubsub_v1 = pytest.importorskip("google.cloud.pubsub_v1")

from google.api_core import exceptions  # noqa: E402
from google.cloud.pubsub_v1.subscriber import exceptions as sub_exceptions  # noqa: E402
from google.pubsub_v1 import types as gapic  # noqa: E402
from google.rpc import error_details_pb2  # noqa: E402
from grpc_status import rpc_status  # noqa: E402

from leasekit.emulators.pubsub import ManualClock, PubSubEmulator  # noqa: E402

PROJECT = "leasekit-test"
#: ``PublisherClient.api`` (the raw API, without the client's batching) warns.
pytestmark = pytest.mark.filterwarnings('ignore:The "api" property:DeprecationWarning')
WAIT = 10.0


def _id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


class Clients:
    """A publisher and a subscriber on one emulator, and a fresh topic."""

    def __init__(self) -> None:
        self.publisher = pubsub_v1.PublisherClient()
        self.subscriber = pubsub_v1.SubscriberClient()
        self.topic = self.publisher.topic_path(PROJECT, _id("topic"))
        self.publisher.create_topic(name=self.topic)

    def subscription(self, **fields: Any) -> str:
        path = self.subscriber.subscription_path(PROJECT, _id("sub"))
        self.subscriber.create_subscription(request={"name": path, "topic": self.topic, **fields})
        return path

    def publish(self, data: bytes, **attrs: str) -> str:
        message_id: str = self.publisher.publish(self.topic, data, **attrs).result(timeout=WAIT)
        return message_id

    def pull(self, sub: str, n: int = 10, timeout: float = 2.0) -> list[Any]:
        response = self.subscriber.pull(
            request={"subscription": sub, "max_messages": n}, timeout=timeout
        )
        return list(response.received_messages)

    def close(self) -> None:
        self.subscriber.close()


@pytest.fixture
def clients(pubsub_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Clients]:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_server.address)
    made = Clients()
    yield made
    made.close()


@pytest.fixture(scope="module")
def manual() -> Iterator[tuple[PubSubEmulator, ManualClock]]:
    clock = ManualClock()
    with PubSubEmulator(clock=clock, heartbeat=0.2) as emulator:
        yield emulator, clock


@pytest.fixture
def timed(
    manual: tuple[PubSubEmulator, ManualClock], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Clients, ManualClock]]:
    emulator, clock = manual
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator.address)
    made = Clients()
    yield made, clock
    made.close()


def _error_info(exc: exceptions.GoogleAPICallError) -> Any:
    status = rpc_status.from_call(exc.response)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return info


# ------------------------------------------------------------- quickstart


def test_quickstart_publishes_and_the_streaming_subscriber_receives_and_acks(
    clients: Clients,
) -> None:
    sub = clients.subscription()
    sent = {
        clients.publish(f"Message number {n}".encode(), origin="python-sample") for n in range(3)
    }
    received: list[Any] = []
    done = threading.Event()

    def callback(message: Any) -> None:
        received.append(message)
        message.ack()
        if len(received) == 3:
            done.set()

    future = clients.subscriber.subscribe(sub, callback=callback)
    try:
        assert done.wait(WAIT), "the streaming subscriber did not get the three messages"
    finally:
        future.cancel()
        future.result(timeout=WAIT)
    assert {m.message_id for m in received} == sent
    assert all(m.attributes["origin"] == "python-sample" for m in received)
    assert clients.pull(sub, timeout=1.0) == [], "acked messages came back"


# -------------------------------------------------------------- publisher


def test_topics_are_created_listed_got_and_deleted(clients: Clients) -> None:
    names = [
        t.name for t in clients.publisher.list_topics(request={"project": f"projects/{PROJECT}"})
    ]
    assert clients.topic in names
    assert clients.publisher.get_topic(request={"topic": clients.topic}).name == clients.topic
    with pytest.raises(exceptions.AlreadyExists):
        clients.publisher.create_topic(name=clients.topic)
    sub = clients.subscription()
    clients.publisher.delete_topic(request={"topic": clients.topic})
    with pytest.raises(exceptions.NotFound):
        clients.publisher.get_topic(request={"topic": clients.topic})
    # A subscription outlives its topic, as documented.
    assert clients.subscriber.get_subscription(subscription=sub).topic == "_deleted-topic_"


def test_publish_to_a_missing_topic_is_not_found(clients: Clients) -> None:
    missing = clients.publisher.topic_path(PROJECT, _id("missing"))
    with pytest.raises(exceptions.NotFound, match=missing):
        clients.publisher.publish(missing, b"x").result(timeout=WAIT)


def test_list_topic_subscriptions_and_project_subscriptions(clients: Clients) -> None:
    a, b = clients.subscription(), clients.subscription()
    listed = list(clients.publisher.list_topic_subscriptions(request={"topic": clients.topic}))
    assert sorted(listed) == sorted([a, b])
    in_project = {
        s.name
        for s in clients.subscriber.list_subscriptions(request={"project": f"projects/{PROJECT}"})
    }
    assert {a, b} <= in_project


@pytest.mark.parametrize(
    "messages, match",
    [
        ([{"data": b""}], "empty"),
        ([{"data": b"x"}] * 1001, "1001"),
        ([{"data": b"x", "attributes": {"k" * 257: "v"}}], "key"),
        ([{"data": b"x", "attributes": {"goog-x": "v"}}], "goog"),
        ([{"data": b"x", "attributes": {"k": "v" * 1025}}], "value"),
        ([{"data": b"x", "attributes": {f"k{i}": "v" for i in range(101)}}], "attributes"),
        ([{"data": b"x", "ordering_key": "o" * 1025}], "Ordering key"),
        ([{"data": b"x" * 5_000_000}, {"data": b"y" * 5_000_000}], "10000000"),
    ],
)
def test_publish_limits_are_refused_with_invalid_argument(
    clients: Clients, messages: list[dict[str, Any]], match: str
) -> None:
    # The raw API call (the client's batching would split or refuse some first).
    with pytest.raises(exceptions.InvalidArgument, match=match):
        clients.publisher.api.publish(topic=clients.topic, messages=messages, timeout=WAIT)


def test_ordering_keys_deliver_in_publish_order(clients: Clients) -> None:
    publisher = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    sub = clients.subscription(enable_message_ordering=True)
    for n in range(4):
        publisher.publish(clients.topic, f"{n}".encode(), ordering_key="k").result(timeout=WAIT)
    publisher.publish(clients.topic, b"other", ordering_key="other").result(timeout=WAIT)
    first = clients.pull(sub)
    keyed = [m.message.data for m in first if m.message.ordering_key == "k"]
    assert keyed == [b"0", b"1", b"2", b"3"]
    # Nacking the key's head gives back the whole outstanding run, in order.
    clients.subscriber.modify_ack_deadline(
        request={
            "subscription": sub,
            "ack_ids": [m.ack_id for m in first if m.message.data == b"0"],
            "ack_deadline_seconds": 0,
        }
    )
    again = [m.message.data for m in clients.pull(sub) if m.message.ordering_key == "k"]
    assert again == [b"0", b"1", b"2", b"3"]


# ------------------------------------------------------------- subscriber


def test_subscription_settings_are_validated_and_defaulted(clients: Clients) -> None:
    sub = clients.subscription()
    got = clients.subscriber.get_subscription(subscription=sub)
    assert got.ack_deadline_seconds == 10
    assert got.message_retention_duration.total_seconds() == 7 * 24 * 3600
    for bad in (
        {"ack_deadline_seconds": 9},
        {"ack_deadline_seconds": 601},
        {"dead_letter_policy": {"dead_letter_topic": clients.topic, "max_delivery_attempts": 4}},
        {"dead_letter_policy": {"dead_letter_topic": clients.topic, "max_delivery_attempts": 101}},
        {"retry_policy": {"minimum_backoff": {"seconds": 700}}},
        {"filter": 'data = "x"'},
    ):
        with pytest.raises(exceptions.InvalidArgument):
            clients.subscription(**bad)
    with pytest.raises(exceptions.NotFound):
        clients.subscriber.create_subscription(
            request={
                "name": clients.subscriber.subscription_path(PROJECT, _id("s")),
                "topic": clients.publisher.topic_path(PROJECT, _id("none")),
            }
        )


def test_update_subscription_dead_letter_policy_then_remove_it(clients: Clients) -> None:
    dead = clients.publisher.topic_path(PROJECT, _id("dead"))
    clients.publisher.create_topic(name=dead)
    sub = clients.subscription()
    updated = clients.subscriber.update_subscription(
        request={
            "subscription": {
                "name": sub,
                "dead_letter_policy": {"dead_letter_topic": dead, "max_delivery_attempts": 20},
                "ack_deadline_seconds": 30,
            },
            "update_mask": {"paths": ["dead_letter_policy", "ack_deadline_seconds"]},
        }
    )
    assert updated.dead_letter_policy.max_delivery_attempts == 20
    assert updated.ack_deadline_seconds == 30
    removed = clients.subscriber.update_subscription(
        request={"subscription": {"name": sub}, "update_mask": {"paths": ["dead_letter_policy"]}}
    )
    assert not removed.dead_letter_policy.dead_letter_topic
    with pytest.raises(exceptions.InvalidArgument):
        clients.subscriber.update_subscription(
            request={
                "subscription": {"name": sub, "filter": "x"},
                "update_mask": {"paths": ["filter"]},
            }
        )


def test_filter_delivers_only_matching_messages(clients: Clients) -> None:
    sub = clients.subscription(filter='attributes.author = "unknown" AND NOT attributes:skip')
    clients.publish(b"yes", author="unknown")
    clients.publish(b"no", author="known")
    clients.publish(b"skipped", author="unknown", skip="1")
    assert [m.message.data for m in clients.pull(sub)] == [b"yes"]


def test_synchronous_pull_with_lease_management_and_delete(clients: Clients) -> None:
    sub = clients.subscription()
    clients.publish(b"work")
    (received,) = clients.pull(sub)
    clients.subscriber.modify_ack_deadline(
        request={"subscription": sub, "ack_ids": [received.ack_id], "ack_deadline_seconds": 60}
    )
    assert clients.pull(sub, timeout=1.0) == [], "a held message was handed out again"
    clients.subscriber.acknowledge(request={"subscription": sub, "ack_ids": [received.ack_id]})
    with pytest.raises(exceptions.InvalidArgument):
        clients.subscriber.modify_ack_deadline(
            request={"subscription": sub, "ack_ids": [received.ack_id], "ack_deadline_seconds": 601}
        )
    with pytest.raises(exceptions.InvalidArgument):
        clients.subscriber.pull(request={"subscription": sub, "max_messages": 0})
    clients.subscriber.delete_subscription(request={"subscription": sub})
    with pytest.raises(exceptions.NotFound, match=sub):
        clients.subscriber.get_subscription(subscription=sub)


def test_pull_waits_for_a_message_published_meanwhile(clients: Clients) -> None:
    sub = clients.subscription()
    timer = threading.Timer(0.3, clients.publish, args=(b"late",))
    timer.start()
    try:
        assert [m.message.data for m in clients.pull(sub, timeout=WAIT)] == [b"late"]
    finally:
        timer.join()


def test_pull_with_nothing_returns_empty_before_the_call_deadline(clients: Clients) -> None:
    sub = clients.subscription()
    started = time.monotonic()
    assert clients.pull(sub, timeout=1.0) == []
    assert time.monotonic() - started < WAIT


def test_detach_subscription_drops_messages_and_refuses_pulls(clients: Clients) -> None:
    sub = clients.subscription()
    clients.publish(b"dropped")
    clients.publisher.detach_subscription(request={"subscription": sub})
    assert clients.subscriber.get_subscription(subscription=sub).detached
    with pytest.raises(exceptions.FailedPrecondition):
        clients.pull(sub)


# ---------------------------------------------------------- exactly-once


def test_exactly_once_refuses_a_stale_ack_id_naming_it_in_error_info(
    timed: tuple[Clients, ManualClock],
) -> None:
    clients, clock = timed
    sub = clients.subscription(enable_exactly_once_delivery=True)
    clients.publish(b"once")
    (old,) = clients.pull(sub)
    clock.advance(11)
    (new,) = clients.pull(sub)
    assert new.message.message_id == old.message.message_id and new.ack_id != old.ack_id
    with pytest.raises(exceptions.InvalidArgument) as caught:
        clients.subscriber.acknowledge(
            request={"subscription": sub, "ack_ids": [old.ack_id, new.ack_id]}
        )
    info = _error_info(caught.value)
    assert info.reason == "EXACTLY_ONCE_ACKID_FAILURE"
    assert dict(info.metadata) == {old.ack_id: "PERMANENT_FAILURE_INVALID_ACK_ID"}
    # The valid ack id of the same request took effect.
    clock.advance(700)
    assert clients.pull(sub, timeout=0.5) == []


def test_exactly_once_refuses_stale_modacks_and_keeps_the_holders_lease(
    timed: tuple[Clients, ManualClock],
) -> None:
    clients, clock = timed
    sub = clients.subscription(enable_exactly_once_delivery=True)
    clients.publish(b"held")
    (old,) = clients.pull(sub)
    clock.advance(11)
    (new,) = clients.pull(sub)
    with pytest.raises(exceptions.InvalidArgument):
        clients.subscriber.modify_ack_deadline(
            request={"subscription": sub, "ack_ids": [old.ack_id], "ack_deadline_seconds": 0}
        )
    assert clients.pull(sub, timeout=0.5) == [], "a stale nack released the holder's message"
    clients.subscriber.acknowledge(request={"subscription": sub, "ack_ids": [new.ack_id]})


def test_without_exactly_once_a_stale_ack_is_accepted(timed: tuple[Clients, ManualClock]) -> None:
    clients, clock = timed
    sub = clients.subscription()
    clients.publish(b"lax")
    (old,) = clients.pull(sub)
    clock.advance(11)
    clients.pull(sub)
    clients.subscriber.acknowledge(request={"subscription": sub, "ack_ids": [old.ack_id]})


def test_streaming_subscriber_surfaces_a_stale_ack_as_acknowledge_error(
    timed: tuple[Clients, ManualClock],
) -> None:
    clients, clock = timed
    sub = clients.subscription(enable_exactly_once_delivery=True)
    clients.publish(b"streamed")
    received: list[Any] = []
    twice = threading.Event()

    def callback(message: Any) -> None:
        received.append(message)
        if len(received) == 2:
            twice.set()

    future = clients.subscriber.subscribe(sub, callback=callback)
    try:
        deadline = time.monotonic() + WAIT
        while not received and time.monotonic() < deadline:
            time.sleep(0.01)  # the manual clock must not move before the first delivery
        assert received, "the streaming subscriber got nothing"
        assert received[0].exactly_once_enabled
        # The lease ends unrenewed (the clock jumps past any deadline the client
        # set); the message comes again with a new ack id.
        clock.advance(700)
        assert twice.wait(WAIT), "the expired message was not delivered again"
        first, second = received
        assert first.message_id == second.message_id and first.ack_id != second.ack_id
        with pytest.raises(sub_exceptions.AcknowledgeError) as caught:
            first.ack_with_response().result(timeout=WAIT)
        assert caught.value.error_code is sub_exceptions.AcknowledgeStatus.INVALID_ACK_ID
        assert second.ack_with_response().result(timeout=WAIT) is (
            sub_exceptions.AcknowledgeStatus.SUCCESS
        )
    finally:
        future.cancel()
        future.result(timeout=WAIT)


# ------------------------------------------------- delivery attempts, DLQ


def test_dead_letter_policy_counts_attempts_and_forwards_after_the_maximum(
    timed: tuple[Clients, ManualClock],
) -> None:
    clients, _ = timed
    dead = clients.publisher.topic_path(PROJECT, _id("dead"))
    clients.publisher.create_topic(name=dead)
    dead_sub = clients.subscriber.subscription_path(PROJECT, _id("dead-sub"))
    clients.subscriber.create_subscription(request={"name": dead_sub, "topic": dead})
    sub = clients.subscription(
        dead_letter_policy={"dead_letter_topic": dead, "max_delivery_attempts": 5}
    )
    clients.publish(b"poison")
    for attempt in range(1, 6):
        (received,) = clients.pull(sub)
        assert received.delivery_attempt == attempt
        clients.subscriber.modify_ack_deadline(
            request={"subscription": sub, "ack_ids": [received.ack_id], "ack_deadline_seconds": 0}
        )
    assert clients.pull(sub, timeout=0.5) == []
    (forwarded,) = clients.pull(dead_sub)
    assert forwarded.message.data == b"poison"
    assert forwarded.message.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    assert (
        forwarded.message.attributes["CloudPubSubDeadLetterSourceSubscription"]
        == sub.split("/")[-1]
    )


def test_retry_policy_backs_off_a_nacked_message(timed: tuple[Clients, ManualClock]) -> None:
    clients, clock = timed
    sub = clients.subscription(
        retry_policy={"minimum_backoff": {"seconds": 30}, "maximum_backoff": {"seconds": 60}}
    )
    clients.publish(b"later")
    (received,) = clients.pull(sub)
    clients.subscriber.modify_ack_deadline(
        request={"subscription": sub, "ack_ids": [received.ack_id], "ack_deadline_seconds": 0}
    )
    assert clients.pull(sub, timeout=0.3) == []
    clock.advance(31)
    assert [m.message.data for m in clients.pull(sub)] == [b"later"]


# ---------------------------------------------------------- StreamingPull


def _stream(clients: Clients, first: dict[str, Any], *later: dict[str, Any]) -> Iterator[Any]:
    requests = [gapic.StreamingPullRequest(first), *(gapic.StreamingPullRequest(r) for r in later)]
    return iter(clients.subscriber.api.streaming_pull(requests=iter(requests), timeout=WAIT))


def test_streaming_pull_validates_the_first_request(clients: Clients) -> None:
    sub = clients.subscription()
    with pytest.raises(exceptions.InvalidArgument):
        next(_stream(clients, {"subscription": sub, "stream_ack_deadline_seconds": 5}))
    with pytest.raises(exceptions.InvalidArgument):
        next(_stream(clients, {"stream_ack_deadline_seconds": 10}))
    missing = clients.subscriber.subscription_path(PROJECT, _id("none"))
    with pytest.raises(exceptions.NotFound):
        next(_stream(clients, {"subscription": missing, "stream_ack_deadline_seconds": 10}))


def test_streaming_pull_flow_control_and_response_size(clients: Clients) -> None:
    sub = clients.subscription()
    big = b"b" * (3 * 1024 * 1024)
    for _ in range(3):
        clients.publisher.api.publish(topic=clients.topic, messages=[{"data": big}], timeout=WAIT)
    clients.publish(b"small")
    stream = _stream(
        clients,
        {"subscription": sub, "stream_ack_deadline_seconds": 60, "max_outstanding_messages": 2},
    )
    sizes = []
    counts = 0
    while counts < 2:
        response = next(stream)
        size = type(response).pb(response).ByteSize()
        assert size < 4 * 1024 * 1024
        sizes.append(size)
        counts += len(response.received_messages)
    assert counts == 2, "more than max_outstanding_messages were sent"
    assert len(sizes) == 2, "two 3 MiB messages shared a response"


def test_streaming_pull_confirms_exactly_once_acks_on_the_stream(clients: Clients) -> None:
    sub = clients.subscription(enable_exactly_once_delivery=True)
    clients.publish(b"confirm")
    (pulled,) = clients.pull(sub)
    stream = _stream(
        clients,
        {
            "subscription": sub,
            "stream_ack_deadline_seconds": 60,
            "ack_ids": [pulled.ack_id, "LKPS-0-0-000000000000"],
        },
    )
    response = next(stream)
    assert response.subscription_properties.exactly_once_delivery_enabled
    assert list(response.acknowledge_confirmation.ack_ids) == [pulled.ack_id]
    assert list(response.acknowledge_confirmation.invalid_ack_ids) == ["LKPS-0-0-000000000000"]


def test_streaming_pull_sends_heartbeats_while_idle(timed: tuple[Clients, ManualClock]) -> None:
    clients, _ = timed
    sub = clients.subscription()
    stream = _stream(clients, {"subscription": sub, "stream_ack_deadline_seconds": 10})
    response = next(stream)  # the emulator's heartbeat is 0.2 s here
    assert list(response.received_messages) == []


# -------------------------------------------------------------------- IAM


def test_iam_get_set_and_test_permissions_as_the_samples_do(clients: Clients) -> None:
    sub = clients.subscription()
    for client, resource in ((clients.publisher, clients.topic), (clients.subscriber, sub)):
        policy = client.get_iam_policy(request={"resource": resource})
        policy.bindings.add(role="roles/pubsub.viewer", members=["allUsers"])
        stored = client.set_iam_policy(request={"resource": resource, "policy": policy})
        assert [b.role for b in stored.bindings] == ["roles/pubsub.viewer"]
        again = client.get_iam_policy(request={"resource": resource})
        assert list(again.bindings[0].members) == ["allUsers"]
        wanted = ["pubsub.topics.publish", "pubsub.topics.update"]
        allowed = client.test_iam_permissions(request={"resource": resource, "permissions": wanted})
        assert list(allowed.permissions) == wanted


class _Requests:
    """A StreamingPull request stream the test feeds while the call runs."""

    def __init__(self, first: dict[str, Any]) -> None:
        import queue

        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.queue.put(gapic.StreamingPullRequest(first))

    def send(self, request: dict[str, Any]) -> None:
        self.queue.put(gapic.StreamingPullRequest(request))

    def close(self) -> None:
        self.queue.put(None)

    def __iter__(self) -> Iterator[Any]:
        while (item := self.queue.get()) is not None:
            yield item


def _next_with_messages(stream: Iterator[Any]) -> Any:
    for response in stream:
        if response.received_messages:
            return response
    raise AssertionError("the stream ended without messages")


def test_a_stream_ack_deadline_change_applies_to_later_deliveries(
    timed: tuple[Clients, ManualClock],
) -> None:
    clients, clock = timed
    sub = clients.subscription(enable_exactly_once_delivery=True)
    requests = _Requests({"subscription": sub, "stream_ack_deadline_seconds": 600})
    stream = iter(clients.subscriber.api.streaming_pull(requests=iter(requests), timeout=WAIT))
    try:
        clients.publish(b"first")
        first = _next_with_messages(stream).received_messages[0]
        # The change and an ack in one request: the ack's confirmation says both were read.
        requests.send({"stream_ack_deadline_seconds": 10, "ack_ids": [first.ack_id]})
        while not next(stream).acknowledge_confirmation.ack_ids:
            pass
        clients.publish(b"second")
        second = _next_with_messages(stream).received_messages[0]
        assert second.message.data == b"second"
        clock.advance(11)  # past the new 10 s stream deadline, far from the old 600 s
        again = _next_with_messages(stream).received_messages
        assert [m.message.data for m in again] == [b"second"]
        assert again[0].ack_id != second.ack_id
    finally:
        requests.close()


def test_stream_flow_control_by_bytes_holds_back_until_an_ack(clients: Clients) -> None:
    sub = clients.subscription()
    clients.publish(b"a" * 200)
    clients.publish(b"b" * 200)
    requests = _Requests(
        {"subscription": sub, "stream_ack_deadline_seconds": 60, "max_outstanding_bytes": 100}
    )
    stream = iter(clients.subscriber.api.streaming_pull(requests=iter(requests), timeout=WAIT))
    try:
        first = _next_with_messages(stream).received_messages
        assert len(first) == 1, "more than max_outstanding_bytes was sent"
        requests.send({"ack_ids": [first[0].ack_id]})
        second = _next_with_messages(stream).received_messages
        assert len(second) == 1 and second[0].message.data != first[0].message.data
    finally:
        requests.close()


def test_a_cancelled_stream_leaves_its_messages_leased_until_their_deadline(
    timed: tuple[Clients, ManualClock],
) -> None:
    clients, clock = timed
    sub = clients.subscription()
    clients.publish(b"held")
    requests = _Requests({"subscription": sub, "stream_ack_deadline_seconds": 30})
    call = clients.subscriber.api.streaming_pull(requests=iter(requests), timeout=WAIT)
    stream = iter(call)
    _next_with_messages(stream)
    requests.close()
    call.cancel() if hasattr(call, "cancel") else None
    assert clients.pull(sub, timeout=0.3) == [], "a cancelled stream's message came back early"
    clock.advance(31)
    assert [m.message.data for m in clients.pull(sub)] == [b"held"]


# ---------------------------------------------- more of the samples' calls


def test_push_subscriptions_are_stored_and_updated_not_pushed(clients: Clients) -> None:
    sub = clients.subscription(push_config={"push_endpoint": "https://example.com/push"})
    got = clients.subscriber.get_subscription(subscription=sub)
    assert got.push_config.push_endpoint == "https://example.com/push"
    updated = clients.subscriber.update_subscription(
        request={
            "subscription": {"name": sub, "push_config": {"push_endpoint": "https://e.org/p"}},
            "update_mask": {"paths": ["push_config"]},
        }
    )
    assert updated.push_config.push_endpoint == "https://e.org/p"


def test_listen_for_errors_sees_a_missing_subscription_through_the_future(
    clients: Clients,
) -> None:
    missing = clients.subscriber.subscription_path(PROJECT, _id("missing"))
    future = clients.subscriber.subscribe(missing, callback=lambda message: None)
    with pytest.raises(exceptions.NotFound):
        future.result(timeout=WAIT)


def test_publish_with_batch_settings_flow_control_and_error_handler(clients: Clients) -> None:
    publisher = pubsub_v1.PublisherClient(
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=10, max_latency=0.05),
        publisher_options=pubsub_v1.types.PublisherOptions(
            flow_control=pubsub_v1.types.PublishFlowControl(
                message_limit=20,
                limit_exceeded_behavior=pubsub_v1.types.LimitExceededBehavior.BLOCK,
            )
        ),
    )
    sub = clients.subscription()
    futures_ = [publisher.publish(clients.topic, b"%d" % n) for n in range(100)]
    ids = [f.result(timeout=WAIT) for f in futures_]
    assert len(set(ids)) == 100
    received: list[Any] = []
    while len(received) < 100:
        batch = clients.pull(sub, n=100)
        assert batch, "published messages did not arrive"
        clients.subscriber.acknowledge(
            request={"subscription": sub, "ack_ids": [m.ack_id for m in batch]}
        )
        received += batch
    assert {m.message.message_id for m in received} == set(ids)


def test_resume_publish_after_an_ordering_key_failure(clients: Clients) -> None:
    publisher = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    missing = clients.publisher.topic_path(PROJECT, _id("missing"))
    with pytest.raises(exceptions.NotFound):
        publisher.publish(missing, b"x", ordering_key="k").result(timeout=WAIT)
    publisher.resume_publish(missing, "k")  # as the sample does after a failure
    publisher.publish(clients.topic, b"z", ordering_key="k").result(timeout=WAIT)


@pytest.mark.parametrize(
    "text, attributes, matches",
    [
        ('attributes.a = "x"', {"a": "x"}, True),
        ('attributes.a != "x"', {}, True),
        ("attributes:a", {"a": ""}, True),
        ("NOT attributes:a", {"a": ""}, False),
        ('-attributes.a = "x"', {"a": "x"}, False),
        ('hasPrefix(attributes.a, "ab")', {"a": "abc"}, True),
        ('hasPrefix(attributes.a, "ab")', {}, False),
        ('attributes.a = "x" OR attributes.b = "y"', {"b": "y"}, True),
        ('attributes.a = "x" AND (attributes.b = "y" OR attributes:c)', {"a": "x", "c": "1"}, True),
        ('attributes.a = "x" AND (attributes.b = "y" OR attributes:c)', {"a": "x"}, False),
        ("attributes.a = 'q\\'s'", {"a": "q's"}, True),
    ],
)
def test_filters_match_as_documented(text: str, attributes: dict[str, str], matches: bool) -> None:
    from leasekit.emulators.pubsub.filters import compile_filter

    predicate = compile_filter(text)
    assert predicate is not None and predicate(attributes) is matches


@pytest.mark.parametrize(
    "text",
    [
        'attributes.a = "x" AND attributes.b = "y" OR attributes.c = "z"',
        'data = "x"',
        "attributes.a =",
        'attributes.a = "' + "x" * 260 + '"',
        "hasPrefix(attributes.a)",
    ],
)
def test_filters_the_documents_do_not_allow_are_refused(text: str) -> None:
    from leasekit.emulators.pubsub.filters import FilterError, compile_filter

    with pytest.raises(FilterError):
        compile_filter(text)
