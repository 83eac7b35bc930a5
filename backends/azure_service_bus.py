"""The Azure Service Bus backend, on ``azure-servicebus`` (>= 7.15): queues, PeekLock.

URLs:
    ``azure-service-bus://NAMESPACE.servicebus.windows.net/QUEUE`` (a bare
    ``NAMESPACE`` gets ``.servicebus.windows.net`` added). Query options:
    ``lock_duration`` (seconds, see Limits), ``max_message_size``, ``max_wait``,
    ``retry_total``, ``sessions`` (``true`` for a ``RequiresSession`` queue: ordered
    groups, see :mod:`.azure_service_bus_sessions`), ``session`` (lease only this
    named session), ``read_timeout`` (seconds an
    operation may wait for the
    service's answer, default 10: the SDK's ``timeout`` and ``try_timeout``; a
    renewal is bounded tighter, by the time left on its lease), ``receivers``
    (receive links, default 1, at most 16; see Connections). The SDK opens
    connections with a fixed 1 s connect timeout. Credentials are keyword options
    only and are refused in a URL:
    ``connection_string=...`` (a namespace connection string, or one with
    ``EntityPath``) or ``credential=...`` (an ``azure-identity`` credential, an
    ``AzureNamedKeyCredential`` or ``AzureSasCredential``). Keyword form:
    ``leasekit.open("azure-service-bus", queue="orders", connection_string=...)``;
    with a connection string the namespace comes from its ``Endpoint``. The
    connection string never appears in a repr, a log line or an error message.
    Constructing the driver does no network I/O: one ``ServiceBusClient``, one
    sender and ``receivers`` PeekLock receivers (``prefetch_count=0``) are made on
    first use and reused; :meth:`ServiceBusDriver.close` closes them all, which
    stops the SDK's keep-alive threads and closes the sockets.

Delivery semantics:
    At least once. A lease is a PeekLock receive: the message is locked for the
    queue's **LockDuration**, a property of the entity that a receive cannot
    choose. So the capabilities declare ``fixed_lease`` (= ``min_lease`` =
    ``max_lease``): core refuses any other physical
    duration, and a longer hold is ``LeaseKeeper`` renewing the fixed lock in
    steps. The driver learns the LockDuration from the ``lock_duration`` option
    (default 60 s, the Service Bus default): capabilities must be known before
    the first call. A lease's expiry is always the broker's ``locked_until`` (also
    after renew), so a wrong option cannot make a lease look longer than it is;
    a first receive whose lock differs from the option by more than a second is
    logged as a warning. :meth:`ServiceBusDriver.create_queue` creates queues with
    that LockDuration, and refuses (real Service Bus) an existing queue whose
    LockDuration differs.

    The receipt is the lock token (a UUID string). Renew is ``renew_message_lock``
    (the token is unchanged, ``renew_rotates_receipt=False``); the keeper's batch
    renew sends several tokens in one ``com.microsoft:renew-lock`` management call
    (``max_renew_batch``), falling back to one call per token when one of them is
    lost, so each lease gets its own result. Complete, abandon and dead-letter are
    native settlements on the receive link that received the message (Service Bus
    settles a message only there), so the driver keeps a map lock token →
    (message, receiver) for the messages it holds; an entry leaves the map when it
    is settled or a second after its lock ended. A settle or renew of a token not
    in the map (completed, expired, or from another process) is ``LeaseLost``, and
    so is one of a message whose receiving connection is gone (a reset or a
    reconnect): Service Bus drops the locks of a broken connection, so such a
    message cannot be settled any more and comes back when its lock ends. An
    abandon cannot be delayed (``max_abandon_delay=0``): the message is available
    again at once, with its delivery count raised. ``delivery_count`` is 1 on first
    delivery: Service Bus sends the number of *failed* deliveries in the AMQP
    header and the Python SDK shows that raw value (0 first), so the driver adds 1
    (the .NET and Java SDKs do the same). An expired lock is not usable even if
    nobody re-received the message (the SDK refuses it before sending:
    ``expired_receipt_usable=False``). Stale tokens are refused by the service
    (``message-lock-lost``): ``detects_stale_receipts=True``.

    Dead-letter is native (``native_dead_letter=True``): the message moves to
    ``<queue>/$deadletterqueue`` with the reason as ``DeadLetterReason``; Service
    Bus also moves it there itself after the queue's ``MaxDeliveryCount``
    deliveries (reason ``MaxDeliveryCountExceeded``). ``peek_dead_letters`` peeks
    the sub-queue through a short-lived receiver (delivery counts unchanged).

    Time-to-live: Service Bus does not expire a message while it is locked, and
    renewing the lock past the TTL succeeds (documented: "the application might be
    in possession of a message that has expired"); the message expires once its
    lock ends. So, unlike DESIGN's rule 4, the TTL does not win over renew here.

    Two SDK behaviours worth knowing: (1) a receive that times out leaves its link
    credit outstanding, so a message sent afterwards is pushed to this idle
    receiver and locked to it; the SDK releases it (no delivery-count increase)
    when it next reads the socket outside a receive (its keep-alive, every 5 s), or
    the next receive returns it. A message returned after its lock already ended is
    dropped here (the service redelivers it). (2) The SDK takes concurrent calls on
    one handler (its own ``AutoLockRenewer`` renews from a thread pool), but it
    holds its socket lock through each blocking read, so calls side by side wait
    for each other's reads: the driver takes turns on each receiver's connection,
    one SDK call at a time, settles and renewals before receives, which is 9 to 23
    times faster under a Consumer (1 to 8 threads) than letting them overlap
    (measured in docs/benchmarks/azure_service_bus.md).

Connections:
    The SDK gives every receiver (and the sender) its own AMQP connection
    (``ServiceBusClient`` shares none), with one receive link and one management
    link on it; there is no public way to put two receive links on one
    connection, and they would share its socket lock anyway. With
    ``receivers=N`` the driver keeps N receivers, each made (and its connection
    opened) on the first receive that gets it: a receive takes the next receiver
    with no call in progress or waiting, round robin
    (``azure_service_bus_links``), so receives side by side run on different
    connections and the settles of one batch run on their receiver while the
    next receive runs on another. A message is settled and renewed only on the
    receiver that received it (each token's receiver is in the map above;
    renewals of several tokens go one ``renew-lock`` call per receiver). Each
    receiver probes its own connection (``PROBE_AFTER``), and a reset loses the
    locks of that connection only. Each extra receiver costs a connection, a
    socket, the SDK's keep-alive thread, a probe every ``PROBE_AFTER`` seconds
    while the queue is idle, and the first receive on it opens it; an idle
    receiver whose last receive left credit can hold a newly sent message until
    its next receive or the SDK's keep-alive release (at most 5 s), which more
    receivers make more likely on a quiet queue. What it brings is measured in
    docs/benchmarks.md ("Service Bus: several receive links").

    Creating and deleting queues: ``ServiceBusAdministrationClient`` (needs Manage
    rights), over HTTPS on Service Bus. With ``UseDevelopmentEmulator=true`` it is
    pointed at the emulator's HTTP port (option ``admin_port``, default 5300 as on
    Microsoft's emulator; leasekit's emulator serves the same API) and speaks plain
    HTTP (the Python SDK would use https).

Limits:
    Lease = the queue's LockDuration exactly (Service Bus allows 5 s – 5 min;
    leasekit's emulator also allows 1–4 s, for tests). 32 messages per receive
    (``MAX_RECEIVE``), 100 tokens per renew call (``MAX_RENEW``), 100 messages per
    send batch (split further by size), one settle per call. Bodies up to
    ``max_message_size`` (the entity's maximum message size, default 262144 bytes =
    Standard tier; Premium allows more) minus ``HEADER_ROOM`` (8192 bytes kept for
    the AMQP header and properties). Send delay (scheduled enqueue) up to 30 days,
    TTL up to 10 years (the queue's DefaultMessageTimeToLive caps it). Receives wait
    at most ``max_wait`` seconds per call (default 1; core loops for longer waits).

    Counts: ``Queue.stats()`` reads the queue's runtime properties through
    ``ServiceBusAdministrationClient.get_queue_runtime_properties`` (the management
    API, Manage rights; the emulator serves it too): ``ScheduledMessageCount`` as
    ``delayed``, ``DeadLetterMessageCount`` as ``dead_lettered``, and as ``total``
    ``MessageCount`` (every message of the entity) less the dead-letter and
    transfer sub-queues. ``visible`` and ``leased`` are ``None``: no API counts
    locked messages, and ``ActiveMessageCount`` ("ready for delivery", deferred
    ones included) is reported to count locked ones too (kedacore/keda#1214), so
    it cannot be split into the two. Microsoft calls reading the counters
    expensive for the broker: poll them at a measured pace.

Raw types:
    ``lease.raw`` is the SDK's ``azure.servicebus.ServiceBusReceivedMessage``; do
    not settle it yourself. SDK errors are ``azure.servicebus.exceptions.*``
    (subclasses of ``ServiceBusError``), ``azure.core.exceptions.*`` from the
    administration client, or :class:`leasekit.spi.DriverError` for a token the
    driver does not hold.

Errors:
    ``MessageLockLostError``, ``MessageAlreadySettled``, an unknown lock token, a
    settle on a receiver the SDK shut down → ``LeaseLost``;
    ``MessagingEntityNotFoundError`` (also a settle after the queue was deleted)
    → ``QueueNotFound``; ``ServiceBusAuthenticationError`` /
    ``ServiceBusAuthorizationError`` → ``AuthenticationFailed``;
    ``ServiceBusConnectionError``, ``ServiceBusCommunicationError``,
    ``OperationTimeoutError``, ``ServiceBusServerBusyError``,
    ``ServiceBusQuotaExceededError``, ``MessagingEntityDisabledError`` →
    ``BackendUnavailable``; ``MessageSizeExceededError`` → ``MessageTooLarge``.
    The SDK retries transient errors itself (``retry_total``), so core does not
    (``is_retryable`` is ``False``). The backend code kept on the leasekit error is
    the SDK error's class name (``MessageLockLostError``...).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import logging
import re
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from leasekit.capabilities import Capabilities
from leasekit.clock import to_datetime
from leasekit.deadline import DeadlineExceeded, call_timeout, check_deadline
from leasekit.errors import BackendNotInstalled, InvalidArgument, InvalidURL
from leasekit.hookspecs import hookimpl
from leasekit.options import as_bool, as_float, as_int, as_text
from leasekit.redaction import Secret as _Secret
from leasekit.redaction import install_log_redaction
from leasekit.registry import BackendSpec
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
from leasekit.url import check_endpoint

from .azure_service_bus_links import ReceiveLink, ReceiveLinks
from .azure_service_bus_watch import ConnectionWatch, socket_of

__all__ = ["HEADER_ROOM", "ServiceBusDriver"]

_log = logging.getLogger("leasekit.backends.azure_service_bus")

#: Messages per receive. Larger batches cost fewer calls, but every message's
#: lock starts on delivery, so a big batch held by a slow worker needs renewals sooner.
MAX_RECEIVE = 32
#: Lock tokens per renew-lock management call (Service Bus documents no limit;
#: 100 tokens is a 1.6 KB request and keeps one failed call cheap to redo per token).
MAX_RENEW = 100
#: Messages per send batch before the size split (the service caps a batch by bytes).
MAX_SEND = 100
#: Bytes of the entity's message size kept for the AMQP header, annotations and
#: properties; more room means smaller bodies, less means large property sets fail.
HEADER_ROOM = 8192
#: Service Bus Standard's maximum message size (Premium entities allow more).
DEFAULT_MAX_MESSAGE_SIZE = 262144
#: Service Bus Premium's largest maximum message size (100 MB).
MAX_MESSAGE_SIZE = 100 * 1024 * 1024
#: Longest ``max_wait`` option: one receive call longer than an hour only delays close().
MAX_WAIT_OPTION = 3600.0
#: The loggers of the SDKs this driver uses; core redacts their records (``leasekit.redaction``).
SDK_LOGGERS = ("azure.core", "azure.servicebus", "azure.identity", "msal", "uamqp", "pyamqp")
#: The Service Bus default LockDuration (PT1M).
DEFAULT_LOCK_DURATION = 60.0
#: Longest lock Service Bus allows (PT5M).
MAX_LOCK_DURATION = 300.0
#: Default longest wait of one receive call; longer waits are core's loop. Short
#: enough that close() and a stop are noticed quickly, long enough to cost few calls.
DEFAULT_MAX_WAIT = 1.0
#: One turn of a receive on the receiver's connection; a settle or renewal
#: waits at most about this long (plus the SDK's 0.2 s batch top-up after a
#: first message). Shorter turns cost more flow frames when idle.
RECEIVE_SLICE = 0.1
#: The receiver's socket read timeout (the SDK's ``socket_timeout``, 0.2 s by
#: default): a receive turn cannot end sooner than one read, and each wake-up
#: costs a little CPU while idle.
SOCKET_TIMEOUT = 0.05
#: Seconds an operation may wait for the service's answer (the SDK's own default
#: is 60); a renewal is bounded tighter, by the time left on its lease.
DEFAULT_READ_TIMEOUT = 10.0
#: Longest read_timeout accepted (an hour).
MAX_READ_TIMEOUT = 3600.0
#: The SDK refuses a zero wait; a "return at once" receive waits this long
#: (a message already pushed to the link is returned within a millisecond).
MIN_WAIT = 0.02
#: A map entry stays this long after its lock ended, so a late settle gets the
#: SDK's own lock-lost error, then it is dropped.
FORGET_AFTER = 1.0
#: Longest scheduled-enqueue delay and per-message TTL leasekit accepts.
MAX_SEND_DELAY = 30 * 86400.0
MAX_TTL = 10 * 365 * 86400.0
#: Tolerated difference between the lock_duration option and the broker's lock.
LOCK_SLACK = 1.0
#: Seconds past an open's deadline before its guard ends a connection still not
#: open (:class:`_OpenGuard`): the SDK's own deadline checks go first.
OPEN_GUARD_GRACE = 0.2
#: An emulator's management port (Microsoft's emulator serves HTTP on 5300).
DEFAULT_ADMIN_PORT = 5300
#: Seconds of empty receives, with nothing else heard from the service, after
#: which a receive probes the connection (a dead one returns empty receives too).
#: Shorter notices a partition sooner; each probe is one management request.
PROBE_AFTER = 2.0
#: Longest wait for the probe's answer: how long a partition may look like an
#: idle queue once a probe is due. Loopback answers in about a millisecond.
PROBE_TIMEOUT = 2.0
#: SDK receivers per queue by default (each its own connection and receive link);
#: see ``receive`` and docs/backends/azure_service_bus.md for what more cost and bring.
DEFAULT_RECEIVERS = 1
#: Most SDK receivers per queue: each is a connection, a socket and a keep-alive thread.
MAX_RECEIVERS = 16
#: The probe peeks from this sequence number: past any queue's end, so the
#: answer carries no message (Service Bus answers 204 No Content).
PROBE_SEQUENCE_NUMBER = 2**62

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,258}[A-Za-z0-9])?$")
_SECRET_OPTIONS = frozenset(
    {"connection_string", "credential", "shared_access_key", "shared_access_signature"}
)

#: Where Service Bus keeps the reason on a dead-lettered message (application
#: properties); shown as ``DeadLetter.reason``, not repeated in its properties.
_DEAD_LETTER_PROPERTIES = frozenset({"DeadLetterReason", "DeadLetterErrorDescription"})

_LOST = frozenset({"MessageLockLostError", "MessageAlreadySettled", "SessionLockLostError"})
_NOT_FOUND = frozenset({"MessagingEntityNotFoundError", "ResourceNotFoundError"})
_EXISTS = frozenset({"MessagingEntityAlreadyExistsError", "ResourceExistsError"})
_AUTH = frozenset(
    {
        "ServiceBusAuthenticationError",
        "ServiceBusAuthorizationError",
        "ClientAuthenticationError",
        "CredentialUnavailableError",
    }
)
_UNAVAILABLE = frozenset(
    {
        "ServiceBusConnectionError",
        "ServiceBusCommunicationError",
        "OperationTimeoutError",
        "ServiceBusServerBusyError",
        "ServiceBusQuotaExceededError",
        "MessagingEntityDisabledError",
        "ServiceRequestError",
        "ServiceResponseError",
        "ServiceRequestTimeoutError",
        "ServiceResponseTimeoutError",
        # pyamqp's own errors, where an SDK step raises them unconverted
        "AMQPConnectionError",
        "AMQPSessionError",
        "AMQPLinkError",
        "DeadlineExceeded",
    }
)
_TOO_LARGE = frozenset({"MessageSizeExceededError"})


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``azure-service-bus``."""
    return [
        BackendSpec(
            name="azure-service-bus",
            driver="leasekit.backends.azure_service_bus:ServiceBusDriver",
            extra="azure-service-bus",
            description="Azure Service Bus queues (PeekLock, fixed lock renewed, native DLQ)",
        )
    ]


