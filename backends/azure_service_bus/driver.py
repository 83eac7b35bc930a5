"""The Service Bus driver: the SPI translated to ``azure-servicebus`` calls."""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar

from leasekit.capabilities import Capabilities
from leasekit.clock import to_datetime
from leasekit.deadline import DeadlineExceeded, call_timeout, check_deadline
from leasekit.errors import BackendNotInstalled, InvalidArgument, InvalidURL
from leasekit.options import as_bool, as_float, as_int, as_text
from leasekit.redaction import Secret as _Secret
from leasekit.redaction import install_log_redaction
from leasekit.spi import (
    DeadLetter,
    Driver,
    DriverError,
    ErrorCode,
    OutgoingMessage,
    ParsedURL,
    QueueStats,
    RawMessage,
    Visibility,
    each,
)

from .admin import admin_client, ensure_queue, peek_dead_letters, queue_stats
from .connection import (
    _drop_connection,
    _installed,
    _open_handler,
    _timeouts,
    resolve_address,
)
from .error_codes import classify, sdk_code
from .links import ReceiveLink, ReceiveLinks, _Held
from .settings import (
    _SECRET_OPTIONS,
    DEFAULT_ADMIN_PORT,
    DEFAULT_LOCK_DURATION,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_WAIT,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_RECEIVERS,
    FORGET_AFTER,
    HEADER_ROOM,
    LOCK_SLACK,
    MAX_LOCK_DURATION,
    MAX_MESSAGE_SIZE,
    MAX_READ_TIMEOUT,
    MAX_RECEIVE,
    MAX_RECEIVERS,
    MAX_RENEW,
    MAX_SEND,
    MAX_SEND_DELAY,
    MAX_TTL,
    MAX_WAIT_OPTION,
    MIN_WAIT,
    PROBE_AFTER,
    PROBE_SEQUENCE_NUMBER,
    PROBE_TIMEOUT,
    RECEIVE_SLICE,
    SDK_LOGGERS,
    SOCKET_TIMEOUT,
)
from .watch import ConnectionWatch
from .wire import _body, _expirations, _properties

#: The service's documented limits with the driver's default options (shown by
#: ``leasekit backends`` without credentials); options can change some per queue.
CAPABILITIES = Capabilities(
    min_lease=DEFAULT_LOCK_DURATION,
    max_lease=DEFAULT_LOCK_DURATION,
    lease_resolution=1.0,
    lease_set_after_receive=False,
    fixed_lease=DEFAULT_LOCK_DURATION,
    max_total_lease=None,
    renew_rotates_receipt=False,
    detects_stale_receipts=True,
    expired_receipt_usable=False,
    max_receive_batch=MAX_RECEIVE,
    max_delete_batch=1,
    max_renew_batch=MAX_RENEW,
    max_send_batch=MAX_SEND,
    max_message_size=DEFAULT_MAX_MESSAGE_SIZE - HEADER_ROOM,
    max_wait=DEFAULT_MAX_WAIT,
    max_abandon_delay=0.0,
    max_send_delay=MAX_SEND_DELAY,
    max_ttl=MAX_TTL,
    ttl_ends_lease=False,  # a locked message outlives its TTL until the lock ends
    supports_properties=True,
    native_dead_letter=True,
    delivery_count=True,
    queue_stats=True,
    counts=frozenset({"delayed", "dead_lettered", "total"}),
    inspect_dead_letters=True,
)

_log = logging.getLogger("leasekit.backends.azure_service_bus")


