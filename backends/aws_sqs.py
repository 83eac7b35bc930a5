"""The AWS SQS backend, on boto3: standard queues, tested against moto's server.

URLs:
    ``aws-sqs://REGION/QUEUE`` — e.g. ``aws-sqs://eu-west-1/orders``; the region may
    be left out (``aws-sqs:///orders``) to take it from the boto3 chain
    (``AWS_REGION``/``AWS_DEFAULT_REGION``, the profile). A queue owned by another
    account: ``aws-sqs://eu-west-1/123456789012/orders``. Query options:
    ``endpoint_url`` (moto, LocalStack, a VPC endpoint), ``profile``,
    ``maximum_message_size``, ``max_attempts``, ``max_pool_connections``,
    ``connect_timeout`` (seconds to open a connection, default 5) and
    ``read_timeout`` (seconds to wait for an answer, default 10; a receive waits
    its long poll beyond that). Each call is bounded tighter still by core's
    deadline: a renewal by the time left on its lease.
    Keyword form: ``leasekit.open("aws-sqs", queue="orders", region="eu-west-1",
    endpoint_url=...)``; ``queue`` may also be a queue URL
    (``https://sqs.eu-west-1.amazonaws.com/123456789012/orders``), which saves the
    ``GetQueueUrl`` call. Credentials come from the usual boto3 chain (environment,
    profile, instance role) or from keyword options ``aws_access_key_id``,
    ``aws_secret_access_key``, ``aws_session_token``, or a ready ``client``; they
    are refused in a URL and never appear in a repr or message. Constructing the
    driver does no network I/O: the boto3 client is created on first use and
    shared with :meth:`SqsDriver.sibling` drivers. A queue named ``*.fifo`` is a
    FIFO queue (``create=True`` creates it with ``FifoQueue=true``): see below.

Delivery semantics:
    At least once. A lease is ``ReceiveMessage`` with ``VisibilityTimeout`` (the
    lease) and ``WaitTimeSeconds`` (long poll, at most 20 s per call; core loops
    for longer waits); renew is ``ChangeMessageVisibility`` and keeps the receipt
    handle; abandon sets the visibility to 0 (or to the delay); complete is
    ``DeleteMessage``; the batch forms use ``ChangeMessageVisibilityBatch`` and
    ``DeleteMessageBatch`` with a result per entry. ``delivery_count`` is
    ``ApproximateReceiveCount``. SQS does **not** promise to refuse a stale
    receipt handle: a delete with an old handle "succeeds but might not delete"
    (and moto accepts stale handles for every call), so
    ``detects_stale_receipts=False`` — a stale complete/renew/abandon may act on
    the message the new holder has, or do nothing, without an error. SQS says a
    change or delete after the lease ended "might result in an error", so
    ``expired_receipt_usable=False``. Invisibility since receive is capped at 12 h
    in total (``max_total_lease``), which core enforces. ``wait=0`` is a short
    poll: real SQS then samples a subset of its servers and may return nothing
    although messages exist; use a wait of 1 s or more when it matters.

    Dead-lettering is core's (``leasekit.dead_letters``): it copies the message,
    with the reason, original id and delivery count as properties, to the queue
    this driver names (:meth:`SqsDriver.dead_letter_queue`: the redrive policy's
    ``deadLetterTargetArn`` queue, where SQS's own redrive puts messages after
    ``maxReceiveCount`` and the rest of the AWS tooling looks) or, without a
    redrive policy, to ``<queue>-poison``; then deletes the original. A copy too
    large for the queue goes with its reason shortened, then without it.
    ``Queue.delete_queue()`` deletes ``<queue>-poison``, never a redrive-policy DLQ.
    Reading dead letters back (``peek_dead_letters``) receives them with a 30 s
    visibility and then releases them (visibility 0): SQS cannot peek, so this
    raises their receive count in the DLQ.

    FIFO queues (``capabilities.ordered`` and ``deduplicates``): every message
    needs ``group=`` (SQS's ``MessageGroupId``; a send without one is refused
    before any call) and cannot be delayed. SQS hands a group's messages out in
    the order sent, possibly several in one receive, and none of the group while
    any of them is in flight; ``lease.message.group`` is read back from the
    ``MessageGroupId`` attribute. Each send carries a deduplication id:
    ``dedup_key=`` when given, else none where the queue has
    ``ContentBasedDeduplication`` (SQS hashes the body), else a fresh UUID per
    message — so a send core retries after a timeout may be stored twice, as on a
    standard queue; give ``dedup_key=`` to make retries safe. (Asked once with
    ``GetQueueAttributes``, on the first send.) Dead letters go to the redrive
    DLQ or to ``<name>-poison.fifo``, a FIFO queue too, each copy in its group.

Limits:
    Leases 1 s – 12 h in whole seconds (SQS accepts 0–43200 s; a 0 s lease hides
    nothing, so leasekit's shortest lease is 1 s, and abandon still uses 0); 12 h
    in total since receive; 10 messages per receive, delete, renew and send call;
    long poll up to 20 s per receive; send delay up to 900 s; abandon delay up
    to 12 h; no per-message time-to-live (the queue's retention period applies).
    Bodies are bytes, sent base64-encoded because an SQS body is text from a
    restricted Unicode set; SQS limits body *plus* message attributes to the
    queue's ``MaximumMessageSize`` (``maximum_message_size``, default 262144 bytes,
    the SQS default and moto's; queues can be set up to 1 MiB). Of that,
    :data:`ATTRIBUTE_ROOM` bytes are kept for properties, so the largest body is
    ``(maximum_message_size - 8192) // 4 * 3`` = 190464 bytes by default. A send
    whose body and properties together exceed the limit is refused before any
    call (``MessageTooLarge``). Properties map to String message attributes, one
    each, when there are at most 10 with names SQS accepts and non-empty values;
    otherwise (more than 10 — e.g. a dead-letter copy of a message with 8 — or a
    name SQS refuses) they travel together as JSON in one attribute,
    ``leasekit-properties``, and are unpacked on receive.

    Counts: ``Queue.stats()`` gives SQS's approximate ``ApproximateNumberOfMessages``
    (visible), ``…NotVisible`` (leased; a message abandoned with a delay is
    counted here too, as SQS hides it like a lease) and ``…Delayed`` (delayed),
    their sum as ``total``, and (core's) as ``dead_lettered`` every message in the
    dead-letter queue core copies to (the redrive DLQ, else ``<queue>-poison``; 0
    while neither exists). SQS documents these counts as eventually consistent, settling up to
    about a minute after traffic stops. A redrive DLQ shared by several queues is
    counted whole: SQS does not tell which queue a letter came from.

Raw types:
    ``lease.raw`` is the message dict from boto3's ``receive_message``
    (``MessageId``, ``ReceiptHandle``, ``Body``, ``Attributes``,
    ``MessageAttributes``). SDK errors are :class:`botocore.exceptions.ClientError`
    (service errors; ``.response["Error"]["Code"]``) and
    :class:`botocore.exceptions.BotoCoreError` (network, credentials); per-entry
    batch failures are :class:`leasekit.spi.DriverError` carrying the entry's code.

Errors:
    ``ReceiptHandleIsInvalid``, ``MessageNotInflight``, ``InvalidParameterValue``
    about the receipt handle (expired) → ``LeaseLost``; ``QueueDoesNotExist`` /
    ``AWS.SimpleQueueService.NonExistentQueue`` → ``QueueNotFound``;
    ``InvalidClientTokenId``, ``SignatureDoesNotMatch``, ``AccessDenied``, missing
    credentials… → ``AuthenticationFailed``; throttling, ``OverLimit``, 5xx and
    network errors (``EndpointConnectionError``, timeouts) →
    ``BackendUnavailable``; other ``InvalidParameterValue`` → ``InvalidArgument``.
    Core retries transient errors, within each call's deadline, so boto3 makes
    one attempt per call by default (``max_attempts=1``); with more, boto3
    retries itself (standard mode, backoff of up to seconds between attempts,
    which a short lease may not have) and core does not retry again.
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import json
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from leasekit.capabilities import Capabilities
from leasekit.clock import to_datetime
from leasekit.deadline import call_timeout, check_deadline
from leasekit.errors import BackendNotInstalled, InvalidURL
from leasekit.hookspecs import hookimpl
from leasekit.options import as_float, as_int, as_object
from leasekit.redaction import Secret, install_log_redaction, redact_url
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
)
from leasekit.url import check_endpoint

__all__ = ["ATTRIBUTE_ROOM", "SqsDriver"]

#: SQS limits: messages per receive/delete/change/send batch, long poll, delays.
BATCH = 10
MAX_VISIBILITY = 43200
MAX_WAIT = 20
MAX_DELAY = 900
#: Seconds to open a connection (a dead endpoint fails this fast).
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds to wait for an answer beyond a receive's long poll; each call is
#: bounded tighter by core's deadline (see :mod:`leasekit.deadline`).
DEFAULT_READ_TIMEOUT = 10.0
#: The SQS default (and moto's) for a queue's MaximumMessageSize; SQS allows
#: 1024 to 1048576. It limits the body and the message attributes together.
DEFAULT_MAXIMUM_MESSAGE_SIZE = 262144
#: Bytes of the message size limit kept for properties (message attributes).
#: More room means smaller bodies; less means a maximum-size body can carry
#: fewer properties and a dead-letter reason is shortened sooner.
ATTRIBUTE_ROOM = 8192
#: SQS allows at most this many message attributes per message.
MAX_ATTRIBUTES = 10
#: The attribute that carries all properties as JSON when they cannot map one to one.
PACKED = "leasekit-properties"
#: How long ``peek_dead_letters`` hides the letters it reads before releasing
#: them; long enough to read a few hundred, short if the release fails.
PEEK_HIDE = 30
#: The queue attributes read by ``stats()``: visible, in flight (leased), delayed.
COUNT_ATTRIBUTES = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
]

_ATTRIBUTE_NAME = re.compile(r"^(?!\.)(?!.*\.\.)(?!.*\.$)[A-Za-z0-9_.-]{1,256}$")
_BAD_TEXT = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
#: A FIFO queue's name: up to 80 characters with the ``.fifo`` suffix.
_FIFO_NAME = re.compile(r"^[A-Za-z0-9_-]{1,75}\.fifo$")
_FIFO = ".fifo"
_ACCOUNT = re.compile(r"^\d{12}$")
_XML_CODE = re.compile(r"<Code>([^<]+)</Code>")
_XML_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
_AWS_HOST = re.compile(r"^sqs\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?$")

_LOST_CODES = frozenset(
    {
        "ReceiptHandleIsInvalid",
        "AWS.SimpleQueueService.ReceiptHandleIsInvalid",
        "MessageNotInflight",
        "AWS.SimpleQueueService.MessageNotInflight",
    }
)
_NOT_FOUND_CODES = frozenset({"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"})
_EXISTS_CODES = frozenset({"QueueAlreadyExists", "QueueNameExists"})
_AUTH_CODES = frozenset(
    {
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidSecurity",
        "MissingAuthenticationToken",
        "IncompleteSignature",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "AuthFailure",
        "InvalidAccessKeyId",
        "NotAuthorized",
        "OptInRequired",
        "KMS.AccessDeniedException",
    }
)
_UNAVAILABLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "OverLimit",
        "AWS.SimpleQueueService.OverLimit",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "RequestTimeout",
        "RequestTimeoutException",
        "KmsThrottled",
        "KMS.ThrottlingException",
    }
)
_TOO_LARGE_CODES = frozenset({"BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong"})
_UNSUPPORTED_CODES = frozenset(
    {"UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation"}
)
_INVALID_CODES = frozenset(
    {
        "InvalidParameterValue",
        "InvalidParameterCombination",
        "MissingParameter",
        "InvalidAttributeName",
        "InvalidAttributeValue",
        "InvalidMessageContents",
        "InvalidBatchEntryId",
        "AWS.SimpleQueueService.InvalidBatchEntryId",
        "TooManyEntriesInBatchRequest",
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        "EmptyBatchRequest",
        "AWS.SimpleQueueService.EmptyBatchRequest",
        "BatchEntryIdsNotDistinct",
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        "InvalidIdFormat",
        "InvalidAddress",
        "ValidationError",
        "InvalidQueryParameter",
        "MalformedQueryString",
    }
)
#: boto3/botocore failures raised before or instead of a service answer.
_NETWORK_ERRORS = (
    "ConnectionError",  # botocore's base of EndpointConnectionError, timeouts, proxy errors
    "HTTPClientError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "EndpointConnectionError",
)
_CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError")
#: Option names that are credentials: accepted as keywords only, never in a URL.
_SECRET_OPTIONS = frozenset({"aws_access_key_id", "aws_secret_access_key", "aws_session_token"})
#: The loggers of the SDK this driver uses; core redacts their records (``leasekit.redaction``).
SDK_LOGGERS = ("boto3", "botocore", "urllib3")
#: What a ready ``client=`` must be able to do.
_CLIENT_METHODS = ("receive_message", "send_message", "delete_message")
_HTTP = ("http://", "https://")


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``aws-sqs``."""
    return [
        BackendSpec(
            name="aws-sqs",
            driver="leasekit.backends.aws_sqs:SqsDriver",
            extra="sqs",
            description="Amazon SQS standard queues through boto3 (moto for local tests)",
        )
    ]


