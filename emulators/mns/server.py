# House docstring style uses "Parameters:"/"Returns:"/"Raises:" sections (STYLE.md 14), which
# ruff's unconfigured pydocstyle misreads as numpy sections.
"""The MNS emulator's HTTP server: routes MNS's REST API onto :class:`MnsStore`.

Routes (MNS API version ``2015-06-06``, queue model only)::

    GET    /queues                                 ListQueue
    PUT    /queues/{q}                             CreateQueue (201; 204 if identical)
    PUT    /queues/{q}?metaoverride=true           SetQueueAttributes (204)
    GET    /queues/{q}                             GetQueueAttributes
    DELETE /queues/{q}                             DeleteQueue (204)
    POST   /queues/{q}/messages                    SendMessage / BatchSendMessage (201)
    GET    /queues/{q}/messages[?waitseconds=N]    ReceiveMessage
    GET    ...?numOfMessages=N[&waitseconds=N]     BatchReceiveMessage
    GET    ...?peekonly=true[&numOfMessages=N]     PeekMessage / BatchPeekMessage
    PUT    ...?ReceiptHandle=H&VisibilityTimeout=S ChangeMessageVisibility
    DELETE ...?ReceiptHandle=H                     DeleteMessage (204)
    DELETE ... with <ReceiptHandles> body          BatchDeleteMessage (204, or 404 + <Errors>)

The control-plane OpenAPI (``2022-01-19``: ``CreateQueue`` with ``QueueType``,
``GetQueueAttributes``, ``DeleteQueue``) is served on the same port: a request
with an ``x-acs-action`` header goes to :mod:`.openapi`, signed and answered
the OpenAPI way (``ACS3-HMAC-SHA256``, JSON).

Every request must be signed (see :mod:`.auth`); every response carries
``Content-Length``, ``x-mns-request-id`` and ``x-mns-version``. Query parameter
names are matched case-insensitively (the docs write ``receiptHandle``, the
Python SDK ``ReceiptHandle``); values are percent-decoded but not form-decoded,
so a ``+`` stays a ``+``.

Deviations and choices where MNS's documentation is silent:

- BatchDeleteMessage with some failed handles answers 404 with the documented
  ``<Errors>`` list; handles that succeeded are deleted.
- BatchSendMessage validates every message first and rejects the whole batch
  with one ``<Error>`` if any is invalid (MNS may accept part of a batch).
- DeleteQueue of a missing queue answers 204 (its docs list no special error).
- A peeked message that was never received reports ``FirstDequeueTime`` 0.
- Receive order is priority (1 first), then send order (MNS documents no strict order).
- Requests http.server itself rejects (bad request line, unknown method) get
  an ``InvalidRequestURL`` error body with the status http.server chose.
- Topics, subscriptions, account attributes, dead-letter policies, QPS limits
  and ``TimeExpired`` are not emulated. Ordered (FIFO) queues are; the choices
  made where their documentation is silent are listed in :mod:`.store`.

Limits that keep one client from exhausting the server:

- A request is authenticated from its headers (the signature does not cover the
  body) and its ``Content-Length`` is checked against :data:`MAX_REQUEST_BODY`
  before a byte of its body is read; only then is the body read (and checked
  against its ``Content-MD5``). A larger request gets MNS's ``InvalidArgument``
  (400) for a value out of range, the error MNS documents for sizes
  (https://www.alibabacloud.com/help/en/mns/developer-reference/syntax-of-error-responses:
  "The value of Element should between Low and High seconds/bytes").
  A refused body of up to 1 MiB is read and dropped so the connection stays
  usable; a larger one is not read and the connection is closed after the answer.
- Every read and write on a connection times out after ``idle_timeout`` seconds
  (default :data:`DEFAULT_IDLE_TIMEOUT`): an idle keep-alive connection or a
  request sent only in part is closed without an answer, freeing its thread. The
  timeout is per socket operation, so a client trickling a byte at a time inside
  it is not cut off. Each connection has its own thread, so stalled clients never
  delay others.
"""

