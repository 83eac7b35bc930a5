"""Opening SDK handlers within core's deadline, and the connection-string plumbing."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

from leasekit.options import as_text
from leasekit.spi import (
    DriverError,
    ErrorCode,
)
from leasekit.url import check_endpoint

from .settings import _QUEUE_NAME, OPEN_GUARD_GRACE
from .watch import socket_of

_log = logging.getLogger("leasekit.backends.azure_service_bus")


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


def resolve_address(
    queue: str | None,
    connection_string: str | None,
    namespace: str | None,
    credential: Any,
    credential_hint: str,
) -> tuple[str, str, dict[str, str]]:
    """The queue name, the namespace host and the connection string's parts, checked.

    Raises ``ValueError`` (core's ``InvalidArgument``) for an address that cannot be
    a Service Bus queue's: no endpoint, a namespace that differs from the connection
    string's, no credentials, a bad queue name or another entity's connection string.
    """
    parts: dict[str, str] = {}
    if connection_string is not None:
        if not isinstance(connection_string, str) or "endpoint=" not in (connection_string.lower()):
            raise ValueError(
                "azure-service-bus: connection_string is not a Service Bus connection "
                "string (no Endpoint=...)"
            )
        parts = _parse_connection_string(connection_string)
        if credential is not None:
            raise ValueError("azure-service-bus: give connection_string or credential, not both")
    endpoint_host = ""
    if parts:
        endpoint = parts.get("endpoint", "")
        check_endpoint(endpoint, "connection_string's Endpoint", "azure-service-bus")
        endpoint_host = endpoint.split("://", 1)[-1].strip("/")
    if namespace is not None:
        as_text(namespace, "namespace")
        check_endpoint(namespace, "namespace", "azure-service-bus", credential_hint)
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
            "azure-service-bus: give connection_string=..., or namespace=... with credential=..."
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
    return name, host, parts
