"""Parsing queue URLs (``scheme://host/queue?option=value``) before any backend is loaded."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

from .errors import InvalidURL
from .spi import ParsedURL

__all__ = ["is_url", "parse_url", "redact_url"]

_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")


def is_url(target: str) -> bool:
    """Whether ``target`` looks like a URL (has ``://``) rather than a bare backend name."""
    return "://" in target


def check_scheme(name: str) -> str:
    """Return ``name`` if it is a valid backend name/scheme, else raise :class:`InvalidURL`."""
    if not isinstance(name, str) or not _SCHEME.match(name):
        raise InvalidURL(
            f"{name!r} is not a backend name: use lowercase letters, digits, '+', '-' or '.'"
        )
    return name


def parse_url(url: str) -> ParsedURL:
    """Split a queue URL into parts; raise :class:`InvalidURL` with the reason if it cannot be used.

    Credentials in the URL are kept out of every repr and message.
    """
    if not isinstance(url, str):
        raise InvalidURL(f"a queue URL must be a str, got {type(url).__name__}")
    if not is_url(url):
        raise InvalidURL(f"{redact_url(url)!r} is not a URL: expected scheme://...")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidURL(f"cannot parse {redact_url(url)!r}: {exc}") from None
    scheme = check_scheme(parts.scheme.lower())
    if parts.fragment:
        raise InvalidURL(f"{redact_url(url)!r}: a queue URL takes no #fragment")
    try:
        raw_query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise InvalidURL(f"{redact_url(url)!r}: bad query string ({exc})") from None
    query: dict[str, str] = {}
    for key, values in raw_query.items():
        if len(values) != 1:
            raise InvalidURL(f"{redact_url(url)!r}: option {key!r} is given more than once")
        query[key] = values[0]
    return ParsedURL(
        scheme=scheme,
        host=parts.hostname or "",
        port=port,
        path=parts.path,
        query=query,
        username=parts.username,
        password=parts.password,
    )


def redact_url(url: str) -> str:
    """``url`` with any password (and secret-looking query values) replaced by ``***``."""
    redacted = re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)
    return re.sub(
        r"((?:secret|password|key|token|sig|signature|credential|connection)[a-z_]*=)[^&]*",
        r"\1***",
        redacted,
        flags=re.IGNORECASE,
    )
