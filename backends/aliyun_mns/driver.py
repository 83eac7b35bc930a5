"""The MNS driver: the SPI translated to ``aliyun-mns-sdk`` calls."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from leasekit.capabilities import Capabilities
from leasekit.errors import BackendNotInstalled, InvalidURL
from leasekit.options import as_bool, as_float
from leasekit.redaction import install_log_redaction
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

from .clients import _ClientPool
from .error_codes import _QUEUE_EXISTS, _QUEUE_NOT_FOUND, _openapi_code, classify
from .openapi import ControlPlane
from .wire import (
    _ENDPOINT_REGION,
    _SECRET_OPTIONS,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_READ_TIMEOUT,
    ENV_ACCESS_KEY_ID,
    ENV_ACCESS_KEY_SECRET,
    ENV_SECURITY_TOKEN,
    FIFO_QUEUE_TYPE,
    MAX_BATCH,
    MAX_BODY,
    MAX_DELAY,
    MAX_TIMEOUT,
    MAX_VISIBILITY,
    MAX_WAIT,
    MIN_VISIBILITY,
    SDK_LOGGERS,
    _check_queue_name,
    _is_loopback,
    _ms,
    _property_value,
    _read_properties,
    _whole_seconds,
    decode_body,
    encode_body,
)

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