class _Connection:
    """One boto3 client, created on first use and shared by a driver and its siblings."""

    def __init__(self, factory: Callable[[], Any], client: Any = None) -> None:
        self._factory = factory
        self._client = client
        self._owned = client is None
        self._lock = threading.Lock()
        self._users = 1

    def client(self) -> Any:
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._users <= 0:
                raise DriverError(ErrorCode.UNKNOWN, "aws-sqs: the driver is closed")
            if self._client is None:
                self._client = self._factory()
            return self._client

    def share(self) -> _Connection:
        with self._lock:
            self._users += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return
            client, self._client = self._client, None
        if client is not None and self._owned:
            close = getattr(client, "close", None)
            if close is not None:
                close()


#: The service's documented limits with the driver's default options (shown by
#: ``leasekit backends`` without credentials); options can change some per queue.
CAPABILITIES = Capabilities(
    min_lease=1.0,
    max_lease=float(MAX_VISIBILITY),
    lease_resolution=1.0,
    max_total_lease=float(MAX_VISIBILITY),
    renew_rotates_receipt=False,
    detects_stale_receipts=False,
    expired_receipt_usable=False,
    max_receive_batch=BATCH,
    max_delete_batch=BATCH,
    max_renew_batch=BATCH,
    max_send_batch=BATCH,
    max_message_size=(DEFAULT_MAXIMUM_MESSAGE_SIZE - ATTRIBUTE_ROOM) // 4 * 3,
    max_wait=float(MAX_WAIT),
    wait_resolution=1.0,
    max_abandon_delay=float(MAX_VISIBILITY),
    max_send_delay=float(MAX_DELAY),
    max_ttl=None,
    supports_properties=True,
    native_dead_letter=False,
    delivery_count=True,
    queue_stats=True,
    counts=frozenset({"visible", "leased", "delayed"}),
    inspect_dead_letters=True,
)


