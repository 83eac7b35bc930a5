"""AMQP frame rewriting between the socket and proton, where proton is stricter than Service Bus.

proton's engine checks that the delivery-ids of a session's incoming transfers
follow one another and closes the whole connection otherwise ("sequencing error,
expected delivery-id N, got M"). Service Bus does not check them: its session
takes each transfer's delivery-id as sent and answers dispositions with it
(``IncomingSessionChannel.OnAcceptTransfer`` in Azure/azure-amqp's
``AmqpSession.cs``). The ``azure-servicebus`` SDK relies on that: it assigns
delivery-ids without a lock, so management calls made at once from several
threads or tasks on one receiver (its own ``AutoLockRenewer``, concurrent peeks or
renewals) send ids out of order or twice. :class:`FrameRewriter` sits on each
accepted connection's byte stream and makes the two agree:

* an incoming transfer that starts a delivery gets the delivery-id proton expects
  next on its session, and the id the client sent is remembered;
* an outgoing disposition for deliveries the emulator received (role receiver)
  names them by the ids the client sent, as Service Bus does;
* an outgoing ``close``, ``end`` or ``detach`` error that proton generated with no
  ``info`` field gets an explicit null there: Service Bus always sends the three
  fields, and the SDK reads them by position (``error[2]``).

A connection that starts with an HTTP request instead of an AMQP header (AMQP
over WebSocket, which the SDK opens on the same port) raises
:class:`NotAmqpError`; the caller answers it in plain HTTP.

Frames are parsed by the AMQP type system's width categories (the upper nibble of
a constructor gives the size of its value), so any value can be skipped without
decoding it; only the few fields rewritten here are decoded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from dataclasses import field as dataclass_field

__all__ = ["HTTP_METHODS", "FrameRewriter", "NotAmqpError"]

#: Request lines that mark a connection as HTTP (a WebSocket upgrade is a GET).
HTTP_METHODS = (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC", b"CONN")

_HEADER = b"AMQP"
_AMQP_FRAME = 0
_BEGIN, _TRANSFER, _DISPOSITION, _DETACH, _END, _CLOSE, _ERROR = (
    0x11,
    0x14,
    0x15,
    0x16,
    0x17,
    0x18,
    0x1D,
)
_SYMBOLIC = {
    b"amqp:begin:list": _BEGIN,
    b"amqp:transfer:list": _TRANSFER,
    b"amqp:disposition:list": _DISPOSITION,
    b"amqp:detach:list": _DETACH,
    b"amqp:end:list": _END,
    b"amqp:close:list": _CLOSE,
    b"amqp:error:list": _ERROR,
}
#: Where the error is in a performative's field list.
_ERROR_FIELD = {_CLOSE: 0, _END: 0, _DETACH: 2}
_NULL = b"\x40"
_MASK = 0xFFFFFFFF
#: Remembered client ids per session before the oldest are dropped (a delivery the
#: client sent unsettled is normally settled long before this many follow it).
_MAX_REMEMBERED = 65536


class NotAmqpError(Exception):
    """The connection does not speak AMQP; ``data`` holds what it sent first."""

    def __init__(self, data: bytes) -> None:
        super().__init__("not an AMQP connection")
        self.data = data


class _Malformed(Exception):
    """A frame this module cannot parse; it is passed on to proton unchanged."""


def _skip(buf: bytes, pos: int) -> int:
    """The position after the AMQP value encoded at ``pos``."""
    code = buf[pos]
    pos += 1
    if code == 0x00:  # described: a descriptor, then the value
        return _skip(buf, _skip(buf, pos))
    width = code >> 4
    if width == 0x4:
        end = pos
    elif width == 0x5:
        end = pos + 1
    elif width == 0x6:
        end = pos + 2
    elif width == 0x7:
        end = pos + 4
    elif width == 0x8:
        end = pos + 8
    elif width == 0x9:
        end = pos + 16
    elif width in (0xA, 0xC, 0xE):
        end = pos + 1 + buf[pos]
    elif width in (0xB, 0xD, 0xF):
        end = pos + 4 + struct.unpack_from(">I", buf, pos)[0]
    else:
        raise _Malformed(f"unknown constructor 0x{code:02x}")
    if end > len(buf):
        raise _Malformed("value runs past the frame")
    return end


def _uint(buf: bytes, start: int, end: int) -> int | None:
    """Decode a uint (or null) element spanning ``buf[start:end]``."""
    code = buf[start]
    if code == 0x40:
        return None
    if code == 0x43:
        return 0
    if code == 0x52:
        return buf[start + 1]
    if code == 0x70:
        return int(struct.unpack_from(">I", buf, start + 1)[0])
    raise _Malformed(f"not a uint: 0x{code:02x}")


def _bool(buf: bytes, start: int) -> bool | None:
    code = buf[start]
    if code == 0x41:
        return True
    if code == 0x42:
        return False
    if code == 0x56:
        return buf[start + 1] != 0
    if code == 0x40:
        return None
    raise _Malformed(f"not a boolean: 0x{code:02x}")


def _encode_uint(value: int) -> bytes:
    return b"\x70" + struct.pack(">I", value & _MASK)


def _encode_list(elements: list[bytes]) -> bytes:
    body = b"".join(elements)
    if not elements:
        return b"\x45"
    if len(body) + 1 <= 255 and len(elements) <= 255:
        return bytes((0xC0, len(body) + 1, len(elements))) + body
    return b"\xd0" + struct.pack(">II", len(body) + 4, len(elements)) + body


@dataclass
class _Performative:
    """A frame's performative, split into element spans, and what follows it (payload)."""

    code: int
    descriptor: bytes
    elements: list[bytes]
    payload: bytes

    def encode(self) -> bytes:
        return self.descriptor + _encode_list(self.elements) + self.payload


