"""Service Bus messages as leasekit reads them: bodies, properties, lock expirations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from leasekit.spi import (
    DriverError,
    ErrorCode,
)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else str(value)


def _body(message: Any) -> bytes:
    """The body as bytes: data sections joined; another producer's value body as text."""
    from azure.servicebus.amqp import AmqpMessageBodyType

    kind = message.body_type
    body = message.body
    if kind == AmqpMessageBodyType.DATA:
        return b"".join(bytes(part) for part in body)
    if kind == AmqpMessageBodyType.VALUE:
        if isinstance(body, bytes | bytearray):
            return bytes(body)
        if body is None:
            return b""
        return _text(body).encode("utf-8")
    return repr(list(body)).encode("utf-8")


def _properties(message: Any) -> dict[str, str]:
    raw = message.application_properties or {}
    return {_text(k): _text(v) for k, v in raw.items()}


def _expirations(response: Any) -> list[float]:
    """Seconds since the epoch from a renew-lock reply (``{"expirations": [ms, ...]}``)."""
    values = None
    if isinstance(response, Mapping):
        values = response.get(b"expirations", response.get("expirations"))
    if values is None:
        raise DriverError(ErrorCode.UNKNOWN, "renew-lock reply without expirations")
    return [float(ms) / 1000.0 for ms in values]