class ServiceBusDriver(Driver):
    """Driver for one Service Bus queue.

    Parameters
    ----------
        queue: the queue name (from the connection string's ``EntityPath`` if ``None``).
        connection_string: a Service Bus connection string (keyword only; never shown).
        namespace: the fully qualified namespace (``NAME.servicebus.windows.net``),
            with ``credential``; taken from the connection string otherwise.
        credential: a token, named-key or SAS credential (keyword only).
        lock_duration: the queue's LockDuration in seconds (default 60): every
            lease is exactly this long.
        max_message_size: the entity's maximum message size in bytes (262144 on Standard).
        max_wait: longest wait of one receive call in seconds (core loops for longer).
        retry_total: the SDK's own retries per operation (default 0: core retries
            within its deadline, and a connection error reconnects at once).
        read_timeout: seconds an operation may wait for the service's answer (default
            10); renewals are bounded tighter, by core's deadline.
        admin_port: with ``UseDevelopmentEmulator=true``, the emulator's HTTP port for
            queue management (default 5300, Microsoft's emulator's).
        sessions: the queue requires sessions (``RequiresSession``): ``group`` is the
            session id, and leasing accepts sessions (:mod:`.sessions`).
        session: with ``sessions``, lease only this named session (default: the next
            available one).
        receivers: SDK receivers (each its own AMQP connection and receive link)
            that receives spread over, round robin (default ``DEFAULT_RECEIVERS``,
            at most ``MAX_RECEIVERS``); each opens on first use.
    """

    scheme = "azure-service-bus"
    #: The driver of a queue's dead-letter sub-queue: a subclass of this one, which
    #: :mod:`.dead_letters` sets here when it is imported (so this module imports it not).
    dead_letter_driver: ClassVar[type[ServiceBusDriver]]
    capabilities = CAPABILITIES
    #: The connection watch reports the leases of a connection that is gone, at once.
    reports_lost_leases = True
    secret_options = _SECRET_OPTIONS
    credential_hint = "pass connection_string= or credential= as keyword options"

    def __init__(
        self,
        queue: str | None = None,
        *,
        connection_string: str | None = None,
        namespace: str | None = None,
        credential: Any = None,
        lock_duration: float | str = DEFAULT_LOCK_DURATION,
        max_message_size: int | str = DEFAULT_MAX_MESSAGE_SIZE,
        max_wait: float | str = DEFAULT_MAX_WAIT,
        retry_total: int | str = 0,
        read_timeout: float | str = DEFAULT_READ_TIMEOUT,
        admin_port: int | str = DEFAULT_ADMIN_PORT,
        sessions: bool | str = False,
        session: str | None = None,
        receivers: int | str = DEFAULT_RECEIVERS,
    ) -> None:
        install_log_redaction(SDK_LOGGERS)
        name, host, parts = resolve_address(
            queue, connection_string, namespace, credential, self.credential_hint
        )
        lock = as_float(lock_duration, "lock_duration", minimum=0.001)
        if lock > MAX_LOCK_DURATION:
            raise ValueError(
                f"azure-service-bus: lock_duration is at most {MAX_LOCK_DURATION:g} s, got {lock:g}"
            )
        size = as_int(
            max_message_size, "max_message_size", minimum=HEADER_ROOM + 1, maximum=MAX_MESSAGE_SIZE
        )
        wait = as_float(max_wait, "max_wait", minimum=MIN_WAIT, maximum=MAX_WAIT_OPTION)
        links = as_int(receivers, "receivers", minimum=1, maximum=MAX_RECEIVERS)
        if not _installed("azure.servicebus"):
            raise BackendNotInstalled(
                "backend 'azure-service-bus' needs azure-servicebus; install it with: "
                "pip install 'leasekit[azure-service-bus]'"
            )
        self.queue = name
        self.namespace = host
        self.lock_duration = lock
        self.emulator = parts.get("usedevelopmentemulator", "").lower() == "true"
        self.admin_port = as_int(admin_port, "admin_port", minimum=1)
        self._secret = _Secret(connection_string if connection_string is not None else credential)
        self._uses_connection_string = connection_string is not None
        self._retry_total = as_int(retry_total, "retry_total", minimum=0)
        self._read_timeout = as_float(
            read_timeout, "read_timeout", minimum=0.001, maximum=MAX_READ_TIMEOUT
        )
        self._max_message_size = size
        self.sessions = as_bool(sessions, "sessions", error=InvalidArgument)
        self.session = session
        if session is not None:
            as_text(session, "session")
            if not 1 <= len(session) <= 128 or not all("!" <= c <= "~" for c in session):
                raise InvalidArgument(
                    "azure-service-bus: session must be 1 to 128 letters, digits and ASCII "
                    f"punctuation (a group name), got {session!r}"
                )
            if not self.sessions:
                raise InvalidArgument("azure-service-bus: session=... needs sessions=true")
        self._sessions: Any = None
        if self.sessions:
            from .sessions import SessionReceivers

            self._sessions = SessionReceivers(self)
        self._client: Any = None
        self._sender: Any = None
        self._setup_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._links = ReceiveLinks(links)
        self._held_lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        #: Connections found gone (reset, closed): their leases are lost.
        self._gone: weakref.WeakSet[Any] = weakref.WeakSet()
        self._watch = ConnectionWatch(self._holding, self._connection_gone)
        self._checked_lock = False
        self._entity_missing = False
        self._closed = False
        self.capabilities = CAPABILITIES.replace(
            min_lease=lock,
            max_lease=lock,
            lease_resolution=1.0 if lock == int(lock) else 0.001,
            fixed_lease=lock,
            max_message_size=size - HEADER_ROOM,
            max_wait=wait,
            ordered=self.sessions,
            group_state=self.sessions,
        )

    @classmethod
    def options_from_url(cls, url: ParsedURL) -> dict[str, Any]:
        """``azure-service-bus://NAMESPACE.servicebus.windows.net/QUEUE``; options as query."""
        allowed = {
            "lock_duration",
            "max_message_size",
            "max_wait",
            "retry_total",
            "read_timeout",
            "admin_port",
            "sessions",
            "session",
            "receivers",
        }
        unknown = sorted(set(url.query) - allowed)
        if unknown:
            raise InvalidURL(
                f"azure-service-bus: option(s) {', '.join(unknown)} cannot come from a URL"
            )
        options: dict[str, Any] = dict(url.query)
        segments = [s for s in url.path.split("/") if s]
        if segments:
            options["queue"] = "/".join(segments)
        if url.host:
            options["namespace"] = f"{url.host}:{url.port}" if url.port else url.host
        return options

    def __repr__(self) -> str:
        return (
            f"<ServiceBusDriver queue={self.queue!r} namespace={self.namespace!r} "
            f"lock_duration={self.lock_duration:g} receivers={len(self._links)}"
            f"{' sessions' if self.sessions else ''}>"
        )

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """``send_messages`` of one, or ``ServiceBusMessageBatch`` sends split at the size limit.

        Each message gets a fresh message id (its leasekit id). A message too large
        even alone gets its error; the others are still sent. Every SDK call is
        bounded by core's deadline (the sender's turn and the link's open included).
        """
        outgoing = [self._outgoing(m) for m in messages]
        results: list[str | BaseException] = [str(m.message_id) for m in outgoing]
        if not self._send_lock.acquire(timeout=self._left()):
            raise DeadlineExceeded("azure-service-bus: another send held the sender too long")
        try:
            self._send_with(outgoing, results)
        finally:
            self._send_lock.release()
        self._entity_missing = False
        return results

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """PeekLock ``receive_messages``: up to ``max_messages``, in one short turn on a link.

        The receive takes the next receive link with no call in progress or
        waiting (round robin over the ``receivers`` links, :class:`ReceiveLinks`)
        for a turn of at most ``RECEIVE_SLICE`` (that link's settles and renewals
        go first) and returns what it got; core calls again while its wait lasts.
        Receives side by side use different links, and the settles of one batch
        run on its link while the next receive runs on another. ``visibility``
        is always the queue's lock duration (core refuses others).

        A receive on a dead connection (a partition: nothing answers, nothing
        resets) returns an empty list just like one on an idle queue. So when a
        link's receives have come back empty for ``PROBE_AFTER`` seconds with
        nothing else heard on its connection, the receive asks the service
        something cheap (a peek past the end of the queue, ``PROBE_TIMEOUT`` at
        most): no answer is an ``OperationTimeoutError``, a failed receive core
        reports like any other backend's, and the connection is dropped so the
        next call on that link opens a new one.
        """
        if self._sessions is not None:
            return list(self._sessions.receive(max_messages, wait))
        link = self._links.take_turn(max(wait, 0.0))
        if link is None:
            return []
        try:
            receiver = self._get_receiver(link)
            messages = receiver.receive_messages(
                max_message_count=max_messages,
                max_wait_time=min(max(wait, MIN_WAIT), RECEIVE_SLICE),
            )
            if messages:
                link.heard = time.monotonic()
            elif time.monotonic() - link.heard > PROBE_AFTER:
                self._probe(link, receiver)
        except Exception as exc:
            self._note_failure(None, exc)  # a missing queue, for later settles
            raise
        finally:
            link.gate.end_turn()
        self._entity_missing = False
        raws = self._hold(link, receiver, messages)
        self._check_lock_duration(raws)
        return raws

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """``renew_message_lock``: each lock runs for the queue's LockDuration from now.

        Several tokens of one receiver go in one renew-lock management call; if
        one of them is lost that call fails, and each is then renewed alone to
        find which. A lease whose receiving connection is gone is ``LeaseLost``
        without a call (:meth:`_check_connection`).
        """
        if self._sessions is not None:
            return list(self._sessions.renew(receipts))
        results: list[Visibility | BaseException | None] = [None] * len(receipts)
        groups: dict[int, list[tuple[int, _Held]]] = {}
        for index, receipt in enumerate(receipts):
            try:
                held = self._lookup(receipt)
                self._check_connection(held)
            except DriverError as exc:
                self._note_failure(receipt, exc)
                results[index] = exc
                continue
            groups.setdefault(id(held.receiver), []).append((index, held))
        for group in groups.values():
            receiver, link = group[0][1].receiver, group[0][1].link
            renew_many = getattr(receiver, "_renew_locks", None)
            if renew_many is None or len(group) == 1:  # one token: the same request
                self._renew_each(receipts, group, results)
                continue
            try:
                with link.gate.priority(self._left()):
                    response = renew_many(
                        *[str(h.message.lock_token) for _, h in group], timeout=self._left()
                    )
                link.heard = time.monotonic()
                expirations = _expirations(response)
            except Exception as exc:
                if self.error_code(exc) is ErrorCode.LEASE_LOST:
                    self._renew_each(receipts, group, results)  # find the lost one(s)
                    continue
                self._note_failure(None, exc)
                for index, _ in group:
                    results[index] = exc
                continue
            for (index, held), expiry in zip(group, expirations, strict=True):
                self._renewed(held, expiry)
                results[index] = Visibility(receipts[index], to_datetime(expiry))
        return [
            r if r is not None else DriverError(ErrorCode.UNKNOWN, "no result") for r in results
        ]

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """``complete_message`` of each on the receiver that received it."""
        return each(receipts, lambda receipt: self._settle(receipt, "complete_message"))

    # ------------------------------------------------------------------ admin

    def create_queue(self) -> None:
        """Create the queue with LockDuration = ``lock_duration``; an existing one is fine.

        An existing queue with another LockDuration is refused (its leases would not
        match the capabilities; :func:`.admin.ensure_queue`).
        """
        with self._admin_client() as admin:
            ensure_queue(admin, self.queue, self.lock_duration, self.sessions)
        self._entity_missing = False

    def delete_queue(self) -> None:
        """Delete the queue and its messages; a missing queue is fine."""
        from azure.core.exceptions import ResourceNotFoundError

        with self._admin_client() as admin, contextlib.suppress(ResourceNotFoundError):
            admin.delete_queue(self.queue)
        with self._held_lock:
            self._held.clear()
        if self._sessions is not None:
            self._sessions.close()
        self._entity_missing = True

    # ------------------------------------------------------------- connection

    def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        from azure.servicebus import ServiceBusClient

        if self._closed:
            raise DriverError(ErrorCode.UNKNOWN, "azure-service-bus: the driver is closed")
        # timeout: how long a settle waits for the service's answer (set per settle
        # to core's deadline, see _settle); try_timeout: one attempt of an
        # operation. retry_total 0 by default: a failed attempt returns at once
        # (the handler reconnects on the next call) and core retries within its
        # deadline, instead of the SDK sleeping 1.6 s and more between tries.
        options: dict[str, Any] = {
            "retry_total": self._retry_total,
            "timeout": self._read_timeout,
            "try_timeout": self._read_timeout,
        }
        if self._uses_connection_string:
            self._client = ServiceBusClient.from_connection_string(self._secret.value, **options)
        else:
            self._client = ServiceBusClient(self.namespace, self._secret.value, **options)
        return self._client

    def _get_sender(self) -> Any:
        with self._setup_lock:
            if self._sender is None:
                # keep_alive=0: no keep-alive thread for the sender (an idle link
                # the service detaches is re-opened by the SDK on the next send).
                self._sender = self._get_client().get_queue_sender(self.queue, keep_alive=0)
            sender = self._sender
        # Open the link (or re-open it after the SDK shut it down on an error)
        # within core's deadline; a no-op while it is open.
        _open_handler(sender, self._left())
        return sender

    def _new_receiver(self) -> Any:
        """A PeekLock SDK receiver on the queue (not opened); a link's receiver is made here."""
        from azure.servicebus import ServiceBusReceiveMode

        # prefetch 0: the broker locks only what a receive asked for.
        return self._get_client().get_queue_receiver(
            self.queue,
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
            prefetch_count=0,
            socket_timeout=SOCKET_TIMEOUT,
        )

    def _get_receiver(self, link: ReceiveLink) -> Any:
        """``link``'s SDK receiver, made on first use and opened (call with its turn held)."""
        with self._setup_lock:
            receiver = link.receiver
            if receiver is None:
                receiver = link.receiver = self._new_receiver()
        # Opens the link (or re-opens it after the SDK shut it down on an error)
        # within core's deadline, outside a receive's wait; a no-op while it is open.
        _open_handler(receiver, self._left())
        return receiver

    # --------------------------------------------------------------- messages

    def _outgoing(self, message: OutgoingMessage) -> Any:
        from azure.servicebus import ServiceBusMessage

        kwargs: dict[str, Any] = {"message_id": str(uuid.uuid4())}
        if message.group is not None:
            kwargs["session_id"] = message.group
        if message.properties:
            kwargs["application_properties"] = dict(message.properties)
        if message.ttl is not None:
            kwargs["time_to_live"] = datetime.timedelta(seconds=message.ttl)
        if message.delay > 0:
            kwargs["scheduled_enqueue_time_utc"] = datetime.datetime.now(
                datetime.UTC
            ) + datetime.timedelta(seconds=message.delay)
        return ServiceBusMessage(message.body, **kwargs)

    def validate(self, message: OutgoingMessage) -> None:
        """A ``RequiresSession`` queue takes only messages with a session id (a ``group``)."""
        if self.sessions and message.group is None:
            raise DriverError(
                ErrorCode.INVALID_ARGUMENT,
                f"azure-service-bus: queue {self.queue!r} requires sessions: send each "
                "message with group=... (its session id)",
            )

    def _send_with(self, outgoing: list[Any], results: list[str | BaseException]) -> None:
        """Send ``outgoing`` (``_send_lock`` held), each call within core's deadline."""
        from azure.servicebus.exceptions import MessageSizeExceededError

        sender = self._get_sender()
        if len(outgoing) == 1:
            sender.send_messages(outgoing[0], timeout=self._left())
        else:
            batch, pending = sender.create_message_batch(), 0
            for index, message in enumerate(outgoing):
                try:
                    batch.add_message(message)
                except MessageSizeExceededError as exc:
                    if not pending:  # too large even alone
                        results[index] = exc
                        continue
                    sender.send_messages(batch, timeout=self._left())
                    batch, pending = sender.create_message_batch(), 0
                    try:
                        batch.add_message(message)
                    except MessageSizeExceededError as alone:
                        results[index] = alone
                        continue
                pending += 1
            if pending:
                sender.send_messages(batch, timeout=self._left())

    def _probe(self, link: ReceiveLink, receiver: Any) -> None:
        """Check the link's connection is alive: ask the service for nothing (a peek past the end).

        Called with the link's turn held. A probe that gets no answer in time
        closes the receiver's connection (the next call reconnects) and raises.
        """
        try:
            receiver.peek_messages(
                max_message_count=1,
                sequence_number=PROBE_SEQUENCE_NUMBER,
                timeout=min(self._left(), PROBE_TIMEOUT),
            )
        except Exception as exc:
            if self.error_code(exc) is ErrorCode.UNAVAILABLE:
                _drop_connection(receiver)
            raise
        link.heard = time.monotonic()

    def _hold(self, link: ReceiveLink, receiver: Any, messages: Sequence[Any]) -> list[RawMessage]:
        """Record the received messages in the token map; drop those whose lock already ended."""
        now = time.time()
        raws: list[RawMessage] = []
        with self._held_lock:
            self._forget_expired(now)
            for message in messages:
                until = message.locked_until_utc
                locked_until = until.timestamp() if until is not None else now
                if locked_until <= now:
                    # Pushed to the idle link after a timed-out receive and read
                    # only now: its lock is gone, the service redelivers it.
                    _log.debug("dropping message %r: its lock ended", message.message_id)
                    continue
                token = str(message.lock_token)
                handler = getattr(receiver, "_handler", None)
                self._held[token] = _Held(
                    message,
                    receiver,
                    locked_until,
                    handler,
                    getattr(handler, "_connection", None),
                    link,
                )
                raws.append(self._raw(message, token, locked_until))
        if raws:
            self._watch.wake()
        return raws

    def _check_lock_duration(self, raws: list[RawMessage]) -> None:
        if not raws or self._checked_lock:
            return
        self._checked_lock = True
        # The first lock seen tells whether lock_duration matches the queue.
        # A lock shorter than declared by more than the slack (network time,
        # clock skew) means the keeper would renew too late.
        actual = raws[0].visible_until.timestamp() - time.time()
        if abs(actual - self.lock_duration) > LOCK_SLACK:
            _log.warning(
                "queue %r locks messages for about %.1f s but lock_duration=%g; "
                "open it with lock_duration equal to the queue's LockDuration",
                self.queue,
                actual,
                self.lock_duration,
            )

    def _raw(self, message: Any, token: str, locked_until: float) -> RawMessage:
        enqueued = message.enqueued_time_utc
        return RawMessage(
            id=str(message.message_id if message.message_id is not None else token),
            body=_body(message),
            receipt=token,
            delivery_count=int(message.delivery_count or 0) + 1,
            enqueued_at=enqueued if enqueued is not None else to_datetime(time.time()),
            visible_until=to_datetime(locked_until),
            properties=_properties(message),
            raw=message,
        )

    def _forget_expired(self, now: float) -> None:
        """Drop map entries whose lock ended over a second ago (``_held_lock`` held)."""
        stale = [t for t, h in self._held.items() if h.locked_until + FORGET_AFTER < now]
        for token in stale:
            del self._held[token]

    def _lookup(self, receipt: str) -> _Held:
        if self._entity_missing:
            # The queue was deleted (by this driver, or a settle found it gone):
            # every lock went with it, and that is QueueNotFound, not LeaseLost.
            raise DriverError(
                ErrorCode.QUEUE_NOT_FOUND,
                f"azure-service-bus: queue {self.queue!r} does not exist (deleted)",
                backend_code="MessagingEntityNotFoundError",
            )
        with self._held_lock:
            held = self._held.get(receipt)
        if held is None:
            raise DriverError(
                ErrorCode.LEASE_LOST,
                "azure-service-bus: this driver holds no lock with that token (settled, "
                "expired, or received elsewhere)",
                backend_code="MessageLockLostError",
            )
        return held

    def _forget(self, receipt: str) -> None:
        with self._held_lock:
            self._held.pop(receipt, None)

    def _settle(self, receipt: str, action: str, **kwargs: Any) -> None:
        """Complete/abandon/dead-letter on the receiving link; forget the token when done.

        Within core's deadline, the wait for the connection included: the SDK
        takes no timeout per settle, so the receiver's outcome timeout (its
        ``timeout`` setting) is set to the time left while this call holds the
        connection. A message whose connection is gone (see :meth:`_check_connection`)
        is ``LeaseLost`` at once: Service Bus cannot settle it any more.
        """
        if self._sessions is not None:
            self._sessions.settle(receipt, action, **kwargs)
            return
        held = self._lookup(receipt)
        try:
            self._check_connection(held)
            with held.link.gate.priority(self._left()), _timeouts(held.receiver, self._left()):
                getattr(held.receiver, action)(held.message, **kwargs)
        except Exception as exc:
            self._note_failure(receipt, exc)
            raise
        held.link.heard = time.monotonic()
        self._forget(receipt)

    def _check_connection(self, held: _Held) -> None:
        """Raise ``LeaseLost`` if the connection that received ``held`` is gone.

        The SDK gives each receiver its own connection and closes it when it
        shuts the receiver's handler down after a connection error (the next call
        opens a new one); a management request that meets a reset socket also
        opens a new connection inside the same handler. Service Bus drops the
        locks of a connection that is gone: "If the reason is a broken network
        connection, the lock is dropped since Service Bus does not support
        recovery of existing AMQP links on a different connection" (Microsoft
        Learn, *Message transfers, locks, and settlement*); settling by lock
        token over the management link from the new connection gets
        ``com.microsoft:message-lock-lost``. So such a lease is lost, without a
        call: renewing it would only delay its redelivery (the service still
        renews those locks, but nothing can settle the message), and it comes
        back when its lock ends, with its delivery count raised. Within one
        connection a detached link's message still settles (the SDK falls back
        to the management link itself).
        """
        if held.handler is None:
            return  # not an SDK receiver (tests' stand-ins)
        handler = getattr(held.receiver, "_handler", None)
        connection = getattr(handler, "_connection", None)
        if (
            handler is not held.handler
            or connection is not held.connection
            or connection in self._gone
        ):
            raise DriverError(
                ErrorCode.LEASE_LOST,
                "azure-service-bus: the connection this message was received on is gone "
                "(reset or closed); Service Bus cannot settle it any more, and it comes "
                "back when its lock ends",
                backend_code="MessageLockLostError",
            )

    def _holding(self) -> list[Any]:
        """The connections that hold leases now (for the connection watch)."""
        with self._held_lock:
            connections = {id(h.connection): h.connection for h in self._held.values()}
        if self._sessions is not None:
            connections.update((id(c), c) for c in self._sessions.holding())
        return [c for c in connections.values() if c is not None]

    def _connection_gone(self, connection: Any) -> None:
        """The watch found ``connection`` gone: report the leases received on it, at once.

        Service Bus drops its locks and releases its sessions (see
        :meth:`_check_connection`), so those leases are lost now, not at their
        next renewal; core marks them (``leases_lost``), the driver only forgets
        its sessions and remembers the connection as gone.
        """
        self._gone.add(connection)
        error = DriverError(
            ErrorCode.LEASE_LOST,
            "azure-service-bus: the connection this message was received on is gone "
            "(reset or closed); Service Bus dropped its lock (and released its session)",
            backend_code="MessageLockLostError",
        )
        with self._held_lock:
            receipts = [t for t, h in self._held.items() if h.connection is connection]
        if self._sessions is not None:
            receipts += self._sessions.connection_gone(connection, error)
        report = self.leases_lost
        if receipts and report is not None:
            _log.debug("a connection is gone: %d leases lost", len(receipts))
            report(receipts, error)

    def _note_failure(self, receipt: str | None, exc: BaseException) -> None:
        """After a failed call: a lost lock's token is forgotten, a missing queue remembered."""
        code = self.error_code(exc)
        if code is ErrorCode.QUEUE_NOT_FOUND:
            self._entity_missing = True
        elif code is ErrorCode.LEASE_LOST and receipt is not None:
            self._forget(receipt)

    @staticmethod
    def _renewed(held: _Held, expiry: float) -> None:
        # Keep the SDK's client-side lock check in step with the broker.
        held.message._expiry = to_datetime(expiry)
        held.locked_until = expiry

    def _left(self) -> float:
        """The time left before core's deadline for this call, at most ``read_timeout``.

        Raises :class:`~leasekit.deadline.DeadlineExceeded` once it has passed: no
        SDK call starts then (the SDK would still read its socket at least once).
        """
        check_deadline("azure-service-bus")
        left = call_timeout(self._read_timeout)
        assert left is not None
        return left

    def _renew_each(
        self,
        receipts: Sequence[str],
        group: list[tuple[int, _Held]],
        results: list[Visibility | BaseException | None],
    ) -> None:
        for index, held in group:
            # The renew-lock request itself, as for several tokens (one code
            # path); renew_message_lock only where the SDK has no such method.
            renew = getattr(held.receiver, "_renew_locks", None)
            try:
                self._check_connection(held)  # an earlier one may have found it reset
                with held.link.gate.priority(self._left()):
                    if renew is not None:
                        token = str(held.message.lock_token)
                        [until] = _expirations(renew(token, timeout=self._left()))
                    else:
                        until = held.receiver.renew_message_lock(
                            held.message, timeout=self._left()
                        ).timestamp()
                held.link.heard = time.monotonic()
            except Exception as exc:
                self._note_failure(receipts[index], exc)
                results[index] = exc
                continue
            self._renewed(held, until)
            results[index] = Visibility(receipts[index], to_datetime(held.locked_until))

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        """``abandon_message`` of each: available again at once (``delay`` is 0, core checks)."""
        return each(receipts, lambda receipt: self._settle(receipt, "abandon_message"))

    def dead_letter(self, receipt: str, reason: str, message: RawMessage) -> None:
        """``dead_letter_message`` with ``reason`` as the DeadLetterReason."""
        self._settle(receipt, "dead_letter_message", reason=reason)

    def group_state(self, receipt: str) -> bytes | None:
        """The session state of the leased message's session (sessions only)."""
        if self._sessions is None:
            return super().group_state(receipt)
        state: bytes | None = self._sessions.group_state(receipt)
        return state

    def set_group_state(self, receipt: str, state: bytes | None) -> None:
        """Set the session state of the leased message's session (sessions only)."""
        if self._sessions is None:
            super().set_group_state(receipt, state)
            return
        self._sessions.set_group_state(receipt, state)

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        """Peek up to ``limit`` messages of ``<queue>/$deadletterqueue`` (nothing is settled)."""
        with self._setup_lock:
            client = self._get_client()
        return peek_dead_letters(client, self.queue, limit, self._left)

    def dead_letter_store(self) -> ServiceBusDriver:
        """The queue's ``$deadletterqueue`` sub-queue as a driver (PeekLock), for re-driving."""
        options: dict[str, Any] = {
            "lock_duration": self.lock_duration,
            "max_message_size": self._max_message_size,
            "max_wait": self.capabilities.max_wait,
            "retry_total": self._retry_total,
            "read_timeout": self._read_timeout,
            "admin_port": self.admin_port,
        }
        if self._uses_connection_string:
            options["connection_string"] = self._secret.value
        else:
            options["namespace"] = self.namespace
            options["credential"] = self._secret.value
        return self.dead_letter_driver(self.queue, **options)

    def stats(self) -> QueueStats:
        """The queue's runtime properties as counts (see :func:`.admin.queue_stats`)."""
        left = self._left()
        with self._admin_client() as admin:
            return queue_stats(admin, self.queue, left)

    def _admin_client(self) -> Any:
        """The administration client; for an emulator, on its HTTP port in plain HTTP."""
        return admin_client(
            emulator=self.emulator,
            namespace=self.namespace,
            admin_port=self.admin_port,
            secret=self._secret.value,
            uses_connection_string=self._uses_connection_string,
        )

    # ----------------------------------------------------------------- errors

    def error_code(self, exc: BaseException) -> ErrorCode:
        """Classify an SDK error by its class (:func:`.error_codes.classify`)."""
        return classify(exc, entity_missing=self._entity_missing)

    def backend_code(self, exc: BaseException) -> str | None:
        """The SDK error's class name (``MessageLockLostError``...)."""
        return sdk_code(exc)

    def is_retryable(self, exc: BaseException) -> bool:
        """Transient errors (``BackendUnavailable``): core retries them within its deadline.

        The SDK's own retries are off by default (``retry_total=0``): its backoff
        (0.8 s doubling) would outlast a renewal's time left after a short cut.
        """
        return self.error_code(exc) is ErrorCode.UNAVAILABLE

    def close(self) -> None:
        """Close every receiver, the sender and the client (threads and sockets end).

        Waits for the calls in progress on each receive link (a receive turn is
        at most ``RECEIVE_SLICE``), then closes the links in turn.
        """
        if self._closed:
            return
        self._closed = True
        self._watch.close()
        if self._sessions is not None:
            self._sessions.close()
        with self._links.all_held() as links, self._send_lock, self._setup_lock:
            handlers = [link.receiver for link in links] + [self._sender, self._client]
            for link in links:
                link.receiver = None
            self._sender = self._client = None
            with self._held_lock:
                self._held.clear()
        for handler in handlers:
            if handler is None:
                continue
            try:
                handler.close()
            except Exception:  # closing must not raise; the socket is gone either way
                _log.debug("closing %r failed", type(handler).__name__, exc_info=True)
