"""The Azure Storage Queue backend, on the ``azure-storage-queue`` SDK (v12).

URLs:
    ``azure-storage-queue://ACCOUNT/QUEUE`` — queue ``QUEUE`` in storage account
    ``ACCOUNT`` (``https://ACCOUNT.queue.core.windows.net``).
    ``azure-storage-queue://HOST[:PORT]/ACCOUNT/QUEUE`` — a path-style endpoint
    such as Azurite (``azure-storage-queue://127.0.0.1:10001/devstoreaccount1/jobs``).
    ``azure-storage-queue://HOST[:PORT]/QUEUE`` — a host-style endpoint
    (``azure-storage-queue://acct.queue.core.windows.net/jobs``, a custom domain).
    An endpoint on a loopback host speaks ``http``, any other ``https``;
    ``?protocol=http|https`` overrides. Other URL options: ``retry_total``,
    ``connection_timeout``, ``read_timeout`` (seconds), ``api_version``,
    ``max_connections`` (HTTP connections kept per host, SDK default 10: raise
    it when more than 10 threads use one queue).
    Credentials are **keyword options only**, never in the URL (a URL carrying
    a user, password, key or SAS is refused)::

        leasekit.open("azure-storage-queue://myacct/jobs", credential=DefaultAzureCredential())
        leasekit.open("azure-storage-queue", queue="jobs", connection_string=CONN)
        leasekit.open("azure-storage-queue", queue="jobs",
                      account_url="https://myacct.queue.core.windows.net", credential=KEY)

    ``credential`` is anything the SDK takes: an account key string, a SAS token,
    ``{"account_name": ..., "account_key": ...}``, an ``AzureNamedKeyCredential``,
    ``AzureSasCredential`` or a token credential from ``azure-identity``. A ready
    ``QueueServiceClient`` can be given as ``service_client`` (leasekit then does
    not close it). Connection strings and keys never appear in a repr, a log line
    or an error message from this module.

Delivery semantics:
    At least once. A receive hides each message for the lease's visibility
    timeout and hands out a pop receipt; leasekit's receipt is
    ``"<message id>:<pop receipt>"`` (message ids are GUIDs and pop receipts
    base64, so neither contains ``:``). Renew is ``update_message`` with the new
    visibility, which **rotates the pop receipt** (the old one then fails with
    ``PopReceiptMismatch``); core tracks the newest. Abandon is
    ``update_message`` with visibility 0 (or the delay) — always sent explicitly,
    since the SDK sends ``visibility_timeout or 0`` and an update without one
    releases the message. Complete is ``delete_message``. The delivery count is
    the service's dequeue count. A receipt whose lease expired but whose message
    nobody received again still works (the service allows it). Order is roughly
    FIFO, not guaranteed. There is no long poll: core polls with a short backoff.

    Dead-lettering is not native: core copies the message to ``<queue>-poison``
    (the Azure Functions convention) with the properties
    ``leasekit-dead-letter-reason``, ``leasekit-original-id`` and
    ``leasekit-delivery-count``, then deletes the original.
    ``Queue.peek_dead_letters`` peeks the poison queue (at most 32 messages: a
    peek cannot page).

    **Message encoding.** Storage Queue messages are text with no properties, so
    leasekit writes:

    * a message without properties as the standard base64 of its body — the
      format of the SDK's ``BinaryBase64EncodePolicy`` and of Azure Functions'
      queue output binding, so those consumers read leasekit's messages as is;
    * a message with properties as the JSON envelope
      ``{"leasekit":1,"properties":{...},"body":"<base64>"}`` (ASCII only).
      Base64 text never starts with ``{``, so the two cannot be confused.

    On receive, a text that starts with ``{"leasekit":`` and parses as an
    envelope gives body and properties; otherwise a text that is strict base64
    (the base64 alphabet, correct padding) gives the decoded bytes; anything
    else — plain text from another producer, or JSON — gives the text's UTF-8
    bytes unchanged, with no properties. The one ambiguity is plain text that
    happens to be valid base64 (``"test"``, ``"abcd1234"``): it is read as base64.

    **Checkpoints** are native: ``Lease.checkpoint(data)`` is one ``Update Message``
    that sets the new visibility and rewrites the text as the envelope with the
    body and properties unchanged and a ``"checkpoint"`` field (base64) added —
    no call beyond the renewal it replaces. Any leasekit reads that envelope
    (older versions ignore the field); a consumer that only reads plain base64
    (the Functions binding) does not, so checkpoint only on queues whose
    consumers are leasekit. The body, properties and checkpoint share the 64 KiB
    of text: a checkpoint that does not fit is ``MessageTooLarge``, with no call.
    Producers that share a queue with leasekit consumers should base64-encode
    (as the Functions binding and ``BinaryBase64EncodePolicy``/``TextBase64EncodePolicy``
    do). The original text is always at ``lease.raw.content``.

Limits:
    Leases (visibility on receive) 1 s – 7 days, whole seconds; renew/abandon
    0 – 7 days. 32 messages per receive; no batch delete, update or send (one
    request each). Bodies up to 49,152 bytes (48 KiB): the service takes 64 KiB
    of message text and base64 makes 4 characters of 3 bytes. Properties take
    room from the same 64 KiB (the envelope is JSON text): a message whose
    encoded form is over 65,536 characters is refused as ``MessageTooLarge``
    before it is sent. Hence a body near 48 KiB cannot be dead-lettered (the
    copy carries the reason as a property); the copy then fails, the original
    stays and reappears. Send delay up to 7 days; time-to-live any whole number
    of seconds up to 2**31 − 1 (the service's default when not given is 7 days;
    the delay must be shorter than the TTL). The service's own throughput
    limit is about 2,000 messages/s per queue.

    Counts: the service tells one number, the queue's approximate message count
    ("not lower than the actual number of messages in the queue, but could be
    higher"), which includes invisible messages — leased, delayed or abandoned
    with a delay — and cannot be split by state. So ``Queue.stats()`` gives it as
    ``total``, with ``visible``, ``leased`` and ``delayed`` ``None``; and, as
    ``dead_lettered``, the count of ``<queue>-poison`` (core's, one more call; 0
    while it does not exist).

Raw types:
    ``lease.raw`` is the SDK's ``azure.storage.queue.QueueMessage`` from the
    receive (its ``content`` is the raw text). Errors are the SDK's
    ``azure.core.exceptions.HttpResponseError`` (and subclasses
    ``ResourceNotFoundError``, ``ResourceExistsError``,
    ``ClientAuthenticationError``) or ``ServiceRequestError`` /
    ``ServiceResponseError`` for connection failures; ``.__cause__`` of the
    leasekit error.

Errors:
    Classified by the service's error code, never by the status alone:
    ``PopReceiptMismatch`` (400) and ``MessageNotFound`` (404) → ``LeaseLost``;
    ``QueueNotFound`` (404) → ``QueueNotFound``; ``RequestBodyTooLarge`` (413) →
    ``MessageTooLarge``; ``AuthenticationFailed`` and other 401/403 →
    ``AuthenticationFailed``; connection errors, timeouts and 5xx →
    ``BackendUnavailable``; range errors (400 ``OutOfRange…``) →
    ``InvalidArgument``. Core retries transient errors (connection errors,
    timeouts, 408, 5xx, and ``QueueBeingDeleted``: a queue re-created too soon
    after deletion) within each call's deadline, so the SDK's own retries are
    off by default (``retry_total=0``); with ``retry_total`` > 0 the SDK retries
    connection errors, 408 and 5xx itself (15 s+ backoff, longer than a short
    lease) and core retries only ``QueueBeingDeleted``.

    Every call carries per-operation ``connection_timeout`` and ``read_timeout``:
    the options' values, cut to the time left before core's deadline (a renewal's
    is the time left on its lease), so a hung request fails before the lease ends.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from leasekit.capabilities import Capabilities
from leasekit.deadline import call_timeout
from leasekit.errors import InvalidURL
from leasekit.hookspecs import hookimpl
from leasekit.options import as_float, as_int, as_object, as_text
from leasekit.redaction import install_log_redaction
from leasekit.registry import BackendSpec
from leasekit.spi import (
    CheckpointEntry,
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

if TYPE_CHECKING:
    from azure.storage.queue import QueueClient, QueueMessage, QueueServiceClient

__all__ = ["AzureStorageQueueDriver", "decode_message", "decode_text", "encode_message"]

WEEK = 7 * 24 * 3600
#: Seconds to wait for a connection (a dead endpoint fails this fast).
DEFAULT_CONNECTION_TIMEOUT = 5.0
#: Seconds to wait for an answer; each call is bounded tighter by core's deadline.
DEFAULT_READ_TIMEOUT = 10.0
#: Most messages one receive (and one peek) returns: the service's limit.
MAX_RECEIVE = 32
#: The service's limit on a message's text, in characters (64 KiB).
MAX_TEXT = 64 * 1024
#: Largest body that fits as base64 in ``MAX_TEXT`` (measured on Azurite:
#: 49,152 bytes → 65,536 characters fit, 49,153 → 413 RequestBodyTooLarge).
MAX_BODY = MAX_TEXT // 4 * 3
#: Longest time-to-live: the service takes any positive int32 (or -1, never).
MAX_TTL = 2**31 - 1
#: Longest connection or read timeout accepted (a day); larger ones overflow the socket's limit.
MAX_TIMEOUT = 86400.0
#: The loggers of the SDKs this driver uses; core redacts their records (``leasekit.redaction``).
SDK_LOGGERS = ("azure.core", "azure.storage", "azure.identity", "msal", "urllib3")
#: Leasekit's envelope for a message with properties starts with this; plain
#: base64 can never start with ``{``.
ENVELOPE_PREFIX = '{"leasekit":'
ENVELOPE_VERSION = 1
#: Azure queue names: 3-63 lowercase letters, digits and single hyphens,
#: starting and ending with a letter or digit.
_QUEUE_NAME = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_ACCOUNT_NAME = re.compile(r"^[a-z0-9]{3,24}$")
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}
#: URL query options that would be credentials: refused in a URL.
_SECRET_OPTIONS = frozenset(
    {
        "connection_string",
        "credential",
        "account_key",
        "key",
        "sas",
        "sas_token",
        "sig",
        "token",
        "password",
        "sv",  # a SAS token's fields arriving as query options
    }
)

# Error codes (``x-ms-error-code``) by meaning.
_LEASE_LOST = frozenset({"PopReceiptMismatch", "MessageNotFound"})
_QUEUE_NOT_FOUND = frozenset({"QueueNotFound"})
_QUEUE_EXISTS = frozenset({"QueueAlreadyExists"})
_TOO_LARGE = frozenset({"RequestBodyTooLarge", "MessageTooLarge"})
_UNAUTHENTICATED = frozenset(
    {
        "AuthenticationFailed",
        "AuthorizationFailure",
        "AuthorizationPermissionMismatch",
        "AuthorizationProtocolMismatch",
        "AuthorizationResourceTypeMismatch",
        "AuthorizationServiceMismatch",
        "AuthorizationSourceIPMismatch",
        "InsufficientAccountPermissions",
        "InvalidAuthenticationInfo",
        "NoAuthenticationInformation",
        "AccountIsDisabled",
    }
)
_UNAVAILABLE = frozenset(
    {"ServerBusy", "InternalError", "OperationTimedOut", "QueueBeingDeleted", "QueueDisabled"}
)
#: Unavailable codes the SDK does not retry (it retries 408 and 5xx only).
_CORE_RETRIES = frozenset({"QueueBeingDeleted"})


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``azure-storage-queue``."""
    return [
        BackendSpec(
            name="azure-storage-queue",
            driver="leasekit.backends.azure_storage_queue:AzureStorageQueueDriver",
            extra="azure-storage-queue",
            description="Azure Storage Queue (pop receipts, <queue>-poison dead letters)",
        )
    ]


