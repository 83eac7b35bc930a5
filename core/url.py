"""Parsing queue URLs (``scheme://host/queue?option=value``) before any backend is loaded."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

from .errors import InvalidURL
from .redaction import redact_url
from .spi import ParsedURL

__all__ = ["check_endpoint", "has_userinfo", "is_url", "parse_url", "redact_url"]

_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")


def is_url(target: str) -> bool:
    """Whether ``target`` looks like a URL (has ``://``) rather than a bare backend name."""
    return "://" in target


def check_scheme(name: str) -> str:
    """Return ``name`` if it is a valid backend name/scheme, else raise :class:`InvalidURL`."""
    if not isinstance(name, str) or not _SCHEME.match(name):
        shown = redact_url(name) if isinstance(name, str) else name
        raise InvalidURL(
            f"{shown!r} is not a backend name: use lowercase letters, digits, '+', '-' or '.'"
        )
    return name


def has_userinfo(url: str) -> bool:
    """Whether ``url``'s authority holds a userinfo (``user[:password]@``), parsable or not.

    Any ``@`` between ``scheme://`` and the query counts when the authority is
    not empty: a password with a ``/`` in it (common in AWS secret keys) ends
    the authority early for a URL parser, but it is still a credential.
    ``sqlite:///a@b.db`` has an empty authority and no userinfo.
    """
    _, sep, rest = url.partition("://")
    if not sep:
        return False
    before_query = re.split(r"[?#]", rest, maxsplit=1)[0]
    return "@" in before_query and not before_query.startswith("/")


def check_endpoint(value: object, option: str, scheme: str, hint: str = "") -> None:
    """Refuse an endpoint option (``endpoint_url=``, ``account_url=``...) that carries credentials.

    Raises :class:`InvalidURL` naming the option, never its value, when
    ``value`` is text with a userinfo (``https://user:password@host``, or
    ``user:password@host`` without a scheme). Other checks are the caller's.
    """
    if not isinstance(value, str):
        return
    if has_userinfo(value if "://" in value else f"endpoint://{value}"):
        raise InvalidURL(
            f"{scheme}: option {option} carries credentials (user:password@); an endpoint "
            f"takes none{'; ' + hint if hint else ''}"
        )


def parse_url(url: str) -> ParsedURL:
    """Split a queue URL into parts; raise :class:`InvalidURL` with the reason if it cannot be used.

    Credentials in the URL are kept out of every repr and message. A userinfo
    the URL parser cannot read (a password with ``/``, ``?`` or ``#`` in it) is
    refused as malformed rather than read as a host and path.
    """
    if not isinstance(url, str):
        raise InvalidURL(f"a queue URL must be a str, got {type(url).__name__}")
    if not is_url(url):
        raise InvalidURL(f"{redact_url(url)!r} is not a URL: expected scheme://...")
    try:
        parts = urlsplit(url)
        port = parts.port
        if has_userinfo(url) and parts.username is None:
            raise ValueError("a userinfo the parser does not see")
    except ValueError:
        # Not the parser's words: they quote the part it choked on.
        raise InvalidURL(
            f"cannot parse {redact_url(url)!r}: the host or port is malformed "
            "(a port is a number from 0 to 65535)"
        ) from None
    scheme = check_scheme(parts.scheme.lower())
    if parts.fragment:
        raise InvalidURL(f"{redact_url(url)!r}: a queue URL takes no #fragment")
    try:
        # A '+' is a plus, as libpq and the services' own connection strings read it
        # (a base64 key or a SAS signature holds pluses); a space is %20. parse_qs
        # alone would read '+' as a space (HTML form encoding).
        raw_query = parse_qs(
            parts.query.replace("+", "%2B"),
            keep_blank_values=True,
            strict_parsing=bool(parts.query),
        )
    except ValueError:
        raise InvalidURL(
            f"{redact_url(url)!r}: bad query string (options are name=value, joined by &)"
        ) from None
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