def _descriptor(body: bytes) -> tuple[int, int]:
    """The descriptor code of the described value at the start of ``body``, and its end."""
    if not body or body[0] != 0x00:
        raise _Malformed("not a described type")
    kind = body[1]
    if kind == 0x53:
        return body[2], 3
    end = _skip(body, 1)
    if kind == 0x80:
        return int(struct.unpack_from(">Q", body, 2)[0]), end
    if kind in (0xA3, 0xB3):
        return _SYMBOLIC.get(body[(3 if kind == 0xA3 else 6) : end], -1), end
    raise _Malformed("unknown descriptor")


def _parse_performative(body: bytes) -> _Performative:
    """Split a frame body (performative and payload) into its parts."""
    code, pos = _descriptor(body)
    descriptor = body[:pos]
    kind = body[pos]
    if kind == 0x45:
        count, start = 0, pos + 1
    elif kind == 0xC0:
        count, start = body[pos + 2], pos + 3
    elif kind == 0xD0:
        count, start = int(struct.unpack_from(">I", body, pos + 5)[0]), pos + 9
    else:
        raise _Malformed("the performative is not a list")
    end = _skip(body, pos)
    elements: list[bytes] = []
    for _ in range(count):
        after = _skip(body, start)
        elements.append(body[start:after])
        start = after
    if start != end:
        raise _Malformed("list size does not match its elements")
    return _Performative(code, descriptor, elements, body[end:])


@dataclass
class _SessionIds:
    """Incoming delivery-ids of one client session: proton's next one, and the client's."""

    next_id: int | None = None
    #: proton's delivery-id -> the one the client sent, until settled.
    sent_as: dict[int, int] = dataclass_field(default_factory=dict)
    #: link handle -> proton's delivery-id of a delivery still arriving (more=true).
    open_delivery: dict[int, int] = dataclass_field(default_factory=dict)


class _Stream:
    """Cuts a byte stream into protocol headers and frames."""

    def __init__(self, *, first: bool) -> None:
        self._buffer = bytearray()
        self._first = first

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        if self._first and not _is_header_start(bytes(self._buffer[:4])):
            raise NotAmqpError(bytes(self._buffer))
        units: list[bytes] = []
        while len(self._buffer) >= 8:
            if self._buffer[:4] == _HEADER:
                size = 8
            else:
                size = int(struct.unpack_from(">I", self._buffer, 0)[0])
                if size < 8:
                    size = len(self._buffer)  # garbage: let proton report it
                if len(self._buffer) < size:
                    break
            self._first = False
            units.append(bytes(self._buffer[:size]))
            del self._buffer[:size]
        return units


def _is_header_start(data: bytes) -> bool:
    """Whether ``data`` (up to 4 bytes) can begin an AMQP protocol header."""
    return _HEADER.startswith(data)