from __future__ import annotations

import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import unquote

from . import openapi, wire
from .auth import MNS_VERSION, check_digest, check_signature
from .errors import MnsError, int_param
from .store import MAX_SEND_BODY, Clock, MnsStore

__all__ = [
    "DEFAULT_ACCESS_KEY_ID",
    "DEFAULT_ACCESS_KEY_SECRET",
    "DEFAULT_IDLE_TIMEOUT",
    "MAX_REQUEST_BODY",
    "MnsEmulator",
    "serve",
]

log = logging.getLogger("leasekit.emulators.mns")

# Well-known development credentials, like Azurite's account key: not secret.
DEFAULT_ACCESS_KEY_ID = "leasekit-mns-emulator"
DEFAULT_ACCESS_KEY_SECRET = "leasekit-mns-emulator-secret"

#: The largest request body the emulator reads: the most message text MNS takes in one
#: request (``MAX_SEND_BODY``, 64 KB) plus as much again for the XML around 16 messages
#: and their user properties. A request declaring more is refused unread.
MAX_REQUEST_BODY = 2 * MAX_SEND_BODY
#: Seconds a connection may sit idle (between requests, or in the middle of one) before it
#: is closed. Long enough that a client's keep-alive connection rarely drops between its
#: calls (the SDK re-sends once on a dropped one), short enough that stalled clients give
#: their threads back within a minute. Tests set it to a second or less.
DEFAULT_IDLE_TIMEOUT = 45.0

#: A refused request's body up to this size is read and dropped, so that the client gets
#: the error on a connection it can go on using; a larger one is not read.
_DISCARD_LIMIT = 1024 * 1024
#: After refusing a larger body unread, drop whatever the client still sends for at most
#: this long before closing (a "lingering close", as web servers do): closing a socket
#: with unread data sends a reset, which can destroy the answer before the client reads it.
_LINGER_SECONDS = 1.0
_CONTENT_LENGTH_RE = re.compile(r"[0-9]{1,20}\Z")

