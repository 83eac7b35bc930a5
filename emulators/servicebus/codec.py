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

from proton import (
    Array,
    Data,
    Described,
    decimal32,
    decimal64,
    decimal128,
    symbol,
    timestamp,
    uint,
    ulong,
)

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
    "property_quota_error",
    "render",
    "service_decimals",
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
    # Any order, as Service Bus takes it: the SDK itself encodes delivery
    # annotations after the body (pyamqp ``encode_payload``). A message has a body,
    # and each of its other sections at most once.
    codes = [s.code for s in sections]
    others = [c for c in codes if c not in _BODY]
    return len(others) < len(codes) and len(set(others)) == len(others)


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
        session_id: the properties' group-id (Service Bus' SessionId), if set.
    """

    ttl: float | None
    scheduled_at: float | None
    message_id: str | None
    session_id: str | None = None


def inspect(sections: list[Section]) -> MessageInfo:
    """Read TTL, scheduled enqueue time, message id and session id from a message.

    Parameters:
        sections: the message's sections.

    Returns:
        The extracted values.
    """
    ttl: float | None = None
    scheduled: float | None = None
    message_id: str | None = None
    session_id: str | None = None
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
            # group-id, the 11th field of the properties section, is the SessionId.
            if len(fields) > 10 and fields[10] is not None:
                session_id = str(fields[10])
    return MessageInfo(ttl, scheduled, message_id, session_id)


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
    delivery_annotations: dict[str, Any] | None = None,
    time_to_live_ms: int | None = None,
) -> bytes:
    """Encode a message for delivery with broker-owned fields set.

    Sections go out in the specification's order whatever order they came in;
    the sender's delivery annotations are passed on (Service Bus does), with
    ``delivery_annotations`` (the broker's ``x-opt-lock-token``) added.

    Parameters:
        sections: the stored sections.
        delivery_count: the header's delivery-count (failed deliveries so far).
        annotations: message annotations to set (symbol keys are made from the names);
            ``timestamp`` values must already be :class:`proton.timestamp`.
        application_properties: application properties to add or replace.
        delivery_annotations: delivery annotations to add or replace; ``{}``
            writes the section even when there is nothing in it.
        time_to_live_ms: the header's ttl to set (the time-to-live the broker
            applies, capped to an AMQP ``uint``); ``None`` keeps the sender's.

    Returns:
        The encoded message.
    """
    by_code: dict[int, Section] = {}
    rest: list[Section] = []
    for section in sections:
        if section.code in (
            HEADER,
            DELIVERY_ANNOTATIONS,
            MESSAGE_ANNOTATIONS,
            APPLICATION_PROPERTIES,
        ):
            by_code[section.code] = section
        else:
            rest.append(section)

    header: list[Any] = [None, None, None, None, None]
    if HEADER in by_code:
        old = list(by_code[HEADER].value() or [])
        header[: len(old)] = old[:5]
    header[4] = uint(delivery_count)
    if time_to_live_ms is not None:
        header[2] = uint(min(max(time_to_live_ms, 0), 2**32 - 1))
    out = [encode_section(HEADER, header)]

    if delivery_annotations is not None:
        delivered: dict[Any, Any] = {}
        if DELIVERY_ANNOTATIONS in by_code:
            delivered.update(by_code[DELIVERY_ANNOTATIONS].value() or {})
        for key, value in delivery_annotations.items():
            delivered[symbol(key)] = value
        out.append(encode_section(DELIVERY_ANNOTATIONS, delivered))
    elif DELIVERY_ANNOTATIONS in by_code:
        out.append(by_code[DELIVERY_ANNOTATIONS])

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


# -- decimals, as Service Bus stores them ----------------------------------------------------------

_DECIMAL_CODES = (b"\x74", b"\x84", b"\x94")  # decimal32, decimal64, decimal128 constructors
_MAX_SCALE = 28  # System.Decimal's
_MAX_SIGNIFICAND = (1 << 96) - 1


def service_decimals(sections: list[Section]) -> list[Section]:
    """Re-encode decimal application properties the way Service Bus delivers them.

    Service Bus keeps application properties as .NET values: a decimal is read into
    a ``System.Decimal`` and written back on delivery by Azure/azure-amqp's
    ``DecimalEncoding`` (its own layout: the 14-bit exponent split ``>> 9`` /
    ``& 0x7F``, the 96-bit significand in bytes 4 to 15). The Python SDK's decoder
    reads exactly that layout (``_decode_decimal128`` shifts ``<< 9``), not the
    IEEE layout its encoder writes, so a decimal only round-trips through the
    service's re-encoding.

    Parameters:
        sections: a message's sections.

    Returns:
        The sections, with the application properties re-encoded if they hold a decimal.

    Raises:
        ValueError: a decimal that ``System.Decimal`` cannot hold (NaN, infinity,
            more than 28 decimal places, a value of 2**96 or more).
    """
    out = list(sections)
    for index, section in enumerate(out):
        if section.code != APPLICATION_PROPERTIES or not any(
            code in section.raw for code in _DECIMAL_CODES
        ):
            continue
        props = section.value()
        if not isinstance(props, dict):
            continue
        changed = False
        for key, value in props.items():
            if isinstance(value, decimal32 | decimal64 | decimal128):
                props[key] = _dotnet_decimal128(value, str(key))
                changed = True
        if changed:
            out[index] = encode_section(APPLICATION_PROPERTIES, props)
    return out


def _dotnet_decimal128(value: Any, name: str) -> decimal128:
    """Decode as azure-amqp's ``DecimalEncoding.DecodeValue``, encode as its ``EncodeValue``."""
    negative, significand, exponent = _decode_decimal(value, name)
    if exponent > 0:  # azure-amqp multiplies the value out: scale 0
        significand *= 10**exponent
        exponent = 0
    if -exponent > _MAX_SCALE or significand > _MAX_SIGNIFICAND:
        raise ValueError(
            f"application property {name!r}: the decimal is outside System.Decimal's range "
            "(at most 28 decimal places, magnitude below 2**96), which Service Bus stores"
        )
    stored = 6176 - -exponent  # EncodeValue: Decimal128Bias - scale
    out = bytearray(16)
    out[0] = (0x80 if negative else 0) | (stored >> 9)
    out[1] = (stored & 0x7F) << 1
    out[4:16] = significand.to_bytes(12, "big")
    return decimal128(bytes(out))


