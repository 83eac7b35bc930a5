"""AMQP 1.0 message sections: split, inspect and re-encode messages byte-faithfully.

The emulator keeps each message as its encoded sections and rewrites only what the
broker owns on delivery (the header's ``delivery-count``, broker message
annotations, dead-letter application properties); body, properties and footer go
out byte for byte as they came in. proton's ``Data`` does the encoding.

Batches: the Service Bus SDKs send a batch as one transfer with message-format
``0x80013700`` whose data sections each hold a whole encoded message. proton does
not expose the message format, so :func:`unpack` recognises a batch by its shape:
every body section is a data section and each of them decodes completely as a
sequence of message sections that includes a body. A single message whose binary
body happens to be exactly such an encoding would be mistaken for a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from proton import Array, Data, Described, symbol, timestamp, uint, ulong

__all__ = [
    "APPLICATION_PROPERTIES",
    "DATA",
    "HEADER",
    "MESSAGE_ANNOTATIONS",
    "PROPERTIES",
    "MessageInfo",
    "Section",
    "encode_section",
    "inspect",
    "render",
    "split_sections",
    "unpack",
]

HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78
_BODY = (DATA, AMQP_SEQUENCE, AMQP_VALUE)
_SYMBOLIC = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}


@dataclass(frozen=True)
class Section:
    """One encoded message section.

    Parameters:
        code: the section's descriptor code (0x70 header ... 0x78 footer).
        raw: its exact encoding.
    """

    code: int
    raw: bytes

    def value(self) -> Any:
        """The section's decoded value (list, dict, bytes, ...)."""
        data = Data()
        data.decode(self.raw)
        data.rewind()
        data.next()
        obj = _detach(data.get_object())
        return obj.value if isinstance(obj, Described) else obj