@dataclass
class _Held:
    """A message this driver holds the lock of, and the receiver that must settle it.

    ``handler`` is the receiver's AMQP client (its connection and link) the message
    came on: once the SDK replaced it (a reconnect), that connection is gone and
    Service Bus cannot settle the message any more (``ServiceBusDriver._check_connection``).
    """

    message: Any
    receiver: Any
    locked_until: float
    handler: Any = None
    #: The handler's AMQP connection when the message came (pyamqp replaces it
    #: inside the same handler when a management request meets a reset socket).
    connection: Any = None
    #: The receive link the message came on: its settles and renewals take turns there.
    link: ReceiveLink = field(default_factory=lambda: ReceiveLink(-1))


class _OpenGuard:
    """Ends an SDK handler's open that is still running at its deadline.

    The SDK bounds an open's waits for the CBS token and the link attach by the
    timeout it is given, but not the connection's own open: pyamqp reads the
    SASL handshake (and the protocol header) on a socket without a timeout, so
    an open into a partition (a peer that accepts TCP and never answers) would
    block for good. Just after the deadline (``OPEN_GUARD_GRACE``: the SDK's
    own deadline checks go first), if the connection is still not open, this
    shuts its socket down, which makes that read fail at once (the SDK raises a
    connection error and shuts the handler down; the next call opens a new
    connection). An open connection is left alone: the SDK's waits for the
    token and the attach end by the deadline themselves (a session accept with
    no session available is the service's timeout, not a partition).
    """

    def __init__(self, handler: Any, timeout: float) -> None:
        self._handler = handler
        self._lock = threading.Lock()
        self._done = False
        self.fired = False
        self._timer = threading.Timer(max(timeout, 0.0) + OPEN_GUARD_GRACE, self._fire)
        self._timer.name = "leasekit-sb-open-guard"
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            client = getattr(self._handler, "_handler", None)
            connection = getattr(client, "_connection", None)
            if getattr(getattr(connection, "state", None), "name", None) == "OPENED":
                return  # the SDK's own deadline ends the rest of the open
            sock = socket_of(connection)
            if sock is None:
                return  # not connected yet: the SDK's connect has its own 1 s timeout
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


