"""MNS's limits, names and wire details: base64 bodies, typed properties, times, queue names."""

from __future__ import annotations

import base64
import ipaddress
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from leasekit.spi import (
    DriverError,
    ErrorCode,
)

#: Most messages one receive, peek, send or delete batch takes (MNS's limit).
MAX_BATCH = 16
#: Longest long poll (``waitseconds``) MNS accepts.
MAX_WAIT = 30
#: ChangeMessageVisibility and the queue's VisibilityTimeout: 1 s – 12 h (0 is refused).
MIN_VISIBILITY = 1
MAX_VISIBILITY = 43200
#: Longest per-message delay (``DelaySeconds``): 7 days.
MAX_DELAY = 604800
#: MNS's limit on a message's body text (64 KiB), which leasekit fills with base64.
MAX_TEXT = 64 * 1024
#: Largest body that fits as base64 in ``MAX_TEXT``: 49,152 bytes → 65,536 characters.
MAX_BODY = MAX_TEXT // 4 * 3
#: The body text for an empty body (MNS refuses an empty text; base64 decoders read it as b"").
EMPTY_BODY = "="
#: Seconds to open a connection (a dead endpoint fails this fast).
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds to wait for an answer beyond a receive's long poll; every call is
#: bounded tighter by core's deadline (see :mod:`leasekit.deadline`).
DEFAULT_READ_TIMEOUT = 10.0
#: Longest timeout accepted (a day); larger ones overflow the socket's own limit.
MAX_TIMEOUT = 86400.0
#: The SDK's loggers (``mns_python_sdk`` when given one); core redacts their records.
SDK_LOGGERS = ("mns", "mns_python_sdk")
#: Alibaba Cloud's standard credential variables.
ENV_ACCESS_KEY_ID = "ALIBABA_CLOUD_ACCESS_KEY_ID"
ENV_ACCESS_KEY_SECRET = "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
ENV_SECURITY_TOKEN = "ALIBABA_CLOUD_SECURITY_TOKEN"
#: A data-plane host with its region: ACCOUNT.mns.REGION[-internal[-vpc]].aliyuncs.com.
_ENDPOINT_REGION = re.compile(
    r"^[^.]+\.mns\.([a-z0-9-]+?)(?:-internal(?:-vpc)?)?\.aliyuncs\.com$", re.IGNORECASE
)
#: The OpenAPI's ``QueueType`` of an ordered queue.
FIFO_QUEUE_TYPE = "fifo"
#: MNS queue names: 1-120 letters, digits and hyphens, starting with a letter or digit.
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,119}$")
#: Characters an XML text node cannot carry as they are (or that XML parsers
#: normalise, like ``\r``): property values with any of them go as BINARY.
_NOT_PLAIN_TEXT = re.compile("[\x00-\x1f\x7f\ud800-\udfff\ufffe\uffff]")
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}
#: URL query options that would be credentials: refused in a URL.
_SECRET_OPTIONS = frozenset(
    {
        "access_key_id",
        "access_key_secret",
        "access_key",
        "secret",
        "security_token",
        "token",
        "credentials_provider",
        "password",
    }
)


# ------------------------------------------------------------------ encoding


def encode_body(body: bytes) -> str:
    """The MNS body text leasekit sends for ``body``: standard base64, ``=`` for empty."""
    if not body:
        return EMPTY_BODY
    return base64.b64encode(body).decode("ascii")


def decode_body(text: str | bytes | None) -> bytes:
    """The body bytes of an MNS body text (see "Bodies" in the module doc)."""
    if isinstance(text, bytes):  # the SDK's own base64 path already decoded it
        return text
    if not text or text == EMPTY_BODY:
        return b""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error (not base64), or non-ASCII text
        return text.encode("utf-8", "surrogatepass")


def _property_value(name: str, value: str) -> Any:
    from mns.message_property import MessagePropertyValue, PropertyType

    if not name or _NOT_PLAIN_TEXT.search(name):
        raise DriverError(
            ErrorCode.INVALID_ARGUMENT,
            f"MNS property names must be plain text, got {name!r}",
            backend_code="InvalidPropertyName",
        )
    if not value:
        raise DriverError(
            ErrorCode.INVALID_ARGUMENT,
            f"MNS cannot carry an empty property value (property {name!r}): "
            "the SDK drops it on receive",
            backend_code="EmptyPropertyValue",
        )
    if _NOT_PLAIN_TEXT.search(value):
        return MessagePropertyValue(PropertyType.BINARY, value.encode("utf-8", "surrogatepass"))
    return MessagePropertyValue(PropertyType.STRING, value)


def _read_properties(sdk_properties: Mapping[str, Any] | None) -> dict[str, str]:
    properties: dict[str, str] = {}
    for name, prop in (sdk_properties or {}).items():
        if prop.get_data_type() == "BINARY":
            raw: bytes = prop.get_binary_value()
            try:
                properties[name] = raw.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                properties[name] = base64.b64encode(raw).decode("ascii")
        else:
            properties[name] = str(prop.get_string_value_by_type())
    return properties


# ------------------------------------------------------------------- helpers


def _whole_seconds(seconds: float) -> int:
    # Core rounded lease durations up to whole seconds already; delays may be
    # fractional: round up, never shorten what was asked.
    return math.ceil(seconds - 1e-9)


def _ms(value: Any) -> datetime:
    """A time in milliseconds since the epoch (MNS's format) as a UTC datetime."""
    return datetime.fromtimestamp(int(value) / 1000, UTC)


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_queue_name(queue: object) -> str:
    if not isinstance(queue, str) or not _QUEUE_NAME.match(queue):
        raise ValueError(
            f"aliyun-mns: {queue!r} is not an MNS queue name: use 1-120 letters, digits "
            "and hyphens, starting with a letter or digit"
        )
    return queue


#: How far past a call's deadline its socket's read timeout may reach (a share of
#: the timeout): a timeout within it of the one wanted is kept, not set again.
