"""The Alibaba Cloud MNS (Simple Message Queue) backend, on ``aliyun-mns-sdk`` (API 2015-06-06).

URLs:
    ``aliyun-mns://HOST[:PORT]/QUEUE`` — queue ``QUEUE`` at the MNS endpoint
    ``HOST`` (``aliyun-mns://1234567890.mns.cn-hangzhou.aliyuncs.com/jobs``).
    An endpoint on a loopback host speaks ``http``, any other ``https``;
    ``?scheme=http|https`` overrides (``aliyun-mns://127.0.0.1:8080/jobs?scheme=http``).
    Other URL options: ``connect_timeout`` (seconds to open a connection,
    default 5) and ``read_timeout`` (seconds to wait for an answer, default 10;
    a receive waits its long poll beyond that); ``ordered=true`` for an ordered
    (FIFO) queue and ``control_endpoint`` for the OpenAPI endpoint (see
    "Ordered queues" below). Each call is bounded tighter
    still by core's deadline: a renewal by the time left on its lease, so a
    hung request fails before the lease would have ended. Keyword form::

        leasekit.open("aliyun-mns", queue="jobs",
                      endpoint="https://1234567890.mns.cn-hangzhou.aliyuncs.com",
                      access_key_id=AK, access_key_secret=SK)

    Credentials are **never** part of a URL (a URL with a user, password or a
    key in its query is refused). Give ``access_key_id`` and
    ``access_key_secret`` (plus ``security_token`` for STS) as keyword
    options, or ``credentials_provider`` (any object with the SDK's
    ``get_credentials()``, e.g. from ``alibabacloud_credentials``), or set
    ``ALIBABA_CLOUD_ACCESS_KEY_ID``, ``ALIBABA_CLOUD_ACCESS_KEY_SECRET`` and
    optionally ``ALIBABA_CLOUD_SECURITY_TOKEN``. Secrets never appear in a
    repr, a log line or an error message from this module.

Delivery semantics:
    At least once. MNS sets the visibility timeout **per queue**: a receive
    hides each message for the queue's ``VisibilityTimeout``. A lease of any
    other duration costs one ``ChangeMessageVisibility`` right after the
    receive (core does it: ``lease_set_after_receive=True``), so set the
    queue's visibility timeout to the lease you use most (``create=True``
    makes queues with MNS's default, 30 s, which is also leasekit's default
    lease). The receipt is MNS's receipt handle. Renew is
    ``ChangeMessageVisibility``, which **rotates the handle**
    (the old one then gets ``MessageNotExist``); core tracks the newest.
    Abandon is ``ChangeMessageVisibility`` with the delay, at least 1 s: MNS
    refuses 0, so an abandoned message is visible again after one second, not
    at once. Complete is ``DeleteMessage`` (``BatchDeleteMessage`` when core
    settles several at once, with per-handle results). A handle is valid only
    until the message's ``NextVisibleTime``: an expired handle fails
    (``LeaseLost``) even if nobody received the message again. The delivery
    count is MNS's ``DequeueCount``. Order is MNS's (priority, then roughly
    FIFO); receives long-poll (``waitseconds``, whole seconds:
    ``wait_resolution=1``, so core asks for whole seconds and polls the rest).

    Dead-lettering is not native in this API: core copies the message to
    ``<queue>-poison`` with the properties ``leasekit-dead-letter-reason``,
    ``leasekit-original-id`` and ``leasekit-delivery-count``, then deletes the
    original. ``Queue.peek_dead_letters`` peeks the poison queue
    (``BatchPeekMessage``: at most 16 messages, and only visible ones).

    **Bodies.** leasekit sends the standard base64 of the body — what the
    SDK's default (``set_encoding(True)``) producers send and consumers
    expect, so they interoperate both ways. An empty body, which MNS and the
    SDK refuse, is sent as the text ``=`` (which the SDK's base64 decoder also
    reads as empty). On receive, ``=`` gives ``b""``; strict base64 gives the
    decoded bytes; any other text (a producer with encoding off) gives its
    UTF-8 bytes unchanged. The one ambiguity is plain text that happens to be
    valid base64 (``"test"``): it is read as base64. The text as received is at
    ``lease.raw.message_body``.

    **Properties** are MNS user properties (``UserProperties``), so other MNS
    consumers see them. Plain text values go as ``STRING``; a value with
    control characters (which XML cannot carry, or would normalise, such as a
    carriage return) goes as ``BINARY`` holding its UTF-8 bytes, so it round-trips
    exactly. On receive, ``STRING``/``NUMBER``/``BOOLEAN`` values are read as
    text and ``BINARY`` values as UTF-8 (non-UTF-8 bytes from another producer
    are given as their base64 text).

Ordered queues (``ordered=true``):
    MNS's ordered (FIFO) queues keep each ``MessageGroupId`` in order and hand
    out a group's next message only after the previous one is deleted or its
    visibility timeout has run out (Alibaba's *Ordered messages* page, quoted in
    ``docs/ordering.md``). With ``ordered=true``: ``capabilities.ordered`` is
    true, ``send(..., group=...)`` sends the group as ``MessageGroupId``, every
    message needs a group (MNS answers ``FifoMissingMessageGroupId`` without one;
    leasekit refuses such a send before any call) and none can be delayed, and
    ``lease.message.group`` is read back from the receive. One receive hands out
    at most one message per group (the group's head).

    Only MNS's control-plane OpenAPI (``2022-01-19``) knows queue types, so
    ordered queues use it, through ``alibabacloud-mns-open20220119`` (part of
    the ``aliyun-mns`` extra): ``create=True`` is ``CreateQueue`` with
    ``QueueType=fifo``; an existing queue of that name that is not a FIFO queue
    is refused (``QueueAlreadyExists``), since it would not keep the order; a
    queue opened without ``create`` is checked once, before the first send or
    receive, with ``GetQueueAttributes`` (not FIFO: ``InvalidArgument``). The
    OpenAPI's host is ``mns-open.REGION.aliyuncs.com``, the region read from the
    endpoint (``ACCOUNT.mns.REGION[-internal[-vpc]].aliyuncs.com``); any other
    endpoint (the emulator) serves it itself, and ``control_endpoint=`` overrides
    both. The poison queue of an ordered queue is an ordered queue too, each dead
    letter in its group. Standard queues (the default) never touch the OpenAPI.

Limits:
    Leases 1 s – 12 h (43,200 s), whole seconds. 16 messages per receive,
    delete and send call, and 64 KiB of body text per send batch (declared as
    ``max_send_batch_bytes``: core splits batches by it); no batch visibility
    change. Bodies up to 49,152 bytes
    (48 KiB): MNS takes 64 KiB of body text and base64 makes 4 characters of 3
    bytes. Property values must not be empty (the SDK drops an empty value on
    receive, so it is refused before sending) and names must be plain text.
    Send delay up to 7 days (whole seconds, rounded up); ``delay=0`` leaves the
    queue's own ``DelaySeconds`` (0 unless an operator set one). No
    per-message time-to-live: retention is the queue's
    ``MessageRetentionPeriod`` (60 s – 7 days), so ``ttl=`` is unsupported.
    Long poll up to 30 s.

    Counts: ``Queue.stats()`` gives MNS's approximate ``ActiveMessages``
    (visible), ``InactiveMessages`` (leased; an abandoned message, hidden for its
    delay of at least 1 s, is counted here too) and ``DelayMessages`` (delayed)
    from ``GetQueueAttributes``, their sum as ``total``, and as ``dead_lettered``
    the total of ``<queue>-poison`` (core's, one more call; 0 while it does not
    exist). Alibaba Cloud has announced that these three fields will be retired
    and then always read 0 (the GetQueueAttributes reference points to the
    CloudMonitor metrics ``NumberOfMessagesVisible``, ``…Invisible`` and
    ``…Delayed`` instead, which this driver does not read); from then on the
    counts read 0 whatever the queue holds. aliyun-mns-sdk 1.3.0 marks them
    ``@deprecated`` on ``QueueMeta``; the driver reads them without that
    accessor, so no ``DeprecationWarning`` is raised.

    The SDK is synchronous and one client holds one keep-alive HTTP
    connection that is not safe to share between threads, so the driver
    keeps a small pool of clients: each call borrows one (creating it if all
    are busy) and returns it, so N threads use at most N connections, reused
    across calls. ``Driver.sibling`` (the poison queue) shares the pool.

Raw types:
    ``lease.raw`` is the SDK's ``mns.queue.Message`` from the receive (its
    ``message_body`` is the text as received; ``get_user_properties()`` the
    SDK's property objects). Errors are the SDK's
    ``mns.mns_exception.MNSServerException`` (``.type`` is MNS's error code,
    ``.request_id``), ``MNSClientNetworkException`` (connection failures and
    unreadable responses) and ``MNSClientParameterException``; the leasekit
    error's ``__cause__``.

Errors:
    Classified by MNS's error code: ``MessageNotExist`` and ``ReceiptHandleError``
    on a settle or renew → ``LeaseLost`` (on a receive or peek,
    ``MessageNotExist`` just means "no message" and gives an empty result);
    ``QueueNotExist`` → ``QueueNotFound``; ``SignatureDoesNotMatch``,
    ``AccessDenied``, ``InvalidAccessKeyId`` (and the other authorisation
    codes, ``TimeExpired`` for a skewed clock) → ``AuthenticationFailed``;
    network errors, unreadable responses, ``InternalError`` and throttling →
    ``BackendUnavailable``; ``InvalidArgument`` (an oversize body too),
    ``MalformedXML`` and the SDK's own parameter checks → ``InvalidArgument``.
    The SDK does not retry (it only re-sends once on a dropped keep-alive
    connection), so core retries ``BackendUnavailable``. A retried call whose
    first attempt did reach MNS can then report ``LeaseLost`` (the delete
    happened, or the visibility change rotated the handle): the message is
    then deleted, or comes back when its visibility ends — never lost.
"""

