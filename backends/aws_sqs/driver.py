"""The SQS driver: the SPI translated to boto3 calls."""

from __future__ import annotations

import base64
import importlib.util
import json
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from leasekit.capabilities import Capabilities
from leasekit.clock import to_datetime
from leasekit.errors import BackendNotInstalled, InvalidURL
from leasekit.options import as_float, as_int, as_object
from leasekit.redaction import Secret, install_log_redaction, redact_url
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

from .connection import _bound_attempts, _Connection
from .error_codes import (
    _CREDENTIAL_ERRORS,
    _NETWORK_ERRORS,
    _classify,
    _client_error_parts,
    _entry_error,
)
from .wire import (
    _ACCOUNT,
    _AWS_HOST,
    _CLIENT_METHODS,
    _FIFO,
    _FIFO_NAME,
    _HTTP,
    _QUEUE_NAME,
    _SECRET_OPTIONS,
    _SYSTEM_ATTRIBUTES,
    ATTRIBUTE_ROOM,
    BATCH,
    COUNT_ATTRIBUTES,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAXIMUM_MESSAGE_SIZE,
    DEFAULT_READ_TIMEOUT,
    MAX_DELAY,
    MAX_VISIBILITY,
    MAX_WAIT,
    PEEK_HIDE,
    SDK_LOGGERS,
    _attributes_size,
    _decode_body,
    _decode_properties,
    _encode_properties,
    _send_kwargs,
)

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
