"""The AMQP 1.0 face of the Service Bus emulator, on python-qpid-proton.

Serves the ``azure-servicebus`` SDK (sync and aio, >= 7.15) connected with
``Endpoint=sb://127.0.0.1:PORT;...;UseDevelopmentEmulator=true``: plain TCP, no TLS.

Emulated on the wire:
    * SASL ANONYMOUS only (proton's built-in SASL has no PLAIN server); any CBS
      ``put-token`` on ``$cbs`` is accepted (status-code 202); tokens are not
      validated or expired;
    * sender links to ``<queue>``: single messages and batches (message-format
      0x80013700, recognised by shape), scheduled enqueue time annotation, accepted
      outcome per transfer; oversize or malformed transfers are rejected;
    * receiver links from ``<queue>`` or ``<queue>/$deadletterqueue``: PeekLock
      (rcv-settle-mode second) and ReceiveAndDelete (snd-settle-mode settled);
      credit-based flow; drain answered by giving up the credit;
    * a delivery's tag is its 16-byte lock token (``uuid.bytes_le``); message
      annotations ``x-opt-sequence-number``, ``x-opt-enqueued-time``,
      ``x-opt-locked-until``; header ``delivery-count`` = failed deliveries so far;
    * dispositions: accepted = complete, modified(delivery-failed) = abandon,
      modified(undeliverable-here) = defer, rejected = dead-letter (reason and
      description from the error info), released = unlock without counting; every
      unsettled disposition is answered with a settled disposition repeating the
      outcome, or ``rejected`` with ``com.microsoft:message-lock-lost`` when the lock
      is gone;
    * ``<entity>/$management`` request/response: ``com.microsoft:renew-lock``,
      ``peek-message``, ``receive-by-sequence-number``, ``update-disposition``,
      ``schedule-message``, ``cancel-scheduled-message``; lock lost gives status 410
      with ``errorCondition`` ``com.microsoft:message-lock-lost``, as does an
      ``update-disposition`` for a message whose receiving connection is gone
      (Service Bus drops those locks; ``renew-lock`` still extends them);
    * entity management over HTTP on a second port, as ``ServiceBusAdministrationClient``
      calls it (:mod:`.admin`); a deleted queue's links are detached with
      ``amqp:not-found``;
    * an unknown entity gets its attach answered and then detached with
      ``amqp:not-found`` (the SDK raises ``MessagingEntityNotFoundError``);
    * delivery-ids as Service Bus takes them (out of order or repeated), proton-made
      errors with all three fields, and a plain-HTTP answer to WebSocket: the
      :class:`~.wire.RewritingIOHandler` between each socket and proton;
    * a disposition for a delivery of a detached link is ignored, unanswered, as
      Service Bus drops a closed link's unsettled deliveries.

Sessions (``RequiresSession`` queues, rules in :mod:`.sessions`): a receiver
attaches with the source filter ``com.microsoft:session-filter`` naming a session,
or null for the next available one; the attach is answered once a session is
locked to the link, with the accepted id in that filter and the lock's end in the
link property ``com.microsoft:locked-until-utc`` (.NET ticks); with no session
available within the link's ``com.microsoft:timeout`` (milliseconds; 60 s without
it), the attach is answered and detached with ``com.microsoft:timeout``; a named
session locked by another receiver gets ``com.microsoft:session-cannot-be-locked``.
The session's messages go, in order, to that one link; ``$management`` serves
``renew-session-lock``, ``get-session-state`` and ``set-session-state`` (and
``peek-message`` / ``update-disposition`` with a ``session-id``); a lost session
lock makes settles fail with ``com.microsoft:session-lock-lost`` and detaches the
link with it. A sender's message without a session id on such a queue, and a
receiver whose session mode does not fit the queue, get Service Bus' own
``amqp:not-allowed``.

Not emulated, refused at attach: topics and subscriptions, queues that set
duplicate detection or auto-forwarding. Not emulated at all: TLS, token validation
and expiry, transactions, link redirects, rules, ``get-message-sessions``, message
size quotas per entity. proton's container is not thread-safe: every state change
here runs on the container thread, and timers (lock expiry, TTL, scheduled
messages) are a periodic container task, not threads.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from proton import (
    UNDESCRIBED,
    Array,
    Condition,
    Data,
    Delivery,
    Endpoint,
    Handler,
    Message,
    Terminus,
    int32,
    symbol,
)
from proton.reactor import ApplicationEvent, Container, EventInjector

from .admin import AdminHttpServer, AdminRequest
from .admin import handle as handle_admin
from .broker import (
    Broker,
    EntityNotFound,
    LockLost,
    MessageNotFound,
    MessageState,
    Queue,
    Session,
    SessionCannotBeLocked,
    SessionLockLost,
    StoredMessage,
    SubQueue,
)
from .codec import (
    Section,
    inspect,
    ms_timestamp,
    property_quota_error,
    render,
    service_decimals,
    split_sections,
    unpack,
)
from .wire import RewritingIOHandler

__all__ = ["MAX_MESSAGE_SIZE", "ServiceBusEmulator"]

_log = logging.getLogger("leasekit.emulators.servicebus")

MAX_MESSAGE_SIZE = 256 * 1024
"""Largest message (or batch) accepted, as on the Standard tier."""

CREDIT_WINDOW = 100
TICK_SECONDS = 0.05

LOCK_LOST = "com.microsoft:message-lock-lost"
LOCK_LOST_TEXT = (
    "The lock supplied is invalid. Either the lock expired, or the message has already "
    "been removed from the queue."
)
DEAD_LETTER = "com.microsoft:dead-letter"
OP_PREFIX = "com.microsoft:"
SESSION_FILTER = "com.microsoft:session-filter"
SESSION_LOCKED_UNTIL = "com.microsoft:locked-until-utc"
SESSION_LOCK_LOST = "com.microsoft:session-lock-lost"
SESSION_CANNOT_BE_LOCKED = "com.microsoft:session-cannot-be-locked"
OPERATION_TIMEOUT = "com.microsoft:timeout"
#: The service's operation timeout when a link sets none (seconds).
DEFAULT_OPERATION_TIMEOUT = 60.0
#: .NET ticks (100 ns) at the Unix epoch: ``com.microsoft:locked-until-utc`` counts them.
DOTNET_EPOCH_TICKS = 621355968000000000
NO_SESSION_ID = (
    "The SessionId was not set on a message, and it cannot be sent to the entity. Entities "
    "that have session support enabled can only receive messages that have the SessionId "
    "set to a valid value."
)
TOPICS_UNSUPPORTED = "Topics and subscriptions are not supported by this emulator."


def entity_path(address: str | None) -> str:
    """Reduce a link address to an entity path.

    ``amqps://host:port/orders``, ``sb://host/orders`` and ``orders`` all give
    ``orders``; sub-paths (``orders/$DeadLetterQueue``) are kept.

    Parameters:
        address: the terminus address.

    Returns:
        The path without scheme, host and surrounding slashes.
    """
    text = address or ""
    if "://" in text:
        text = text.split("://", 1)[1]
        text = text.split("/", 1)[1] if "/" in text else ""
    return text.strip("/")


def _elements(value: Any) -> list[Any]:
    if isinstance(value, Array):
        return list(value.elements)
    if isinstance(value, list | tuple):
        return list(value)
    if value is None:
        return []
    return [value]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


class _MgmtError(Exception):
    def __init__(self, status: int, condition: str, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.condition = condition
        self.description = description


class ServiceBusEmulator(Handler):
    """The proton event handler: one instance serves every connection.

    Parameters:
        broker: queue state and semantics.
        host: address to listen on.
        port: port to listen on.
        http_port: port of the management API over HTTP (:mod:`.admin`), bound at
            once; ``None`` serves none.
        clock: the time source (``time.time``); tests may pass another.
    """

    def __init__(
        self,
        broker: Broker,
        host: str = "127.0.0.1",
        port: int = 5672,
        *,
        http_port: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.broker = broker
        self.host = host
        self.port = port
        self.clock = clock
        self._injector = EventInjector()
        self._http = (
            AdminHttpServer(host, http_port, self._submit_admin) if http_port is not None else None
        )
        self._consumers: dict[int, list[Any]] = {}  # id(SubQueue) -> consumer links
        self._entity_links: dict[int, list[Any]] = {}  # id(Queue) -> every link bound to it
        # id(SubQueue) -> session receive links waiting for the next available session
        self._waiting: dict[int, list[Any]] = {}
        self._session_links: dict[int, Any] = {}  # link id -> a link holding a session
        self._acceptor: Any = None
        self._container: Any = None
        self._closing = False
        self._stop_requested = False

    # -- lifecycle ----------------------------------------------------------------------------

    def run(self) -> None:
        """Listen and serve until :meth:`stop` or an exception (e.g. from a signal)."""
        self._container = Container(self)
        # Between each socket and proton: delivery-ids as Service Bus takes them,
        # full error fields, a plain answer to WebSocket (see .frames and .wire).
        self._container.global_handler = RewritingIOHandler()
        if self._http is not None:
            self._http.start()
        try:
            self._container.run()
        finally:
            if self._http is not None:
                self._http.stop()

    def request_stop(self) -> None:
        """Ask the event loop to stop at its next tick (safe from a signal handler).

        Only sets a flag; the timer task, on the container thread, then calls
        :meth:`stop`. The loop wakes every ``TICK_SECONDS``, so it stops promptly.
        """
        self._stop_requested = True

    def stop(self) -> None:
        """Stop listening and close every connection (call on the container thread)."""
        self._closing = True
        self._injector.close()
        if self._acceptor is not None:
            self._acceptor.close()
        if self._container is not None:
            self._container.stop()

    def on_reactor_init(self, event: Any) -> None:
        """Start listening and the timer."""
        event.container.selectable(self._injector)
        self._acceptor = event.container.listen(f"{self.host}:{self.port}")
        event.container.schedule(TICK_SECONDS, self)
        _log.info("Service Bus emulator listening on %s:%s", self.host, self.port)
        if self._http is not None:
            _log.info("management API (HTTP) on %s:%s", self.host, self._http.port)

    # -- management over HTTP -------------------------------------------------------------

    def _submit_admin(self, request: AdminRequest) -> None:
        """From an HTTP thread: hand ``request`` to the container thread."""
        self._injector.trigger(ApplicationEvent("sb_admin", subject=request))

    def on_sb_admin(self, event: Any) -> None:
        """Answer a management request on the container thread (it owns the broker)."""
        request: AdminRequest = event.subject
        try:
            request.response = handle_admin(self.broker, request, self._queue_deleted)
        finally:
            request.done.set()

    def _queue_deleted(self, queue: Queue) -> None:
        """Detach every link of a deleted queue with ``amqp:not-found``."""
        for link in list(self._entity_links.get(id(queue), [])):
            self._forget_link(link)
            link.condition = _condition(
                "amqp:not-found", f"The messaging entity '{queue.name}' was deleted."
            )
            link.close()

    def on_timer_task(self, event: Any) -> None:
        """Apply lock expiry, TTL and scheduled enqueue; feed waiting receivers."""
        if self._closing:
            return
        if self._stop_requested:
            self.stop()
            return
        now = self.clock()
        for queue in self.broker.expire(now):
            self._pump_entity(queue.active)
            self._pump_entity(queue.dead_letter)
        for queue in self.broker.queues:
            self._detach_lost_sessions(queue.active)
        self._time_out_waiting(now)
        event.container.schedule(TICK_SECONDS, self)

    # -- connection, session, link endpoints --------------------------------------------------

    def on_connection_bound(self, event: Any) -> None:
        """Offer SASL ANONYMOUS on accepted connections; number the connection."""
        event.connection.sb_id = next(_connection_ids)
        sasl = event.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        sasl.allow_insecure_mechs = True

    def on_connection_remote_open(self, event: Any) -> None:
        """Open the connection."""
        conn = event.connection
        if conn.state & Endpoint.LOCAL_UNINIT:
            conn.container = "leasekit-servicebus-emulator"
            conn.open()

    def on_connection_remote_close(self, event: Any) -> None:
        """Close the connection and forget its links."""
        self._forget_connection(event.connection)
        if event.connection.state & Endpoint.LOCAL_ACTIVE:
            event.connection.close()

    def on_transport_closed(self, event: Any) -> None:
        """Forget the links of a connection whose socket closed (reset or closed).

        As Service Bus does with a broken connection ("the lock is dropped",
        Message transfers, locks, and settlement): its sessions are released at
        once, their messages uncounted (:mod:`.sessions`), and its other locks can
        no longer settle (:meth:`Broker.drop_connection_locks`).
        """
        if event.connection is not None:
            self._forget_connection(event.connection)

    def on_transport_error(self, event: Any) -> None:
        """Log transport errors (port probes without AMQP end up here)."""
        cond = event.transport.condition
        _log.debug("transport error: %s", cond)

    def on_session_remote_open(self, event: Any) -> None:
        """Open the session."""
        if event.session.state & Endpoint.LOCAL_UNINIT:
            event.session.open()

    def on_session_remote_close(self, event: Any) -> None:
        """Close the session."""
        if event.session.state & Endpoint.LOCAL_ACTIVE:
            event.session.close()

    def on_link_remote_close(self, event: Any) -> None:
        """Close the link; its locks stay until they expire, as in Service Bus."""
        link = event.link
        self._forget_link(link)
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.close()

    def on_link_remote_detach(self, event: Any) -> None:
        """Detach the link."""
        link = event.link
        self._forget_link(link)
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.detach()

    def _forget_link(self, link: Any) -> None:
        entity: SubQueue | None = getattr_safe(link, "sb_entity")
        waiting = self._waiting.get(id(entity)) if entity is not None else None
        if waiting is not None and link in waiting:
            waiting.remove(link)
        session: Session | None = getattr_safe(link, "sb_session")
        if entity is not None and session is not None:
            link.sb_session = None
            self._session_links.pop(link.sb_link_id, None)
            # The receiver let the session go: its unsettled messages come back.
            if entity.release_session(session.session_id, link.sb_link_id, self.clock()):
                self._pump_entity(entity)
        if entity is not None:
            for registry, key in (
                (self._consumers, id(entity)),
                (self._entity_links, id(entity.queue)),
            ):
                links = registry.get(key, [])
                if link in links:
                    links.remove(link)
                if not links:
                    registry.pop(key, None)
        link.sb_kind = "closed"

    def _forget_connection(self, conn: Any) -> None:
        link = conn.link_head(0)
        while link is not None:
            self._forget_link(link)
            link = link.next(0)
        owner: int | None = getattr_safe(conn, "sb_id")
        if owner is not None and not getattr_safe(conn, "sb_gone"):
            # Service Bus drops the locks of a connection that is gone: the messages
            # stay locked until their locks end, but cannot be settled by token.
            conn.sb_gone = True
            dropped = self.broker.drop_connection_locks(owner)
            if dropped:
                _log.debug("connection %s gone: %d locks can no longer settle", owner, dropped)

    def on_link_remote_open(self, event: Any) -> None:
        """Answer an attach: classify the address and set the link up (or refuse it)."""
        link = event.link
        if not link.state & Endpoint.LOCAL_UNINIT:
            return
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        address = link.remote_source.address if link.is_sender else link.remote_target.address
        path = entity_path(address)
        try:
            self._classify(link, path)
        except EntityNotFound:
            self._refuse(
                link,
                "amqp:not-found",
                f"The messaging entity 'sb://{self.host}:{self.port}/{path}' could not be found.",
            )
            return
        except _Refused as exc:
            self._refuse(link, exc.condition, exc.description)
            return
        if link.is_sender:
            link.max_message_size = 0
        else:
            link.max_message_size = MAX_MESSAGE_SIZE
        entity: SubQueue | None = link.sb_entity
        if entity is not None:
            self._entity_links.setdefault(id(entity.queue), []).append(link)
        if link.sb_kind == "session-pending":
            self._accept_or_wait(link)
            return
        link.open()
        if link.is_receiver:
            link.flow(CREDIT_WINDOW)
        elif link.sb_kind == "consumer":
            self._pump_link(link)

    def _classify(self, link: Any, path: str) -> None:
        lowered = path.casefold()
        link.sb_entity = None
        link.sb_pending = deque()
        if lowered == "$cbs":
            link.sb_kind = "cbs"
            link.sb_node = path
        elif lowered.endswith("/$management"):
            link.sb_kind = "mgmt"
            link.sb_node = path
            link.sb_entity = self._entity(path[: -len("/$management")])
        else:
            entity = self._entity(path)
            link.sb_entity = entity
            if link.is_receiver:
                if entity.is_dead_letter:
                    raise _Refused("amqp:not-allowed", "Cannot send to a dead-letter queue.")
                link.sb_kind = "producer"
            else:
                wanted = _session_filter(link)
                self._check_session_mode(entity, wanted is not None)
                link.sb_kind = "consumer"
                link.sb_link_id = next(_link_ids)
                link.sb_session = None
                # snd-settle-mode settled (1) = ReceiveAndDelete; otherwise PeekLock.
                link.sb_lock = link.remote_snd_settle_mode != 1
                if wanted is not None:
                    link.sb_wanted = wanted
                    link.sb_kind = "session-pending"
                    return
                self._consumers.setdefault(id(entity), []).append(link)

    def _entity(self, path: str) -> SubQueue:
        """The sub-queue at ``path``; features the emulator does not have are refused."""
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 3 and parts[1].casefold() == "subscriptions":
            raise _Refused("amqp:not-implemented", TOPICS_UNSUPPORTED)
        if parts and parts[0].casefold() in self.broker.config.topics:
            raise _Refused("amqp:not-implemented", TOPICS_UNSUPPORTED)
        entity = self.broker.entity(path)
        unsupported = entity.queue.properties.unsupported
        if unsupported:
            raise _Refused(
                "amqp:not-implemented",
                f"The queue '{entity.queue.name}' sets {', '.join(unsupported)}, which this "
                "emulator does not support (duplicate detection and auto-forwarding are "
                "not emulated).",
            )
        return entity

    @staticmethod
    def _check_session_mode(entity: SubQueue, session_receiver: bool) -> None:
        """Refuse a receiver whose session mode does not fit the queue, as Service Bus does."""
        requires_session = entity.queue.properties.requires_session
        if session_receiver and not requires_session:
            # Service Bus' own refusal (an InvalidOperationException, amqp:not-allowed).
            raise _Refused(
                "amqp:not-allowed",
                "A sessionful message receiver cannot be created on an entity that does not "
                "require sessions. Ensure RequiresSession is set to true when creating a Queue "
                "or Subscription to enable sessionful behavior.",
            )
        if requires_session and not session_receiver:
            raise _Refused(
                "amqp:not-allowed",
                "It is not possible for an entity that requires sessions to create a "
                "non-sessionful message receiver.",
            )

    def _refuse(self, link: Any, condition: str, description: str) -> None:
        # As the spec (and Service Bus) do: attach with a null terminus, then detach
        # with the error; the SDK then raises the mapped error when it opens.
        link.sb_kind = "refused"
        link.sb_entity = None
        if link.is_sender:
            link.source.type = Terminus.UNSPECIFIED
        else:
            link.target.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = _condition(condition, description)
        link.close()

    # -- flow ---------------------------------------------------------------------------------

    def on_link_flow(self, event: Any) -> None:
        """Send what the new credit allows; answer drain; flush pending replies."""
        link = event.link
        kind = getattr_safe(link, "sb_kind")
        if not link.is_sender:
            return
        if kind == "consumer":
            self._pump_link(link)
        elif kind in ("cbs", "mgmt"):
            self._flush_replies(link)

    def _pump_entity(self, entity: SubQueue) -> None:
        if entity.sessionful:
            self._serve_waiting(entity)
            for link in list(self._consumers.get(id(entity), [])):
                self._pump_link(link)
            return
        links = list(self._consumers.get(id(entity), []))
        if not links:
            return
        # Round robin: one message per link per pass while credit and messages last.
        active = [link for link in links if link.credit > 0]
        now = self.clock()
        while active and entity.has_available(now):
            still: list[Any] = []
            for link in active:
                if self._deliver_one(link, entity, now) and link.credit > 0:
                    still.append(link)
            active = still
        for link in links:
            if link.drain_mode and link.credit > 0 and not entity.has_available(now):
                link.drained()

    def _pump_link(self, link: Any) -> None:
        entity: SubQueue | None = getattr_safe(link, "sb_entity")
        if entity is None or not link.state & Endpoint.LOCAL_ACTIVE:
            return
        now = self.clock()
        while link.credit > 0 and self._deliver_one(link, entity, now):
            pass
        if link.drain_mode and link.credit > 0:
            link.drained()
        if entity.sessionful:
            self._detach_lost_sessions(entity)

    def _deliver_one(self, link: Any, entity: SubQueue, now: float) -> bool:
        if link.credit <= 0 or not link.state & Endpoint.LOCAL_ACTIVE:
            return False
        lock = bool(link.sb_lock)
        session: Session | None = getattr_safe(link, "sb_session")
        if entity.sessionful and session is None:
            return False
        message = entity.receive(
            now, lock=lock, owner=getattr_safe(link.connection, "sb_id"), session=session
        )
        if message is None:
            return False
        payload = self._render(message, locked=lock, delivered=True)
        token = message.lock_token if lock and message.lock_token else uuid.uuid4()
        delivery = link.delivery(token.bytes_le)
        link.stream(payload)
        link.advance()
        if lock:
            delivery.sb_token = token
            delivery.sb_entity = entity
            delivery.sb_done = False
            delivery.sb_session_id = session.session_id if session is not None else None
        else:
            delivery.settle()
        return True

    def _render(
        self,
        message: StoredMessage,
        *,
        locked: bool,
        peek: bool = False,
        delivered: bool = False,
    ) -> bytes:
        annotations: dict[str, Any] = {
            "x-opt-sequence-number": message.sequence_number,
            "x-opt-enqueued-time": ms_timestamp(message.enqueued_at),
        }
        if message.locked_until is not None and (locked or peek):
            annotations["x-opt-locked-until"] = ms_timestamp(message.locked_until)
        if message.state is not MessageState.ACTIVE:
            # ServiceBusMessageState: 0 active, 1 deferred, 2 scheduled.
            annotations["x-opt-message-state"] = message.state.value
        sections: list[Section] = message.payload
        # The time-to-live applied, min(message's, queue's DefaultMessageTimeToLive),
        # is what the service shows on the message ("a larger value specified on the
        # message will be overridden by the entity's DefaultMessageTimeToLive value",
        # BrokeredMessage.TimeToLive).
        ttl = message.time_to_live
        ttl_ms = round(ttl * 1000) if ttl is not None else None
        return render(
            sections,
            time_to_live_ms=ttl_ms,
            delivery_count=message.delivery_count,
            annotations=annotations,
            application_properties=message.dead_letter_properties or None,
            # Service Bus names the lock in the delivery annotations too (the SDK's
            # ServiceBusReceivedMessage.lock_token falls back to it).
            # A delivery on a receive link always has the section: empty in
            # ReceiveAndDelete, as the service sends it.
            delivery_annotations=(
                {"x-opt-lock-token": message.lock_token}
                if locked and message.lock_token is not None
                else {}
                if delivered
                else None
            ),
        )

    # -- deliveries ---------------------------------------------------------------------------

    def on_delivery(self, event: Any) -> None:
        """Incoming transfers (sends, requests) and dispositions of our deliveries."""
        delivery = event.delivery
        link = delivery.link
        if link.is_receiver:
            self._on_transfer(link, delivery)
        else:
            self._on_disposition(delivery)

    def _on_transfer(self, link: Any, delivery: Any) -> None:
        if not delivery.readable:
            return
        chunk = link.recv(delivery.pending) or b""
        buffered: bytes = getattr_safe(delivery, "sb_buffer") or b""
        if delivery.partial:
            delivery.sb_buffer = buffered + chunk
            return
        payload = buffered + chunk
        link.advance()
        kind = getattr_safe(link, "sb_kind")
        outcome: tuple[int, Condition | None] = (Delivery.ACCEPTED, None)
        try:
            if kind == "producer":
                outcome = self._accept_send(link.sb_entity, payload)
            elif kind in ("cbs", "mgmt"):
                self._on_request(link, payload)
            else:
                outcome = (Delivery.REJECTED, _condition("amqp:not-allowed", "link is closed"))
        except Exception as exc:  # a bad request must not take the emulator down
            _log.exception("failed to handle a transfer on %s", kind)
            outcome = (Delivery.REJECTED, _condition("amqp:internal-error", str(exc)))
        if not delivery.settled:
            state, condition = outcome
            if condition is not None:
                delivery.local.condition = condition
            delivery.update(state)
        delivery.settle()
        if link.credit < CREDIT_WINDOW // 2 and link.state & Endpoint.LOCAL_ACTIVE:
            link.flow(CREDIT_WINDOW - link.credit)

    def _accept_send(self, entity: SubQueue, payload: bytes) -> tuple[int, Condition | None]:
        if len(payload) > MAX_MESSAGE_SIZE:
            return Delivery.REJECTED, _condition(
                "amqp:link:message-size-exceeded",
                f"The message size {len(payload)} exceeds the limit of {MAX_MESSAGE_SIZE} bytes.",
            )
        try:
            messages = [service_decimals(sections) for sections in unpack(payload)]
        except ValueError as exc:
            return Delivery.REJECTED, _condition("amqp:decode-error", str(exc))
        for sections in messages:
            quota = property_quota_error(sections)
            if quota is not None:
                # The service raises a SerializationException; nothing is enqueued.
                return Delivery.REJECTED, _condition("amqp:link:message-size-exceeded", quota)
        if entity.sessionful and any(inspect(s).session_id is None for s in messages):
            return Delivery.REJECTED, _condition("amqp:not-allowed", NO_SESSION_ID)
        now = self.clock()
        for sections in messages:
            self._enqueue(entity, sections, now)
        self._pump_entity(entity)
        return Delivery.ACCEPTED, None

    def _enqueue(self, entity: SubQueue, sections: list[Section], now: float) -> StoredMessage:
        info = inspect(sections)
        return entity.enqueue(
            sections,
            now,
            ttl=info.ttl,
            scheduled_at=info.scheduled_at,
            message_id=info.message_id,
            size=sum(len(section.raw) for section in sections),
            session_id=info.session_id,
        )

    def _on_disposition(self, delivery: Any) -> None:
        token: uuid.UUID | None = getattr_safe(delivery, "sb_token")
        if token is None or getattr_safe(delivery, "sb_done"):
            if delivery.settled:
                delivery.settle()
            return
        state = delivery.remote_state
        remote_settled = delivery.settled
        if state not in (
            Delivery.ACCEPTED,
            Delivery.REJECTED,
            Delivery.RELEASED,
            Delivery.MODIFIED,
        ):
            if remote_settled:
                state = Delivery.RELEASED  # settled without an outcome: give it back
            else:
                return
        entity: SubQueue = delivery.sb_entity
        delivery.sb_done = True
        if getattr_safe(delivery.link, "sb_kind") != "consumer":
            # The link detached: Service Bus drops its unsettled deliveries then
            # (azure-amqp's SessionChannel.OnLinkClosed), so a later disposition for
            # them matches nothing, changes nothing and gets no answer; the lock
            # stays until it expires or is settled over $management. The delivery
            # is left unsettled here (answering would send an outcome); proton frees
            # it with its connection.
            return
        now = self.clock()
        remote = delivery.remote
        held: Session | None = getattr_safe(delivery.link, "sb_session")
        session = held.session_id if held is not None else None
        if entity.sessionful and session is None:
            session = getattr_safe(delivery, "sb_session_id")  # the link lost it meanwhile
        try:
            if state == Delivery.ACCEPTED:
                entity.complete(token, now, session=session)
            elif state == Delivery.MODIFIED:
                if remote.undeliverable:
                    entity.defer(token, now, session=session)
                else:
                    entity.abandon(token, now, failed=bool(remote.failed), session=session)
            elif state == Delivery.REJECTED:
                reason, description = _dead_letter_details(remote.condition)
                entity.dead_letter(token, now, reason, description, session=session)
            else:
                entity.abandon(token, now, failed=False, session=session)
        except SessionLockLost as exc:
            if not remote_settled:
                delivery.local.condition = _condition(SESSION_LOCK_LOST, str(exc))
                delivery.update(Delivery.REJECTED)
            delivery.settle()
            return
        except LockLost:
            if not remote_settled:
                delivery.local.condition = _condition(LOCK_LOST, LOCK_LOST_TEXT)
                delivery.update(Delivery.REJECTED)
            delivery.settle()
            return
        if not remote_settled:
            if state == Delivery.MODIFIED:
                delivery.local.failed = bool(remote.failed)
                delivery.local.undeliverable = bool(remote.undeliverable)
            delivery.update(state)
        delivery.settle()
        if state != Delivery.ACCEPTED:
            self._pump_entity(entity)

    # -- sessions -----------------------------------------------------------------------------

    def _accept_or_wait(self, link: Any) -> None:
        """Lock a session to a session receiver's link and answer its attach, or make it wait.

        A named session is accepted at once (or refused when another receiver holds
        it); the next available one waits, unanswered, until a session has an
        available message or the link's operation timeout passes.
        """
        entity: SubQueue = link.sb_entity
        wanted: str = link.sb_wanted
        now = self.clock()
        try:
            session = entity.accept_session(wanted or None, link.sb_link_id, now)
        except SessionCannotBeLocked as exc:
            self._forget_link(link)
            self._refuse(link, SESSION_CANNOT_BE_LOCKED, str(exc))
            return
        if session is None:
            timeout = _operation_timeout(link)
            link.sb_deadline = now + timeout
            self._waiting.setdefault(id(entity), []).append(link)
            return
        self._open_session_link(link, session)

    def _open_session_link(self, link: Any, session: Session) -> None:
        """Answer the attach: the accepted id in the filter, the lock's end as a property."""
        entity: SubQueue = link.sb_entity
        link.sb_session = session
        link.sb_kind = "consumer"
        self._session_links[link.sb_link_id] = link
        link.source.filter.clear()
        link.source.filter.put_dict({symbol(SESSION_FILTER): session.session_id})
        assert session.locked_until is not None
        ticks = DOTNET_EPOCH_TICKS + round(session.locked_until * 10_000_000)
        link.properties = {symbol(SESSION_LOCKED_UNTIL): ticks}
        self._consumers.setdefault(id(entity), []).append(link)
        link.open()
        self._pump_link(link)

    def _serve_waiting(self, entity: SubQueue) -> None:
        """Give available sessions to links waiting for the next available one, in order."""
        waiting = self._waiting.get(id(entity))
        now = self.clock()
        while waiting:
            link = waiting[0]
            session = entity.accept_session(None, link.sb_link_id, now)
            if session is None:
                return
            waiting.pop(0)
            self._open_session_link(link, session)

    def _time_out_waiting(self, now: float) -> None:
        """Answer the links whose wait for a session outlasted their operation timeout."""
        for key, links in list(self._waiting.items()):
            for link in [lk for lk in links if lk.sb_deadline <= now]:
                links.remove(link)
                self._forget_link(link)
                self._refuse(
                    link,
                    OPERATION_TIMEOUT,
                    "The operation did not complete within the allocated time "
                    f"{link.sb_deadline - now:.0f} for object session.",
                )
            if not links:
                self._waiting.pop(key, None)

    def _detach_lost_sessions(self, entity: SubQueue) -> None:
        """Detach the links whose session lock expired, with ``session-lock-lost``."""
        while entity.lost_sessions:
            holder, session_id = entity.lost_sessions.pop()
            link = self._session_links.pop(holder, None)
            if link is None:
                continue
            link.sb_session = None
            self._forget_link(link)
            link.condition = _condition(
                SESSION_LOCK_LOST,
                f"The session lock has expired on the MessageSession '{session_id}'. "
                "Accept a new MessageSession.",
            )
            link.close()
        if entity.lost_sessions == [] and self._waiting.get(id(entity)):
            self._serve_waiting(entity)

    def _holds(self, mgmt_link: Any, props: dict[str, Any]) -> Callable[[Any], bool]:
        """Whether a session holder (a link id) belongs to the requester.

        The SDK names its receive link in the request (``associated-link-name``);
        without it, any receive link on the requester's connection will do.
        """
        name = _text(props.get("associated-link-name"))
        conn_id = getattr_safe(mgmt_link.connection, "sb_id")

        def holds(holder: Any) -> bool:
            link = self._session_links.get(holder)
            if link is None or getattr_safe(link.connection, "sb_id") != conn_id:
                return False
            return name is None or link.name == name

        return holds

    def _session_operation(
        self,
        entity: SubQueue,
        op: str,
        session: str | None,
        body: dict[str, Any],
        now: float,
        holds: Callable[[Any], bool],
    ) -> Any:
        if session is None:
            raise _MgmtError(400, "com.microsoft:argument-error", "session-id is required.")
        if not entity.sessionful:
            raise _MgmtError(
                400, "amqp:not-allowed", f"The entity '{entity.path}' does not require sessions."
            )
        if op == "renew-session-lock":
            until = entity.renew_session(session, now, holds)
            return {"expiration": ms_timestamp(until)}
        held = entity.held_session(session, now, holds)
        if op == "get-session-state":
            return {"session-state": held.state}
        state = body.get("session-state")
        held.state = bytes(state) if state is not None else None
        return {}

    # -- request/response nodes ---------------------------------------------------------------

    def _on_request(self, link: Any, payload: bytes) -> None:
        request = Message()
        request.decode(payload)
        props: dict[str, Any] = dict(request.properties or {})
        operation = _text(props.get("operation")) or ""
        kind = link.sb_kind
        reply: Message
        if kind == "cbs":
            reply = Message(
                properties={"status-code": int32(202), "status-description": "Accepted"}
            )
        else:
            try:
                body = self._management(
                    link.sb_entity, operation, request.body or {}, self._holds(link, props)
                )
                status, description = (200, "OK") if body is not None else (204, "No Content")
                reply = Message(
                    properties={"statusCode": int32(status), "statusDescription": description},
                    body=body,
                )
            except _MgmtError as err:
                reply = Message(
                    properties={
                        "statusCode": int32(err.status),
                        "statusDescription": err.description,
                        "errorCondition": symbol(err.condition),
                    }
                )
        reply.correlation_id = request.id
        reply_to = request.reply_to or link.remote_target.address
        self._send_reply(link.connection, reply_to, reply)

    def _send_reply(self, conn: Any, address: str | None, reply: Message) -> None:
        target = entity_path(address).casefold()
        link = conn.link_head(Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE)
        fallback = None
        while link is not None:
            if link.is_sender and getattr_safe(link, "sb_kind") in ("cbs", "mgmt"):
                if entity_path(link.remote_source.address).casefold() == target:
                    break
                fallback = fallback or link
            link = link.next(Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE)
        link = link or fallback
        if link is None:
            _log.warning("no reply link for %s; response dropped", address)
            return
        link.sb_pending.append(reply.encode())
        self._flush_replies(link)

    def _flush_replies(self, link: Any) -> None:
        pending: deque[bytes] = link.sb_pending
        while pending and link.credit > 0:
            delivery = link.delivery(uuid.uuid4().bytes)
            link.stream(pending.popleft())
            link.advance()
            delivery.settle()

    def _management(
        self, entity: SubQueue, operation: str, body: Any, holds: Callable[[Any], bool]
    ) -> Any:
        if not isinstance(body, dict):
            raise _MgmtError(400, "com.microsoft:argument-error", "The request body must be a map.")
        now = self.clock()
        op = operation[len(OP_PREFIX) :] if operation.startswith(OP_PREFIX) else operation
        session = _text(body.get("session-id"))
        try:
            if op in ("renew-session-lock", "get-session-state", "set-session-state"):
                return self._session_operation(entity, op, session, body, now, holds)
            if op == "renew-lock":
                tokens = [_uuid(t) for t in _elements(body.get("lock-tokens"))]
                expirations = [entity.renew(token, now) for token in tokens]
                return {
                    "expirations": _array(Data.TIMESTAMP, [ms_timestamp(t) for t in expirations])
                }
            if op == "peek-message":
                start = int(body.get("from-sequence-number") or 1)
                count = int(body.get("message-count") or 1)
                peeked = entity.peek(start, count, now, session=session)
                if not peeked:
                    return None
                return {
                    "messages": [
                        {"message": self._render(m, locked=False, peek=True)} for m in peeked
                    ]
                }
            if op == "receive-by-sequence-number":
                seqs = [int(s) for s in _elements(body.get("sequence-numbers"))]
                lock = int(body.get("receiver-settle-mode", 1) or 0) == 1
                found = entity.receive_deferred(seqs, now, lock=lock)
                items: list[dict[str, Any]] = []
                for m in found:
                    item: dict[str, Any] = {"message": self._render(m, locked=lock)}
                    if lock and m.lock_token is not None:
                        item["lock-token"] = m.lock_token
                    items.append(item)
                return {"messages": items}
            if op == "update-disposition":
                status = _text(body.get("disposition-status")) or ""
                tokens = [_uuid(t) for t in _elements(body.get("lock-tokens"))]
                if session is not None:
                    entity.held_session(session, now, holds)
                for token in tokens:
                    self._settle_by_status(entity, token, status, body, now, session)
                self._pump_entity(entity)
                return {}
            if op == "schedule-message":
                seqs = []
                for item in _elements(body.get("messages")):
                    raw = item.get("message") if isinstance(item, dict) else None
                    if raw is None:
                        raise _MgmtError(400, "com.microsoft:argument-error", "message missing")
                    sections = service_decimals(split_sections(bytes(raw)))
                    quota = property_quota_error(sections)
                    if quota is not None:
                        raise _MgmtError(400, "amqp:link:message-size-exceeded", quota)
                    seqs.append(self._enqueue(entity, sections, now).sequence_number)
                self._pump_entity(entity)
                return {"sequence-numbers": _array(Data.LONG, seqs)}
            if op == "cancel-scheduled-message":
                entity.cancel_scheduled(int(s) for s in _elements(body.get("sequence-numbers")))
                return {}
        except SessionLockLost as exc:
            raise _MgmtError(410, SESSION_LOCK_LOST, str(exc)) from exc
        except LockLost as exc:
            raise _MgmtError(410, LOCK_LOST, LOCK_LOST_TEXT) from exc
        except MessageNotFound as exc:
            # An expired deferred message may just have been dead-lettered.
            self._pump_entity(entity.queue.dead_letter)
            raise _MgmtError(404, "com.microsoft:message-not-found", str(exc)) from exc
        except (ValueError, TypeError) as exc:
            raise _MgmtError(400, "com.microsoft:argument-error", str(exc)) from exc
        raise _MgmtError(
            501, "amqp:not-implemented", f"The operation {operation!r} is not supported."
        )

    def _settle_by_status(
        self,
        entity: SubQueue,
        token: uuid.UUID,
        status: str,
        body: dict[str, Any],
        now: float,
        session: str | None = None,
    ) -> None:
        if status == "completed":
            entity.complete(token, now, session=session)
        elif status == "abandoned":
            entity.abandon(token, now, session=session)
        elif status == "defered":
            entity.defer(token, now, session=session)
        elif status == "suspended":
            entity.dead_letter(
                token,
                now,
                _text(body.get("deadletter-reason")),
                _text(body.get("deadletter-description")),
                session=session,
            )
        else:
            raise ValueError(f"unknown disposition-status {status!r}")