from __future__ import annotations

import base64
import ipaddress
import math
import os
import re
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from leasekit.backends.aliyun_mns_openapi import ControlPlane
from leasekit.capabilities import Capabilities
from leasekit.deadline import call_timeout
from leasekit.errors import BackendNotInstalled, InvalidURL
from leasekit.hookspecs import hookimpl
from leasekit.options import as_bool, as_float
from leasekit.redaction import install_log_redaction
from leasekit.registry import BackendSpec
from leasekit.spi import (
    Driver,
    DriverError,
    ErrorCode,
    OutgoingMessage,
    ParsedURL,
    QueueStats,
    RawMessage,
    Visibility,
    each,
    received,
)
from leasekit.url import check_endpoint

__all__ = ["AliyunMnsDriver", "classify", "decode_body", "encode_body"]

#: Most messages one receive, peek, send or delete batch takes (MNS's limit).
MAX_BATCH = 16
#: Longest long poll (``waitseconds``) MNS accepts.
MAX_WAIT = 30
#: ChangeMessageVisibility and the queue's VisibilityTimeout: 1 s – 12 h (0 is refused).
MIN_VISIBILITY = 1
MAX_VISIBILITY = 43200
#: Longest per-message delay (``DelaySeconds``): 7 days.
MAX_DELAY = 604800
#: MNS's limit on a message's body text (64 KiB), which leasekit fills with base64.
MAX_TEXT = 64 * 1024
#: Largest body that fits as base64 in ``MAX_TEXT``: 49,152 bytes → 65,536 characters.
MAX_BODY = MAX_TEXT // 4 * 3
#: The body text for an empty body (MNS refuses an empty text; base64 decoders read it as b"").
EMPTY_BODY = "="
#: Seconds to open a connection (a dead endpoint fails this fast).
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds to wait for an answer beyond a receive's long poll; every call is
#: bounded tighter by core's deadline (see :mod:`leasekit.deadline`).
DEFAULT_READ_TIMEOUT = 10.0
#: Longest timeout accepted (a day); larger ones overflow the socket's own limit.
MAX_TIMEOUT = 86400.0
#: The SDK's loggers (``mns_python_sdk`` when given one); core redacts their records.
SDK_LOGGERS = ("mns", "mns_python_sdk")
#: Alibaba Cloud's standard credential variables.
ENV_ACCESS_KEY_ID = "ALIBABA_CLOUD_ACCESS_KEY_ID"
ENV_ACCESS_KEY_SECRET = "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
ENV_SECURITY_TOKEN = "ALIBABA_CLOUD_SECURITY_TOKEN"
#: A data-plane host with its region: ACCOUNT.mns.REGION[-internal[-vpc]].aliyuncs.com.
_ENDPOINT_REGION = re.compile(
    r"^[^.]+\.mns\.([a-z0-9-]+?)(?:-internal(?:-vpc)?)?\.aliyuncs\.com$", re.IGNORECASE
)
#: The OpenAPI's ``QueueType`` of an ordered queue.
FIFO_QUEUE_TYPE = "fifo"
#: MNS queue names: 1-120 letters, digits and hyphens, starting with a letter or digit.
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,119}$")
#: Characters an XML text node cannot carry as they are (or that XML parsers
#: normalise, like ``\r``): property values with any of them go as BINARY.
_NOT_PLAIN_TEXT = re.compile("[\x00-\x1f\x7f\ud800-\udfff\ufffe\uffff]")
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}
#: URL query options that would be credentials: refused in a URL.
_SECRET_OPTIONS = frozenset(
    {
        "access_key_id",
        "access_key_secret",
        "access_key",
        "secret",
        "security_token",
        "token",
        "credentials_provider",
        "password",
    }
)

