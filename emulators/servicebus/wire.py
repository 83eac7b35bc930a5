"""Socket I/O of the emulator: proton's own I/O handler with a :class:`FrameRewriter` in between.

proton's container reads a socket into a transport (``push``) and writes what
the transport has pending (``peek``/``pop``). :class:`RewritingIOHandler`
replaces the container's I/O handler and passes every accepted connection's bytes
through its :class:`~.frames.FrameRewriter` both ways, keeping what the rewriter
or the socket could not take yet in per-connection buffers. A connection whose
first bytes are an HTTP request (AMQP over WebSocket) is answered ``501`` with a
sentence saying so, and closed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any

from proton.handlers import IOHandler

from .frames import FrameRewriter, NotAmqpError

__all__ = ["WEBSOCKET_REFUSAL", "RewritingIOHandler"]

_log = logging.getLogger("leasekit.emulators.servicebus")

#: What an HTTP (WebSocket) request on the AMQP port is told.
WEBSOCKET_REFUSAL = (
    "AMQP over WebSocket is not supported by leasekit's Service Bus emulator; "
    "connect with TransportType.Amqp (plain AMQP on this port)."
)
#: Bytes taken from proton's transport before the socket has taken the previous ones.
_MAX_OUT = 256 * 1024


class _Buffers:
    __slots__ = ("rewriter", "to_proton", "to_socket")

    def __init__(self) -> None:
        self.rewriter = FrameRewriter()
        self.to_proton = bytearray()
        self.to_socket = bytearray()


def _buffers(selectable: Any) -> _Buffers:
    buffers: _Buffers | None = getattr(selectable, "_sb_buffers", None)
    if buffers is None:
        buffers = _Buffers()
        selectable._sb_buffers = buffers
    return buffers


class RewritingIOHandler(IOHandler):
    """proton's ``IOHandler`` with each connection's bytes rewritten (see the module)."""

    def update(  # type: ignore[override]  # proton's is a staticmethod called on self
        self, transport: Any, selectable: Any, now: float
    ) -> None:
        """As proton's, and keep writing while bytes wait in this handler's buffer."""
        IOHandler.update(transport, selectable, now)
        buffers: _Buffers | None = getattr(selectable, "_sb_buffers", None)
        if buffers is not None and buffers.to_socket and not selectable.is_terminal:
            selectable.writing = True
            selectable.update()

    def on_selectable_readable(self, event: Any) -> None:
        """Read, rewrite and push into the transport."""
        selectable = event.selectable
        transport = selectable._transport
        if not transport:
            return  # the acceptor
        buffers = _buffers(selectable)
        capacity = transport.capacity()
        if capacity > 0:
            try:
                data = selectable.recv(capacity)
            except OSError as exc:
                _log.debug("recv failed: %r", exc)
                transport.close_tail()
                data = None
            if data == b"":
                self._push(transport, buffers)
                self.on_selectable_error(event)
                return
            if data:
                try:
                    buffers.to_proton += buffers.rewriter.incoming(data)
                except NotAmqpError as exc:
                    self._refuse_http(event, exc.data)
                    return
        self._push(transport, buffers)
        self.update(transport, selectable, selectable._reactor.now)

    @staticmethod
    def _push(transport: Any, buffers: _Buffers) -> None:
        while buffers.to_proton:
            room = transport.capacity()
            if room <= 0:
                return
            chunk = bytes(buffers.to_proton[:room])
            transport.push(chunk)
            del buffers.to_proton[: len(chunk)]

    def on_selectable_writable(self, event: Any) -> None:
        """Take the transport's output, rewrite it and send what the socket takes."""
        selectable = event.selectable
        transport = selectable._transport
        if not transport:
            return
        buffers = _buffers(selectable)
        self._pull(transport, buffers)
        if buffers.to_socket:
            try:
                sent = selectable.send(bytes(buffers.to_socket))
                del buffers.to_socket[:sent]
            except OSError as exc:
                _log.debug("send failed: %r", exc)
                transport.close_head()
        self.update(transport, selectable, selectable._reactor.now)

    @staticmethod
    def _pull(transport: Any, buffers: _Buffers) -> None:
        if len(buffers.to_socket) >= _MAX_OUT:
            return
        try:
            pending = transport.pending()
        except Exception:  # a closed head: nothing more to take
            return
        if pending > 0:
            data = transport.peek(pending)
            transport.pop(len(data))
            buffers.to_socket += buffers.rewriter.outgoing(data)

    def on_transport_closed(self, event: Any) -> None:
        """Send what is still buffered (the close frame, usually), then close as proton does."""
        transport = event.transport
        selectable = getattr(transport, "_selectable", None)
        buffers: _Buffers | None = getattr(selectable, "_sb_buffers", None)
        if selectable is not None and buffers is not None:
            self._pull(transport, buffers)
            if buffers.to_socket:
                _send_all(selectable, bytes(buffers.to_socket))
                buffers.to_socket.clear()
        super().on_transport_closed(event)

    def _refuse_http(self, event: Any, request: bytes) -> None:
        selectable = event.selectable
        transport = selectable._transport
        line = request.split(b"\r\n", 1)[0][:200].decode("latin-1", "replace")
        _log.warning("refused an HTTP request on the AMQP port (%s): %s", line, WEBSOCKET_REFUSAL)
        body = (WEBSOCKET_REFUSAL + "\n").encode()
        response = (
            b"HTTP/1.1 501 Not Implemented\r\n"
            b"Content-Type: text/plain; charset=utf-8\r\n"
            + f"Content-Length: {len(body)}\r\n".encode()
            + b"Connection: close\r\n\r\n"
            + body
        )
        _send_all(selectable, response)
        transport.close_tail()
        transport.close_head()
        self.on_selectable_error(event)


def _send_all(selectable: Any, data: bytes) -> None:
    """Write ``data`` to a non-blocking socket, waiting briefly if it is full."""
    sock = getattr(selectable, "_delegate", None)
    if not isinstance(sock, socket.socket):
        return
    try:
        sock.settimeout(1.0)
        sock.sendall(data)
    except OSError as exc:
        _log.debug("could not send the last %d bytes: %r", len(data), exc)
    finally:
        with contextlib.suppress(OSError):
            sock.setblocking(False)