def _open_handler(handler: Any, timeout: float) -> None:
    """Open an SDK sender or receiver (a no-op while open) within ``timeout`` seconds.

    ``__enter__`` would open with the SDK's retries and its own ``try_timeout``;
    ``_open(timeout)`` is the step it repeats, bounded by the time given, and
    :class:`_OpenGuard` bounds the part the SDK does not (the connection's open).
    """
    opener = getattr(handler, "_open", None)
    if opener is None:
        handler.__enter__()
        return
    if getattr(handler, "_running", False):
        return  # open: nothing to do (the SDK's _open returns at once too)
    guard = _OpenGuard(handler, timeout)
    try:
        opener(timeout)
    except Exception as exc:
        guard.cancel()
        if guard.fired:
            raise DriverError(
                ErrorCode.UNAVAILABLE,
                f"azure-service-bus: no answer from the service within {timeout:.1f} s "
                "while opening the connection",
                backend_code="OperationTimeoutError",
            ) from exc
        # What the SDK's retry loop does with an error of one attempt: the raw
        # AMQP error as the ServiceBusError it means, the handler shut down if
        # the connection is gone (the next call reconnects).
        handle = getattr(handler, "_handle_exception", None)
        if handle is None:
            raise
        raise handle(exc) from exc
    finally:
        guard.cancel()


