"""The Google Cloud Pub/Sub backend, on ``google-cloud-pubsub``'s gRPC API clients.

URLs:
    ``gcp-pubsub://PROJECT/SUBSCRIPTION?topic=TOPIC`` — pull subscription
    ``SUBSCRIPTION`` of project ``PROJECT``; ``send`` publishes to ``TOPIC``
    (default: a topic named like the subscription). Other options:
    ``endpoint`` (``host:port`` of an emulator, plain gRPC; default
    ``$PUBSUB_EMULATOR_HOST`` as the official client reads it, else the
    service), ``exactly_once`` (default ``true``: the subscription must have
    exactly-once delivery), ``dead_letter_topic`` and ``max_delivery_attempts``
    (the subscription's dead-letter policy), ``ack_deadline`` (the
    subscription's deadline when leasekit creates it, 10-600 s, default 60) and
    ``timeout`` (seconds per call, default 30). Credentials are **keyword options
    only**: ``credentials=`` (a ``google.auth`` credentials object) or
    ``credentials_file=`` (a service-account JSON file); without either, the
    usual Google sources (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's
    application-default login, the metadata server) through ``google.auth.default``.
    They never appear in a repr, a log line or an error message.

Delivery semantics:
    At least once. A lease is one delivery: ``Pull`` (the subscription's ack
    deadline), then one batched ``ModifyAckDeadline`` setting the lease's
    duration (``lease_set_after_receive``), unless it is the subscription's
    deadline as read on first use (no call then); the receipt is the ack id, which
    renewals keep. Renew is ``ModifyAckDeadline`` (0-600 s, batched), complete
    is ``Acknowledge`` (batched), abandon is ``ModifyAckDeadline`` with the
    delay (0: now; up to 600 s: the message stays hidden that long, as a lease
    nobody renews).

    **Exactly-once subscriptions** (``exactly_once=true``): only the newest ack id
    of a message works, while its deadline has not passed; the service refuses
    any other with ``INVALID_ARGUMENT`` and a ``google.rpc.ErrorInfo`` naming each
    refused ack id (``PERMANENT_FAILURE_INVALID_ACK_ID``): that entry is
    ``LeaseLost``, its neighbours in the batch are unaffected; an outstanding
    message is not redelivered. So stale receipts are detected and an expired
    one is not usable.

    **Without exactly-once** (``exactly_once=false``) the service promises less:
    a stale ack may succeed (and complete a message someone else now holds), a
    stale renew is ignored without an error, and a message may come back before
    its deadline. The capabilities say so (``detects_stale_receipts=False``,
    and ``expired_receipt_usable=False``: an ack after the deadline is best effort);
    core then counts a renewal that returns after the lease's end as lost.

    On first use the driver reads the subscription once (``GetSubscription``) and
    refuses to work if its exactly-once setting differs from ``exactly_once``,
    or its dead-letter topic from ``dead_letter_topic``: the capabilities must
    be true.

    **Delivery count** is the service's ``delivery_attempt``, which it only
    keeps on a subscription with a dead-letter policy: with
    ``dead_letter_topic`` the count is exact; without, it is reported as 1 and
    the capabilities say it is not kept.

    **Dead letters** are leasekit's: ``dead_letter(reason)`` publishes a copy with
    the reason, original id and delivery count as attributes and acknowledges
    the original. The copy goes to the subscription's dead-letter topic when it
    has one (read back through that topic's subscription of the same name, as
    leasekit creates it), else to ``<subscription>-poison`` (a topic and
    subscription of that name, made on first use). The service's own policy
    acts independently: after ``max_delivery_attempts`` deliveries it forwards
    a message to the same topic with its ``CloudPubSubDeadLetterSource*``
    attributes. ``Queue.peek_dead_letters`` reads dead letters by pulling and
    giving them back at once (Pub/Sub has no peek: each read counts a delivery).

    **Ordering keys are not mapped to ``group``**: the service delivers a key's
    messages in order but may hand out its next messages while the head is
    still leased, which is weaker than leasekit's ``ordered`` promise, so the
    capabilities declare ``ordered=False`` and ``group`` is refused.

    **An empty body without properties** is sent with the attribute
    ``leasekit-empty-body=1`` (the service refuses a message with neither data
    nor attributes); leasekit's receive drops that attribute again.

    **Checkpoints** need a checkpoint store (``leasekit.open(...,
    checkpoint_store=...)``): a Pub/Sub message cannot be rewritten.

Limits:
    Leases 1-600 s (``ModifyAckDeadline``'s range after the pull; the service's
    documented minimum is 0); longer work is kept by the keeper in steps.
    1,000 messages per pull, publish, ack and modack call. A publish request is
    at most 10,000,000 bytes (the client's constant): a message whose body,
    attributes and framing pass it is ``MessageTooLarge`` before any call; core
    splits sends at 9,000,000 bytes of bodies and attributes. Attribute keys at
    most 256 bytes (not starting with ``goog``), values 1,024 bytes, 100 per
    message. No send delay and no per-message time-to-live (the subscription's
    retention applies). No message counts (Cloud Monitoring only). No peek:
    ``peek`` pulls and gives back at once.

Raw types:
    ``lease.raw`` is the protobuf ``google.pubsub.v1.ReceivedMessage`` of the pull
    (``google.pubsub_v1.types.ReceivedMessage.wrap(lease.raw)`` gives the client's
    proto-plus view of it); errors are
    ``google.api_core.exceptions.GoogleAPICallError`` subclasses (``__cause__``),
    per-entry ack failures are :class:`~leasekit.spi.DriverError` chained from it.

Errors:
    ``NOT_FOUND`` → ``QueueNotFound`` (the message names the subscription or
    topic); ``ALREADY_EXISTS`` on create is success; exactly-once ack id
    failures → ``LeaseLost`` per entry (``TRANSIENT_FAILURE_*`` entries →
    ``BackendUnavailable``, retried by core); ``INVALID_ARGUMENT`` for a payload
    over the limit → ``MessageTooLarge``, other ``INVALID_ARGUMENT`` →
    ``InvalidArgument``; ``PERMISSION_DENIED``, ``UNAUTHENTICATED`` and
    ``google.auth`` errors → ``AuthenticationFailed``; ``UNAVAILABLE``,
    ``DEADLINE_EXCEEDED``, ``RESOURCE_EXHAUSTED``, ``ABORTED``, ``INTERNAL`` →
    ``BackendUnavailable``. The client's own retries are off (``retry=None``):
    core retries transient errors within each call's deadline, and every call
    gets core's remaining time as its gRPC timeout.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from leasekit.capabilities import Capabilities
from leasekit.clock import to_datetime
from leasekit.deadline import call_timeout
from leasekit.errors import InvalidArgument, InvalidLeaseDuration, InvalidURL
from leasekit.hookspecs import hookimpl
from leasekit.options import as_bool, as_float, as_int, as_object, as_text
from leasekit.redaction import Secret, install_log_redaction
from leasekit.registry import BackendSpec
from leasekit.spi import (
    Driver,
    DriverError,
    ErrorCode,
    OutgoingMessage,
    ParsedURL,
    RawMessage,
    Visibility,
    received,
)

__all__ = ["CAPABILITIES", "PubSubDriver", "classify"]

#: Most messages one Pull returns, and ack ids per Acknowledge / ModifyAckDeadline
#: (the client library's own batch size: requests stay far below 512 KB).
MAX_BATCH = 1000
#: A Publish request's limit in bytes (``google.cloud.pubsub_v1``'s constant).
MAX_PUBLISH_BYTES = 10_000_000
#: Bytes of bodies and attributes core puts in one publish; the rest of the
#: 10 MB is room for the framing of up to 1,000 messages.
SEND_BATCH_BYTES = 9_000_000
#: Largest body: the request limit less room for the topic name and framing;
#: ``validate`` checks the exact request size with the attributes.
MAX_BODY = MAX_PUBLISH_BYTES - 4096
MAX_ACK_DEADLINE = 600
DEFAULT_ACK_DEADLINE = 60
#: Longest a Pull waits in one call; core loops for longer waits.
MAX_WAIT = 20.0
DEFAULT_TIMEOUT = 30.0
#: Extra seconds a long-polling Pull's call gets beyond its wait, for the answer.
PULL_MARGIN = 1.0
#: gRPC channel options. No message size limit (as the client's own channel);
#: after a lost connection, try to reconnect every 0.1-0.25 s instead of gRPC's
#: default 1 s growing to 120 s: a renewal retried within its lease's time must
#: find the channel connected again (measured: a 1.4 s cut lost all 20 leases of
#: 6 s with the default; with a 1 s cap, a cut ending 0.9 s before expiry lost
#: some under load). One connection attempt per channel each 0.25 s of an outage.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 250),
]
#: The service refuses a message with no data and no attributes: an empty body
#: without properties is sent with this attribute, which the receive removes.
EMPTY_MARK = {"leasekit-empty-body": "1"}
#: Attribute names of leasekit's dead-letter copies.
REASON = "leasekit-dead-letter-reason"
SDK_LOGGERS = ("google.cloud.pubsub_v1", "google.api_core", "google.auth", "grpc")
_SECRET_OPTIONS = frozenset({"credentials", "credentials_file", "token", "key", "private_key"})
_TRANSIENT_CODES = frozenset(
    {
        "ServiceUnavailable",
        "DeadlineExceeded",
        "TooManyRequests",
        "ResourceExhausted",
        "Aborted",
        "InternalServerError",
        "GatewayTimeout",
        "RetryError",
    }
)


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``gcp-pubsub``."""
    return [
        BackendSpec(
            name="gcp-pubsub",
            driver="leasekit.backends.gcp_pubsub:PubSubDriver",
            extra="gcp-pubsub",
            description="Google Cloud Pub/Sub pull subscriptions (exactly-once fencing)",
        )
    ]


