"""Formatting for the pages: bodies (text, JSON, hex), durations, filters and signed cursors."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BODY_TEXT",
    "BadInput",
    "Body",
    "parse_duration",
    "render_body",
    "seconds_text",
    "sign",
    "unsign",
]

#: Characters of a body shown as text (Sidekiq and procrastinate cut at 2,000).
BODY_TEXT = 2000
#: Bytes of a body shown as hex.
BODY_HEX = 512


class BadInput(ValueError):
    """Raised when a request's parameter does not parse (the page answers 400 and says which)."""


@dataclass(frozen=True)
class Body:
    """A message body ready to show: always as text (escaped by the template), JSON and hex."""

    size: int
    text: str
    text_cut: bool
    is_utf8: bool
    json: str | None
    hex: str
    hex_cut: bool


def render_body(body: bytes) -> Body:
    """``body`` as text (U+FFFD where not UTF-8), pretty JSON where it parses, and hex."""
    try:
        text = body.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError:
        text = body.decode("utf-8", "replace")
        utf8 = False
    pretty: str | None = None
    if utf8 and text.strip()[:1] in ("{", "["):
        try:
            pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)[: BODY_TEXT * 2]
        except ValueError:
            pretty = None
    raw = body[:BODY_HEX]
    hexed = " ".join(raw[i : i + 16].hex(" ") for i in range(0, len(raw), 16))
    return Body(
        size=len(body),
        text=text[:BODY_TEXT],
        text_cut=len(text) > BODY_TEXT,
        is_utf8=utf8,
        json=pretty,
        hex=hexed,
        hex_cut=len(body) > BODY_HEX,
    )


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
#: Longest duration a filter takes (a year).
MAX_DURATION = 366 * 86400


def parse_duration(text: str | None, name: str) -> float | None:
    """``"90"``, ``"90s"``, ``"5m"``, ``"2h"``, ``"1d"`` as seconds; empty is ``None``.

    Raises:
        BadInput: anything else (the message says what is accepted).
    """
    if text is None or not text.strip():
        return None
    match = _DURATION.match(text)
    if not match or len(text) > 32:
        raise BadInput(f"{name} takes a number of seconds or 30s, 5m, 2h, 1d")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds > MAX_DURATION:
        raise BadInput(f"{name} is at most 366 days")
    return seconds


def seconds_text(seconds: float | None) -> str:
    """A short human duration: ``850 ms``, ``12.5 s``, ``3 min``, ``2.1 h``, ``4 d``."""
    if seconds is None:
        return "—"
    negative = seconds < 0
    s = abs(seconds)
    if s < 1:
        out = f"{s * 1000:.0f} ms"
    elif s < 60:
        out = f"{s:.1f} s"
    elif s < 3600:
        out = f"{s / 60:.0f} min"
    elif s < 86400:
        out = f"{s / 3600:.1f} h"
    else:
        out = f"{s / 86400:.1f} d"
    return "-" + out if negative else out


def sign(secret: bytes, payload: dict[str, Any]) -> str:
    """``payload`` as a URL-safe token with an HMAC, so a tampered one is refused."""
    data = base64.urlsafe_b64encode(json.dumps(payload, sort_keys=True).encode()).decode()
    mac = hmac.new(secret, data.encode(), hashlib.sha256).hexdigest()[:32]
    return f"{data}.{mac}"


def unsign(secret: bytes, token: str, what: str = "cursor") -> dict[str, Any]:
    """The payload of a :func:`sign` token.

    Raises:
        BadInput: malformed, or its HMAC does not match (tampered with, or from
            another dashboard process).
    """
    data, _, mac = token.partition(".")
    expected = hmac.new(secret, data.encode(), hashlib.sha256).hexdigest()[:32]
    if not mac or len(token) > 4096 or not hmac.compare_digest(mac, expected):
        raise BadInput(f"this {what} is not valid here (tampered with, or from another session)")
    try:
        payload = json.loads(base64.urlsafe_b64decode(data.encode()))
    except (ValueError, binascii.Error):
        raise BadInput(f"this {what} is malformed") from None
    if not isinstance(payload, dict):
        raise BadInput(f"this {what} is malformed")
    return payload