@contextlib.contextmanager
def _timeouts(handler: Any, seconds: float) -> Iterator[None]:
    """Run one SDK call with the handler's operation timeouts set to ``seconds``.

    The SDK takes no timeout per settle: a settle waits for the service's
    outcome for the handler's ``timeout`` setting, and over the management link
    for its ``try_timeout``. Only for a caller that holds the handler's
    connection alone (the gate), so no other call sees the change.
    """
    config = getattr(handler, "_config", None)
    if config is None:
        yield
        return
    saved = config.timeout, config.try_timeout
    # Half each: a settle whose outcome does not come on the receive link is
    # tried again over the management link by the SDK, within the same call.
    config.timeout = config.try_timeout = seconds / 2
    try:
        yield
    finally:
        config.timeout, config.try_timeout = saved


def _drop_connection(receiver: Any) -> None:
    """Close the receiver's AMQP client so its next call opens a new connection.

    For a connection that stopped answering: the SDK keeps using it otherwise.
    Never raises (the socket may be gone already).
    """
    try:
        receiver._close_handler()
    except Exception:
        _log.debug("closing the receiver's connection failed", exc_info=True)


def _installed(module: str) -> bool:
    """Whether ``module`` imports (``find_spec`` raises if a parent package is missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def _parse_connection_string(text: str) -> dict[str, str]:
    """The ``key=value;`` pairs of a connection string, keys lowercased."""
    parts: dict[str, str] = {}
    for item in text.split(";"):
        key, sep, value = item.strip().partition("=")
        if sep and key:
            parts[key.strip().lower()] = value.strip()
    return parts


def _with_endpoint(connection_string: str, endpoint: str) -> str:
    """``connection_string`` with its ``Endpoint`` replaced."""
    parts = [
        f"Endpoint={endpoint}" if item.strip().lower().startswith("endpoint=") else item
        for item in connection_string.split(";")
    ]
    return ";".join(parts)


def _plain_http_transport() -> Any:
    """An azure-core transport that sends the admin client's ``https://`` URLs as ``http://``.

    azure-servicebus 7.15 builds management URLs with ``https://`` even when the
    connection string says ``UseDevelopmentEmulator=true`` (only the .NET admin
    client speaks plain HTTP to an emulator); emulators serve plain HTTP.
    """
    from azure.core.pipeline.transport import RequestsTransport

    class PlainHttpTransport(RequestsTransport):  # type: ignore[misc]
        def send(self, request: Any, **kwargs: Any) -> Any:
            if request.url.startswith("https://"):
                request.url = "http://" + request.url[len("https://") :]
            return super().send(request, **kwargs)

    return PlainHttpTransport()


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else str(value)


def _body(message: Any) -> bytes:
    """The body as bytes: data sections joined; another producer's value body as text."""
    from azure.servicebus.amqp import AmqpMessageBodyType

    kind = message.body_type
    body = message.body
    if kind == AmqpMessageBodyType.DATA:
        return b"".join(bytes(part) for part in body)
    if kind == AmqpMessageBodyType.VALUE:
        if isinstance(body, bytes | bytearray):
            return bytes(body)
        if body is None:
            return b""
        return _text(body).encode("utf-8")
    return repr(list(body)).encode("utf-8")