#: The capabilities of an exactly-once subscription without a dead-letter policy.
CAPABILITIES = Capabilities(
    min_lease=1.0,
    max_lease=float(MAX_ACK_DEADLINE),
    lease_resolution=1.0,
    lease_set_after_receive=True,
    renew_rotates_receipt=False,
    detects_stale_receipts=True,
    expired_receipt_usable=False,
    max_receive_batch=MAX_BATCH,
    max_delete_batch=MAX_BATCH,
    max_renew_batch=MAX_BATCH,
    max_send_batch=MAX_BATCH,
    max_send_batch_bytes=SEND_BATCH_BYTES,
    max_message_size=MAX_BODY,
    max_wait=MAX_WAIT,
    wait_resolution=0.0,
    max_abandon_delay=float(MAX_ACK_DEADLINE),
    max_send_delay=0.0,
    max_ttl=None,
    supports_properties=True,
    native_dead_letter=False,
    delivery_count=False,
    queue_stats=False,
    inspect_dead_letters=True,
    ordered=False,
)


def _full(kind: str, project: str, name: str) -> str:
    if name.startswith("projects/"):
        return name
    return f"projects/{project}/{kind}/{name}"


class PubSubDriver(Driver):
    """Driver for one Pub/Sub pull subscription (and the topic ``send`` publishes to).

    Parameters
    ----------
        project: the Google Cloud project id.
        queue: the subscription id.
        topic: the topic id ``send`` publishes to (default: ``queue``).
        endpoint: ``host:port`` of an emulator (plain gRPC); default ``$PUBSUB_EMULATOR_HOST``.
        credentials: a ``google.auth`` credentials object (keyword only).
        credentials_file: a service-account JSON file (keyword only); must exist.
        exactly_once: the subscription has exactly-once delivery (default ``True``).
        dead_letter_topic: the subscription's dead-letter topic id (``None``: none).
        max_delivery_attempts: its policy's attempts (5-100, default 100) when creating.
        ack_deadline: the subscription's ack deadline when creating (10-600, default 60).
        timeout: seconds per call (default 30); each call is bounded tighter by core's deadline.
    """

    scheme = "gcp-pubsub"
    capabilities = CAPABILITIES
    secret_options = _SECRET_OPTIONS
    credential_hint = "pass credentials= or credentials_file= as keyword options"
    #: Whether close() closes the gRPC clients (a sibling shares its parent's).
    _owns_clients = True

    def __init__(
        self,
        project: str,
        queue: str,
        topic: str | None = None,
        endpoint: str | None = None,
        credentials: Any = None,
        credentials_file: str | None = None,
        exactly_once: bool | str = True,
        dead_letter_topic: str | None = None,
        max_delivery_attempts: int | str = 100,
        ack_deadline: int | str = DEFAULT_ACK_DEADLINE,
        timeout: float | str = DEFAULT_TIMEOUT,
    ) -> None:
        install_log_redaction(SDK_LOGGERS)
        self.project = as_text(project, "project")
        self.queue = as_text(queue, "queue")
        if "/" in self.queue or "/" in self.project:
            raise InvalidURL("gcp-pubsub: project and subscription are ids, not paths")
        self.subscription = _full("subscriptions", self.project, self.queue)
        self.topic = _full("topics", self.project, as_text(topic or self.queue, "topic"))
        self.exactly_once = as_bool(exactly_once, "exactly_once")
        self.dead_letter_topic = (
            None
            if dead_letter_topic is None
            else _full("topics", self.project, as_text(dead_letter_topic, "dead_letter_topic"))
        )
        self.max_delivery_attempts = as_int(
            max_delivery_attempts, "max_delivery_attempts", minimum=5, maximum=100
        )
        deadline = as_int(ack_deadline, "ack_deadline", error=InvalidLeaseDuration)
        if not 10 <= deadline <= MAX_ACK_DEADLINE:
            raise InvalidLeaseDuration(
                f"gcp-pubsub: ack_deadline must be 10 to {MAX_ACK_DEADLINE} seconds, got {deadline}"
            )
        self.ack_deadline = deadline
        self._timeout = as_float(timeout, "timeout", minimum=0.001, maximum=86400.0)
        if credentials is not None and credentials_file is not None:
            raise InvalidArgument("gcp-pubsub: give credentials or credentials_file, not both")
        if credentials_file is not None:
            path = as_text(credentials_file, "credentials_file")
            if not os.path.isfile(path):
                raise InvalidArgument(
                    "gcp-pubsub: the credentials file does not exist (credentials_file)"
                )
        if credentials is not None:
            as_object(
                credentials,
                "credentials",
                methods=("refresh",),
                what="a google.auth credentials object",
            )
        self._credentials = Secret(credentials)
        self._credentials_file = Secret(credentials_file)
        given = endpoint if endpoint is not None else os.environ.get("PUBSUB_EMULATOR_HOST")
        self.endpoint = None if not given else as_text(given, "endpoint")
        self.capabilities = CAPABILITIES.replace(
            detects_stale_receipts=self.exactly_once,
            delivery_count=self.dead_letter_topic is not None,
        )
        self._lock = threading.Lock()
        self._clients: tuple[Any, Any] | None = None
        self._checked = False
        self._pull_deadline = 10.0
        self._closed = False

    @classmethod
    def options_from_url(cls, url: ParsedURL) -> dict[str, Any]:
        """``gcp-pubsub://PROJECT/SUBSCRIPTION?topic=...``."""
        segments = [s for s in url.path.split("/") if s]
        if not url.host or len(segments) != 1 or url.port is not None:
            raise InvalidURL(
                "gcp-pubsub URLs name a project and a subscription: "
                "gcp-pubsub://PROJECT/SUBSCRIPTION?topic=TOPIC"
            )
        return {**url.query, "project": url.host, "queue": segments[0]}

    def __repr__(self) -> str:
        where = f" endpoint={self.endpoint}" if self.endpoint else ""
        return f"<PubSubDriver {self.subscription}{where}>"

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """One ``Publish`` for the batch (all or nothing, as the service answers)."""
        publisher, _ = self._api()
        request = {
            "topic": self.topic,
            "messages": [
                {"data": m.body, "attributes": dict(m.properties or EMPTY_MARK)}
                if not m.body
                else {"data": m.body, "attributes": dict(m.properties)}
                for m in messages
            ],
        }
        response = self._call(publisher.publish, request)
        return list(response.message_ids)

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """One ``Pull`` for up to ``max_messages``; waits up to ``wait`` (0: returns at once)."""
        self._check_subscription()
        _, subscriber = self._api()
        started = time.time()
        request: dict[str, Any] = {"subscription": self.subscription, "max_messages": max_messages}
        if wait <= 0:
            response = self._pull_now(subscriber, request)
        else:
            # The service answers an empty pull before the call's deadline, so
            # DEADLINE_EXCEEDED means no answer came (a partition), not "no message".
            response = self._call(subscriber.pull, request, cap=wait + PULL_MARGIN)
        # The subscription's deadline as read on first use: a lease of that length
        # needs no ModifyAckDeadline after the pull (core sets any other).
        until = to_datetime(started + self._pull_deadline)
        counted = self.dead_letter_topic is not None
        out = []
        # The protobuf messages under the client's proto-plus wrappers: reading
        # fields through the wrappers cost three times the client's own work.
        pb = type(response).pb(response) if hasattr(type(response), "pb") else response
        for item in pb.received_messages:
            message = item.message
            stamp = message.publish_time
            attributes = dict(message.attributes) if message.attributes else {}
            if not message.data and attributes == EMPTY_MARK:
                attributes = {}
            out.append(
                received(
                    message.message_id,
                    message.data,
                    item.ack_id,
                    max(1, item.delivery_attempt) if counted else 1,
                    to_datetime(stamp.seconds + stamp.nanos / 1e9),
                    until,
                    attributes,
                    item,
                )
            )
        return out

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """One ``ModifyAckDeadline`` for the batch; the ack ids stay."""
        _, subscriber = self._api()
        whole = min(MAX_ACK_DEADLINE, math.ceil(seconds - 1e-9))
        started = time.time()
        request = _request(
            "ModifyAckDeadlineRequest",
            subscription=self.subscription,
            ack_ids=receipts,
            ack_deadline_seconds=whole,
        )
        results = self._per_entry(subscriber.modify_ack_deadline, request, receipts)
        until = to_datetime(started + whole)
        return [
            error if error is not None else Visibility(receipt, until)
            for receipt, error in zip(receipts, results, strict=True)
        ]

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """One ``Acknowledge`` for the batch."""
        _, subscriber = self._api()
        request = _request("AcknowledgeRequest", subscription=self.subscription, ack_ids=receipts)
        return self._per_entry(subscriber.acknowledge, request, receipts)

    # ------------------------------------------------------------------ admin

    def create_queue(self) -> None:
        """Create the topic, the subscription and any dead-letter topic; keep existing ones.

        A dead-letter topic gets a subscription of its own name, which keeps its
        messages (a topic keeps none without a subscription).
        """
        from google.api_core import exceptions

        publisher, subscriber = self._api()
        for topic in filter(None, (self.topic, self.dead_letter_topic)):
            with contextlib.suppress(exceptions.AlreadyExists):
                self._call(publisher.create_topic, {"name": topic})
        request: dict[str, Any] = {
            "name": self.subscription,
            "topic": self.topic,
            "ack_deadline_seconds": self.ack_deadline,
            "enable_exactly_once_delivery": self.exactly_once,
        }
        if self.dead_letter_topic is not None:
            # The dead-letter topic's subscription of the same name keeps what
            # reaches the topic (a topic keeps nothing without one) for reading back.
            keeper = self.dead_letter_topic.replace("/topics/", "/subscriptions/")
            with contextlib.suppress(exceptions.AlreadyExists):
                self._call(
                    subscriber.create_subscription,
                    {**request, "name": keeper, "topic": self.dead_letter_topic},
                )
            request["dead_letter_policy"] = {
                "dead_letter_topic": self.dead_letter_topic,
                "max_delivery_attempts": self.max_delivery_attempts,
            }
        with contextlib.suppress(exceptions.AlreadyExists):
            self._call(subscriber.create_subscription, request)

    def delete_queue(self) -> None:
        """Delete the subscription and the topic; succeed if they do not exist."""
        from google.api_core import exceptions

        publisher, subscriber = self._api()
        for call, request in (
            (subscriber.delete_subscription, {"subscription": self.subscription}),
            (publisher.delete_topic, {"topic": self.topic}),
        ):
            with contextlib.suppress(exceptions.NotFound):
                self._call(call, request)
        self._checked = False

    # ---------------------------------------------------------------- clients

    def _api(self) -> tuple[Any, Any]:
        """The publisher and subscriber API clients, made on first use."""
        clients = self._clients
        if clients is not None:
            return clients
        with self._lock:
            if self._clients is None:
                self._clients = self._make_clients()
            return self._clients

    def _make_clients(self) -> tuple[Any, Any]:
        from google.pubsub_v1 import PublisherClient, SubscriberClient
        from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        if self.endpoint is not None:
            import grpc

            channel = grpc.insecure_channel(self.endpoint, options=CHANNEL_OPTIONS)
            return (
                PublisherClient(transport=PublisherGrpcTransport(channel=channel)),
                SubscriberClient(transport=SubscriberGrpcTransport(channel=channel)),
            )
        credentials = self._credentials.value
        if self._credentials_file.value is not None:
            from google.oauth2 import service_account

            load: Any = service_account.Credentials.from_service_account_file
            credentials = load(
                self._credentials_file.value,
                scopes=["https://www.googleapis.com/auth/pubsub"],
            )
        channel = SubscriberGrpcTransport.create_channel(
            SubscriberGrpcTransport.DEFAULT_HOST + ":443",
            credentials=credentials,
            scopes=SubscriberGrpcTransport.AUTH_SCOPES,
            options=CHANNEL_OPTIONS,
        )
        return (
            PublisherClient(transport=PublisherGrpcTransport(channel=channel)),
            SubscriberClient(transport=SubscriberGrpcTransport(channel=channel)),
        )

    def _call(self, method: Any, request: Any, cap: float | None = None) -> Any:
        return method(request=request, retry=None, timeout=call_timeout(cap or self._timeout))

    def _check_subscription(self) -> None:
        """Read the subscription once: it must exist and match the declared capabilities."""
        if self._checked:
            return
        _, subscriber = self._api()
        sub = self._call(subscriber.get_subscription, {"subscription": self.subscription})
        if bool(sub.enable_exactly_once_delivery) != self.exactly_once:
            state = "on" if sub.enable_exactly_once_delivery else "off"
            raise DriverError(
                ErrorCode.INVALID_ARGUMENT,
                f"gcp-pubsub: {self.subscription} has exactly-once delivery {state}; "
                f"open it with exactly_once={'true' if state == 'on' else 'false'}",
            )
        policy_topic = sub.dead_letter_policy.dead_letter_topic or None
        if policy_topic != self.dead_letter_topic:
            raise DriverError(
                ErrorCode.INVALID_ARGUMENT,
                f"gcp-pubsub: {self.subscription} has dead-letter topic {policy_topic}; "
                f"open it with dead_letter_topic={policy_topic}",
            )
        self._pull_deadline = float(sub.ack_deadline_seconds or 10)
        self._checked = True

    # --------------------------------------------------------------- messages

    def validate(self, message: OutgoingMessage) -> None:
        """Refuse a message whose Publish request would pass 10,000,000 bytes, or bad attributes."""
        for key, value in message.properties.items():
            if key.startswith("goog") or len(key.encode()) > 256 or len(value.encode()) > 1024:
                raise DriverError(
                    ErrorCode.INVALID_ARGUMENT,
                    "gcp-pubsub: attribute keys are 1-256 bytes not starting with 'goog', "
                    "values at most 1,024 bytes",
                )
        if len(message.properties) > 100:
            raise DriverError(ErrorCode.INVALID_ARGUMENT, "gcp-pubsub: at most 100 attributes")
        size = len(message.body) + len(self.topic) + 16
        size += sum(len(k.encode()) + len(v.encode()) + 8 for k, v in message.properties.items())
        if size > MAX_PUBLISH_BYTES:
            raise DriverError(
                ErrorCode.TOO_LARGE,
                f"gcp-pubsub: the message ({len(message.body)} bytes with its attributes) "
                f"passes the {MAX_PUBLISH_BYTES}-byte publish limit",
            )

    def _pull_now(self, subscriber: Any, request: dict[str, Any]) -> Any:
        """``Pull`` with ``return_immediately``, through the client's gRPC stub.

        The flag is deprecated in the client (which warns on every call) but still
        in the API. Errors are raised as the client's exceptions.
        """
        from google.api_core import exceptions
        from google.pubsub_v1.types import PullRequest

        request["return_immediately"] = True
        try:
            return subscriber.transport.pull(
                PullRequest(request), timeout=call_timeout(self._timeout)
            )
        except grpc_error() as exc:
            convert: Any = exceptions.from_grpc_error
            raise convert(exc) from exc

    def _per_entry(
        self, call: Any, request: Any, ack_ids: Sequence[str]
    ) -> list[BaseException | None]:
        """Run an ack or modack; exactly-once failures become the failed entries' errors."""
        from google.api_core import exceptions

        try:
            self._call(call, request)
        except exceptions.InvalidArgument as exc:
            failures = _ack_failures(exc)
            if failures is None:
                raise
            results: list[BaseException | None] = []
            for ack_id in ack_ids:
                reason = failures.get(ack_id)
                if reason is None:
                    results.append(None)
                    continue
                if reason.startswith("TRANSIENT_"):
                    code = ErrorCode.UNAVAILABLE
                elif reason == "PERMANENT_FAILURE_INVALID_ACK_ID":
                    code = ErrorCode.LEASE_LOST
                else:
                    code = ErrorCode.UNKNOWN
                error = DriverError(
                    code, f"gcp-pubsub: the ack id was refused ({reason})", backend_code=reason
                )
                error.__cause__ = exc
                results.append(error)
            return results
        return [None] * len(ack_ids)

    def peek(self, limit: int) -> list[RawMessage]:
        """Pull up to ``limit`` (at most 1,000) and give them back at once (modack 0).

        Pub/Sub cannot peek: each peeked message counts a delivery, and while
        it is pulled (a round trip) no other consumer gets it.
        """
        pulled = self.receive(min(limit, MAX_BATCH), 0.0, 0.0)
        if pulled:
            self.change_visibility([m.receipt for m in pulled], 0.0)
        return pulled

    def dead_letter_queue(self) -> str | None:
        """The subscription's dead-letter topic id, where it has one."""
        if self.dead_letter_topic is None:
            return None
        return self.dead_letter_topic.rsplit("/", 1)[-1]

    def sibling(self, queue: str) -> PubSubDriver:
        """The topic and subscription named ``queue`` in the same project, on this connection."""
        twin = PubSubDriver(
            project=self.project,
            queue=queue,
            endpoint=self.endpoint,
            exactly_once=self.exactly_once,
            ack_deadline=self.ack_deadline,
            timeout=self._timeout,
        )
        twin._credentials = self._credentials
        twin._credentials_file = self._credentials_file
        twin._clients = self._api()  # one channel for both (made here if not yet: no I/O)
        twin._owns_clients = False
        return twin

    # ----------------------------------------------------------------- errors

    def error_code(self, exc: BaseException) -> ErrorCode:
        """Classify a ``google.api_core`` / ``google.auth`` error."""
        if isinstance(exc, DriverError):
            return exc.code
        return classify(exc)

    def backend_code(self, exc: BaseException) -> str | None:
        """The gRPC status name (``NOT_FOUND``) of a service error."""
        if isinstance(exc, DriverError):
            return exc.backend_code
        code = getattr(exc, "grpc_status_code", None)
        return getattr(code, "name", None)

    def is_retryable(self, exc: BaseException) -> bool:
        """Transient errors: the client's own retries are off."""
        return self.error_code(exc) is ErrorCode.UNAVAILABLE

    def close(self) -> None:
        """Close the gRPC channels (a sibling shares its parent's)."""
        if self._closed:
            return
        self._closed = True
        clients, self._clients = self._clients, None
        if clients is not None and self._owns_clients:
            for client in clients:
                client.transport.close()