_Reply = tuple[int, bytes, dict[str, str]]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # The default backlog of 5 drops connections from a burst of clients (each retries its
    # SYN only after a second); every accepted connection gets a thread of its own.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], emulator: MnsEmulator) -> None:
        self.emulator = emulator
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK expects
    # Headers and body go out in two writes; without TCP_NODELAY, Nagle plus the
    # client's delayed ACK adds ~40 ms to every response.
    disable_nagle_algorithm = True
    server_version = "leasekit-mns-emulator"
    server: _Server
    _linger = False

    def setup(self) -> None:
        """Give the connection the emulator's idle timeout (http.server closes it on expiry)."""
        super().setup()
        self.connection.settimeout(self.server.emulator.idle_timeout)

    def do_GET(self) -> None:
        """Handle GET."""
        self._handle()

    def do_PUT(self) -> None:
        """Handle PUT."""
        self._handle()

    def do_POST(self) -> None:
        """Handle POST."""
        self._handle()

    def do_DELETE(self) -> None:
        """Handle DELETE."""
        self._handle()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Silence the default access log; :meth:`_handle` logs each request."""

    def log_message(self, format: str, *args: object) -> None:
        """Route http.server's own messages (bad requests) to the debug log."""
        log.debug("%s: " + format, self.address_string(), *args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Answer http.server's own errors (bad request line, unknown method) MNS-style."""
        self.log_message("code %d, message %s", code, message)
        request_id = secrets.token_hex(12).upper()
        emulator = self.server.emulator
        base_url = f"http://{emulator.host}:{emulator.port}"
        text = message or "Http request format invalid."
        self.close_connection = True
        self._reply(
            code, wire.error_xml("InvalidRequestURL", text, request_id, base_url), request_id
        )

    def _handle(self) -> None:
        started = time.monotonic()
        request_id = secrets.token_hex(12).upper()
        headers = {name.lower(): value for name, value in self.headers.items()}
        emulator = self.server.emulator
        base_url = f"http://{headers.get('host') or f'{emulator.host}:{emulator.port}'}"
        action = headers.get("x-acs-action")  # the control-plane OpenAPI
        error = wire.error_xml if action is None else openapi.error_json
        try:
            body = self._read_body(headers, action is not None)
            if body is None:
                log.debug("client went away or stalled in the middle of request %s", request_id)
                return
            if action is None:
                status, payload, extra = self._dispatch(headers, body, base_url)
            else:
                if self.command != "POST":
                    raise MnsError("InvalidRequestURL", 400, "OpenAPI requests are POST /.")
                status, payload = openapi.dispatch(
                    emulator.store, action, self.path.partition("?")[2], request_id
                )
                extra = {}
        except MnsError as exc:
            status, extra = exc.status, {}
            payload = error(exc.code, exc.message, request_id, base_url)
        except Exception:
            log.exception("internal error handling %s %s", self.command, self.path)
            status, extra = 500, {}
            payload = error("InternalError", "Internal error.", request_id, base_url)
        if action is not None:
            extra = {**extra, "Content-Type": "application/json;charset=utf-8"}
        self._reply(status, payload, request_id, extra)
        if self._linger:
            self._lingering_close()
        log.debug(
            "%s %s -> %d (%.1f ms, request %s)",
            self.command,
            self.path,
            status,
            (time.monotonic() - started) * 1000,
            request_id,
        )

    def _read_body(self, headers: Mapping[str, str], acs3: bool = False) -> bytes | None:
        """Authenticate the request and bound its size, then read its body.

        ``acs3``: an OpenAPI request (signed ``ACS3-HMAC-SHA256``, body hash in a header).

        Returns:
            The body, or ``None`` if the client closed the connection or stalled past the
            idle timeout before sending all of it.

        Raises:
            MnsError: the request is refused (its body has then been dropped, or the
                connection will close).
        """
        raw_length = (headers.get("content-length") or "0").strip()
        if not _CONTENT_LENGTH_RE.match(raw_length):
            self.close_connection = True  # where this request ends is unknown
            raise MnsError.invalid_argument("The Content-Length header is invalid.")
        length = int(raw_length)
        credentials = self.server.emulator.credentials
        try:
            if acs3:
                path, _, query = self.path.partition("?")
                openapi.check_acs3_signature(self.command, headers, path, query, credentials)
            else:
                check_signature(self.command, headers, self.path, credentials)
            if length > MAX_REQUEST_BODY:
                raise MnsError.out_of_range("Content-Length", 0, MAX_REQUEST_BODY, "bytes")
        except MnsError:
            self._drop_body(length)
            raise
        try:
            body = self.rfile.read(length) if length else b""
        except OSError:  # stalled past the idle timeout, or reset
            body = b""
        if len(body) < length:
            self.close_connection = True
            return None
        if acs3:
            openapi.check_payload(headers, body)
        else:
            check_digest(headers, body)
        return body

    def _drop_body(self, length: int) -> None:
        """Skip the body of a refused request: read a small one, close after a large one."""
        if length > _DISCARD_LIMIT:
            self.close_connection = self._linger = True
            return
        try:
            while length > 0:
                chunk = self.rfile.read(min(length, 64 * 1024))
                if not chunk:
                    break
                length -= len(chunk)
        except OSError:  # stalled past the idle timeout, or reset
            pass
        if length > 0:
            self.close_connection = True

    def _lingering_close(self) -> None:
        """Send FIN, then drop what the client still sends, for a bounded time."""
        deadline = time.monotonic() + _LINGER_SECONDS
        try:
            self.connection.shutdown(socket.SHUT_WR)
            while (left := deadline - time.monotonic()) > 0:
                self.connection.settimeout(left)
                if not self.connection.recv(64 * 1024):
                    break
        except OSError:  # timed out or reset: close now
            pass

    def _reply(
        self,
        status: int,
        payload: bytes,
        request_id: str,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        try:
            self.send_response(status)
            if payload and "Content-Type" not in (extra or {}):
                self.send_header("Content-Type", "text/xml;charset=utf-8")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("x-mns-request-id", request_id)
            self.send_header("x-mns-version", MNS_VERSION)
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (e.g. its long poll timed out first); nothing to answer.
            self.close_connection = True
            log.debug("client went away before request %s was answered", request_id)

    def _dispatch(self, headers: Mapping[str, str], body: bytes, base_url: str) -> _Reply:
        path, _, query = self.path.partition("?")
        params: dict[str, str] = {}
        for part in query.split("&"):
            if part:
                key, _, value = part.partition("=")
                params[unquote(key).lower()] = unquote(value)
        segments = [unquote(s) for s in path.split("/") if s]
        method = self.command
        if segments == ["queues"] and method == "GET":
            return self._list_queues(headers, base_url)
        if len(segments) == 2 and segments[0] == "queues":
            return self._queue(method, segments[1], params, body, base_url)
        if len(segments) == 3 and segments[0] == "queues" and segments[2] == "messages":
            return self._messages(method, segments[1], params, body)
        raise MnsError("InvalidRequestURL", 400, "Http request URL format invalid.")

    def _list_queues(self, headers: Mapping[str, str], base_url: str) -> _Reply:
        store = self.server.emulator.store
        try:
            limit = int(headers.get("x-mns-ret-number", "1000"))
        except ValueError:
            raise MnsError.invalid_argument("x-mns-ret-number must be an integer.") from None
        names, next_marker = store.list_queues(
            headers.get("x-mns-prefix", ""), headers.get("x-mns-marker", ""), limit
        )
        infos = []
        for name in names:
            try:
                infos.append(store.get_queue(name))
            except MnsError:  # deleted since listed
                continue
        with_meta = headers.get("x-mns-with-meta", "").lower() == "true"
        return 200, wire.queues_xml(base_url, infos, next_marker, with_meta), {}

    def _queue(
        self, method: str, name: str, params: Mapping[str, str], body: bytes, base_url: str
    ) -> _Reply:
        store = self.server.emulator.store
        if method == "PUT":
            attributes, logging_enabled = wire.parse_queue_attributes(body)
            if params.get("metaoverride", "").lower() == "true":
                store.set_queue_attributes(name, attributes, logging_enabled)
                return 204, b"", {}
            created = store.create_queue(name, attributes, logging_enabled)
            # The Python SDK reads Location on 204 too.
            return (201 if created else 204), b"", {"Location": f"{base_url}/queues/{name}"}
        if method == "GET":
            return 200, wire.queue_xml(store.get_queue(name)), {}
        if method == "DELETE":
            store.delete_queue(name)
            return 204, b"", {}
        raise MnsError("InvalidRequestURL", 400, "Http request URL format invalid.")

    def _messages(self, method: str, name: str, params: Mapping[str, str], body: bytes) -> _Reply:
        store = self.server.emulator.store
        if method == "POST":
            messages, batch = wire.parse_messages(body)
            return 201, wire.sent_xml(store.send(name, messages), batch), {}
        if method == "GET":
            count = int_param(params.get("numofmessages"), "numOfMessages")
            if params.get("peekonly", "").lower() == "true":
                views = store.peek(name, 1 if count is None else count)
            else:
                wait = int_param(params.get("waitseconds"), "waitseconds")
                views = store.receive(name, 1 if count is None else count, wait)
            if count is None:
                return 200, wire.message_xml(views[0]), {}
            return 200, wire.messages_xml(views), {}
        if method == "PUT":
            handle = params.get("receipthandle")
            if not handle:
                raise MnsError("MissingReceiptHandle", 400, "ReceiptHandle is required.")
            seconds = int_param(params.get("visibilitytimeout"), "VisibilityTimeout")
            if seconds is None:
                raise MnsError("MissingVisibilityTimeout", 400, "VisibilityTimeout is required.")
            new_handle, next_visible = store.change_visibility(name, handle, seconds)
            return 200, wire.change_visibility_xml(new_handle, next_visible), {}
        if method == "DELETE":
            if "receipthandle" in params:
                handle = params["receipthandle"]
                if not handle:
                    raise MnsError("MissingReceiptHandle", 400, "ReceiptHandle is required.")
                store.delete(name, handle)
                return 204, b"", {}
            failures = store.delete_batch(name, wire.parse_receipt_handles(body))
            if not failures:
                return 204, b"", {}
            return 404, wire.batch_delete_errors_xml(failures), {}
        raise MnsError("InvalidRequestURL", 400, "Http request URL format invalid.")


class MnsEmulator:
    """An MNS endpoint served from a background thread or the calling one.

    Parameters:
        host: the address to listen on.
        port: the port; 0 picks a free one (see :attr:`port`).
        access_key_id: the accepted AccessKey ID.
        access_key_secret: its secret.
        credentials: several accepted ``{id: secret}`` pairs instead of one.
        clock: time source in epoch seconds for message timing (tests pass a
            fake one to age messages without waiting).
        idle_timeout: seconds a connection may stay idle, between requests or in
            the middle of one, before it is closed; ``None`` never closes one.

    Use it as a context manager (``with MnsEmulator() as mns: mns.endpoint``) or
    call :meth:`start`/:meth:`stop`; :meth:`serve_forever` blocks instead.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        access_key_id: str = DEFAULT_ACCESS_KEY_ID,
        access_key_secret: str = DEFAULT_ACCESS_KEY_SECRET,
        credentials: Mapping[str, str] | None = None,
        clock: Clock = time.time,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        if idle_timeout is not None and not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be > 0 seconds or None, not {idle_timeout!r}")
        self.idle_timeout = idle_timeout
        self.credentials: dict[str, str] = (
            dict(credentials) if credentials is not None else {access_key_id: access_key_secret}
        )
        self.store = MnsStore(clock)
        self._server = _Server((host, port), self)
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<MnsEmulator {self.endpoint}>"

    @property
    def host(self) -> str:
        """The address the server listens on."""
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """The URL to give ``mns.account.Account``: ``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def serve_forever(self) -> None:
        """Serve requests in the calling thread until :meth:`stop` or an exception."""
        try:
            self._server.serve_forever(poll_interval=0.2)
        finally:
            self._server.server_close()

    def shutdown(self) -> None:
        """Make :meth:`serve_forever` return; blocks until it has (call from another thread)."""
        self._server.shutdown()

    def start(self) -> MnsEmulator:
        """Serve from a daemon thread and return self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.2},
                name=f"mns-emulator-{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket; blocked long polls end with the process."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> MnsEmulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    access_key_id: str = DEFAULT_ACCESS_KEY_ID,
    access_key_secret: str = DEFAULT_ACCESS_KEY_SECRET,
    clock: Clock = time.time,
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
) -> None:
    """Run an emulator in the calling thread until interrupted.

    Parameters:
        host: the address to listen on.
        port: the port (0 picks a free one; it is logged).
        access_key_id: the accepted AccessKey ID.
        access_key_secret: its secret (never logged).
        clock: time source in epoch seconds.
        idle_timeout: seconds before an idle or stalled connection is closed.
    """
    emulator = MnsEmulator(
        host,
        port,
        access_key_id=access_key_id,
        access_key_secret=access_key_secret,
        clock=clock,
        idle_timeout=idle_timeout,
    )
    log.info("MNS emulator listening on %s (AccessKeyId %s)", emulator.endpoint, access_key_id)
    emulator.serve_forever()