_connection_ids = itertools.count(1)
_link_ids = itertools.count(1)


class _Refused(Exception):
    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


def getattr_safe(obj: Any, name: str) -> Any:
    """Read an attribute stored on a proton object, ``None`` if it was never set."""
    try:
        return getattr(obj, name)
    except AttributeError:
        return None


def _condition(name: str, description: str) -> Condition:
    """An error condition with an info map, as Service Bus sends (a tracking id).

    The SDK reads the info field by position, so it must not be left out.
    """
    info: Any = {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())}
    return Condition(name, description, info)


def _array(element_type: int, values: list[Any]) -> Array:
    """An AMQP array of ``element_type`` (``Data.TIMESTAMP``, ``Data.LONG``...)."""
    return Array(cast(Any, UNDESCRIBED), element_type, *values)


def _uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bytes | bytearray) and len(value) == 16:
        return uuid.UUID(bytes=bytes(value))
    return uuid.UUID(str(value))


def _session_filter(link: Any) -> str | None:
    """The session an attach asks for (``com.microsoft:session-filter``).

    Returns:
        ``None`` without the filter (no session receiver); ``""`` for a null filter
        (the next available session); else the session id.
    """
    data = link.remote_source.filter
    try:
        data.rewind()
        if data.next() is None:
            return None
        filters = data.get_object()
    except Exception:  # an undecodable filter set is no session filter
        return None
    if not isinstance(filters, dict):
        return None
    for key, value in filters.items():
        if str(key) == SESSION_FILTER:
            return _text(value) or ""
    return None


def _operation_timeout(link: Any) -> float:
    """The link's ``com.microsoft:timeout`` property in seconds, or the service's default."""
    try:
        props = link.remote_properties or {}
        value = props.get(symbol(OPERATION_TIMEOUT), props.get(OPERATION_TIMEOUT))
    except Exception:  # undecodable properties: the default
        value = None
    return (
        int(value) / 1000.0 if isinstance(value, int) and value > 0 else DEFAULT_OPERATION_TIMEOUT
    )


def _dead_letter_details(condition: Condition | None) -> tuple[str | None, str | None]:
    if condition is None:
        return None, None
    info = condition.info or {}
    reason = _text(info.get("DeadLetterReason")) if isinstance(info, dict) else None
    description = _text(info.get("DeadLetterErrorDescription")) if isinstance(info, dict) else None
    if description is None:
        description = _text(condition.description)
    return reason, description