def _request(name: str, **fields: Any) -> Any:
    """A request of the client's type ``name`` made from its protobuf message.

    Passing a dict makes the client convert each list entry through proto-plus
    (measured: a third of the batch's client time for 100 ack ids).
    """
    from google.pubsub_v1 import types

    cls = getattr(types, name)
    return cls.wrap(cls.pb()(**fields))


def grpc_error() -> type[Exception]:
    """``grpc.RpcError`` (imported when first needed)."""
    import grpc

    error: type[Exception] = grpc.RpcError
    return error


def _ack_failures(exc: Any) -> dict[str, str] | None:
    """The ``ack id → reason`` map of an exactly-once ack failure (``None``: not one)."""
    from google.rpc import error_details_pb2

    for detail in getattr(exc, "details", None) or ():
        if isinstance(detail, error_details_pb2.ErrorInfo) and (
            detail.reason == "EXACTLY_ONCE_ACKID_FAILURE"
        ):
            return dict(detail.metadata)
    return None


def classify(exc: BaseException) -> ErrorCode:
    """The :class:`ErrorCode` a ``google-cloud-pubsub`` error means."""
    from google.api_core import exceptions

    try:
        from google.auth import exceptions as auth_exceptions

        if isinstance(exc, auth_exceptions.GoogleAuthError):
            if isinstance(exc, auth_exceptions.TransportError):
                return ErrorCode.UNAVAILABLE
            return ErrorCode.UNAUTHENTICATED
    except ImportError:  # pragma: no cover - google-auth comes with the client
        pass
    if isinstance(exc, exceptions.NotFound):
        return ErrorCode.QUEUE_NOT_FOUND
    if isinstance(exc, exceptions.AlreadyExists):
        return ErrorCode.QUEUE_EXISTS
    if isinstance(exc, exceptions.InvalidArgument):
        if "size exceeds" in str(exc) or "too large" in str(exc).lower():
            return ErrorCode.TOO_LARGE
        return ErrorCode.INVALID_ARGUMENT
    if isinstance(exc, exceptions.PermissionDenied | exceptions.Unauthenticated):
        return ErrorCode.UNAUTHENTICATED
    if type(exc).__name__ in _TRANSIENT_CODES or isinstance(
        exc,
        exceptions.ServiceUnavailable
        | exceptions.DeadlineExceeded
        | exceptions.TooManyRequests
        | exceptions.Aborted
        | exceptions.InternalServerError
        | exceptions.RetryError,
    ):
        return ErrorCode.UNAVAILABLE
    if isinstance(exc, exceptions.MethodNotImplemented):
        return ErrorCode.UNSUPPORTED
    if isinstance(exc, ConnectionError | TimeoutError):
        return ErrorCode.UNAVAILABLE
    return ErrorCode.UNKNOWN
