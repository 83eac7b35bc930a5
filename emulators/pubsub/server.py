"""The gRPC server: ``google.pubsub.v1.Publisher``, ``Subscriber`` and ``google.iam.v1.IAMPolicy``.

Built with plain ``grpcio`` generic handlers over the message types that
``google-cloud-pubsub`` ships (no generated service code): each method is a
handler that deserializes its request with the protobuf class behind the
client's own proto-plus type and serializes the response the same way. The
official client reaches it unchanged through ``PUBSUB_EMULATOR_HOST``.

Errors carry the gRPC status and, for exactly-once ack failures, a
``google.rpc.Status`` with its details in the ``grpc-status-details-bin``
trailer (what ``google.api_core`` and the subscriber's ``_get_ack_errors`` read).

StreamingPull (from the ``StreamingPullRequest`` reference):
    The first request must name the subscription and set
    ``stream_ack_deadline_seconds`` (10-600), else ``INVALID_ARGUMENT``; later
    requests must not set ``subscription``, ``client_id``,
    ``max_outstanding_messages`` or ``max_outstanding_bytes`` (the stream aborts
    with ``INVALID_ARGUMENT``), may change the stream's ack deadline with a
    non-zero ``stream_ack_deadline_seconds``, and may carry acks and modacks
    (``modify_deadline_ack_ids`` and ``modify_deadline_seconds`` of equal length).
    The server stops sending while ``max_outstanding_messages`` messages or
    ``max_outstanding_bytes`` bytes delivered on the stream are unsettled (<= 0:
    no limit; CHOICE: one message is sent even if alone it passes the byte limit).
    Each response stays under 4 MiB, the client's default limit (CHOICE: a
    single larger message goes alone). Every response carries the
    ``subscription_properties``; with exactly-once, acks and modacks sent on the
    stream are confirmed in ``acknowledge_confirmation`` /
    ``modify_ack_deadline_confirmation`` (valid and invalid ack ids). CHOICE: an
    empty response is sent every ``heartbeat`` seconds (default 15) while there is
    nothing to deliver. A cancelled stream leaves its messages leased until their
    deadlines.

Pull waits for messages until shortly before the call's deadline or
``max_pull_wait`` seconds (CHOICE: 10), whichever is first, then returns an
empty response; ``return_immediately`` returns at once.

IAM (CHOICE): policies are stored per resource and returned with a fresh etag on
each set; ``TestIamPermissions`` grants every ``pubsub.*`` permission asked for
(the emulator has no identities).

Not emulated: push delivery (push configs are stored only), BigQuery and Cloud
Storage subscriptions, schemas, snapshots and Seek (``UNIMPLEMENTED``), message
transforms, topic retention replay, expiration of idle subscriptions,
authentication.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from google.iam.v1 import iam_policy_pb2, policy_pb2
from google.protobuf import empty_pb2
from google.pubsub_v1.types import pubsub
from google.rpc import status_pb2
from grpc_status import rpc_status

from .broker import MAX_ACK_DEADLINE, MIN_ACK_DEADLINE, Broker, Clock, EmulatorError, Sub

__all__ = ["PubSubEmulator"]

log = logging.getLogger("leasekit.emulators.pubsub")

#: The client's default receive limit; a StreamingPull response stays below it.
RESPONSE_LIMIT = 4 * 1024 * 1024 - 64 * 1024
DEFAULT_HEARTBEAT = 15.0
DEFAULT_MAX_PULL_WAIT = 10.0
#: Largest request the server reads (a Publish over 10 MB must reach the check).
MAX_REQUEST = 32 * 1024 * 1024


def _pb(cls: Any) -> Any:
    return cls.pb()


def _abort(context: grpc.ServicerContext, error: EmulatorError) -> None:
    status = status_pb2.Status(code=error.code.value[0], message=error.message)
    status.details.extend(error.details)
    context.abort_with_status(rpc_status.to_status(status))


def _unary(handler: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[..., Any]:
    @functools.wraps(handler)
    def call(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return handler(request, context)
        except EmulatorError as exc:
            _abort(context, exc)
            raise AssertionError("unreachable") from None  # abort raises

    return call


def _page(items: list[Any], size: int, token: str) -> tuple[list[Any], str]:
    start = int(token) if token.isdigit() else 0
    size = size if size > 0 else 100
    end = start + size
    return items[start:end], (str(end) if end < len(items) else "")


class _Stream:
    """One StreamingPull call's state."""

    def __init__(self, sub: Sub, first: Any) -> None:
        self.sub = sub
        self.deadline = first.stream_ack_deadline_seconds
        self.max_messages = first.max_outstanding_messages
        self.max_bytes = first.max_outstanding_bytes
        self.confirm_acks: list[tuple[str, bool]] = []
        self.confirm_modacks: list[tuple[str, bool]] = []
        self.error: EmulatorError | None = None
        self.done = False