# ------------------------------------------------------------------ encoding


def encode_message(
    body: bytes, properties: Mapping[str, str] | None = None, *, checkpoint: bytes | None = None
) -> str:
    """The message text leasekit stores for ``body``, ``properties`` and a ``checkpoint``.

    Plain base64 without properties or checkpoint; the ASCII JSON envelope with
    them (the checkpoint as the envelope's ``"checkpoint"`` field, base64).
    """
    text = base64.b64encode(body).decode("ascii")
    if not properties and checkpoint is None:
        return text
    envelope = {"leasekit": ENVELOPE_VERSION, "properties": dict(properties or {}), "body": text}
    if checkpoint is not None:
        envelope["checkpoint"] = base64.b64encode(checkpoint).decode("ascii")
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=True)


def decode_message(text: str | None) -> tuple[bytes, dict[str, str]]:
    """Body and properties of a message text (see "Message encoding" in the module doc).

    A leasekit envelope gives both; strict base64 gives the decoded bytes;
    any other text gives its UTF-8 bytes and no properties.
    """
    body, properties, _ = decode_text(text)
    return body, properties


def decode_text(text: str | None) -> tuple[bytes, dict[str, str], bytes | None]:
    """Body, properties and checkpoint of a message text (``None``: no checkpoint)."""
    if not text:
        return b"", {}, None
    if text.startswith(ENVELOPE_PREFIX):
        decoded = _decode_envelope(text)
        if decoded is not None:
            return decoded
    try:
        return base64.b64decode(text, validate=True), {}, None
    except ValueError:  # binascii.Error, or non-ASCII text
        return text.encode("utf-8", "surrogatepass"), {}, None