# MNS error codes (``MNSServerException.type``) by meaning.
_LEASE_LOST = frozenset({"MessageNotExist", "ReceiptHandleError"})
_QUEUE_NOT_FOUND = frozenset({"QueueNotExist"})
_QUEUE_EXISTS = frozenset({"QueueAlreadyExist"})
#: An ordered queue's send without ``MessageGroupId`` (leasekit refuses it before sending).
_MISSING_GROUP = frozenset({"FifoMissingMessageGroupId"})
_UNAUTHENTICATED = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "MissingAuthorizationHeader",
        "InvalidAuthorizationHeader",
        "TimeExpired",
        "SecurityTokenExpired",
        "InvalidSecurityToken",
    }
)
_UNAVAILABLE = frozenset(
    {"InternalError", "ServiceUnavailable", "ServerBusy", "QpsLimitExceeded", "Throttling"}
)
_INVALID = frozenset(
    {
        "InvalidArgument",
        "MalformedXML",
        "InvalidQueueName",
        "QueueNameLengthError",
        "InvalidDigest",
        "MissingReceiptHandle",
        "MissingVisibilityTimeout",
        "InvalidRequestURL",
        *_MISSING_GROUP,
    }
)


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``aliyun-mns``."""
    return [
        BackendSpec(
            name="aliyun-mns",
            driver="leasekit.backends.aliyun_mns:AliyunMnsDriver",
            extra="aliyun-mns",
            description="Alibaba Cloud MNS queues (rotating receipt handles, <queue>-poison)",
        )
    ]


# ------------------------------------------------------------------ encoding


def encode_body(body: bytes) -> str:
    """The MNS body text leasekit sends for ``body``: standard base64, ``=`` for empty."""
    if not body:
        return EMPTY_BODY
    return base64.b64encode(body).decode("ascii")


def decode_body(text: str | bytes | None) -> bytes:
    """The body bytes of an MNS body text (see "Bodies" in the module doc)."""
    if isinstance(text, bytes):  # the SDK's own base64 path already decoded it
        return text
    if not text or text == EMPTY_BODY:
        return b""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error (not base64), or non-ASCII text
        return text.encode("utf-8", "surrogatepass")


def _property_value(name: str, value: str) -> Any:
    from mns.message_property import MessagePropertyValue, PropertyType

    if not name or _NOT_PLAIN_TEXT.search(name):
        raise DriverError(
            ErrorCode.INVALID_ARGUMENT,
            f"MNS property names must be plain text, got {name!r}",
            backend_code="InvalidPropertyName",
        )
    if not value:
        raise DriverError(
            ErrorCode.INVALID_ARGUMENT,
            f"MNS cannot carry an empty property value (property {name!r}): "
            "the SDK drops it on receive",
            backend_code="EmptyPropertyValue",
        )
    if _NOT_PLAIN_TEXT.search(value):
        return MessagePropertyValue(PropertyType.BINARY, value.encode("utf-8", "surrogatepass"))
    return MessagePropertyValue(PropertyType.STRING, value)


def _read_properties(sdk_properties: Mapping[str, Any] | None) -> dict[str, str]:
    properties: dict[str, str] = {}
    for name, prop in (sdk_properties or {}).items():
        if prop.get_data_type() == "BINARY":
            raw: bytes = prop.get_binary_value()
            try:
                properties[name] = raw.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                properties[name] = base64.b64encode(raw).decode("ascii")
        else:
            properties[name] = str(prop.get_string_value_by_type())
    return properties


# ------------------------------------------------------------------- helpers


def _whole_seconds(seconds: float) -> int:
    # Core rounded lease durations up to whole seconds already; delays may be
    # fractional: round up, never shorten what was asked.
    return math.ceil(seconds - 1e-9)


def _ms(value: Any) -> datetime:
    """A time in milliseconds since the epoch (MNS's format) as a UTC datetime."""
    return datetime.fromtimestamp(int(value) / 1000, UTC)


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_queue_name(queue: object) -> str:
    if not isinstance(queue, str) or not _QUEUE_NAME.match(queue):
        raise ValueError(
            f"aliyun-mns: {queue!r} is not an MNS queue name: use 1-120 letters, digits "
            "and hyphens, starting with a letter or digit"
        )
    return queue


def _check_endpoint(endpoint: object) -> str:
    if not isinstance(endpoint, str):
        raise InvalidURL(
            "aliyun-mns: endpoint is required, e.g. https://ACCOUNT.mns.REGION.aliyuncs.com"
        )
    check_endpoint(endpoint, "endpoint", "aliyun-mns", AliyunMnsDriver.credential_hint)
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 - parsed here, so a bad port is refused now
    except ValueError:
        parts = urlsplit("")
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.password is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        # Not repeated: a mistyped endpoint may hold a credential.
        raise InvalidURL(
            "aliyun-mns: endpoint must be http(s)://HOST[:PORT] with no path, query or "
            "credentials, e.g. https://ACCOUNT.mns.REGION.aliyuncs.com"
        )
    return f"{parts.scheme}://{parts.netloc}"


#: How far past a call's deadline its socket's read timeout may reach (a share of
#: the timeout): a timeout within it of the one wanted is kept, not set again.
TIMEOUT_SLACK = 0.01


class _Pooled:
    """One SDK client (one HTTP connection) and the SDK ``Queue`` objects made on it."""

    __slots__ = ("client", "queues")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.queues: dict[str, Any] = {}

    def queue(self, name: str) -> Any:
        sdk_queue = self.queues.get(name)
        if sdk_queue is None:
            from mns.queue import Queue as SdkQueue

            sdk_queue = SdkQueue(name, self.client)
            sdk_queue.set_encoding(False)  # leasekit base64-encodes bytes itself
            self.queues[name] = sdk_queue
        return sdk_queue


class _Borrowed:
    """``with pool.queue(name, wait) as sdk_queue:`` — a client for the length of one call.

    On entry the client's connection gets the call's timeouts: a connect
    timeout for opening it, and for reading the time left before core's
    deadline (at most ``read_timeout``, plus ``wait`` for a long poll).
    """

    __slots__ = ("_entry", "_name", "_pool", "_wait")

    def __init__(self, pool: _ClientPool, name: str, wait: float) -> None:
        self._pool = pool
        self._name = name
        self._wait = wait
        self._entry: _Pooled | None = None

    def __enter__(self) -> Any:
        entry = self._entry = self._pool.borrow(self._wait)
        sdk_queue = entry.queues.get(self._name)
        return sdk_queue if sdk_queue is not None else entry.queue(self._name)

    def __exit__(self, *exc_info: object) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            self._pool.give(entry)


class _ClientPool:
    """SDK clients to borrow one call at a time (an ``MNSClient`` is one HTTP connection).

    A client is not thread-safe, so each call takes one from the idle list (or
    makes a new one when all are busy) and gives it back afterwards; the pool
    grows to the peak number of concurrent calls and reuses warm connections
    (last in, first out).
    """

    def __init__(
        self,
        endpoint: str,
        credentials_provider: Any,
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        self.endpoint = endpoint
        self._provider = credentials_provider
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._idle: list[_Pooled] = []
        self._lock = threading.Lock()
        self._closed = False

    def _new(self) -> _Pooled:
        from mns.mns_client import MNSClient

        return _Pooled(MNSClient(self.endpoint, credentials_provider=self._provider))

    def apply_timeouts(self, client: Any, wait: float) -> None:
        """Give ``client``'s connection this call's timeouts, connecting it first if needed.

        The SDK opens its connection inside the request and reads with the
        connect timeout; connecting here lets the two differ (a long poll must
        not be cut at the connect timeout). The SDK's HTTPS connection has no
        timeout of its own: without this a dead peer would block forever.
        """
        read = call_timeout(self._read_timeout + wait)
        assert read is not None
        conn = client.http.conn
        if conn.sock is None:
            connect = min(self._connect_timeout, read)
            conn.timeout = connect  # used by HTTPSConnection.connect
            if hasattr(conn, "connection_timeout"):
                conn.connection_timeout = connect  # MNSHTTPConnection.connect
            try:
                conn.connect()
            except OSError as exc:
                conn.close()
                from mns.mns_exception import MNSClientNetworkException

                raise MNSClientNetworkException(
                    "NetWorkException", f"cannot connect to {self.endpoint}: {exc}"
                ) from exc
        # A reconnect inside the SDK (a dropped keep-alive) uses the read timeout too.
        conn.timeout = read
        if hasattr(conn, "connection_timeout"):
            conn.connection_timeout = read
        sock = conn.sock
        current = sock.gettimeout()
        # Setting a socket's timeout is a system call; the deadline moves a little
        # with every call. Keep the one set unless it would outlast this call's
        # by more than TIMEOUT_SLACK of it, or cut it short by more than a tenth.
        if current is None or not read * 0.9 <= current <= read * (1 + TIMEOUT_SLACK):
            sock.settimeout(read)

    def borrow(self, wait: float) -> _Pooled:
        """An idle client (or a new one) with this call's timeouts; :meth:`give` it back."""
        try:
            entry = self._idle.pop()  # one bytecode-level operation: no lock needed
        except IndexError:
            entry = self._new()
        self.apply_timeouts(entry.client, wait)
        return entry

    def give(self, entry: _Pooled) -> None:
        """Take back a borrowed client (closed instead once the pool is)."""
        with self._lock:
            if not self._closed:
                self._idle.append(entry)
                return
        entry.client.close_connection()

    def queue(self, name: str, wait: float = 0.0) -> _Borrowed:
        """An SDK ``Queue`` for ``name`` on a borrowed client, body encoding off.

        ``wait``: the call's long poll in seconds (the read timeout is extended by it).
        """
        return _Borrowed(self, name, wait)

    def close(self) -> None:
        """Close every idle connection; busy ones close when their call returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for entry in idle:
            entry.client.close_connection()


# -------------------------------------------------------------------- driver


#: The service's documented limits with the driver's default options (shown by
#: ``leasekit backends`` without credentials); options can change some per queue.
CAPABILITIES = Capabilities(
    min_lease=float(MIN_VISIBILITY),
    max_lease=float(MAX_VISIBILITY),
    lease_resolution=1.0,
    lease_set_after_receive=True,
    fixed_lease=None,
    max_total_lease=None,
    renew_rotates_receipt=True,
    detects_stale_receipts=True,
    expired_receipt_usable=False,
    max_receive_batch=MAX_BATCH,
    max_delete_batch=MAX_BATCH,
    max_renew_batch=1,
    max_send_batch=MAX_BATCH,
    # BatchSendMessage takes 64 KiB of body text in all: 49,152 bytes as base64.
    max_send_batch_bytes=MAX_BODY,
    max_message_size=MAX_BODY,
    max_wait=float(MAX_WAIT),
    wait_resolution=1.0,
    max_abandon_delay=float(MAX_VISIBILITY),
    min_abandon_delay=float(MIN_VISIBILITY),
    max_send_delay=float(MAX_DELAY),
    max_ttl=None,
    supports_properties=True,
    native_dead_letter=False,
    delivery_count=True,
    queue_stats=True,
    counts=frozenset({"visible", "leased", "delayed"}),
    inspect_dead_letters=True,
)


class AliyunMnsDriver(Driver):
    """Driver for one Alibaba Cloud MNS queue.

    Parameters
    ----------
        queue: the queue name (1-120 letters, digits and hyphens).
        endpoint: ``https://ACCOUNT.mns.REGION.aliyuncs.com`` (or ``http://HOST:PORT``).
        access_key_id: the AccessKey ID (default: ``ALIBABA_CLOUD_ACCESS_KEY_ID``).
        access_key_secret: its secret (default: ``ALIBABA_CLOUD_ACCESS_KEY_SECRET``).
        security_token: an STS token (default: ``ALIBABA_CLOUD_SECURITY_TOKEN``, if set).
        credentials_provider: instead of keys, an object whose ``get_credentials()``
            returns the SDK's credentials (refreshed on every request).
        connect_timeout: seconds to open a connection (default 5).
        read_timeout: seconds to wait for an answer (default 10), beyond a receive's
            long poll; each call is bounded tighter by core's deadline.
        timeout: an older name for ``read_timeout``.
        ordered: the queue is an ordered (FIFO) queue (see "Ordered queues").
        control_endpoint: the OpenAPI endpoint ``http(s)://HOST[:PORT]`` used for
            ordered queues (default: ``mns-open.REGION.aliyuncs.com`` for an Alibaba
            endpoint, else the endpoint itself).
    """

    scheme = "aliyun-mns"
    capabilities = CAPABILITIES
    secret_options = _SECRET_OPTIONS
    credential_hint = (
        "pass access_key_id= and access_key_secret= as keyword options or set "
        f"{ENV_ACCESS_KEY_ID} and {ENV_ACCESS_KEY_SECRET}"
    )

    def __init__(
        self,
        queue: str,
        endpoint: str | None = None,
        access_key_id: str | None = None,
        access_key_secret: str | None = None,
        security_token: str | None = None,
        credentials_provider: Any = None,
        connect_timeout: float | str = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float | str = DEFAULT_READ_TIMEOUT,
        timeout: float | str | None = None,
        ordered: bool | str = False,
        control_endpoint: str | None = None,
    ) -> None:
        install_log_redaction(SDK_LOGGERS)
        self.queue = _check_queue_name(queue)
        self._endpoint = _check_endpoint(endpoint)
        self.ordered = as_bool(ordered, "ordered")
        control = _check_endpoint(control_endpoint) if control_endpoint is not None else None
        connect_seconds = as_float(
            connect_timeout, "connect_timeout", minimum=0.001, maximum=MAX_TIMEOUT
        )
        if timeout is not None:
            read_timeout = timeout
        read_seconds = as_float(read_timeout, "read_timeout", minimum=0.001, maximum=MAX_TIMEOUT)
        try:
            from mns.auth import StaticCredentialsProvider
        except ImportError as exc:
            raise BackendNotInstalled(
                f"backend 'aliyun-mns' needs aliyun-mns-sdk ({exc}); install it with: "
                "pip install 'leasekit[aliyun-mns]'"
            ) from exc
        if credentials_provider is not None:
            if access_key_id or access_key_secret or security_token:
                raise ValueError(
                    "aliyun-mns: give either credentials_provider or access keys, not both"
                )
            if not callable(getattr(credentials_provider, "get_credentials", None)):
                raise ValueError("aliyun-mns: credentials_provider needs a get_credentials()")
            provider = credentials_provider
        else:
            key_id = access_key_id or os.environ.get(ENV_ACCESS_KEY_ID)
            secret = access_key_secret or os.environ.get(ENV_ACCESS_KEY_SECRET)
            token = security_token or os.environ.get(ENV_SECURITY_TOKEN) or ""
            if not key_id or not secret:
                raise ValueError(
                    "aliyun-mns: no credentials: pass access_key_id= and access_key_secret= "
                    f"(or credentials_provider=), or set {ENV_ACCESS_KEY_ID} and "
                    f"{ENV_ACCESS_KEY_SECRET}"
                )
            if not all(isinstance(v, str) for v in (key_id, secret, token)):
                raise ValueError("aliyun-mns: access keys and the security token must be str")
            # The SDK sends the security-token header whenever the token is not "".
            provider = StaticCredentialsProvider(key_id, secret, token)
        self._clients = _ClientPool(self._endpoint, provider, connect_seconds, read_seconds)
        self._owns_clients = True
        self._closed = False
        self._control: ControlPlane | None = None
        self._fifo_checked = False
        if self.ordered:
            region_match = _ENDPOINT_REGION.match(urlsplit(self._endpoint).hostname or "")
            if control is None and region_match is None:
                control = self._endpoint  # not Alibaba's host: it serves the OpenAPI too
            self._control = ControlPlane(
                control,
                region_match.group(1).lower() if region_match else None,
                lambda: _keys(provider),
                connect_seconds,
                read_seconds,
            )
            # Every message needs a group, and a group's message cannot be delayed.
            self.capabilities = CAPABILITIES.replace(ordered=True, max_send_delay=0.0)

    @classmethod
    def options_from_url(cls, url: ParsedURL) -> dict[str, Any]:
        """Endpoint and queue from ``aliyun-mns://HOST[:PORT]/QUEUE[?scheme=http]``."""
        query = dict(url.query)
        if "endpoint" in query:
            raise InvalidURL("aliyun-mns: the endpoint is the URL's host, not an option")
        scheme = query.pop("scheme", None)
        if scheme is not None and scheme not in ("http", "https"):
            raise InvalidURL(f"aliyun-mns: scheme must be http or https, got {scheme!r}")
        if not url.host:
            raise InvalidURL(
                "aliyun-mns URLs name the endpoint host: aliyun-mns://HOST[:PORT]/QUEUE"
            )
        segments = [s for s in url.path.split("/") if s]
        if len(segments) > 1 or (not segments and "queue" not in query):
            raise InvalidURL("aliyun-mns: the path is the queue: aliyun-mns://HOST[:PORT]/QUEUE")
        host = url.host
        netloc = f"[{host}]" if ":" in host else host
        if url.port is not None:
            netloc += f":{url.port}"
        endpoint = f"{scheme or ('http' if _is_loopback(host) else 'https')}://{netloc}"
        options: dict[str, Any] = {**query, "endpoint": endpoint}
        if segments:
            options["queue"] = segments[0]
        return options

    def __repr__(self) -> str:
        ordered = " ordered" if self.ordered else ""
        return f"<AliyunMnsDriver {self._endpoint} queue={self.queue!r}{ordered}>"

    # --------------------------------------------------------------- messages

    def _sdk_message(self, message: OutgoingMessage) -> Any:
        from mns.queue import Message

        sdk_message = Message(encode_body(message.body))
        if self.ordered and message.group is not None:
            sdk_message.set_message_group_id(message.group)
        if message.delay > 0:
            sdk_message.set_delayseconds(min(MAX_DELAY, _whole_seconds(message.delay)))
        for name, value in message.properties.items():
            sdk_message.add_user_property(name, _property_value(name, value))
        return sdk_message

    def validate(self, message: OutgoingMessage) -> None:
        """Refuse properties MNS cannot carry (an empty value, a name that is not plain text).

        On an ordered queue, also a message without a group (MNS requires ``MessageGroupId``).
        """
        if self.ordered and message.group is None:
            raise DriverError(
                ErrorCode.INVALID_ARGUMENT,
                f"aliyun-mns: ordered queue {self.queue!r} needs a group on every message "
                "(send(..., group=...))",
                backend_code="FifoMissingMessageGroupId",
            )
        for name, value in message.properties.items():
            _property_value(name, value)

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """``SendMessage`` for one, ``BatchSendMessage`` (≤ 16) for several; a result per message.

        MNS answers a batch it accepted only in part with per-message results.
        """
        from mns.mns_exception import MNSServerException

        sdk_messages = [self._sdk_message(message) for message in messages]
        self._check_fifo()
        with self._clients.queue(self.queue) as sdk_queue:
            if len(sdk_messages) == 1:
                return [str(sdk_queue.send_message(sdk_messages[0]).message_id)]
            try:
                sent = sdk_queue.batch_send_message(sdk_messages)
            except MNSServerException as exc:
                entries = exc.sub_errors
                if not isinstance(entries, list) or len(entries) != len(sdk_messages):
                    raise  # the whole call failed
                return [
                    str(entry["MessageId"])
                    if "MessageId" in entry
                    else MNSServerException(
                        entry.get("ErrorCode", "Unknown"),
                        entry.get("ErrorMessage", ""),
                        exc.request_id,
                        exc.host_id,
                    )
                    for entry in entries
                ]
        return [str(m.message_id) for m in sent]

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """``BatchReceiveMessage``: up to 16, hidden for the queue's visibility timeout.

        ``visibility`` is not sent (MNS has none per receive; core changes it
        afterwards). ``wait`` is rounded up to whole seconds, at most 30.
        """
        from mns.mns_exception import MNSServerException

        wait_seconds = min(MAX_WAIT, _whole_seconds(wait)) if wait > 0 else 0  # whole already
        self._check_fifo()
        with self._clients.queue(self.queue, wait_seconds) as sdk_queue:
            try:
                messages = sdk_queue.batch_receive_message(max_messages, wait_seconds)
            except MNSServerException as exc:
                if exc.type == "MessageNotExist":  # nothing to receive
                    return []
                raise
        return [self._raw(m) for m in messages]

    def _raw(self, message: Any) -> RawMessage:
        return received(  # the fields set directly: half a frozen dataclass's __init__
            str(message.message_id),
            decode_body(message.message_body),
            str(message.receipt_handle),
            int(message.dequeue_count),
            _ms(message.enqueue_time),
            _ms(message.next_visible_time),
            _read_properties(message.get_user_properties()),
            message,
            None,
            (message.message_group_id or None) if self.ordered else None,
        )

    def _check_fifo(self) -> None:
        """Once per driver, make sure a queue opened as ordered is a FIFO queue.

        Raises the SDK's error (``QueueNotExist`` for a missing queue), or a
        ``DriverError`` for a standard queue: it would not keep the order.
        """
        if self._control is None or self._fifo_checked:
            return
        queue_type = self._control.queue_type(self.queue)
        if queue_type != FIFO_QUEUE_TYPE:
            raise DriverError(
                ErrorCode.INVALID_ARGUMENT,
                f"aliyun-mns: queue {self.queue!r} was opened with ordered=true but is a "
                f"{queue_type!r} queue, which keeps no order; use an ordered (FIFO) queue",
                backend_code="NotFifoQueue",
            )
        self._fifo_checked = True

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """``ChangeMessageVisibility`` for each (MNS has no batch form); returns the new handles.

        Core keeps ``seconds`` within the capabilities (at least ``min_lease``, and
        an abandon's delay at least ``min_abandon_delay``: MNS refuses 0).
        """
        whole = _whole_seconds(seconds)

        def change(receipt: str) -> Visibility:
            with self._clients.queue(self.queue) as sdk_queue:
                changed = sdk_queue.change_message_visibility(receipt, whole)
            return Visibility(str(changed.receipt_handle), _ms(changed.next_visible_time))

        return each(receipts, change)

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """``DeleteMessage`` for one, ``BatchDeleteMessage`` (≤ 16) for several; an error each.

        MNS reports the handles of a batch that failed, one error each.
        """
        if len(receipts) == 1:  # lease.complete(): ``each`` and ``with`` inlined
            pool = self._clients
            try:
                entry = pool.borrow(0.0)
                try:
                    entry.queue(self.queue).delete_message(receipts[0])
                finally:
                    pool.give(entry)
            except Exception as exc:
                return [exc]
            return [None]
        from mns.mns_exception import MNSServerException

        with self._clients.queue(self.queue) as sdk_queue:
            try:
                sdk_queue.batch_delete_message(list(receipts))
            except MNSServerException as exc:
                entries = exc.sub_errors
                if not isinstance(entries, list):  # the whole call failed (QueueNotExist, ...)
                    raise
                failed = {
                    str(entry.get("ReceiptHandle")): MNSServerException(
                        entry.get("ErrorCode", "Unknown"),
                        entry.get("ErrorMessage", ""),
                        exc.request_id,
                        exc.host_id,
                    )
                    for entry in entries
                }
                return [failed.get(receipt) for receipt in receipts]
        return [None] * len(receipts)

    def peek(self, limit: int) -> list[RawMessage]:
        """``BatchPeekMessage`` of up to ``min(limit, 16)`` visible messages (no receipts)."""
        from mns.mns_exception import MNSServerException

        with self._clients.queue(self.queue) as sdk_queue:
            try:
                peeked = sdk_queue.batch_peek_message(min(limit, MAX_BATCH))
            except MNSServerException as exc:
                if exc.type == "MessageNotExist":
                    return []
                raise
        return [
            RawMessage(
                id=str(message.message_id),
                body=decode_body(message.message_body),
                receipt="",
                delivery_count=int(message.dequeue_count),
                enqueued_at=_ms(message.enqueue_time),
                visible_until=_ms(message.enqueue_time),
                properties=_read_properties(message.get_user_properties()),
                raw=message,
            )
            for message in peeked
        ]

    def stats(self) -> QueueStats:
        """``GetQueueAttributes``: ``ActiveMessages``, ``InactiveMessages``, ``DelayMessages``.

        Read from the SDK's response object, through the client call under
        ``Queue.get_attributes``: that method copies the counts onto a ``QueueMeta``
        whose setters (and getters) are marked ``@deprecated`` and so warn
        ``DeprecationWarning`` three times per call. The response carries the same
        numbers as plain attributes, without a warning and without touching the
        process-wide warning filters (which other threads share).
        """
        from mns.mns_request import GetQueueAttributesRequest, GetQueueAttributesResponse

        request = GetQueueAttributesRequest(self.queue)
        response = GetQueueAttributesResponse()
        with self._clients.queue(self.queue) as sdk_queue:
            sdk_queue.mns_client.get_queue_attributes(request, response)
        return QueueStats(
            visible=int(response.active_messages),
            leased=int(response.inactive_messages),
            delayed=int(response.delay_messages),
        )

    def sibling(self, queue: str) -> AliyunMnsDriver:
        """The queue ``queue`` on the same endpoint, sharing this driver's connections."""
        twin = object.__new__(AliyunMnsDriver)
        twin.queue = _check_queue_name(queue)
        twin._endpoint = self._endpoint
        twin._clients = self._clients
        twin._owns_clients = False  # the driver that made the pool closes it
        twin._closed = False
        twin.capabilities = self.capabilities
        twin.ordered = self.ordered  # an ordered queue's poison queue keeps the groups too
        twin._control = self._control
        twin._fifo_checked = False
        return twin

    # ------------------------------------------------------------------ admin

    def create_queue(self) -> None:
        """``CreateQueue`` with MNS's default attributes; succeed if the queue exists.

        An ordered queue is created through the OpenAPI (``QueueType=fifo``); one that
        exists already must be a FIFO queue (else ``QueueAlreadyExist``).
        """
        from mns.mns_exception import MNSServerException
        from mns.queue import QueueMeta

        if self._control is not None:
            try:
                self._control.create_queue(self.queue, FIFO_QUEUE_TYPE)
            except Exception as exc:
                if _openapi_code(exc) not in _QUEUE_EXISTS:
                    raise
                if self._control.queue_type(self.queue) != FIFO_QUEUE_TYPE:
                    raise DriverError(
                        ErrorCode.QUEUE_EXISTS,
                        f"aliyun-mns: queue {self.queue!r} exists and is not an ordered "
                        "(FIFO) queue",
                        backend_code="QueueAlreadyExist",
                    ) from exc
            self._fifo_checked = True
            return
        with self._clients.queue(self.queue) as sdk_queue:
            try:
                sdk_queue.create(QueueMeta())
            except MNSServerException as exc:
                # 409 QueueAlreadyExist: it exists with other attributes; keep them.
                if exc.type not in _QUEUE_EXISTS:
                    raise

    def delete_queue(self) -> None:
        """``DeleteQueue``; succeed if the queue does not exist."""
        from mns.mns_exception import MNSServerException

        with self._clients.queue(self.queue) as sdk_queue:
            try:
                sdk_queue.delete()
            except MNSServerException as exc:
                if exc.type not in _QUEUE_NOT_FOUND:
                    raise

    # ----------------------------------------------------------------- errors

    def error_code(self, exc: BaseException) -> ErrorCode:
        """Classify by MNS's error code (see "Errors" in the module doc)."""
        return classify(exc)

    def backend_code(self, exc: BaseException) -> str | None:
        """MNS's error code (``.type`` of an SDK exception, ``.code`` of an OpenAPI one)."""
        if isinstance(exc, DriverError):
            return exc.backend_code
        code = getattr(exc, "type", None)
        if isinstance(code, str) and code:
            return code
        return _openapi_code(exc)

    def is_retryable(self, exc: BaseException) -> bool:
        """Transient failures: the SDK does not retry, so core does."""
        return classify(exc) is ErrorCode.UNAVAILABLE

    def close(self) -> None:
        """Close the pooled connections (a sibling leaves them to the driver that made them)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_clients:
            self._clients.close()


def _keys(provider: Any) -> tuple[str, str, str]:
    """The current keys of an ``aliyun-mns-sdk`` credentials provider, for the OpenAPI."""
    credentials = provider.get_credentials()
    return (
        str(credentials.get_access_key_id()),
        str(credentials.get_access_key_secret()),
        str(credentials.get_security_token() or ""),
    )


def _openapi_code(exc: BaseException) -> str | None:
    """MNS's error code on an OpenAPI SDK error (``AlibabaCloudException.code``)."""
    if type(exc).__module__.startswith(("alibabacloud_tea_openapi", "Tea", "darabonba")):
        code = getattr(exc, "code", None)
        return code if isinstance(code, str) and code and code != "None" else None
    return None


def _classify_code(code: str) -> ErrorCode | None:
    for codes, meaning in (
        (_LEASE_LOST, ErrorCode.LEASE_LOST),
        (_QUEUE_NOT_FOUND, ErrorCode.QUEUE_NOT_FOUND),
        (_QUEUE_EXISTS, ErrorCode.QUEUE_EXISTS),
        (_UNAUTHENTICATED, ErrorCode.UNAUTHENTICATED),
        (_UNAVAILABLE, ErrorCode.UNAVAILABLE),
        (_INVALID, ErrorCode.INVALID_ARGUMENT),
    ):
        if code in codes:
            return meaning
    return None


def _classify_openapi(exc: BaseException) -> ErrorCode | None:
    """Classify an OpenAPI SDK error (``None``: not one)."""
    module = type(exc).__module__
    if not module.startswith(("alibabacloud_tea_openapi", "Tea", "darabonba")):
        return None
    if type(exc).__name__ in ("UnretryableException", "RetryError", "ThrottlingException"):
        return ErrorCode.UNAVAILABLE  # network failure (wrapped by the SDK), or throttled
    code = _openapi_code(exc)
    meaning = _classify_code(code) if code is not None else None
    if meaning is not None:
        return meaning
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status >= 500:
        return ErrorCode.UNAVAILABLE
    return ErrorCode.UNKNOWN


def classify(exc: BaseException) -> ErrorCode:
    """The :class:`ErrorCode` an ``aliyun-mns-sdk`` (or MNS OpenAPI SDK) error means."""
    if isinstance(exc, DriverError):
        return exc.code
    openapi_meaning = _classify_openapi(exc)
    if openapi_meaning is not None:
        return openapi_meaning
    from mns.mns_exception import (
        MNSClientException,
        MNSClientNetworkException,
        MNSClientParameterException,
        MNSServerException,
    )

    if isinstance(exc, MNSServerException):
        return _classify_code(exc.type) or ErrorCode.UNKNOWN
    if isinstance(exc, MNSClientNetworkException):
        # Connection failures, and responses the SDK could not read (RespDataDamaged).
        return ErrorCode.UNAVAILABLE
    if isinstance(exc, MNSClientParameterException):
        return ErrorCode.INVALID_ARGUMENT
    if isinstance(exc, MNSClientException):
        return ErrorCode.UNKNOWN
    if isinstance(exc, ConnectionError | TimeoutError):
        return ErrorCode.UNAVAILABLE
    if isinstance(exc, ValueError | TypeError):
        return ErrorCode.INVALID_ARGUMENT
    return ErrorCode.UNKNOWN