def _properties(message: Any) -> dict[str, str]:
    raw = message.application_properties or {}
    return {_text(k): _text(v) for k, v in raw.items()}


def _expirations(response: Any) -> list[float]:
    """Seconds since the epoch from a renew-lock reply (``{"expirations": [ms, ...]}``)."""
    values = None
    if isinstance(response, Mapping):
        values = response.get(b"expirations", response.get("expirations"))
    if values is None:
        raise DriverError(ErrorCode.UNKNOWN, "renew-lock reply without expirations")
    return [float(ms) / 1000.0 for ms in values]


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
            session id, and leasing accepts sessions (:mod:`.azure_service_bus_sessions`).
        session: with ``sessions``, lease only this named session (default: the next
            available one).
        receivers: SDK receivers (each its own AMQP connection and receive link)
            that receives spread over, round robin (default ``DEFAULT_RECEIVERS``,
            at most ``MAX_RECEIVERS``); each opens on first use.
    """

    scheme = "azure-service-bus"
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
        parts: dict[str, str] = {}
        if connection_string is not None:
            if not isinstance(connection_string, str) or "endpoint=" not in (
                connection_string.lower()
            ):
                raise ValueError(
                    "azure-service-bus: connection_string is not a Service Bus connection "
                    "string (no Endpoint=...)"
                )
            parts = _parse_connection_string(connection_string)
            if credential is not None:
                raise ValueError(
                    "azure-service-bus: give connection_string or credential, not both"
                )
        endpoint_host = ""
        if parts:
            endpoint = parts.get("endpoint", "")
            check_endpoint(endpoint, "connection_string's Endpoint", self.scheme)
            endpoint_host = endpoint.split("://", 1)[-1].strip("/")
        if namespace is not None:
            as_text(namespace, "namespace")
            check_endpoint(namespace, "namespace", self.scheme, self.credential_hint)
            namespace = namespace.strip().split("://", 1)[-1].strip("/")
            if "." not in namespace.split(":")[0]:
                namespace += ".servicebus.windows.net"
            if endpoint_host and endpoint_host.lower() != namespace.lower():
                raise ValueError(
                    f"azure-service-bus: namespace {namespace!r} differs from the connection "
                    f"string's endpoint {endpoint_host!r}"
                )
        host = namespace or endpoint_host
        if not host:
            raise ValueError(
                "azure-service-bus: give connection_string=..., or namespace=... with "
                "credential=..."
            )
        if connection_string is None and credential is None:
            raise ValueError(
                "azure-service-bus: no credentials; pass connection_string=... or credential=... "
                "(keyword options, never in the URL)"
            )
        name = queue or parts.get("entitypath")
        if not isinstance(name, str) or not _QUEUE_NAME.match(name):
            raise ValueError(
                f"azure-service-bus: {name!r} is not a queue name (1-260 letters, digits, "
                "'.', '-', '_' or '/', starting and ending with a letter or digit)"
            )
        if parts.get("entitypath") and parts["entitypath"] != name:
            raise ValueError(
                f"azure-service-bus: the connection string is for entity "
                f"{parts['entitypath']!r}, not {name!r}"
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
            from .azure_service_bus_sessions import SessionReceivers

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

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """``complete_message`` of each on the receiver that received it."""
        return each(receipts, lambda receipt: self._settle(receipt, "complete_message"))

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
        from azure.servicebus import ServiceBusSubQueue

        # prefetch 1 and keep_alive 0: a peek needs no PeekLock link, and then the
        # SDK starts no keep-alive thread (closing it is instant).
        with self._setup_lock:
            client = self._get_client()
        receiver = client.get_queue_receiver(
            self.queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, prefetch_count=1, keep_alive=0
        )
        letters: list[DeadLetter] = []
        with contextlib.closing(receiver):
            _open_handler(receiver, self._left())
            while len(letters) < limit:
                peeked = receiver.peek_messages(
                    max_message_count=limit - len(letters), timeout=self._left()
                )
                if not peeked:
                    break
                for message in peeked:
                    letters.append(
                        DeadLetter(
                            id=str(message.message_id),
                            body=_body(message),
                            reason=message.dead_letter_reason,
                            delivery_count=int(message.delivery_count or 0) + 1,
                            properties={
                                k: v
                                for k, v in _properties(message).items()
                                if k not in _DEAD_LETTER_PROPERTIES
                            },
                            enqueued_at=message.enqueued_time_utc,
                        )
                    )
        return letters[:limit]

    def dead_letter_store(self) -> ServiceBusDeadLetters:
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
        return ServiceBusDeadLetters(self.queue, **options)

    def stats(self) -> QueueStats:
        """The queue's runtime properties (``get_queue_runtime_properties``) as counts.

        ``ScheduledMessageCount`` is ``delayed``, ``DeadLetterMessageCount``
        ``dead_lettered``, and ``MessageCount`` less the dead-letter and transfer
        sub-queues ``total``. ``visible`` and ``leased`` stay ``None``: nothing
        counts locked messages, and ``ActiveMessageCount`` is reported to include
        them (see Limits), so it cannot be split into the two.
        """
        left = self._left()
        with self._admin_client() as admin:
            runtime = admin.get_queue_runtime_properties(
                self.queue, connection_timeout=left, read_timeout=left
            )
        parts = (
            runtime.total_message_count,
            runtime.dead_letter_message_count,
            runtime.transfer_dead_letter_message_count,
            runtime.transfer_message_count,
        )
        total = None
        if all(isinstance(part, int) for part in parts):
            everything, dead, transfer_dead, transfer = parts
            total = everything - dead - transfer_dead - transfer
        return QueueStats(
            delayed=runtime.scheduled_message_count,
            dead_lettered=runtime.dead_letter_message_count,
            total=total,
        )

    # ------------------------------------------------------------------ admin

    def create_queue(self) -> None:
        """Create the queue with LockDuration = ``lock_duration``; an existing one is fine.

        ``ServiceBusAdministrationClient.create_queue``; an existing queue with another
        LockDuration is refused (its leases would not match the capabilities).
        """
        from azure.core.exceptions import ResourceExistsError

        with self._admin_client() as admin:
            try:
                admin.create_queue(
                    self.queue,
                    lock_duration=datetime.timedelta(seconds=self.lock_duration),
                    requires_session=self.sessions,
                )
            except ResourceExistsError:
                properties = admin.get_queue(self.queue)
                if bool(properties.requires_session) != self.sessions:
                    raise DriverError(
                        ErrorCode.INVALID_ARGUMENT,
                        f"azure-service-bus: queue {self.queue!r} exists with RequiresSession="
                        f"{bool(properties.requires_session)}; open it with "
                        f"sessions={str(bool(properties.requires_session)).lower()}",
                    ) from None
                existing = properties.lock_duration
                seconds = existing.total_seconds() if existing is not None else None
                if seconds is not None and abs(seconds - self.lock_duration) > 1e-3:
                    raise DriverError(
                        ErrorCode.INVALID_ARGUMENT,
                        f"azure-service-bus: queue {self.queue!r} exists with LockDuration "
                        f"{seconds:g} s; open it with lock_duration={seconds:g}",
                    ) from None
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

    def _admin_client(self) -> Any:
        """The administration client; for an emulator, on its HTTP port in plain HTTP."""
        from azure.servicebus.management import ServiceBusAdministrationClient

        if self.emulator:
            host = self.namespace.rpartition(":")[0] or self.namespace
            return ServiceBusAdministrationClient.from_connection_string(
                _with_endpoint(self._secret.value, f"sb://{host}:{self.admin_port}"),
                transport=_plain_http_transport(),
            )
        if self._uses_connection_string:
            return ServiceBusAdministrationClient.from_connection_string(self._secret.value)
        return ServiceBusAdministrationClient(self.namespace, self._secret.value)

    # ----------------------------------------------------------------- errors

    def error_code(self, exc: BaseException) -> ErrorCode:
        """Classify an SDK error by its class (the SDK's exceptions name what happened).

        The SDK shuts a receiver down after an error, and then refuses to settle
        on it (``ValueError`` "...shutdown"): that lock is lost, unless the queue
        itself is gone.
        """
        if isinstance(exc, DriverError):
            return exc.code
        if isinstance(exc, ValueError) and "shutdown" in str(exc):
            return ErrorCode.QUEUE_NOT_FOUND if self._entity_missing else ErrorCode.LEASE_LOST
        names = {cls.__name__ for cls in type(exc).__mro__}
        if names & _LOST:
            return ErrorCode.LEASE_LOST
        if names & _NOT_FOUND:
            return ErrorCode.QUEUE_NOT_FOUND
        if names & _AUTH:
            return ErrorCode.UNAUTHENTICATED
        if names & _TOO_LARGE:
            return ErrorCode.TOO_LARGE
        if names & _EXISTS:
            return ErrorCode.QUEUE_EXISTS
        if names & _UNAVAILABLE:
            return ErrorCode.UNAVAILABLE
        if "HttpResponseError" in names:
            status = getattr(exc, "status_code", None)
            if status in (401, 403):
                return ErrorCode.UNAUTHENTICATED
            if status == 429 or (isinstance(status, int) and status >= 500):
                return ErrorCode.UNAVAILABLE
        return ErrorCode.UNKNOWN

    def backend_code(self, exc: BaseException) -> str | None:
        """The SDK error's class name (``MessageLockLostError``...)."""
        if isinstance(exc, DriverError):
            return exc.backend_code
        module = type(exc).__module__
        if module.startswith(("azure.servicebus", "azure.core")):
            return type(exc).__name__
        return None

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


class ServiceBusDeadLetters(ServiceBusDriver):
    """A queue's dead-letter sub-queue (``<queue>/$deadletterqueue``) as a driver.

    What :meth:`ServiceBusDriver.dead_letter_store` returns: a PeekLock receiver on
    the sub-queue (Service Bus lets a dead letter be received, its lock renewed
    and completed like any message; it cannot be sent to or dead-lettered again).
    Each message carries its ``DeadLetterReason`` as leasekit's dead-letter marks.
    """

    def __repr__(self) -> str:
        return f"<ServiceBusDeadLetters queue={self.queue!r} namespace={self.namespace!r}>"

    def _new_receiver(self) -> Any:
        """A PeekLock SDK receiver on the dead-letter sub-queue (not opened)."""
        from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue

        return self._get_client().get_queue_receiver(
            self.queue,
            sub_queue=ServiceBusSubQueue.DEAD_LETTER,
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
            prefetch_count=0,
            socket_timeout=SOCKET_TIMEOUT,
        )

    def _raw(self, message: Any, token: str, locked_until: float) -> RawMessage:
        import dataclasses

        from leasekit.dead_letters import marked

        raw = super()._raw(message, token, locked_until)
        own = {k: v for k, v in raw.properties.items() if k not in _DEAD_LETTER_PROPERTIES}
        reason = message.dead_letter_reason
        return dataclasses.replace(
            raw,
            properties=marked(
                own,
                id=raw.id,
                reason=str(reason) if reason is not None else None,
                delivery_count=raw.delivery_count,
            ),
        )

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Refused: Service Bus does not take messages sent to a dead-letter sub-queue."""
        error = DriverError(
            ErrorCode.UNSUPPORTED, "azure-service-bus: cannot send to a dead-letter sub-queue"
        )
        return [error for _ in messages]