def _decode_envelope(text: str) -> tuple[bytes, dict[str, str], bytes | None] | None:
    try:
        envelope = json.loads(text)
    except ValueError:
        return None
    if not isinstance(envelope, dict) or envelope.get("leasekit") != ENVELOPE_VERSION:
        return None
    properties = envelope.get("properties")
    body = envelope.get("body")
    if not isinstance(properties, dict) or not isinstance(body, str):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in properties.items()):
        return None
    try:
        decoded = base64.b64decode(body, validate=True)
    except binascii.Error:
        return None
    checkpoint = envelope.get("checkpoint")
    try:  # a malformed checkpoint field is no checkpoint: the message itself is intact
        saved = base64.b64decode(checkpoint, validate=True) if isinstance(checkpoint, str) else None
    except binascii.Error:
        saved = None
    return decoded, properties, saved


# ------------------------------------------------------------------- helpers


def _error_code_of(exc: BaseException) -> str | None:
    code = getattr(exc, "error_code", None)
    if code is None:
        return None
    value = getattr(code, "value", code)  # StorageErrorCode is a str enum
    return str(value) if value else None


def _receipt_parts(receipt: str) -> tuple[str, str]:
    message_id, sep, pop_receipt = receipt.partition(":")
    if not sep or not message_id or not pop_receipt:
        raise DriverError(
            ErrorCode.LEASE_LOST,
            "malformed receipt: expected '<message id>:<pop receipt>'",
            backend_code="MalformedReceipt",
        )
    return message_id, pop_receipt


