"""SQS's limits and wire details: bodies, message attributes as properties, names."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from typing import Any

#: SQS limits: messages per receive/delete/change/send batch, long poll, delays.
BATCH = 10
MAX_VISIBILITY = 43200
MAX_WAIT = 20
MAX_DELAY = 900
#: Seconds to open a connection (a dead endpoint fails this fast).
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds to wait for an answer beyond a receive's long poll; each call is
#: bounded tighter by core's deadline (see :mod:`leasekit.deadline`).
DEFAULT_READ_TIMEOUT = 10.0
#: The SQS default (and moto's) for a queue's MaximumMessageSize; SQS allows
#: 1024 to 1048576. It limits the body and the message attributes together.
DEFAULT_MAXIMUM_MESSAGE_SIZE = 262144
#: Bytes of the message size limit kept for properties (message attributes).
#: More room means smaller bodies; less means a maximum-size body can carry
#: fewer properties and a dead-letter reason is shortened sooner.
ATTRIBUTE_ROOM = 8192
#: SQS allows at most this many message attributes per message.
MAX_ATTRIBUTES = 10
#: The attribute that carries all properties as JSON when they cannot map one to one.
PACKED = "leasekit-properties"
#: How long ``peek_dead_letters`` hides the letters it reads before releasing
#: them; long enough to read a few hundred, short if the release fails.
PEEK_HIDE = 30
#: The queue attributes read by ``stats()``: visible, in flight (leased), delayed.
COUNT_ATTRIBUTES = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
]

_ATTRIBUTE_NAME = re.compile(r"^(?!\.)(?!.*\.\.)(?!.*\.$)[A-Za-z0-9_.-]{1,256}$")
_BAD_TEXT = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
#: A FIFO queue's name: up to 80 characters with the ``.fifo`` suffix.
_FIFO_NAME = re.compile(r"^[A-Za-z0-9_-]{1,75}\.fifo$")
_FIFO = ".fifo"
_ACCOUNT = re.compile(r"^\d{12}$")
_XML_CODE = re.compile(r"<Code>([^<]+)</Code>")
_XML_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
_AWS_HOST = re.compile(r"^sqs\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?$")


_SECRET_OPTIONS = frozenset({"aws_access_key_id", "aws_secret_access_key", "aws_session_token"})
#: The loggers of the SDK this driver uses; core redacts their records (``leasekit.redaction``).
SDK_LOGGERS = ("boto3", "botocore", "urllib3")
#: What a ready ``client=`` must be able to do.
_CLIENT_METHODS = ("receive_message", "send_message", "delete_message")
_HTTP = ("http://", "https://")


# --------------------------------------------------------------------- helpers


#: The system attributes a receive asks for (``MessageGroupId``: FIFO queues only have it).
_SYSTEM_ATTRIBUTES = ["ApproximateReceiveCount", "SentTimestamp", "MessageGroupId"]


def _send_kwargs(body: str, attributes: dict[str, Any], delay: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"MessageBody": body}
    if attributes:
        kwargs["MessageAttributes"] = attributes
    if delay > 0:
        kwargs["DelaySeconds"] = min(math.ceil(delay), MAX_DELAY)
    return kwargs


def _decode_body(text: str) -> bytes:
    """A leasekit body is base64; a body some other producer sent is returned as UTF-8."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return text.encode("utf-8")


def _attribute_ok(name: str, value: str) -> bool:
    lowered = name.lower()
    return (
        bool(_ATTRIBUTE_NAME.match(name))
        and not lowered.startswith(("aws.", "amazon."))
        and name != PACKED
        and bool(value)
        and not _BAD_TEXT.search(value)
    )


def _encode_properties(properties: Mapping[str, str]) -> dict[str, Any]:
    """One String attribute per property where SQS allows it; else all as JSON in one."""
    if not properties:
        return {}
    if len(properties) <= MAX_ATTRIBUTES and all(
        _attribute_ok(k, v) for k, v in properties.items()
    ):
        return {k: {"DataType": "String", "StringValue": v} for k, v in properties.items()}
    packed = json.dumps(dict(properties), ensure_ascii=True, separators=(",", ":"))
    return {PACKED: {"DataType": "String", "StringValue": packed}}


def _decode_properties(attributes: Mapping[str, Any]) -> dict[str, str]:
    properties: dict[str, str] = {}
    packed: dict[str, str] = {}
    for name, value in attributes.items():
        text = value.get("StringValue")
        if text is None:
            binary = value.get("BinaryValue")
            if binary is None:
                continue
            text = base64.b64encode(binary).decode("ascii")
        if name == PACKED:
            try:
                decoded = json.loads(text)
            except ValueError:
                decoded = None
            if isinstance(decoded, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in decoded.items()
            ):
                packed = decoded
                continue
        properties[name] = text
    properties.update(packed)
    return properties


def _attributes_size(attributes: Mapping[str, Any]) -> int:
    """Bytes SQS counts for message attributes: name, data type and value."""
    return sum(
        len(name.encode("utf-8"))
        + len(value["DataType"].encode("utf-8"))
        + len(value["StringValue"].encode("utf-8"))
        for name, value in attributes.items()
    )