class SqsDriver(Driver):
    """Driver for one SQS standard queue.

    Parameters
    ----------
        queue: the queue name, or its URL.
        region: the AWS region; from the boto3 chain if ``None`` (or from an AWS queue URL).
        endpoint_url: another endpoint (moto, LocalStack, a VPC endpoint).
        account: the 12-digit account that owns the queue, if not yours.
        profile: a named profile from the AWS config files.
        aws_access_key_id / aws_secret_access_key / aws_session_token: explicit
            credentials (keywords only; otherwise the boto3 chain).
        client: a ready boto3 SQS client to use instead of making one (not closed by the driver).
        maximum_message_size: the queue's ``MaximumMessageSize`` in bytes (body
            plus attributes); 262144 unless the queue was set otherwise.
        max_attempts: boto3's total attempts per call (standard retry mode); 1 (the
            default) leaves retrying to core, within each call's deadline.
        connect_timeout: seconds to open a connection (default 5).
        read_timeout: seconds to wait for an answer beyond a receive's long poll
            (default 10); each call is bounded tighter by core's deadline.
        max_pool_connections: HTTP connections the client keeps (one per concurrent call).
    """

    scheme = "aws-sqs"
    capabilities = CAPABILITIES
    secret_options = _SECRET_OPTIONS
    credential_hint = "use the boto3 chain (environment, profile, role) or keyword options"

    def __init__(
        self,
        queue: str,
        region: str | None = None,
        endpoint_url: str | None = None,
        account: str | None = None,
        profile: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        client: Any = None,
        maximum_message_size: int | str = DEFAULT_MAXIMUM_MESSAGE_SIZE,
        max_attempts: int | str = 1,
        connect_timeout: float | str = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float | str = DEFAULT_READ_TIMEOUT,
        max_pool_connections: int | str = 16,
        _connection: _Connection | None = None,
    ) -> None:
        install_log_redaction(SDK_LOGGERS)
        if not isinstance(queue, str) or not queue:
            raise InvalidURL("aws-sqs: a queue name or URL is required (queue=...)")
        for option, value in (("queue", queue), ("endpoint_url", endpoint_url)):
            check_endpoint(value, option, self.scheme, self.credential_hint)
        if endpoint_url is not None and not (
            isinstance(endpoint_url, str) and endpoint_url.lower().startswith(_HTTP)
        ):
            raise InvalidURL("aws-sqs: option endpoint_url must be an http(s):// URL")
        for option, value in (
            ("region", region),
            ("profile", profile),
            ("aws_access_key_id", aws_access_key_id),
            ("aws_secret_access_key", aws_secret_access_key),
            ("aws_session_token", aws_session_token),
        ):
            if value is not None and not isinstance(value, str):
                # Never the value: some of these are secrets.
                raise InvalidURL(f"aws-sqs: option {option} must be text (str)")
        if client is not None:
            as_object(client, "client", methods=_CLIENT_METHODS, what="a boto3 SQS client")
        queue_url: str | None = None
        if "://" in queue:
            queue_url = queue
            parts = urlsplit(queue)
            segments = [s for s in parts.path.split("/") if s]
            if not segments:
                raise ValueError(f"aws-sqs: {queue!r} is not a queue URL (no queue name)")
            name = segments[-1]
            match = _AWS_HOST.match(parts.hostname or "")
            if region is None and match:
                region = match.group(1)
        else:
            name = queue
        if not (_QUEUE_NAME.match(name) or _FIFO_NAME.match(name)):
            raise ValueError(
                f"aws-sqs: {name!r} is not a queue name (1-80 letters, digits, '-' or '_'; "
                "a FIFO queue's ends in '.fifo')"
            )
        if account is not None and (
            isinstance(account, bool)
            or not isinstance(account, str | int)
            or not _ACCOUNT.match(str(account))
        ):
            raise ValueError(f"aws-sqs: account must be a 12-digit AWS account id, got {account!r}")
        size = as_int(maximum_message_size, "maximum_message_size", minimum=1024)
        if size > 1048576:
            raise ValueError(f"aws-sqs: maximum_message_size is at most 1048576, got {size}")
        if _connection is None and client is None and importlib.util.find_spec("boto3") is None:
            raise BackendNotInstalled(
                "backend 'aws-sqs' needs boto3; install it with: pip install 'leasekit[sqs]'"
            )
        self.queue = name
        self.region = region
        self.endpoint_url = endpoint_url
        self.account = str(account) if account is not None else None
        self._profile = profile
        self._secret = Secret((aws_access_key_id, aws_secret_access_key, aws_session_token))
        self._max_attempts = as_int(max_attempts, "max_attempts", minimum=1)
        self._connect_timeout = as_float(connect_timeout, "connect_timeout", minimum=0.001)
        self._read_timeout = as_float(read_timeout, "read_timeout", minimum=0.001)
        self._max_pool = as_int(max_pool_connections, "max_pool_connections", minimum=1)
        self._given_url = queue_url
        self._queue_url = queue_url
        self._url_lock = threading.Lock()
        self._closed = False
        self._maximum_message_size = size
        if client is not None:
            _bound_attempts(client)
        self._connection = (
            _connection.share()
            if _connection is not None
            else _Connection(self._make_client, client)
        )
        self.fifo = name.endswith(_FIFO)
        self._content_based: bool | None = None  # the FIFO queue's ContentBasedDeduplication
        self.capabilities = CAPABILITIES.replace(max_message_size=(size - ATTRIBUTE_ROOM) // 4 * 3)
        if self.fifo:
            self.capabilities = self.capabilities.replace(
                ordered=True, deduplicates=True, max_send_delay=0.0
            )

    @classmethod
    def options_from_url(cls, url: ParsedURL) -> dict[str, Any]:
        """``aws-sqs://REGION/QUEUE`` or ``aws-sqs://REGION/ACCOUNT/QUEUE``, options as query."""
        objects = sorted(k for k in url.query if k == "client" or k.startswith("_"))
        if objects:
            raise InvalidURL(
                f"aws-sqs: option(s) {', '.join(objects)} cannot come from a URL (keyword only)"
            )
        if url.port is not None:
            raise InvalidURL("aws-sqs URLs name a region, not a host:port; use ?endpoint_url=")
        options: dict[str, Any] = dict(url.query)
        segments = [s for s in url.path.split("/") if s]
        if len(segments) == 2 and _ACCOUNT.match(segments[0]):
            options.setdefault("account", segments[0])
            segments = segments[1:]
        if len(segments) > 1:
            raise InvalidURL(f"aws-sqs URL path {url.path!r}: expected /QUEUE or /ACCOUNT/QUEUE")
        if segments:
            options.setdefault("queue", segments[0])
        if url.host:
            options.setdefault("region", url.host)
        return options

    def __repr__(self) -> str:
        where = f" endpoint={redact_url(self.endpoint_url)!r}" if self.endpoint_url else ""
        return f"<SqsDriver queue={self.queue!r} region={self.region!r}{where}>"

    # ------------------------------------------------------------- connection

    def _make_client(self) -> Any:
        import boto3
        from botocore.config import Config

        key_id, secret, token = self._secret.value
        session = boto3.session.Session(
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            aws_session_token=token,
            profile_name=self._profile,
            region_name=self.region,
        )
        config = Config(
            retries={"mode": "standard", "total_max_attempts": self._max_attempts},
            max_pool_connections=self._max_pool,
            connect_timeout=self._connect_timeout,
            # The cap: the longest long poll (20 s) plus read_timeout. Each call gets
            # less, the time left before core's deadline (see _bound_attempt).
            read_timeout=MAX_WAIT + self._read_timeout,
        )
        client = session.client("sqs", endpoint_url=self.endpoint_url, config=config)
        _bound_attempts(client)
        return client

    @property
    def client(self) -> Any:
        """The boto3 SQS client (created on first use; shared with siblings)."""
        return self._connection.client()

    def _url(self) -> str:
        url = self._queue_url
        if url is not None:
            return url
        with self._url_lock:
            if self._queue_url is None:
                self._queue_url = self._lookup(self.queue, self.account)
            return self._queue_url

    def _lookup(self, name: str, account: str | None) -> str:
        kwargs: dict[str, Any] = {"QueueName": name}
        if account:
            kwargs["QueueOwnerAWSAccountId"] = account
        url: str = self.client.get_queue_url(**kwargs)["QueueUrl"]
        return url

    # --------------------------------------------------------------- messages

    def validate(self, message: OutgoingMessage) -> None:
        """Refuse a message whose body and properties together pass the queue's limit, encoded.

        On a FIFO queue, also one without a group (SQS requires ``MessageGroupId``).
        """
        if self.fifo and message.group is None:
            raise DriverError(
                ErrorCode.INVALID_ARGUMENT,
                f"aws-sqs: FIFO queue {self.queue!r} needs a group on every message "
                "(send(..., group=...))",
                backend_code="MissingParameter",
            )
        self._encode(message)

    def _ordering(self, message: OutgoingMessage) -> dict[str, str]:
        """A FIFO send's ``MessageGroupId`` and ``MessageDeduplicationId`` (none elsewhere)."""
        if not self.fifo or message.group is None:
            return {}
        extra = {"MessageGroupId": message.group}
        if message.dedup_key is not None:
            extra["MessageDeduplicationId"] = message.dedup_key
        elif not self._deduplicates_content():
            extra["MessageDeduplicationId"] = uuid.uuid4().hex
        return extra

    def _deduplicates_content(self) -> bool:
        """Whether the FIFO queue has ``ContentBasedDeduplication`` (asked once)."""
        if self._content_based is None:
            response = self.client.get_queue_attributes(
                QueueUrl=self._url(), AttributeNames=["ContentBasedDeduplication"]
            )
            value = response.get("Attributes", {}).get("ContentBasedDeduplication", "false")
            self._content_based = str(value).lower() == "true"
        return self._content_based

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """``SendMessage`` for one; ``SendMessageBatch`` for several, split by the size limit.

        SQS limits a batch request to the queue's ``MaximumMessageSize`` in all,
        so a batch may go as several requests; each message gets its own result.
        """
        encoded = [self._encode(message) for message in messages]
        if len(messages) == 1:
            body, attributes = encoded[0]
            kwargs = _send_kwargs(body, attributes, messages[0].delay)
            kwargs.update(self._ordering(messages[0]))
            response = self.client.send_message(QueueUrl=self._url(), **kwargs)
            return [str(response["MessageId"])]
        results: list[str | BaseException] = [
            DriverError(ErrorCode.UNKNOWN, "SQS returned no result for this message")
        ] * len(messages)
        groups: list[list[tuple[int, dict[str, Any]]]] = [[]]
        group_size = 0
        for index, ((body, attributes), message) in enumerate(zip(encoded, messages, strict=True)):
            size = len(body) + _attributes_size(attributes)
            if groups[-1] and group_size + size > self._maximum_message_size:
                groups.append([])
                group_size = 0
            kwargs = _send_kwargs(body, attributes, message.delay)
            kwargs.update(self._ordering(message))
            groups[-1].append((index, kwargs))
            group_size += size
        url = self._url()
        for group in groups:
            entries = [{"Id": str(index), **kwargs} for index, kwargs in group]
            response = self.client.send_message_batch(QueueUrl=url, Entries=entries)
            for ok in response.get("Successful", []):
                results[int(ok["Id"])] = ok["MessageId"]
            for failed in response.get("Failed", []):
                results[int(failed["Id"])] = _entry_error(failed)
        return results

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """``ReceiveMessage``: up to 10 messages, hidden for ``visibility``; long-polls ``wait``."""
        url = self._url()
        wait_seconds = min(int(wait), MAX_WAIT)
        now = time.time()
        response = self.client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=max_messages,
            VisibilityTimeout=int(visibility),
            WaitTimeSeconds=wait_seconds,
            MessageSystemAttributeNames=_SYSTEM_ATTRIBUTES,
            MessageAttributeNames=["All"],
        )
        messages = response.get("Messages", [])
        until = to_datetime(now + visibility)
        return [self._raw_message(m, until) for m in messages]

    def _raw_message(self, m: Mapping[str, Any], until: Any) -> RawMessage:
        attributes = m.get("Attributes", {})
        sent = attributes.get("SentTimestamp")
        return RawMessage(
            id=m["MessageId"],
            body=_decode_body(m.get("Body", "")),
            receipt=m["ReceiptHandle"],
            delivery_count=int(attributes.get("ApproximateReceiveCount", "1")),
            enqueued_at=to_datetime(int(sent) / 1000.0 if sent else time.time()),
            visible_until=until,
            properties=_decode_properties(m.get("MessageAttributes", {})),
            raw=m,
            group=attributes.get("MessageGroupId") if self.fifo else None,
        )

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """``ChangeMessageVisibility`` for one, ``…Batch`` (≤ 10) for several; the handle stays."""
        now = time.time()
        if len(receipts) == 1:
            self.client.change_message_visibility(
                QueueUrl=self._url(), ReceiptHandle=receipts[0], VisibilityTimeout=int(seconds)
            )
            return [Visibility(receipts[0], to_datetime(now + seconds))]
        entries = [
            {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": int(seconds)}
            for i, r in enumerate(receipts)
        ]
        response = self.client.change_message_visibility_batch(
            QueueUrl=self._url(), Entries=entries
        )
        until = to_datetime(now + seconds)
        results: list[Visibility | BaseException] = [
            DriverError(ErrorCode.UNKNOWN, "SQS returned no result for this entry")
        ] * len(receipts)
        for ok in response.get("Successful", []):
            index = int(ok["Id"])
            results[index] = Visibility(receipts[index], until)
        for failed in response.get("Failed", []):
            results[int(failed["Id"])] = _entry_error(failed)
        return results

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """``DeleteMessage`` for one, ``DeleteMessageBatch`` (≤ 10) for several.

        A stale handle may succeed without deleting (SQS's rule).
        """
        if len(receipts) == 1:
            self.client.delete_message(QueueUrl=self._url(), ReceiptHandle=receipts[0])
            return [None]
        entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts)]
        response = self.client.delete_message_batch(QueueUrl=self._url(), Entries=entries)
        results: list[BaseException | None] = [
            DriverError(ErrorCode.UNKNOWN, "SQS returned no result for this entry")
        ] * len(receipts)
        for ok in response.get("Successful", []):
            results[int(ok["Id"])] = None
        for failed in response.get("Failed", []):
            results[int(failed["Id"])] = _entry_error(failed)
        return results

    # ------------------------------------------------------------ dead letter

    def dead_letter_queue(self) -> str | None:
        """The queue named by the redrive policy's ``deadLetterTargetArn``, if the queue has one.

        Core copies dead letters there (where SQS's own redrive puts messages
        after ``maxReceiveCount`` and the rest of the AWS tooling looks), else to
        ``<queue>-poison``. SQS keeps a dead-letter queue in the source queue's
        account and region.
        """
        response = self.client.get_queue_attributes(
            QueueUrl=self._url(), AttributeNames=["RedrivePolicy"]
        )
        policy = response.get("Attributes", {}).get("RedrivePolicy")
        if not policy:
            return None
        arn = json.loads(policy)["deadLetterTargetArn"]
        return str(arn.rsplit(":", 1)[-1])

    def peek(self, limit: int) -> list[RawMessage]:
        """Receive up to ``limit`` messages hidden for 30 s, then release them (visibility 0).

        SQS cannot peek: this raises the messages' receive counts.
        """
        seen: dict[str, RawMessage] = {}
        handles: list[str] = []
        url = self._url()
        try:
            while len(seen) < limit:
                response = self.client.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=min(BATCH, limit - len(seen)),
                    VisibilityTimeout=PEEK_HIDE,
                    WaitTimeSeconds=0 if seen else 1,
                    MessageSystemAttributeNames=_SYSTEM_ATTRIBUTES,
                    MessageAttributeNames=["All"],
                )
                messages = response.get("Messages", [])
                if not messages:
                    break
                until = to_datetime(time.time())
                for m in messages:
                    handles.append(m["ReceiptHandle"])
                    seen.setdefault(m["MessageId"], self._raw_message(m, until))
        finally:
            for start in range(0, len(handles), BATCH):
                chunk = handles[start : start + BATCH]
                self.client.change_message_visibility_batch(
                    QueueUrl=url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
                        for i, h in enumerate(chunk)
                    ],
                )
        return list(seen.values())[:limit]

    def stats(self) -> QueueStats:
        """SQS's approximate counts (``ApproximateNumberOfMessages*``).

        Core adds ``dead_lettered``: the depth of the dead-letter queue it copies to.
        """
        visible, leased, delayed = self._counts(self._url())
        return QueueStats(visible=visible, leased=leased, delayed=delayed)

    def _counts(self, url: str) -> tuple[int, int, int]:
        """Visible, in-flight and delayed messages of the queue at ``url``."""
        response = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=COUNT_ATTRIBUTES)
        attributes = response.get("Attributes", {})
        visible, leased, delayed = (int(attributes.get(name, 0)) for name in COUNT_ATTRIBUTES)
        return visible, leased, delayed

    def sibling(self, queue: str) -> SqsDriver:
        """Another queue of the same account and region, sharing this driver's client.

        From a FIFO queue, core's ``<name>.fifo-poison`` is ``<name>-poison.fifo``
        (a FIFO queue's dead letters must go to a FIFO queue).
        """
        base, fifo, rest = queue.partition(_FIFO)
        if self.fifo and fifo and rest:
            queue = base + rest + _FIFO
        return SqsDriver(
            queue=queue,
            region=self.region,
            endpoint_url=self.endpoint_url,
            account=self.account,
            maximum_message_size=self._maximum_message_size,
            _connection=self._connection,
        )

    # ------------------------------------------------------------------ admin

    def create_queue(self) -> None:
        """``CreateQueue`` (a no-op for an existing queue with default attributes)."""
        attributes = {"FifoQueue": "true"} if self.fifo else {}
        try:
            url: str = self.client.create_queue(QueueName=self.queue, Attributes=attributes)[
                "QueueUrl"
            ]
        except Exception as exc:
            if self.error_code(exc) is not ErrorCode.QUEUE_EXISTS:
                raise
            url = self._lookup(self.queue, self.account)
        if self._given_url is None:
            with self._url_lock:
                self._queue_url = url

    def delete_queue(self) -> None:
        """``DeleteQueue``; a missing queue is fine."""
        try:
            self.client.delete_queue(
                QueueUrl=self._queue_url or self._lookup(self.queue, self.account)
            )
        except Exception as exc:
            if self.error_code(exc) is not ErrorCode.QUEUE_NOT_FOUND:
                raise
        with self._url_lock:
            if self._given_url is None:
                self._queue_url = None

    # ----------------------------------------------------------------- errors

    def error_code(self, exc: BaseException) -> ErrorCode:
        """Classify a botocore error by its service code, HTTP status or class."""
        if isinstance(exc, DriverError):
            return exc.code
        code, query_code, message, status = _client_error_parts(exc)
        if code is not None:
            return _classify(code, query_code, message, status)
        names = {cls.__name__ for cls in type(exc).__mro__}
        if names & set(_NETWORK_ERRORS):
            return ErrorCode.UNAVAILABLE
        if names & set(_CREDENTIAL_ERRORS):
            return ErrorCode.UNAUTHENTICATED
        if names & {"ParamValidationError", "NoRegionError", "InvalidRegionError"}:
            return ErrorCode.INVALID_ARGUMENT
        return ErrorCode.UNKNOWN

    def backend_code(self, exc: BaseException) -> str | None:
        """The SQS error code (``ReceiptHandleIsInvalid``...) or the botocore error's class."""
        if isinstance(exc, DriverError):
            return exc.backend_code
        code, _, _, _ = _client_error_parts(exc)
        if code is not None:
            return code
        if type(exc).__module__.startswith("botocore"):
            return type(exc).__name__
        return None

    def is_retryable(self, exc: BaseException) -> bool:
        """Transient errors when boto3 makes one attempt; never when it retries itself."""
        return self._max_attempts == 1 and self.error_code(exc) is ErrorCode.UNAVAILABLE

    def close(self) -> None:
        """Release the shared client (closed when its last driver closes)."""
        if self._closed:
            return
        self._closed = True
        self._connection.release()

    # ------------------------------------------------------------ encoding

    def _encode(self, message: OutgoingMessage) -> tuple[str, dict[str, Any]]:
        body = base64.b64encode(message.body).decode("ascii")
        attributes = _encode_properties(message.properties)
        total = len(body) + _attributes_size(attributes)
        if total > self._maximum_message_size:
            raise DriverError(
                ErrorCode.TOO_LARGE,
                f"aws-sqs: body and properties take {total} bytes once encoded; the queue "
                f"accepts {self._maximum_message_size}",
                backend_code="MessageTooLong",
            )
        return body, attributes