def _when(value: datetime | None) -> datetime:
    # The service always sends these times on receive and update; the SDK
    # types them optional.
    if value is None:
        raise DriverError(ErrorCode.UNKNOWN, "the service sent a message without its times")
    return value


def _whole_seconds(seconds: float) -> int:
    # Core already rounded lease durations up to whole seconds; delays and
    # TTLs may still be fractional: round up, never shorten what was asked.
    return math.ceil(seconds - 1e-9)


def _transport(max_connections: int, **timeouts: float) -> Any:
    """The SDK's requests transport with a connection pool of ``max_connections`` per host."""
    import requests
    from azure.core.pipeline.transport import RequestsTransport
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    session = requests.Session()
    # As azure-core's own adapter: requests must not retry (the SDK's policy does).
    adapter = HTTPAdapter(
        pool_connections=4,
        pool_maxsize=max_connections,
        max_retries=Retry(total=False, redirect=False, raise_on_status=False),
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return RequestsTransport(session=session, session_owner=True, **timeouts)


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_endpoint_host(host: str, port: int | None) -> bool:
    return port is not None or "." in host or ":" in host or host.lower() == "localhost"


def _connection_string_endpoints(connection_string: object) -> list[tuple[str, str]]:
    """The ``...Endpoint=URL`` parts of a connection string (to refuse one with credentials)."""
    if not isinstance(connection_string, str):
        return []
    found = []
    for part in connection_string.split(";"):
        key, sep, value = part.partition("=")
        if sep and key.strip().lower().endswith("endpoint"):
            found.append((key.strip(), value.strip()))
    return found


def _redacted_endpoint(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"


# -------------------------------------------------------------------- driver


#: The service's documented limits with the driver's default options (shown by
#: ``leasekit backends`` without credentials); options can change some per queue.
CAPABILITIES = Capabilities(
    min_lease=1.0,
    max_lease=float(WEEK),
    lease_resolution=1.0,
    renew_rotates_receipt=True,
    detects_stale_receipts=True,
    expired_receipt_usable=True,
    max_receive_batch=MAX_RECEIVE,
    max_delete_batch=1,
    max_renew_batch=1,
    max_send_batch=1,
    max_message_size=MAX_BODY,
    max_wait=0.0,
    max_abandon_delay=float(WEEK),
    max_send_delay=float(WEEK),
    max_ttl=float(MAX_TTL),
    supports_properties=True,
    native_dead_letter=False,
    delivery_count=True,
    queue_stats=True,
    counts=frozenset({"total"}),
    inspect_dead_letters=True,
    native_checkpoint=True,
)


class AzureStorageQueueDriver(Driver):
    """Driver for one Azure Storage queue.

    Parameters
    ----------
        queue: the queue name (3-63 lowercase letters, digits and single hyphens).
        connection_string: an Azure Storage connection string (keyword only, never a URL).
        account_url: the queue service endpoint, e.g. ``https://ACCOUNT.queue.core.windows.net``.
        credential: anything the SDK takes as a credential (with ``account_url``).
        service_client: a ready ``QueueServiceClient``; the driver uses it and does not close it.
        retry_total: the SDK's own retries of connection errors, 408 and 5xx (default 0:
            core retries them, within each call's deadline).
        max_connections: HTTP connections kept open per host (SDK default 10); more
            concurrent calls than this open and discard extra connections.
        connection_timeout: seconds to wait for a connection (default 5).
        read_timeout: seconds to wait for a response (default 10); each call is
            bounded tighter by core's deadline.
        api_version: the storage service API version (SDK default).

    Exactly one of ``connection_string``, ``account_url`` and ``service_client`` is needed.
    """

    scheme = "azure-storage-queue"
    capabilities = CAPABILITIES
    secret_options = _SECRET_OPTIONS
    credential_hint = "pass connection_string= or credential= as keyword options"

    def __init__(
        self,
        queue: str,
        connection_string: str | None = None,
        account_url: str | None = None,
        credential: Any = None,
        service_client: QueueServiceClient | None = None,
        retry_total: int | str | None = None,
        max_connections: int | str | None = None,
        connection_timeout: float | str | None = None,
        read_timeout: float | str | None = None,
        api_version: str | None = None,
    ) -> None:
        install_log_redaction(SDK_LOGGERS)
        if not isinstance(queue, str) or not _QUEUE_NAME.match(queue):
            raise ValueError(
                f"azure-storage-queue: {queue!r} is not a queue name: use 3-63 lowercase "
                "letters, digits and single hyphens, starting and ending with a letter or digit"
            )
        given = [
            name
            for name, value in (
                ("connection_string", connection_string),
                ("account_url", account_url),
                ("service_client", service_client),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "azure-storage-queue: give exactly one of connection_string, account_url "
                "(with credential) or service_client"
                + (f"; got {' and '.join(given)}" if given else "")
                + (
                    " (an azure-storage-queue:// URL sets account_url: pass credential=, "
                    "or use the keyword form with connection_string=)"
                    if connection_string is not None and account_url is not None
                    else ""
                )
            )
        if credential is not None and account_url is None:
            raise ValueError("azure-storage-queue: credential goes with account_url")
        check_endpoint(account_url, "account_url", self.scheme, self.credential_hint)
        for option, endpoint in _connection_string_endpoints(connection_string):
            check_endpoint(endpoint, f"connection_string's {option}", self.scheme)
        if service_client is not None:
            as_object(
                service_client,
                "service_client",
                methods=("get_queue_client",),
                what="an azure.storage.queue.QueueServiceClient",
            )
        if api_version is not None:
            as_text(api_version, "api_version")
        self.queue = queue
        kwargs: dict[str, Any] = {}
        if retry_total is not None:
            kwargs["retry_total"] = as_int(retry_total, "retry_total", minimum=0)
        self._connection_timeout = (
            DEFAULT_CONNECTION_TIMEOUT
            if connection_timeout is None
            else as_float(
                connection_timeout, "connection_timeout", minimum=0.001, maximum=MAX_TIMEOUT
            )
        )
        self._read_timeout = (
            DEFAULT_READ_TIMEOUT
            if read_timeout is None
            else as_float(read_timeout, "read_timeout", minimum=0.001, maximum=MAX_TIMEOUT)
        )
        if max_connections is not None:
            pool = as_int(max_connections, "max_connections", minimum=1)
            kwargs["transport"] = _transport(pool)
        if api_version is not None:
            kwargs["api_version"] = api_version

        from azure.storage.queue import QueueServiceClient

        self._owns_service = service_client is None
        # Core retries within each call's deadline; the SDK's own retries (15 s+
        # backoff) only when asked for.
        self._sdk_retries = kwargs.get("retry_total", 0 if service_client is None else None)
        if service_client is None:
            kwargs.setdefault("retry_total", 0)
        if service_client is not None:
            if kwargs:
                raise ValueError(
                    "azure-storage-queue: with service_client, configure retries, timeouts "
                    "and the API version on that client"
                )
            self._service = service_client
        elif connection_string is not None:
            if not isinstance(connection_string, str):
                raise ValueError("azure-storage-queue: connection_string must be a str")
            # The SDK's ValueError for a malformed string does not repeat it.
            self._service = QueueServiceClient.from_connection_string(connection_string, **kwargs)
        else:
            if not isinstance(account_url, str) or not account_url.lower().startswith(
                ("http://", "https://")
            ):
                raise ValueError(
                    "azure-storage-queue: account_url must be an http(s) URL such as "
                    "https://ACCOUNT.queue.core.windows.net"
                )
            self._service = QueueServiceClient(account_url, credential=credential, **kwargs)
        self._client: QueueClient = self._service.get_queue_client(queue)
        self._endpoint = _redacted_endpoint(self._service.url)
        self._closed = False

    @classmethod
    def options_from_url(cls, url: ParsedURL) -> dict[str, Any]:
        """Account URL and queue from ``azure-storage-queue://ACCOUNT/QUEUE`` or an endpoint."""
        query = dict(url.query)
        for option in ("account_url", "service_client"):
            if option in query:
                raise InvalidURL(f"azure-storage-queue: {option} is not a URL option")
        protocol = query.pop("protocol", None)
        if protocol is not None and protocol not in ("http", "https"):
            raise InvalidURL(
                f"azure-storage-queue: protocol must be http or https, got {protocol!r}"
            )
        host = url.host
        segments = [s for s in url.path.split("/") if s]
        if not host:
            raise InvalidURL(
                "azure-storage-queue URLs name an account or endpoint: "
                "azure-storage-queue://ACCOUNT/QUEUE or azure-storage-queue://HOST:PORT/ACCOUNT/QUEUE"
            )
        if _is_endpoint_host(host, url.port):
            if len(segments) not in (1, 2):
                raise InvalidURL(
                    "azure-storage-queue: with an endpoint host, the path is /QUEUE "
                    "or /ACCOUNT/QUEUE (path-style, as Azurite)"
                )
            netloc = f"[{host}]" if ":" in host else host
            if url.port is not None:
                netloc += f":{url.port}"
            scheme = protocol or ("http" if _is_loopback(host) else "https")
            base = f"{scheme}://{netloc}"
            account_url = f"{base}/{segments[0]}" if len(segments) == 2 else base
        else:
            if not _ACCOUNT_NAME.match(host):
                raise InvalidURL(
                    f"azure-storage-queue: {host!r} is not a storage account name "
                    "(3-24 lowercase letters and digits)"
                )
            if len(segments) != 1:
                raise InvalidURL("azure-storage-queue: the path is the queue: ACCOUNT/QUEUE")
            account_url = f"{protocol or 'https'}://{host}.queue.core.windows.net"
        return {**query, "account_url": account_url, "queue": segments[-1]}

    def __repr__(self) -> str:
        return f"<AzureStorageQueueDriver {self._endpoint} queue={self.queue!r}>"

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """``Put Message`` for each (base64 text, or the envelope when it has properties).

        The service has no batch send.
        """

        def put(message: OutgoingMessage) -> str:
            kwargs: dict[str, Any] = {}
            if message.delay > 0:
                kwargs["visibility_timeout"] = _whole_seconds(message.delay)
            if message.ttl is not None:
                kwargs["time_to_live"] = min(_whole_seconds(message.ttl), MAX_TTL)
            text = encode_message(message.body, message.properties)
            return str(self._client.send_message(text, **kwargs, **self._timeouts()).id)

        return each(messages, put)

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """One receive request for up to ``max_messages`` (≤ 32); no long poll."""
        pages = self._client.receive_messages(
            messages_per_page=max_messages,
            max_messages=max_messages,
            visibility_timeout=int(visibility),
            **self._timeouts(),
        ).by_page()
        page = next(pages, None)
        if page is None:
            return []
        return [self._raw(m) for m in page]

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """``Update Message`` for each, with an explicit visibility (0 releases).

        Each returns a new pop receipt; the service has no batch update.
        """
        whole = _whole_seconds(seconds)

        def update(receipt: str) -> Visibility:
            message_id, pop_receipt = _receipt_parts(receipt)
            updated = self._client.update_message(
                message_id, pop_receipt, visibility_timeout=whole, **self._timeouts()
            )
            return Visibility(
                receipt=f"{message_id}:{updated.pop_receipt}",
                visible_until=_when(updated.next_visible_on),
            )

        return each(receipts, update)

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """``Delete Message`` for each, with its pop receipt (the service has no batch delete)."""

        def delete_one(receipt: str) -> None:
            message_id, pop_receipt = _receipt_parts(receipt)
            self._client.delete_message(message_id, pop_receipt, **self._timeouts())

        return each(receipts, delete_one)

    # ------------------------------------------------------------------ admin

    def create_queue(self) -> None:
        """Create the queue; succeed if it exists."""
        from azure.core.exceptions import ResourceExistsError

        try:
            self._client.create_queue(**self._timeouts())
        except ResourceExistsError as exc:
            if _error_code_of(exc) not in _QUEUE_EXISTS:
                raise

    def delete_queue(self) -> None:
        """Delete the queue; succeed if it does not exist."""
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._client.delete_queue(**self._timeouts())
        except ResourceNotFoundError as exc:
            if _error_code_of(exc) not in _QUEUE_NOT_FOUND:
                raise

    # --------------------------------------------------------------- messages

    def validate(self, message: OutgoingMessage) -> None:
        """Refuse a body whose text (base64, or the envelope with properties) passes 64 KiB."""
        text = encode_message(message.body, message.properties)
        if len(text) > MAX_TEXT:
            raise DriverError(
                ErrorCode.TOO_LARGE,
                f"the body ({len(message.body)} bytes) and properties encode to {len(text)} "
                f"characters; Azure Storage Queue takes at most {MAX_TEXT}",
                backend_code="RequestBodyTooLarge",
            )

    def _raw(self, message: QueueMessage) -> RawMessage:
        body, properties, checkpoint = decode_text(message.content)
        return RawMessage(
            id=message.id,
            body=body,
            receipt=f"{message.id}:{message.pop_receipt}",
            delivery_count=int(message.dequeue_count or 1),
            enqueued_at=_when(message.inserted_on),
            visible_until=_when(message.next_visible_on),
            properties=properties,
            raw=message,
            checkpoint=checkpoint,
        )

    def checkpoint(
        self, entries: Sequence[CheckpointEntry], seconds: float
    ) -> list[Visibility | BaseException]:
        """``Update Message`` for each with the new text and visibility: one request, no extra.

        The text is the envelope with the body and properties as received and
        the checkpoint added; a text over 64 KiB is refused with no request.
        """
        whole = _whole_seconds(seconds)

        def update(entry: CheckpointEntry) -> Visibility:
            message_id, pop_receipt = _receipt_parts(entry.receipt)
            message = entry.message
            text = encode_message(message.body, message.properties, checkpoint=entry.data)
            if len(text) > MAX_TEXT:
                raise DriverError(
                    ErrorCode.TOO_LARGE,
                    f"the body ({len(message.body)} bytes), properties and a checkpoint of "
                    f"{len(entry.data)} bytes encode to {len(text)} characters; Azure Storage "
                    f"Queue takes at most {MAX_TEXT}",
                    backend_code="RequestBodyTooLarge",
                )
            updated = self._client.update_message(
                message_id,
                pop_receipt,
                content=text,
                visibility_timeout=whole,
                **self._timeouts(),
            )
            return Visibility(
                receipt=f"{message_id}:{updated.pop_receipt}",
                visible_until=_when(updated.next_visible_on),
            )

        return each(entries, update)

    def peek(self, limit: int) -> list[RawMessage]:
        """``Peek Messages``: up to ``min(limit, 32)`` visible messages, no receipts."""
        peeked = self._client.peek_messages(
            max_messages=min(limit, MAX_RECEIVE), **self._timeouts()
        )
        letters = []
        for message in peeked:
            body, properties = decode_message(message.content)
            letters.append(
                RawMessage(
                    id=str(message.id),
                    body=body,
                    receipt="",
                    delivery_count=int(message.dequeue_count or 0),
                    enqueued_at=_when(message.inserted_on),
                    visible_until=_when(message.inserted_on),
                    properties=properties,
                    raw=message,
                )
            )
        return letters

    def stats(self) -> QueueStats:
        """``get_queue_properties``: the approximate message count, as ``total`` only.

        The service counts every message in the queue, visible or not (leased,
        delayed), and cannot tell them apart, so the other counts stay ``None``.
        """
        properties = self._client.get_queue_properties(**self._timeouts())
        count = properties.approximate_message_count  # None if the header was missing
        return QueueStats(total=None if count is None else int(count))

    def sibling(self, queue: str) -> AzureStorageQueueDriver:
        """The queue ``queue`` on the same account, sharing this driver's connection pool."""
        twin = AzureStorageQueueDriver(queue=queue, service_client=self._service)
        twin._connection_timeout = self._connection_timeout
        twin._read_timeout = self._read_timeout
        twin._sdk_retries = self._sdk_retries
        return twin

    # ----------------------------------------------------------------- errors

    def error_code(self, exc: BaseException) -> ErrorCode:
        """Classify by the service's error code first; the status only when there is none."""
        if isinstance(exc, DriverError):
            return exc.code
        return classify(exc)

    def backend_code(self, exc: BaseException) -> str | None:
        """The ``x-ms-error-code`` of a service error."""
        if isinstance(exc, DriverError):
            return exc.backend_code
        return _error_code_of(exc)

    def is_retryable(self, exc: BaseException) -> bool:
        """Transient errors while the SDK's own retries are off; else only ``QueueBeingDeleted``."""
        if _error_code_of(exc) in _CORE_RETRIES:
            return True
        return self._sdk_retries == 0 and classify(exc) is ErrorCode.UNAVAILABLE

    def _timeouts(self) -> dict[str, Any]:
        """Per-operation timeouts for the call being made: the options, cut to core's deadline."""
        read = call_timeout(self._read_timeout)
        assert read is not None
        return {"connection_timeout": min(self._connection_timeout, read), "read_timeout": read}

    def close(self) -> None:
        """Close the HTTP session (unless the service client was given by the caller)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_service:
            self._service.close()


def classify(exc: BaseException) -> ErrorCode:
    """The :class:`ErrorCode` an ``azure-storage-queue`` / ``azure-core`` error means."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ServiceRequestError,
        ServiceResponseError,
    )

    code = _error_code_of(exc)
    if code in _LEASE_LOST:
        return ErrorCode.LEASE_LOST
    if code in _QUEUE_NOT_FOUND:
        return ErrorCode.QUEUE_NOT_FOUND
    if code in _QUEUE_EXISTS:
        return ErrorCode.QUEUE_EXISTS
    if code in _TOO_LARGE:
        return ErrorCode.TOO_LARGE
    if code in _UNAUTHENTICATED or isinstance(exc, ClientAuthenticationError):
        return ErrorCode.UNAUTHENTICATED
    if code in _UNAVAILABLE:
        return ErrorCode.UNAVAILABLE
    if isinstance(exc, ServiceRequestError | ServiceResponseError):
        return ErrorCode.UNAVAILABLE
    if isinstance(exc, HttpResponseError):
        status = exc.status_code or 0
        if status in (401, 403):
            return ErrorCode.UNAUTHENTICATED
        if status == 413:
            return ErrorCode.TOO_LARGE
        if status in (408, 429) or status >= 500:
            return ErrorCode.UNAVAILABLE
        if status == 400:
            return ErrorCode.INVALID_ARGUMENT
        # A 404 or 409 with an unknown code is not guessed at: a 404 is not
        # LeaseLost unless the code says MessageNotFound.
        return ErrorCode.UNKNOWN
    if isinstance(exc, ConnectionError | TimeoutError):
        return ErrorCode.UNAVAILABLE
    if isinstance(exc, ValueError | TypeError):
        return ErrorCode.INVALID_ARGUMENT
    return ErrorCode.UNKNOWN