def _detach(value: Any) -> Any:
    """Copy binary values out of proton's buffers (its memoryviews die with the Data)."""
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, Described):
        return Described(value.descriptor, _detach(value.value))
    if isinstance(value, Array):
        return Array(value.descriptor, value.type, *[_detach(v) for v in value.elements])
    if isinstance(value, dict):
        return {_detach(k): _detach(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_detach(v) for v in value]
    return value


def split_sections(payload: bytes) -> list[Section]:
    """Split an encoded message into its sections.

    Parameters:
        payload: the bytes of one message.

    Returns:
        Its sections in order.

    Raises:
        ValueError: the bytes are not a sequence of described message sections.
    """
    sections: list[Section] = []
    view = bytes(payload)
    pos = 0
    data = Data()
    while pos < len(view):
        data.clear()
        try:
            consumed = data.decode(view[pos:])
        except Exception as exc:
            raise ValueError(f"undecodable section at byte {pos}: {exc}") from exc
        if consumed <= 0:
            raise ValueError(f"undecodable section at byte {pos}")
        data.rewind()
        if data.next() != Data.DESCRIBED:
            raise ValueError(f"section at byte {pos} is not a described type")
        data.enter()
        data.next()
        kind = data.type()
        if kind == Data.ULONG:
            code = int(data.get_ulong())
        elif kind == Data.SYMBOL:
            code = _SYMBOLIC.get(str(data.get_symbol()), -1)
        else:
            code = -1
        data.exit()
        if not HEADER <= code <= FOOTER:
            raise ValueError(f"unknown section descriptor at byte {pos}")
        sections.append(Section(code, view[pos : pos + consumed]))
        pos += consumed
    return sections


def _looks_like_message(sections: list[Section]) -> bool:
    codes = [s.code for s in sections]
    return bool(codes) and any(c in _BODY for c in codes) and codes == sorted(codes)


def unpack(payload: bytes) -> list[list[Section]]:
    """Turn one transfer into the messages it carries (one, or a batch's many).

    Parameters:
        payload: the transfer's bytes.

    Returns:
        The sections of each message.

    Raises:
        ValueError: the payload is not an AMQP message.
    """
    sections = split_sections(payload)
    bodies = [s for s in sections if s.code in _BODY]
    if not bodies or any(s.code != DATA for s in bodies):
        return [sections]
    inner: list[list[Section]] = []
    for body in bodies:
        raw = body.value()
        if not isinstance(raw, bytes | bytearray | memoryview) or not raw:
            return [sections]
        try:
            parts = split_sections(bytes(raw))
        except ValueError:
            return [sections]
        if not _looks_like_message(parts):
            return [sections]
        inner.append(parts)
    return inner


@dataclass(frozen=True)
class MessageInfo:
    """What the broker needs to know about a message.

    Parameters:
        ttl: the header's time-to-live in seconds, if set.
        scheduled_at: ``x-opt-scheduled-enqueue-time`` in seconds, if set.
        message_id: the properties' message-id as text, if set.
    """

    ttl: float | None
    scheduled_at: float | None
    message_id: str | None


def inspect(sections: list[Section]) -> MessageInfo:
    """Read TTL, scheduled enqueue time and message id from a message.

    Parameters:
        sections: the message's sections.

    Returns:
        The extracted values.
    """
    ttl: float | None = None
    scheduled: float | None = None
    message_id: str | None = None
    for section in sections:
        if section.code == HEADER:
            fields = section.value() or []
            if len(fields) > 2 and fields[2]:
                ttl = int(fields[2]) / 1000.0
        elif section.code == MESSAGE_ANNOTATIONS:
            annotations = section.value() or {}
            value = annotations.get(symbol("x-opt-scheduled-enqueue-time"))
            if value is None:
                value = annotations.get("x-opt-scheduled-enqueue-time")
            if isinstance(value, int):
                scheduled = int(value) / 1000.0
        elif section.code == PROPERTIES:
            fields = section.value() or []
            if fields and fields[0] is not None:
                message_id = str(fields[0])
    return MessageInfo(ttl, scheduled, message_id)


def encode_section(code: int, value: Any) -> Section:
    """Encode ``value`` as the described section ``code``.

    Parameters:
        code: section descriptor code.
        value: its value (list for header/properties, dict for maps).

    Returns:
        The encoded section.
    """
    data = Data()
    data.put_object(Described(ulong(code), value))
    return Section(code, bytes(data.encode()))


def render(
    sections: list[Section],
    *,
    delivery_count: int,
    annotations: dict[str, Any],
    application_properties: dict[str, Any] | None = None,
) -> bytes:
    """Encode a message for delivery with broker-owned fields set.

    Parameters:
        sections: the stored sections.
        delivery_count: the header's delivery-count (failed deliveries so far).
        annotations: message annotations to set (symbol keys are made from the names);
            ``timestamp`` values must already be :class:`proton.timestamp`.
        application_properties: application properties to add or replace.

    Returns:
        The encoded message.
    """
    by_code: dict[int, Section] = {}
    rest: list[Section] = []
    for section in sections:
        if section.code in (HEADER, MESSAGE_ANNOTATIONS, APPLICATION_PROPERTIES):
            by_code[section.code] = section
        elif section.code != DELIVERY_ANNOTATIONS:
            rest.append(section)

    header: list[Any] = [None, None, None, None, None]
    if HEADER in by_code:
        old = list(by_code[HEADER].value() or [])
        header[: len(old)] = old[:5]
    header[4] = uint(delivery_count)
    out = [encode_section(HEADER, header)]

    merged: dict[Any, Any] = {}
    if MESSAGE_ANNOTATIONS in by_code:
        merged.update(by_code[MESSAGE_ANNOTATIONS].value() or {})
    for key, value in annotations.items():
        merged[symbol(key)] = value
    out.append(encode_section(MESSAGE_ANNOTATIONS, merged))

    body_and_footer = [s for s in rest if s.code != PROPERTIES]
    out.extend(s for s in rest if s.code == PROPERTIES)

    if APPLICATION_PROPERTIES in by_code or application_properties:
        if application_properties:
            props = (
                dict(by_code[APPLICATION_PROPERTIES].value() or {})
                if (APPLICATION_PROPERTIES in by_code)
                else {}
            )
            props.update(application_properties)
            out.append(encode_section(APPLICATION_PROPERTIES, props))
        else:
            out.append(by_code[APPLICATION_PROPERTIES])
    out.extend(body_and_footer)
    return b"".join(s.raw for s in out)


def ms_timestamp(seconds: float) -> timestamp:
    """A proton ``timestamp`` (milliseconds since the epoch) for ``seconds``.

    Rounded down, so a client comparing ``x-opt-locked-until`` with its clock never
    believes a lock outlives the emulator's own record of it.
    """
    return timestamp(math.floor(seconds * 1000))