class FrameRewriter:
    """The byte streams of one accepted connection, both directions (see the module)."""

    def __init__(self) -> None:
        self._incoming = _Stream(first=True)
        self._outgoing = _Stream(first=False)
        self._sessions: dict[int, _SessionIds] = {}  # by the client's channel
        self._remote_channel: dict[int, int] = {}  # proton's channel -> the client's

    # -- client to proton ---------------------------------------------------------------------

    def incoming(self, data: bytes) -> bytes:
        """Rewrite bytes read from the client before proton sees them.

        Raises:
            NotAmqpError: the connection opened with something other than an AMQP header.
        """
        return b"".join(self._incoming_unit(unit) for unit in self._incoming.feed(data))

    def _incoming_unit(self, unit: bytes) -> bytes:
        if len(unit) <= 8 or unit[5] != _AMQP_FRAME or unit[:4] == _HEADER:
            return unit
        head = unit[: unit[4] * 4]
        channel = int(struct.unpack_from(">H", unit, 6)[0])
        try:
            code, _ = _descriptor(unit[len(head) : len(head) + 64])
            if code == _BEGIN:
                self._sessions[channel] = _SessionIds()
            elif code == _TRANSFER:
                transfer = _parse_performative(unit[len(head) :])
                if self._renumber(self._sessions.setdefault(channel, _SessionIds()), transfer):
                    return _frame(head, transfer)
        except (_Malformed, IndexError, struct.error):
            pass
        return unit

    def _renumber(self, session: _SessionIds, transfer: _Performative) -> bool:
        """Give a transfer the delivery-id proton expects; ``True`` if it changed."""
        fields = transfer.elements
        if len(fields) < 2:
            return False
        handle = _uint(fields[0], 0, len(fields[0]))
        sent = _uint(fields[1], 0, len(fields[1]))
        more = len(fields) > 5 and bool(_bool(fields[5], 0))
        aborted = len(fields) > 9 and bool(_bool(fields[9], 0))
        if handle is None:
            return False
        ongoing = session.open_delivery.get(handle)
        if ongoing is not None:  # a continuation: same delivery, same id as its first frame
            ours = ongoing
        elif sent is None:
            return False  # proton reports the missing id itself
        else:
            if session.next_id is None:
                session.next_id = sent  # proton starts where the client starts
            ours = session.next_id
            session.next_id = (ours + 1) & _MASK
            settled = len(fields) > 4 and bool(_bool(fields[4], 0))
            if not settled:
                session.sent_as[ours] = sent
                if len(session.sent_as) > _MAX_REMEMBERED:
                    del session.sent_as[next(iter(session.sent_as))]
        if more and not aborted:
            session.open_delivery[handle] = ours
        else:
            session.open_delivery.pop(handle, None)
        if sent == ours:
            return False
        if ongoing is not None and sent is None:
            return False
        fields[1] = _encode_uint(ours)
        return True

    # -- proton to client ---------------------------------------------------------------------

    def outgoing(self, data: bytes) -> bytes:
        """Rewrite bytes proton wrote before they go to the client."""
        return b"".join(self._outgoing_unit(unit) for unit in self._outgoing.feed(data))

    def _outgoing_unit(self, unit: bytes) -> bytes:
        if len(unit) <= 8 or unit[5] != _AMQP_FRAME or unit[:4] == _HEADER:
            return unit
        head = unit[: unit[4] * 4]
        channel = int(struct.unpack_from(">H", unit, 6)[0])
        try:
            code, _ = _descriptor(unit[len(head) : len(head) + 64])
            if code not in (_BEGIN, _DISPOSITION) and code not in _ERROR_FIELD:
                return unit  # transfers and flows, the bulk, pass untouched
            performative = _parse_performative(unit[len(head) :])
            if code == _BEGIN and performative.elements:
                field = performative.elements[0]
                if field[0] == 0x60:
                    self._remote_channel[channel] = int(struct.unpack_from(">H", field, 1)[0])
            elif code == _DISPOSITION:
                return self._disposition(unit, head, channel, performative)
            elif code in _ERROR_FIELD:
                if code == _END:
                    client_channel = self._remote_channel.pop(channel, None)
                    if client_channel is not None:
                        self._sessions.pop(client_channel, None)
                if _pad_error(performative, _ERROR_FIELD[code]):
                    return _frame(head, performative)
        except (_Malformed, IndexError, struct.error):
            pass
        return unit

    def _disposition(
        self, unchanged: bytes, head: bytes, channel: int, disposition: _Performative
    ) -> bytes:
        fields = disposition.elements
        if len(fields) < 2 or not _bool(fields[0], 0):
            return unchanged  # role sender: the emulator's own deliveries, its own ids
        session = self._sessions.get(self._remote_channel.get(channel, channel))
        if session is None:
            return unchanged
        first = _uint(fields[1], 0, len(fields[1]))
        last = _uint(fields[2], 0, len(fields[2])) if len(fields) > 2 else None
        settled = len(fields) > 3 and bool(_bool(fields[3], 0))
        if first is None:
            return unchanged
        count = ((last if last is not None else first) - first) & _MASK
        ours = [(first + i) & _MASK for i in range(count + 1)]
        theirs = [session.sent_as.get(i, i) for i in ours]
        if settled:
            for i in ours:
                session.sent_as.pop(i, None)
        if theirs == ours:
            return unchanged
        rest = fields[3:]
        frames: list[bytes] = []
        start = 0
        for i in range(1, len(theirs) + 1):
            if i == len(theirs) or theirs[i] != (theirs[i - 1] + 1) & _MASK:
                run = [fields[0], _encode_uint(theirs[start]), _encode_uint(theirs[i - 1]), *rest]
                frames.append(
                    _frame(head, _Performative(_DISPOSITION, disposition.descriptor, run, b""))
                )
                start = i
        return b"".join(frames)


def _pad_error(performative: _Performative, index: int) -> bool:
    """Give the error at ``index`` all three fields (condition, description, info)."""
    if len(performative.elements) <= index:
        return False
    error = performative.elements[index]
    if error[:1] != b"\x00":
        return False
    inner = _parse_performative(error)
    if inner.code != _ERROR or len(inner.elements) >= 3:
        return False
    inner.elements += [_NULL] * (3 - len(inner.elements))
    performative.elements[index] = inner.encode()
    return True


def _frame(head: bytes, performative: _Performative) -> bytes:
    body = performative.encode()
    return struct.pack(">I", len(head) + len(body)) + head[4:] + body