def _decode_decimal(value: Any, name: str) -> tuple[bool, int, int]:
    """Sign, significand and exponent of an AMQP decimal, read as azure-amqp reads it."""
    if isinstance(value, decimal128):
        raw = bytearray(bytes(value))
    else:
        raw = bytearray(int(value).to_bytes(8 if isinstance(value, decimal64) else 4, "big"))
    negative = bool(raw[0] & 0x80)
    if raw[0] & 0x60 == 0x60 and (raw[0] & 0x78 == 0x78 or len(raw) == 16):
        # NaN and infinity (System.Decimal has neither), or decimal128's large form,
        # which azure-amqp reads as 0: refuse rather than store something else.
        raise ValueError(
            f"application property {name!r}: a decimal NaN, infinity or 113-bit "
            "significand cannot be stored by Service Bus (System.Decimal)"
        )
    large = raw[0] & 0x60 == 0x60
    if len(raw) == 16:
        exponent = ((raw[0] & 0x7F) << 7) | ((raw[1] & 0xFE) >> 1)
        raw[1] &= 0x01
        significand = int.from_bytes(raw[4:16], "big")  # azure-amqp reads 96 bits only
        return negative, significand, exponent - 6176
    if len(raw) == 8:
        if large:
            exponent = ((raw[0] & 0x1F) << 8) | ((raw[1] & 0xF8) >> 3)
            raw[1] = (raw[1] & 0x07) | 0x20
        else:
            exponent = ((raw[0] & 0x7F) << 3) | ((raw[1] & 0xE0) >> 5)
            raw[1] &= 0x1F
        raw[0] = 0
        return negative, int.from_bytes(raw, "big"), exponent - 398
    if large:
        exponent = ((raw[0] & 0x1F) << 3) | ((raw[1] & 0xE0) >> 5)
        raw[1] = (raw[1] & 0x1F) | 0x80
    else:
        exponent = ((raw[0] & 0x7F) << 1) | ((raw[1] & 0x80) >> 7)
        raw[1] &= 0x7F
    raw[0] = 0
    return negative, int.from_bytes(raw, "big"), exponent - 101


#: Service Bus quotas, "Message property size": each property at most 32 KB, and
#: "Cumulative size of all properties can't exceed 64 KB. This limit applies to the
#: entire header of the brokered message, which has both user properties and system
#: properties, such as sequence number, label, and message ID."
MAX_PROPERTY_SIZE = 32 * 1024
MAX_HEADER_SIZE = 64 * 1024


def property_quota_error(sections: list[Section]) -> str | None:
    """Why a message breaks the property-size quotas, or ``None`` if it does not.

    Each application property (name and value, as encoded) must fit in 32 KB; the
    properties, application properties and message annotations together in 64 KB.
    """
    header = 0
    for section in sections:
        if section.code not in (MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES):
            continue
        header += len(section.raw)
        if section.code == APPLICATION_PROPERTIES:
            for key, value in (section.value() or {}).items():
                data = Data()
                data.put_object(key)
                data.put_object(value)
                size = len(data.encode())
                if size > MAX_PROPERTY_SIZE:
                    return (
                        f"The application property {str(key)!r} is {size} bytes; the maximum "
                        "message property size for each property is 32 KB."
                    )
    if header > MAX_HEADER_SIZE:
        return (
            f"The message's properties are {header} bytes; their cumulative size can't "
            "exceed 64 KB."
        )
    return None