class PubSubEmulator:
    """A Pub/Sub emulator serving on ``host:port`` (0 picks a free port); a context manager.

    ``clock`` replaces the machine's clock (``ManualClock`` for tests).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        clock: Clock | None = None,
        heartbeat: float = DEFAULT_HEARTBEAT,
        max_pull_wait: float = DEFAULT_MAX_PULL_WAIT,
        max_workers: int = 64,
    ) -> None:
        self.broker = Broker(clock)
        self.heartbeat = heartbeat
        self.max_pull_wait = max_pull_wait
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="pubsub"),
            options=[
                ("grpc.max_receive_message_length", MAX_REQUEST),
                ("grpc.max_send_message_length", -1),
            ],
        )
        self._server.add_generic_rpc_handlers(self._handlers())
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        self.host = host

    @property
    def address(self) -> str:
        """``host:port``, the value for ``PUBSUB_EMULATOR_HOST``."""
        return f"{self.host}:{self.port}"

    def start(self) -> PubSubEmulator:
        """Start serving (returns at once)."""
        self._server.start()
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; calls in progress get ``grace`` seconds."""
        with self.broker.changed:
            self.broker.changed.notify_all()
        self._server.stop(grace).wait()

    def wait(self) -> None:
        """Block until the server stops."""
        self._server.wait_for_termination()

    def __enter__(self) -> PubSubEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --------------------------------------------------------------- handlers

    def _handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        def unary(handler: Callable[..., Any], request: Any, response: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                _unary(handler),
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )

        p = pubsub
        empty = empty_pb2.Empty
        publisher = {
            "CreateTopic": unary(self.create_topic, _pb(p.Topic), _pb(p.Topic)),
            "UpdateTopic": unary(self.update_topic, _pb(p.UpdateTopicRequest), _pb(p.Topic)),
            "Publish": unary(self.publish, _pb(p.PublishRequest), _pb(p.PublishResponse)),
            "GetTopic": unary(self.get_topic, _pb(p.GetTopicRequest), _pb(p.Topic)),
            "ListTopics": unary(
                self.list_topics, _pb(p.ListTopicsRequest), _pb(p.ListTopicsResponse)
            ),
            "ListTopicSubscriptions": unary(
                self.list_topic_subscriptions,
                _pb(p.ListTopicSubscriptionsRequest),
                _pb(p.ListTopicSubscriptionsResponse),
            ),
            "ListTopicSnapshots": unary(
                self.list_topic_snapshots,
                _pb(p.ListTopicSnapshotsRequest),
                _pb(p.ListTopicSnapshotsResponse),
            ),
            "DeleteTopic": unary(self.delete_topic, _pb(p.DeleteTopicRequest), empty),
            "DetachSubscription": unary(
                self.detach_subscription,
                _pb(p.DetachSubscriptionRequest),
                _pb(p.DetachSubscriptionResponse),
            ),
        }
        subscriber = {
            "CreateSubscription": unary(
                self.create_subscription, _pb(p.Subscription), _pb(p.Subscription)
            ),
            "GetSubscription": unary(
                self.get_subscription, _pb(p.GetSubscriptionRequest), _pb(p.Subscription)
            ),
            "UpdateSubscription": unary(
                self.update_subscription, _pb(p.UpdateSubscriptionRequest), _pb(p.Subscription)
            ),
            "ListSubscriptions": unary(
                self.list_subscriptions,
                _pb(p.ListSubscriptionsRequest),
                _pb(p.ListSubscriptionsResponse),
            ),
            "DeleteSubscription": unary(
                self.delete_subscription, _pb(p.DeleteSubscriptionRequest), empty
            ),
            "ModifyAckDeadline": unary(
                self.modify_ack_deadline, _pb(p.ModifyAckDeadlineRequest), empty
            ),
            "Acknowledge": unary(self.acknowledge, _pb(p.AcknowledgeRequest), empty),
            "Pull": unary(self.pull, _pb(p.PullRequest), _pb(p.PullResponse)),
            "StreamingPull": grpc.stream_stream_rpc_method_handler(
                self.streaming_pull,
                request_deserializer=_pb(p.StreamingPullRequest).FromString,
                response_serializer=_pb(p.StreamingPullResponse).SerializeToString,
            ),
            "ModifyPushConfig": unary(
                self.modify_push_config, _pb(p.ModifyPushConfigRequest), empty
            ),
        }
        iam = {
            "SetIamPolicy": unary(
                self.set_iam_policy, iam_policy_pb2.SetIamPolicyRequest, policy_pb2.Policy
            ),
            "GetIamPolicy": unary(
                self.get_iam_policy, iam_policy_pb2.GetIamPolicyRequest, policy_pb2.Policy
            ),
            "TestIamPermissions": unary(
                self.test_iam_permissions,
                iam_policy_pb2.TestIamPermissionsRequest,
                iam_policy_pb2.TestIamPermissionsResponse,
            ),
        }
        return (
            grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", publisher),
            grpc.method_handlers_generic_handler("google.pubsub.v1.Subscriber", subscriber),
            grpc.method_handlers_generic_handler("google.iam.v1.IAMPolicy", iam),
        )

    # -------------------------------------------------------------- publisher

    def create_topic(self, request: Any, context: grpc.ServicerContext) -> Any:
        """CreateTopic."""
        return self.broker.create_topic(request)

    def update_topic(self, request: Any, context: grpc.ServicerContext) -> Any:
        """UpdateTopic."""
        return self.broker.update_topic(request.topic, list(request.update_mask.paths))

    def get_topic(self, request: Any, context: grpc.ServicerContext) -> Any:
        """GetTopic."""
        return self.broker.get_topic(request.topic)

    def list_topics(self, request: Any, context: grpc.ServicerContext) -> Any:
        """ListTopics, paged."""
        topics, token = _page(
            self.broker.list_topics(request.project), request.page_size, request.page_token
        )
        return _pb(pubsub.ListTopicsResponse)(topics=topics, next_page_token=token)

    def list_topic_subscriptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        """ListTopicSubscriptions, paged."""
        names, token = _page(
            self.broker.topic_subscriptions(request.topic), request.page_size, request.page_token
        )
        return _pb(pubsub.ListTopicSubscriptionsResponse)(
            subscriptions=names, next_page_token=token
        )

    def list_topic_snapshots(self, request: Any, context: grpc.ServicerContext) -> Any:
        """ListTopicSnapshots: the emulator has no snapshots."""
        self.broker.get_topic(request.topic)
        return _pb(pubsub.ListTopicSnapshotsResponse)()

    def delete_topic(self, request: Any, context: grpc.ServicerContext) -> Any:
        """DeleteTopic."""
        self.broker.delete_topic(request.topic)
        return empty_pb2.Empty()

    def detach_subscription(self, request: Any, context: grpc.ServicerContext) -> Any:
        """DetachSubscription."""
        self.broker.detach_subscription(request.subscription)
        return _pb(pubsub.DetachSubscriptionResponse)()

    def publish(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Publish."""
        ids = self.broker.publish(request.topic, request.messages, request.ByteSize())
        return _pb(pubsub.PublishResponse)(message_ids=ids)

    # ------------------------------------------------------------- subscriber

    def create_subscription(self, request: Any, context: grpc.ServicerContext) -> Any:
        """CreateSubscription."""
        return self.broker.create_subscription(request)

    def get_subscription(self, request: Any, context: grpc.ServicerContext) -> Any:
        """GetSubscription."""
        return self.broker.get_subscription(request.subscription)

    def update_subscription(self, request: Any, context: grpc.ServicerContext) -> Any:
        """UpdateSubscription."""
        return self.broker.update_subscription(
            request.subscription, list(request.update_mask.paths)
        )

    def list_subscriptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        """ListSubscriptions, paged."""
        subs, token = _page(
            self.broker.list_subscriptions(request.project), request.page_size, request.page_token
        )
        return _pb(pubsub.ListSubscriptionsResponse)(subscriptions=subs, next_page_token=token)

    def delete_subscription(self, request: Any, context: grpc.ServicerContext) -> Any:
        """DeleteSubscription."""
        self.broker.delete_subscription(request.subscription)
        return empty_pb2.Empty()

    def modify_push_config(self, request: Any, context: grpc.ServicerContext) -> Any:
        """ModifyPushConfig: stored, never used."""
        update = _pb(pubsub.Subscription)(name=request.subscription)
        update.push_config.CopyFrom(request.push_config)
        self.broker.update_subscription(update, ["push_config"])
        return empty_pb2.Empty()

    def acknowledge(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Acknowledge (exactly-once failures as ErrorInfo)."""
        results = self.broker.acknowledge(request.subscription, list(request.ack_ids))
        self.broker.raise_failures(request.subscription, results)
        return empty_pb2.Empty()

    def modify_ack_deadline(self, request: Any, context: grpc.ServicerContext) -> Any:
        """ModifyAckDeadline (exactly-once failures as ErrorInfo)."""
        results = self.broker.modify_ack_deadline(
            request.subscription, list(request.ack_ids), request.ack_deadline_seconds
        )
        self.broker.raise_failures(request.subscription, results)
        return empty_pb2.Empty()

    def pull(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Pull: wait (bounded) for messages, lease them for the subscription's deadline."""
        if request.max_messages <= 0:
            raise EmulatorError(
                grpc.StatusCode.INVALID_ARGUMENT, "max_messages must be a positive integer."
            )
        sub = self.broker.pullable(request.subscription)
        remaining = context.time_remaining()
        wait = (
            self.max_pull_wait if remaining is None else min(self.max_pull_wait, remaining - 0.05)
        )
        until = time.monotonic() + (0.0 if request.return_immediately else max(0.0, wait))
        broker = self.broker
        with broker.changed:
            while True:
                if broker.subs.get(request.subscription) is not sub:
                    raise EmulatorError(
                        grpc.StatusCode.NOT_FOUND,
                        f"Resource not found (resource={request.subscription}).",
                    )
                taken = broker.take(
                    sub,
                    request.max_messages,
                    sub.pb.ack_deadline_seconds,
                    byte_budget=RESPONSE_LIMIT,
                )
                left = until - time.monotonic()
                if taken or left <= 0 or not context.is_active():
                    return _pb(pubsub.PullResponse)(received_messages=taken)
                broker.changed.wait(self._sleep(sub, left))

    def _sleep(self, sub: Sub, left: float) -> float:
        """How long to wait for a change: until the next lease end (real time), at most ``left``."""
        event = self.broker.next_event(sub)
        if event is None:
            return left
        return max(0.005, min(left, event - self.broker.clock.now() + 0.001))

    def streaming_pull(
        self, requests: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[Any]:
        """StreamingPull: see the module docstring."""
        try:
            first = next(requests)
        except StopIteration:
            return
        try:
            stream = self._open_stream(first)
        except EmulatorError as exc:
            _abort(context, exc)
            return
        broker = self.broker
        incoming: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def on_done() -> None:
            stream.done = True
            with broker.changed:
                broker.changed.notify_all()

        context.add_callback(on_done)
        try:
            self._settle(stream, first)
        except EmulatorError as exc:
            _abort(context, exc)
            return
        reader = threading.Thread(
            target=self._read,
            args=(stream, requests, incoming),
            daemon=True,
            name="pubsub-stream-reader",
        )
        reader.start()
        response_type = _pb(pubsub.StreamingPullResponse)
        last_sent = time.monotonic()
        sub = stream.sub
        while not stream.done and context.is_active():
            with broker.changed:
                if stream.error is not None:
                    break
                if broker.subs.get(sub.pb.name) is not sub or sub.pb.detached:
                    stream.error = EmulatorError(
                        grpc.StatusCode.NOT_FOUND,
                        f"Resource not found (resource={sub.pb.name}).",
                    )
                    break
                count, size = broker.outstanding(sub, stream)
                room = (stream.max_messages - count) if stream.max_messages > 0 else 1000
                room_bytes = (stream.max_bytes - size) if stream.max_bytes > 0 else 0
                taken: list[Any] = []
                if room > 0 and (stream.max_bytes <= 0 or room_bytes > 0):
                    taken = broker.take(
                        sub,
                        min(room, 1000),
                        stream.deadline,
                        stream=stream,
                        max_bytes=room_bytes,
                        byte_budget=RESPONSE_LIMIT,
                    )
                acks, stream.confirm_acks = stream.confirm_acks, []
                modacks, stream.confirm_modacks = stream.confirm_modacks, []
                exactly_once = sub.exactly_once
                ordering = sub.pb.enable_message_ordering
                idle = time.monotonic() - last_sent
                if not (taken or acks or modacks) and idle < self.heartbeat:
                    broker.changed.wait(self._sleep(sub, self.heartbeat - idle))
                    continue
            response = response_type(received_messages=taken)
            response.subscription_properties.exactly_once_delivery_enabled = exactly_once
            response.subscription_properties.message_ordering_enabled = ordering
            if acks:
                confirm = response.acknowledge_confirmation
                confirm.ack_ids.extend(a for a, ok in acks if ok)
                confirm.invalid_ack_ids.extend(a for a, ok in acks if not ok)
            if modacks:
                confirm_m = response.modify_ack_deadline_confirmation
                confirm_m.ack_ids.extend(a for a, ok in modacks if ok)
                confirm_m.invalid_ack_ids.extend(a for a, ok in modacks if not ok)
            last_sent = time.monotonic()
            yield response
        stream.done = True
        if stream.error is not None and context.is_active():
            _abort(context, stream.error)

    def _open_stream(self, first: Any) -> _Stream:
        if not first.subscription:
            raise EmulatorError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "The first request on a stream must name the subscription.",
            )
        deadline = first.stream_ack_deadline_seconds
        if not MIN_ACK_DEADLINE <= deadline <= MAX_ACK_DEADLINE:
            raise EmulatorError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Invalid stream_ack_deadline_seconds: {deadline} (must be between "
                f"{MIN_ACK_DEADLINE} and {MAX_ACK_DEADLINE}).",
            )
        sub = self.broker.pullable(first.subscription)
        return _Stream(sub, first)

    def _read(self, stream: _Stream, requests: Iterator[Any], incoming: Any) -> None:
        try:
            for request in requests:
                if stream.done:
                    return
                if (
                    request.subscription
                    or request.client_id
                    or request.max_outstanding_messages
                    or request.max_outstanding_bytes
                ):
                    raise EmulatorError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "subscription, client_id and max_outstanding_* may only be set in "
                        "the first request on a stream.",
                    )
                seconds = request.stream_ack_deadline_seconds
                if seconds:
                    if not MIN_ACK_DEADLINE <= seconds <= MAX_ACK_DEADLINE:
                        raise EmulatorError(
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"Invalid stream_ack_deadline_seconds: {seconds}.",
                        )
                    stream.deadline = seconds
                self._settle(stream, request)
        except EmulatorError as exc:
            with self.broker.changed:
                stream.error = exc
                self.broker.changed.notify_all()
        except grpc.RpcError:
            pass  # the call ended (cancelled by the client)
        except Exception:  # a reader must never kill the server
            log.exception("StreamingPull reader failed")
        finally:
            with self.broker.changed:
                self.broker.changed.notify_all()

    def _settle(self, stream: _Stream, request: Any) -> None:
        """The acks and modacks of one stream request."""
        if len(request.modify_deadline_ack_ids) != len(request.modify_deadline_seconds):
            raise EmulatorError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "modify_deadline_ack_ids and modify_deadline_seconds must have the same length.",
            )
        name = stream.sub.pb.name
        exactly_once = stream.sub.exactly_once
        if request.ack_ids:
            results = self.broker.acknowledge(name, list(request.ack_ids))
            if exactly_once:
                with self.broker.changed:
                    stream.confirm_acks.extend(results.items())
        by_seconds: dict[int, list[str]] = {}
        for ack_id, seconds in zip(
            request.modify_deadline_ack_ids, request.modify_deadline_seconds, strict=True
        ):
            by_seconds.setdefault(seconds, []).append(ack_id)
        for seconds, ack_ids in by_seconds.items():
            results = self.broker.modify_ack_deadline(name, ack_ids, seconds)
            if exactly_once:
                with self.broker.changed:
                    stream.confirm_modacks.extend(results.items())

    # -------------------------------------------------------------------- IAM

    def _resource(self, resource: str) -> None:
        if "/subscriptions/" in resource:
            self.broker.get_subscription(resource)
        else:
            self.broker.get_topic(resource)

    def get_iam_policy(self, request: Any, context: grpc.ServicerContext) -> Any:
        """GetIamPolicy: the stored policy (an empty one at first)."""
        self._resource(request.resource)
        with self.broker.changed:
            stored = self.broker.policies.get(request.resource)
        return stored if stored is not None else policy_pb2.Policy(etag=b"\x00")

    def set_iam_policy(self, request: Any, context: grpc.ServicerContext) -> Any:
        """SetIamPolicy: stored with a new etag."""
        self._resource(request.resource)
        policy = policy_pb2.Policy()
        policy.CopyFrom(request.policy)
        with self.broker.changed:
            version = len(self.broker.policies) + int(time.monotonic_ns() % 1_000_000)
            policy.etag = version.to_bytes(8, "big")
            self.broker.policies[request.resource] = policy
        return policy

    def test_iam_permissions(self, request: Any, context: grpc.ServicerContext) -> Any:
        """TestIamPermissions: every ``pubsub.*`` permission asked for."""
        self._resource(request.resource)
        granted = [p for p in request.permissions if p.startswith("pubsub.")]
        return iam_policy_pb2.TestIamPermissionsResponse(permissions=granted)