# --------------------------------------------------------------------- helpers


#: The system attributes a receive asks for (``MessageGroupId``: FIFO queues only have it).
_SYSTEM_ATTRIBUTES = ["ApproximateReceiveCount", "SentTimestamp", "MessageGroupId"]


def _send_kwargs(body: str, attributes: dict[str, Any], delay: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"MessageBody": body}
    if attributes:
        kwargs["MessageAttributes"] = attributes
    if delay > 0:
        kwargs["DelaySeconds"] = min(math.ceil(delay), MAX_DELAY)
    return kwargs


def _decode_body(text: str) -> bytes:
    """A leasekit body is base64; a body some other producer sent is returned as UTF-8."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return text.encode("utf-8")


def _attribute_ok(name: str, value: str) -> bool:
    lowered = name.lower()
    return (
        bool(_ATTRIBUTE_NAME.match(name))
        and not lowered.startswith(("aws.", "amazon."))
        and name != PACKED
        and bool(value)
        and not _BAD_TEXT.search(value)
    )


def _encode_properties(properties: Mapping[str, str]) -> dict[str, Any]:
    """One String attribute per property where SQS allows it; else all as JSON in one."""
    if not properties:
        return {}
    if len(properties) <= MAX_ATTRIBUTES and all(
        _attribute_ok(k, v) for k, v in properties.items()
    ):
        return {k: {"DataType": "String", "StringValue": v} for k, v in properties.items()}
    packed = json.dumps(dict(properties), ensure_ascii=True, separators=(",", ":"))
    return {PACKED: {"DataType": "String", "StringValue": packed}}


def _decode_properties(attributes: Mapping[str, Any]) -> dict[str, str]:
    properties: dict[str, str] = {}
    packed: dict[str, str] = {}
    for name, value in attributes.items():
        text = value.get("StringValue")
        if text is None:
            binary = value.get("BinaryValue")
            if binary is None:
                continue
            text = base64.b64encode(binary).decode("ascii")
        if name == PACKED:
            try:
                decoded = json.loads(text)
            except ValueError:
                decoded = None
            if isinstance(decoded, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in decoded.items()
            ):
                packed = decoded
                continue
        properties[name] = text
    properties.update(packed)
    return properties


def _attributes_size(attributes: Mapping[str, Any]) -> int:
    """Bytes SQS counts for message attributes: name, data type and value."""
    return sum(
        len(name.encode("utf-8"))
        + len(value["DataType"].encode("utf-8"))
        + len(value["StringValue"].encode("utf-8"))
        for name, value in attributes.items()
    )


def _client_error_parts(exc: BaseException) -> tuple[str | None, str | None, str, int | None]:
    """(code, query code, message, HTTP status) of a botocore ClientError; code None otherwise."""
    response = getattr(exc, "response", None)
    if not isinstance(response, Mapping):
        return None, None, "", None
    error = response.get("Error") or {}
    code = error.get("Code")
    if not code:
        return None, None, "", None
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    message = str(error.get("Message") or "")
    if str(code).isdigit():
        # An XML error body a JSON-protocol client could not parse (moto's auth
        # errors): botocore puts the HTTP status in Code and the XML in Message.
        found = _XML_CODE.search(message)
        if found:
            code = found.group(1)
            inner = _XML_MESSAGE.search(message)
            message = inner.group(1) if inner else message
    return str(code), error.get("QueryErrorCode"), message, status


def _classify(code: str, query_code: str | None, message: str, status: int | None) -> ErrorCode:
    codes = {code, query_code} - {None}
    lowered = message.lower()
    if codes & _LOST_CODES:
        return ErrorCode.LEASE_LOST
    if codes & _NOT_FOUND_CODES:
        return ErrorCode.QUEUE_NOT_FOUND
    if codes & _AUTH_CODES:
        return ErrorCode.UNAUTHENTICATED
    if codes & _UNAVAILABLE_CODES or (status is not None and status >= 500):
        return ErrorCode.UNAVAILABLE
    if codes & _EXISTS_CODES:
        return ErrorCode.QUEUE_EXISTS
    if codes & _TOO_LARGE_CODES:
        return ErrorCode.TOO_LARGE
    if codes & _UNSUPPORTED_CODES:
        return ErrorCode.UNSUPPORTED
    if "InvalidParameterValue" in codes:
        # SQS reports an expired or not-in-flight receipt handle this way, e.g.
        # "Value ... for parameter ReceiptHandle is invalid. Reason: The receipt
        # handle has expired."
        if "receipthandle" in lowered or "receipt handle" in lowered:
            return ErrorCode.LEASE_LOST
        if "message does not exist" in lowered or "not available for visibility" in lowered:
            return ErrorCode.LEASE_LOST
        if "shorter than" in lowered or "too long" in lowered:
            return ErrorCode.TOO_LARGE
    if codes & _INVALID_CODES:
        return ErrorCode.INVALID_ARGUMENT
    if status == 403:
        return ErrorCode.UNAUTHENTICATED
    if status == 429:
        return ErrorCode.UNAVAILABLE
    return ErrorCode.UNKNOWN


def _entry_error(failed: Mapping[str, Any]) -> DriverError:
    """The error for one failed batch entry, classified like a whole-call error."""
    code = str(failed.get("Code") or "UnknownError")
    message = str(failed.get("Message") or code)
    classified = _classify(code, None, message, None)
    if classified is ErrorCode.UNKNOWN and not failed.get("SenderFault", True):
        classified = ErrorCode.UNAVAILABLE  # a server-side fault on this entry
    return DriverError(classified, f"{code}: {message}", backend_code=code)


def _bound_attempt(request: Any, **kwargs: Any) -> None:
    """Botocore ``before-send`` hook: this attempt reads for no longer than core's deadline allows.

    botocore takes a per-request read timeout from ``request.context``; an
    attempt that would start after the deadline is not made.
    """
    check_deadline("aws-sqs request")
    left = call_timeout()
    context = getattr(request, "context", None)
    if left is not None and context is not None:
        context["read_timeout"] = left


def _bound_attempts(client: Any) -> None:
    """Bound every request ``client`` makes by core's deadline for the call (see above)."""
    client.meta.events.register("before-send.sqs", _bound_attempt, unique_id="leasekit-deadline")
