"""The Pub/Sub emulator's state: topics, subscriptions, messages and leases, in memory.

Written from Google's documents (the ``google.pubsub.v1`` API reference, "Resource
limits", "Exactly-once delivery", "Dead-letter topics", "Retry policy", "Ordering
messages", "Filter messages"); choices where they are silent are marked CHOICE.

Messages and acks:
    Publishing copies a message to every attached subscription of the topic whose
    filter it passes (a message a filter rejects is acknowledged at once, as the
    service does). A message published before a subscription was created is not
    delivered to it. Each delivery makes a new ack id; the message is outstanding
    until its ack deadline, then it is delivered again.

    **Exactly-once subscriptions**: only the newest ack id of a message works, and
    only while its deadline has not passed. Acknowledge and ModifyAckDeadline with
    any other ack id (older, expired, already acknowledged, unknown) fail with
    ``INVALID_ARGUMENT`` carrying a ``google.rpc.ErrorInfo`` (reason
    ``EXACTLY_ONCE_ACKID_FAILURE``, domain ``pubsub.googleapis.com``) whose metadata
    maps each refused ack id to ``PERMANENT_FAILURE_INVALID_ACK_ID``. CHOICE: the
    valid ack ids of the same request take effect (the documents do not say;
    the client then reports them failed with ``AcknowledgeStatus.OTHER``, as it
    does for any ack id a failed request does not list). An outstanding message
    is never redelivered.

    **Without exactly-once** (the service is "at least once" and its acks "best
    effort"): CHOICE: an ack with any ack id ever issued for a message still in the
    subscription acknowledges it (a stale ack may succeed, as the documents warn);
    a ModifyAckDeadline with an ack id that is not the message's newest is
    ignored; unknown ack ids of the emulator's format are ignored. CHOICE: the
    emulator never redelivers a message before its deadline (the service may).

    Malformed ack ids (not of the emulator's format) fail with ``INVALID_ARGUMENT``.

Limits (from "Resource limits"): a Publish request at most 10,000,000 bytes (the
client's own constant) and 1,000 messages; each message has data or at least one
attribute; at most 100 attributes, keys at most 256 bytes and not starting with
``goog``, values at most 1,024 bytes; ordering keys at most 1,024 bytes. Ack
deadlines 10-600 s on a subscription and a stream, 0-600 s in ModifyAckDeadline;
retention 10 minutes to 31 days (default 7 days); dead-letter attempts 5-100
(default 5); retry backoff 0-600 s (defaults 10 s and 600 s).

Dead letters: with a dead-letter policy, ``delivery_attempt`` counts deliveries
(0 without a policy, as documented). When a message whose attempts reached the
maximum is nacked or its deadline passes, it is published to the dead-letter
topic with the ``CloudPubSubDeadLetterSource*`` attributes and removed.

Retry policy: a nacked or expired message is delivered again after the
exponential backoff ``min * 2**(attempts-1)``, capped at ``max`` (CHOICE: no
jitter). Without a policy it is available again at once.

Ordering: on a subscription with message ordering, messages of one ordering key
are delivered in publish order; CHOICE: while a message of a key is outstanding,
no later message of that key is delivered, except in the same response; when an
outstanding message of a key is nacked or expires, the key's other outstanding
messages are released with it (the documents: "redelivers every subsequent
message with the same ordering key"; CHOICE: acknowledged ones are not).
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2, timestamp_pb2
from google.pubsub_v1.types import pubsub
from google.rpc import error_details_pb2

from .filters import FilterError, compile_filter

__all__ = ["Broker", "Clock", "EmulatorError", "ManualClock", "SystemClock"]

PubsubMessage: Any = pubsub.PubsubMessage.pb()
ReceivedMessage: Any = pubsub.ReceivedMessage.pb()
Subscription: Any = pubsub.Subscription.pb()
Topic: Any = pubsub.Topic.pb()

MAX_PUBLISH_BYTES = 10_000_000
MAX_PUBLISH_MESSAGES = 1000
MAX_ATTRIBUTES = 100
MAX_ATTRIBUTE_KEY = 256
MAX_ATTRIBUTE_VALUE = 1024
MAX_ORDERING_KEY = 1024
MIN_ACK_DEADLINE = 10
MAX_ACK_DEADLINE = 600
DEFAULT_ACK_DEADLINE = 10
MIN_RETENTION = 600
MAX_RETENTION = 31 * 24 * 3600
DEFAULT_RETENTION = 7 * 24 * 3600
MIN_DELIVERY_ATTEMPTS = 5
MAX_DELIVERY_ATTEMPTS = 100
DEFAULT_MIN_BACKOFF = 10.0
DEFAULT_MAX_BACKOFF = 600.0
#: The ErrorInfo the service attaches to exactly-once ack failures.
EXACTLY_ONCE_REASON = "EXACTLY_ONCE_ACKID_FAILURE"
INVALID_ACK_ID = "PERMANENT_FAILURE_INVALID_ACK_ID"
DOMAIN = "pubsub.googleapis.com"
#: The topic name a subscription shows once its topic was deleted.
DELETED_TOPIC = "_deleted-topic_"
_ACK_PREFIX = "LKPS"


class EmulatorError(Exception):
    """A gRPC error the server returns: a status code, a message and optional details."""

    def __init__(self, code: grpc.StatusCode, message: str, details: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = list(details)


def _not_found(name: str) -> EmulatorError:
    return EmulatorError(grpc.StatusCode.NOT_FOUND, f"Resource not found (resource={name}).")


def _invalid(message: str) -> EmulatorError:
    return EmulatorError(grpc.StatusCode.INVALID_ARGUMENT, message)


class Clock:
    """The emulator's time source (seconds since the epoch)."""

    def now(self) -> float:
        """The current time."""
        raise NotImplementedError

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever time jumps (a manual clock's advance)."""


class SystemClock(Clock):
    """The machine's clock."""

    def now(self) -> float:
        """``time.time()``."""
        return time.time()


class ManualClock(Clock):
    """A clock that only moves when a test calls :meth:`advance` (starts at ``start``)."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def now(self) -> float:
        """The manual time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move the time forward by ``seconds`` and wake every waiter."""
        with self._lock:
            self._now += seconds
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each :meth:`advance`."""
        with self._lock:
            self._listeners.append(listener)


def _timestamp(seconds: float) -> Any:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def _seconds(duration: Any) -> float:
    return float(duration.seconds) + float(duration.nanos) / 1e9


def _duration(seconds: float) -> Any:
    value = duration_pb2.Duration()
    value.FromNanoseconds(int(seconds * 1e9))
    return value


def _check_name(name: str, kind: str) -> tuple[str, str]:
    parts = name.split("/")
    if len(parts) != 4 or parts[0] != "projects" or parts[2] != kind or not parts[1]:
        raise _invalid(
            f"Invalid resource name given (name={name}). Refer to "
            f"https://cloud.google.com/pubsub/docs/pubsub-basics#resource_names "
            "for more information."
        )
    resource = parts[3]
    if (
        not (3 <= len(resource) <= 255)
        or not resource[0].isalpha()
        or resource.startswith("goog")
        or not all(c.isalnum() or c in "-_.~+%" for c in resource)
    ):
        raise _invalid(
            f"Invalid resource name given (name={name}). Refer to "
            f"https://cloud.google.com/pubsub/docs/pubsub-basics#resource_names "
            "for more information."
        )
    return parts[1], resource


@dataclass(eq=False)
class Pending:
    """One message in one subscription, and its lease."""

    message: Any
    size: int
    attempts: int = 0
    ack_id: str | None = None
    ack_ids: list[str] = field(default_factory=list)
    deadline: float | None = None
    available_at: float = 0.0
    stream: object | None = None


@dataclass(eq=False)
class Sub:
    """A subscription and its messages (in publish order)."""

    pb: Any
    number: int
    matches: Callable[[Mapping[str, str]], bool] | None
    messages: dict[str, Pending] = field(default_factory=dict)
    acks: dict[str, Pending] = field(default_factory=dict)

    @property
    def exactly_once(self) -> bool:
        return bool(self.pb.enable_exactly_once_delivery)


class Broker:
    """All topics and subscriptions of one emulator, behind one lock.

    Every method raises :class:`EmulatorError` for a request the service refuses.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self.topics: dict[str, Any] = {}
        self.subs: dict[str, Sub] = {}
        self.policies: dict[str, Any] = {}
        self._message_ids = itertools.count(1)
        self._sub_numbers = itertools.count(1)
        self._ack_numbers = itertools.count(1)
        self.clock.subscribe(self._wake)

    def _wake(self) -> None:
        with self.changed:
            self.changed.notify_all()

    # ----------------------------------------------------------------- topics

    def create_topic(self, topic: Any) -> Any:
        """CreateTopic: ALREADY_EXISTS for a taken name."""
        _check_name(topic.name, "topics")
        if topic.HasField("message_retention_duration"):
            seconds = _seconds(topic.message_retention_duration)
            if not MIN_RETENTION <= seconds <= MAX_RETENTION:
                raise _invalid("Invalid message_retention_duration: must be 10 minutes to 31 days.")
        with self._lock:
            if topic.name in self.topics:
                raise EmulatorError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"Resource already exists in the project (resource={topic.name}).",
                )
            stored = Topic()
            stored.CopyFrom(topic)
            stored.state = 1  # ACTIVE
            self.topics[topic.name] = stored
            return stored

    def get_topic(self, name: str) -> Any:
        """GetTopic."""
        _check_name(name, "topics")
        with self._lock:
            return self._topic(name)

    def _topic(self, name: str) -> Any:
        try:
            return self.topics[name]
        except KeyError:
            raise _not_found(name) from None

    def update_topic(self, topic: Any, paths: Sequence[str]) -> Any:
        """UpdateTopic: labels and message_retention_duration."""
        if not paths:
            raise _invalid("The update_mask in the UpdateTopicRequest must be set.")
        with self._lock:
            stored = self._topic(topic.name)
            for path in paths:
                if path == "labels":
                    stored.labels.clear()
                    stored.labels.update(topic.labels)
                elif path == "message_retention_duration":
                    stored.message_retention_duration.CopyFrom(topic.message_retention_duration)
                else:
                    raise _invalid(
                        f"Invalid update_mask provided in the UpdateTopicRequest: "
                        f"'{path}' is not a known Topic field."
                    )
            return stored

    def list_topics(self, project: str) -> list[Any]:
        """ListTopics (sorted by name)."""
        prefix = f"{project}/topics/"
        with self._lock:
            return [t for name, t in sorted(self.topics.items()) if name.startswith(prefix)]

    def delete_topic(self, name: str) -> None:
        """DeleteTopic: its subscriptions stay, with topic ``_deleted-topic_``."""
        _check_name(name, "topics")
        with self._lock:
            self._topic(name)
            del self.topics[name]
            for sub in self.subs.values():
                if sub.pb.topic == name:
                    sub.pb.topic = DELETED_TOPIC

    def topic_subscriptions(self, topic: str) -> list[str]:
        """ListTopicSubscriptions (sorted)."""
        with self._lock:
            self._topic(topic)
            return sorted(name for name, sub in self.subs.items() if sub.pb.topic == topic)

    def publish(self, topic: str, messages: Sequence[Any], request_size: int) -> list[str]:
        """Publish: validate every message, then copy each to the topic's subscriptions."""
        if request_size > MAX_PUBLISH_BYTES:
            raise _invalid(f"Request payload size exceeds the limit: {MAX_PUBLISH_BYTES} bytes.")
        if not messages:
            raise _invalid("The request must contain at least one message.")
        if len(messages) > MAX_PUBLISH_MESSAGES:
            raise _invalid(
                f"The value for message_count is too large. You passed "
                f"{len(messages)} in the request, but the maximum value is "
                f"{MAX_PUBLISH_MESSAGES}."
            )
        for message in messages:
            if not message.data and not message.attributes:
                raise _invalid(
                    "Some messages in the publish request are empty. Each message "
                    "must contain a non-empty data field, or at least one attribute."
                )
            if len(message.attributes) > MAX_ATTRIBUTES:
                raise _invalid(f"Too many attributes: at most {MAX_ATTRIBUTES} per message.")
            for key, value in message.attributes.items():
                if not key or len(key.encode()) > MAX_ATTRIBUTE_KEY:
                    raise _invalid(f"Invalid attribute key: at most {MAX_ATTRIBUTE_KEY} bytes.")
                if key.startswith("goog"):
                    raise _invalid("Invalid attribute key: keys must not start with 'goog'.")
                if len(value.encode()) > MAX_ATTRIBUTE_VALUE:
                    raise _invalid(
                        f"Invalid attribute value for key '{key}': at most "
                        f"{MAX_ATTRIBUTE_VALUE} bytes."
                    )
            if len(message.ordering_key.encode()) > MAX_ORDERING_KEY:
                raise _invalid(f"Ordering key is longer than {MAX_ORDERING_KEY} bytes.")
        with self._lock:
            self._topic(topic)
            now = self.clock.now()
            ids = []
            for message in messages:
                stored = PubsubMessage()
                stored.CopyFrom(message)
                stored.message_id = str(next(self._message_ids))
                stored.publish_time.CopyFrom(_timestamp(now))
                ids.append(stored.message_id)
                self._fan_out(topic, stored)
            self.changed.notify_all()
            return ids

    def _fan_out(self, topic: str, message: Any) -> None:
        size = message.ByteSize()
        for sub in self.subs.values():
            if sub.pb.topic != topic or sub.pb.detached:
                continue
            if sub.matches is not None and not sub.matches(message.attributes):
                continue
            sub.messages[message.message_id] = Pending(message=message, size=size)

    # ---------------------------------------------------------- subscriptions

    def create_subscription(self, request: Any) -> Any:
        """CreateSubscription with the documented defaults and ranges."""
        _check_name(request.name, "subscriptions")
        sub = Subscription()
        sub.CopyFrom(request)
        if not sub.topic:
            raise _invalid("The topic of a subscription must be set.")
        if sub.ack_deadline_seconds == 0:
            sub.ack_deadline_seconds = DEFAULT_ACK_DEADLINE
        self._check_subscription(sub)
        if not sub.HasField("message_retention_duration"):
            sub.message_retention_duration.CopyFrom(_duration(DEFAULT_RETENTION))
        try:
            matches = compile_filter(sub.filter)
        except FilterError as exc:
            raise _invalid(f"Invalid filter: {exc}") from None
        with self._lock:
            if request.name in self.subs:
                raise EmulatorError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"Resource already exists in the project (resource={request.name}).",
                )
            self._topic(sub.topic)
            sub.state = 1  # ACTIVE
            stored = Sub(pb=sub, number=next(self._sub_numbers), matches=matches)
            self.subs[request.name] = stored
            return sub

    def _check_subscription(self, sub: Any) -> None:
        if not MIN_ACK_DEADLINE <= sub.ack_deadline_seconds <= MAX_ACK_DEADLINE:
            raise _invalid(
                "Invalid ack_deadline_seconds: the ack deadline must be between "
                f"{MIN_ACK_DEADLINE} and {MAX_ACK_DEADLINE} seconds."
            )
        if sub.HasField("message_retention_duration"):
            seconds = _seconds(sub.message_retention_duration)
            if not MIN_RETENTION <= seconds <= MAX_RETENTION:
                raise _invalid(
                    "Invalid message_retention_duration: must be between 10 minutes and 31 days."
                )
        if sub.HasField("dead_letter_policy"):
            policy = sub.dead_letter_policy
            if policy.max_delivery_attempts == 0:
                policy.max_delivery_attempts = MIN_DELIVERY_ATTEMPTS
            if not MIN_DELIVERY_ATTEMPTS <= policy.max_delivery_attempts <= MAX_DELIVERY_ATTEMPTS:
                raise _invalid(
                    "Invalid max_delivery_attempts: must be between "
                    f"{MIN_DELIVERY_ATTEMPTS} and {MAX_DELIVERY_ATTEMPTS}."
                )
            if policy.dead_letter_topic:
                _check_name(policy.dead_letter_topic, "topics")
        if sub.HasField("retry_policy"):
            policy = sub.retry_policy
            low = _seconds(policy.minimum_backoff) if policy.HasField("minimum_backoff") else None
            high = _seconds(policy.maximum_backoff) if policy.HasField("maximum_backoff") else None
            for value in (low, high):
                if value is not None and not 0 <= value <= 600:
                    raise _invalid("Invalid retry_policy: backoffs must be between 0 and 600 s.")
            if (low if low is not None else DEFAULT_MIN_BACKOFF) > (
                high if high is not None else DEFAULT_MAX_BACKOFF
            ):
                raise _invalid("Invalid retry_policy: minimum_backoff exceeds maximum_backoff.")

    def get_subscription(self, name: str) -> Any:
        """GetSubscription."""
        _check_name(name, "subscriptions")
        with self._lock:
            return self._sub(name).pb

    def _sub(self, name: str) -> Sub:
        try:
            return self.subs[name]
        except KeyError:
            raise _not_found(name) from None

    _UPDATABLE = frozenset(
        {
            "ack_deadline_seconds",
            "push_config",
            "labels",
            "message_retention_duration",
            "retain_acked_messages",
            "expiration_policy",
            "dead_letter_policy",
            "retry_policy",
            "enable_exactly_once_delivery",
            "detached",
        }
    )

    def update_subscription(self, update: Any, paths: Sequence[str]) -> Any:
        """UpdateSubscription: the mask's fields (filter and ordering are immutable)."""
        if not paths:
            raise _invalid("The update_mask in the UpdateSubscriptionRequest must be set.")
        for path in paths:
            if path not in self._UPDATABLE:
                raise _invalid(
                    f"Invalid update_mask provided in the UpdateSubscriptionRequest: "
                    f"the '{path}' field cannot be updated."
                )
        with self._lock:
            sub = self._sub(update.name)
            changed = Subscription()
            changed.CopyFrom(sub.pb)
            for path in paths:
                if (
                    update.HasField(path)
                    if path
                    in (
                        "push_config",
                        "message_retention_duration",
                        "expiration_policy",
                        "dead_letter_policy",
                        "retry_policy",
                    )
                    else True
                ):
                    if path == "labels":
                        changed.labels.clear()
                        changed.labels.update(update.labels)
                    elif path in (
                        "push_config",
                        "message_retention_duration",
                        "expiration_policy",
                        "dead_letter_policy",
                        "retry_policy",
                    ):
                        getattr(changed, path).CopyFrom(getattr(update, path))
                    else:
                        setattr(changed, path, getattr(update, path))
                else:
                    changed.ClearField(path)
            if changed.ack_deadline_seconds == 0:
                changed.ack_deadline_seconds = DEFAULT_ACK_DEADLINE
            self._check_subscription(changed)
            sub.pb = changed
            self.changed.notify_all()
            return changed

    def list_subscriptions(self, project: str) -> list[Any]:
        """ListSubscriptions (sorted by name)."""
        prefix = f"{project}/subscriptions/"
        with self._lock:
            return [s.pb for name, s in sorted(self.subs.items()) if name.startswith(prefix)]

    def delete_subscription(self, name: str) -> None:
        """DeleteSubscription: its messages go; its ack ids stop working."""
        _check_name(name, "subscriptions")
        with self._lock:
            self._sub(name)
            del self.subs[name]
            self.changed.notify_all()

    def detach_subscription(self, name: str) -> None:
        """DetachSubscription: it stays, detached, with no messages; pulls fail."""
        _check_name(name, "subscriptions")
        with self._lock:
            sub = self._sub(name)
            sub.pb.detached = True
            sub.messages.clear()
            sub.acks.clear()
            self.changed.notify_all()

    # ----------------------------------------------------------------- leases

    def pullable(self, name: str) -> Sub:
        """The subscription ``name`` if it can be pulled from (FAILED_PRECONDITION if detached)."""
        with self._lock:
            sub = self._sub(name)
            if sub.pb.detached:
                raise EmulatorError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Subscription is detached (resource={name}).",
                )
            return sub

    def take(
        self,
        sub: Sub,
        max_messages: int,
        deadline_seconds: float,
        *,
        stream: object | None = None,
        max_bytes: int = 0,
        byte_budget: int = 0,
    ) -> list[Any]:
        """Lease up to ``max_messages`` available messages of ``sub`` (caller holds the lock).

        ``max_bytes`` stops before the messages' sizes pass it (at least one message
        is always taken); ``byte_budget`` is a response's size cap, the same way.
        """
        now = self.clock.now()
        self._expire(sub, now)
        retention = _seconds(sub.pb.message_retention_duration)
        ordered = sub.pb.enable_message_ordering
        dead_letter = sub.pb.HasField("dead_letter_policy")
        blocked: set[str] = set()
        if ordered:
            blocked = {
                p.message.ordering_key
                for p in sub.messages.values()
                if p.deadline is not None and p.message.ordering_key
            }
        taken: list[Any] = []
        taken_keys: set[str] = set()
        total = 0
        expired: list[str] = []
        for message_id, pending in sub.messages.items():
            if len(taken) >= max_messages:
                break
            message = pending.message
            key = message.ordering_key if ordered else ""
            if pending.deadline is not None:
                continue
            published = message.publish_time.seconds + message.publish_time.nanos / 1e9
            if published + retention <= now:
                expired.append(message_id)
                continue
            if key and key in blocked and key not in taken_keys:
                continue
            if pending.available_at > now:
                if key:
                    blocked.add(key)
                continue
            limit = min((b for b in (byte_budget, max_bytes) if b > 0), default=0)
            if taken and limit and total + pending.size > limit:
                break
            pending.attempts += 1
            ack_id = f"{_ACK_PREFIX}-{sub.number}-{next(self._ack_numbers)}-{secrets.token_hex(6)}"
            pending.ack_id = ack_id
            pending.ack_ids.append(ack_id)
            pending.deadline = now + deadline_seconds
            pending.stream = stream
            sub.acks[ack_id] = pending
            received = ReceivedMessage(
                ack_id=ack_id, delivery_attempt=pending.attempts if dead_letter else 0
            )
            received.message.CopyFrom(message)
            taken.append(received)
            total += pending.size
            if key:
                taken_keys.add(key)
                blocked.add(key)
        for message_id in expired:
            self._forget(sub, sub.messages.pop(message_id))
        return taken

    def _forget(self, sub: Sub, pending: Pending) -> None:
        for ack_id in pending.ack_ids:
            sub.acks.pop(ack_id, None)
        pending.ack_ids.clear()
        pending.ack_id = None
        pending.deadline = None

    def _expire(self, sub: Sub, now: float) -> None:
        for pending in list(sub.messages.values()):
            if pending.deadline is not None and pending.deadline <= now:
                self._release(sub, pending, now)

    def _release(self, sub: Sub, pending: Pending, now: float) -> None:
        """A nack or an expired deadline: dead-letter, or make it available after the backoff."""
        if pending.deadline is None or pending.message.message_id not in sub.messages:
            return
        pending.deadline = None
        pending.stream = None
        policy = sub.pb.dead_letter_policy if sub.pb.HasField("dead_letter_policy") else None
        if policy is not None and pending.attempts >= policy.max_delivery_attempts:
            self._dead_letter(sub, pending, now)
            return
        if sub.pb.HasField("retry_policy"):
            retry = sub.pb.retry_policy
            low = (
                _seconds(retry.minimum_backoff)
                if retry.HasField("minimum_backoff")
                else DEFAULT_MIN_BACKOFF
            )
            high = (
                _seconds(retry.maximum_backoff)
                if retry.HasField("maximum_backoff")
                else DEFAULT_MAX_BACKOFF
            )
            pending.available_at = now + min(high, low * 2 ** max(0, pending.attempts - 1))
        else:
            pending.available_at = now
        key = pending.message.ordering_key
        if sub.pb.enable_message_ordering and key:
            for other in sub.messages.values():
                if (
                    other is not pending
                    and other.deadline is not None
                    and (other.message.ordering_key == key)
                ):
                    other.deadline = None
                    other.stream = None
                    other.available_at = max(other.available_at, pending.available_at)

    def _dead_letter(self, sub: Sub, pending: Pending, now: float) -> None:
        policy = sub.pb.dead_letter_policy
        del sub.messages[pending.message.message_id]
        self._forget(sub, pending)
        target = policy.dead_letter_topic
        if target not in self.topics:
            return  # CHOICE: a dead-letter topic that no longer exists drops the message
        copy = PubsubMessage()
        copy.CopyFrom(pending.message)
        project, sub_id = sub.pb.name.split("/")[1], sub.pb.name.split("/")[3]
        copy.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] = str(pending.attempts)
        copy.attributes["CloudPubSubDeadLetterSourceSubscription"] = sub_id
        copy.attributes["CloudPubSubDeadLetterSourceSubscriptionProject"] = project
        copy.attributes["CloudPubSubDeadLetterSourceTopicPublishTime"] = (
            pending.message.publish_time.ToJsonString()
        )
        copy.message_id = str(next(self._message_ids))
        copy.publish_time.CopyFrom(_timestamp(now))
        self._fan_out(target, copy)

    def _failure(self, failed: Mapping[str, str]) -> EmulatorError:
        info = error_details_pb2.ErrorInfo(reason=EXACTLY_ONCE_REASON, domain=DOMAIN)
        info.metadata.update(failed)
        detail = any_pb2.Any()
        detail.Pack(info)
        return EmulatorError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "Some acknowledgement ids in the request were invalid. This could be because the "
            "acknowledgement ids have expired or the acknowledgement ids were malformed.",
            [detail],
        )

    def _check_ack_ids(self, ack_ids: Iterable[str]) -> None:
        for ack_id in ack_ids:
            if not ack_id.startswith(_ACK_PREFIX + "-"):
                raise _invalid(
                    f"You have passed an invalid ack ID to the service (ack_id={ack_id})."
                )

    def acknowledge(self, name: str, ack_ids: Sequence[str]) -> dict[str, bool]:
        """Acknowledge; returns which ack ids worked (exactly-once failures raise)."""
        if not ack_ids:
            raise _invalid("No ack ids were given.")
        with self._lock:
            sub = self._sub(name)
            self._check_ack_ids(ack_ids)
            now = self.clock.now()
            results: dict[str, bool] = {}
            for ack_id in ack_ids:
                pending = sub.acks.get(ack_id)
                if sub.exactly_once:
                    ok = (
                        pending is not None
                        and pending.ack_id == ack_id
                        and pending.deadline is not None
                        and pending.deadline > now
                    )
                else:
                    ok = pending is not None
                if ok and pending is not None:
                    sub.messages.pop(pending.message.message_id, None)
                    self._forget(sub, pending)
                results[ack_id] = ok
            self.changed.notify_all()
            return results

    def modify_ack_deadline(
        self, name: str, ack_ids: Sequence[str], seconds: int
    ) -> dict[str, bool]:
        """ModifyAckDeadline (0-600 s; 0 nacks); returns which ack ids worked."""
        if not ack_ids:
            raise _invalid("No ack ids were given.")
        if not 0 <= seconds <= MAX_ACK_DEADLINE:
            raise _invalid(
                f"Invalid ack deadline given: {seconds} (the ack deadline must be "
                f"between 0 and {MAX_ACK_DEADLINE} seconds)."
            )
        with self._lock:
            sub = self._sub(name)
            self._check_ack_ids(ack_ids)
            now = self.clock.now()
            results: dict[str, bool] = {}
            for ack_id in ack_ids:
                pending = sub.acks.get(ack_id)
                current = (
                    pending is not None
                    and pending.ack_id == ack_id
                    and (pending.deadline is not None)
                )
                if sub.exactly_once:
                    current = (
                        current
                        and pending is not None
                        and pending.deadline is not None
                        and (pending.deadline > now)
                    )
                if current and pending is not None:
                    if seconds == 0:
                        self._release(sub, pending, now)
                    else:
                        pending.deadline = now + seconds
                results[ack_id] = current or not sub.exactly_once
            self.changed.notify_all()
            return results

    def raise_failures(self, sub_name: str, results: Mapping[str, bool]) -> None:
        """Raise the exactly-once error for the refused ack ids in ``results``, if any."""
        failed = {ack_id: INVALID_ACK_ID for ack_id, ok in results.items() if not ok}
        if failed:
            raise self._failure(failed)

    def outstanding(self, sub: Sub, stream: object) -> tuple[int, int]:
        """Messages and bytes leased on ``stream`` and not yet settled (caller holds the lock)."""
        count = size = 0
        for pending in sub.messages.values():
            if pending.stream is stream and pending.deadline is not None:
                count += 1
                size += pending.size
        return count, size

    def next_event(self, sub: Sub) -> float | None:
        """The next time a lease of ``sub`` ends or a message becomes available."""
        times = [
            p.deadline if p.deadline is not None else p.available_at for p in sub.messages.values()
        ]
        times = [t for t in times if t > 0]
        return min(times) if times else None
