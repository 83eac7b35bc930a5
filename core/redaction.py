"""Keeping secrets out of messages and log lines: the one redaction policy for every backend.

leasekit promises that no credential appears in a repr, an exception message or
a log line. Four tools keep that promise:

:class:`Secret`
    A credential a driver holds (a connection string, an SDK credential
    object, key material) wrapped so that any repr shows ``<credentials
    hidden>``; the driver reads ``.value`` only to make its client.

:func:`redact_url`
    A URL with everything that could be a credential replaced by ``***``: the
    whole userinfo of any authority with an ``@`` (up to the last ``@``,
    whatever it holds, even an unparsable ``user:pa/ss@``), and the values of
    secret-looking query options (``sig=``, ``password=``, ``...key=``...).

:func:`redact`
    Free text (an SDK's error message, a log line) with credentials replaced:
    URL userinfo; ``key=value`` pairs whose key names a secret (SAS ``sig=``,
    ``X-Amz-Security-Token=``, ``X-Amz-Signature=``, ``SharedAccessKey=``,
    ``AccountKey=``, ``password=``...); headers and quoted keys that carry one
    (``Authorization: ...`` including MNS's ``MNS id:signature``,
    ``'X-Amz-Security-Token': b'...'``, ``security-token: ...``);
    ``Bearer``/``SharedAccessSignature`` tokens; and every secret value handed
    to :func:`leasekit.open` as a credential option (:func:`remember_secret`).

Log redaction
    The SDKs leasekit drives log request URLs and headers at ``DEBUG`` level
    (botocore logs the session token, urllib3 the SAS ``sig=``). When a backend
    driver is constructed it calls :func:`install_log_redaction` with its SDK's
    logger names; from then on every record of those loggers, of their child
    loggers and of ``leasekit``'s own is passed through :class:`RedactingFilter`
    as it is made, before any handler sees it, whatever handlers exist now or
    are added later. Nothing is installed by ``import leasekit``. Turn it off
    with :func:`uninstall_log_redaction` or by setting the environment variable
    ``LEASEKIT_LOG_REDACTION=off`` before the first queue is opened. To redact
    other loggers too, add a :class:`RedactingFilter` to your handlers.

The patterns err on the side of hiding: a value that merely looks secret
(``...key=``) is hidden too.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

__all__ = [
    "ENV_SWITCH",
    "MASK",
    "RedactingFilter",
    "Secret",
    "install_log_redaction",
    "log_redaction_installed",
    "redact",
    "redact_url",
    "remember_secret",
    "remember_secrets",
    "uninstall_log_redaction",
]

#: What a secret is replaced with.
MASK = "***"
#: Environment variable that turns the default log redaction off (``off``, ``0``, ``false``).
ENV_SWITCH = "LEASEKIT_LOG_REDACTION"
#: Loggers redacted whenever any are: leasekit's own (they may quote SDK messages).
OWN_LOGGERS = ("leasekit",)
#: Shortest credential value remembered for literal redaction; shorter ones
#: (test dummies like ``"s"``) would turn every log line to asterisks.
MIN_SECRET = 8

#: Words that make a name secret. ``key`` only as the end of a longer name
#: (``AccountKey``, ``api_key``), so a bare ``KEY=VALUE`` in a usage message stays.
_SECRET_WORD = r"(?:sig|signature|token|secret|passw(?:or)?d|pwd|credential|sas|(?<=[\w.\-])key)"
#: ``scheme://userinfo@``: everything from ``://`` to the last ``@`` of the token.
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s'\"<>]*@")
#: ``'Authorization': b'...'`` / ``"SharedAccessKey": "..."`` in reprs and JSON.
_QUOTED = re.compile(
    rf"(?i)(['\"])([\w.\-]*(?:{_SECRET_WORD}|authorization|cookie)[\w.\-]*)\1"
    r"(\s*:\s*)(b?)(['\"])(?:\\.|(?!\5).)*\5"
)
#: ``key=value`` where the key names a secret (query strings, connection strings).
_KEY_VALUE = re.compile(rf"(?i)\b([\w.\-]*{_SECRET_WORD}[\w.\-]*)=([^&;,\s'\"<>\\]+)")
#: ``Authorization: ...`` and other secret headers, up to the end of the line.
_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization|[\w\-]*(?:token|signature|secret|password|"
    r"api-?key|cookie)[\w\-]*)([ \t]*:[ \t]*)(?!\*\*\*)[^\r\n'\"\\]+"
)
#: A signature printed on the line after its label (botocore's ``Signature:\n<hex>``).
_NEXT_LINE_SIGNATURE = re.compile(r"(?i)\b(signature:[ \t]*\r?\n[ \t]*)[0-9a-f]{16,}")
#: Tokens that travel with a prefix: ``Bearer x``, ``SharedAccessSignature sr=...``, ``MNS id:sig``.
_SCHEME_TOKEN = re.compile(
    r"(?i)\b(bearer|sharedaccesssignature)\s+[^\s'\",]+|\b(MNS)\s+[\w\-]+:[\w+/=]+"
)

#: Most remembered secret forms; the oldest are forgotten first, so a process that
#: opens many queues with rotating tokens keeps redaction cheap.
MAX_REMEMBERED = 256

_lock = threading.Lock()
_secrets: dict[str, None] = {}  # insertion-ordered set
_secret_pattern: re.Pattern[str] | None = None


# --------------------------------------------------------------- held secrets


class Secret:
    """A credential a driver keeps until it makes its client, shown as hidden in every repr.

    Parameters
    ----------
        value: the connection string, credential object or key material.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<credentials hidden>"


# ------------------------------------------------------------------ text


def redact_url(url: str) -> str:
    """``url`` with its userinfo (``user:password@``) and secret query values replaced by ``***``.

    Any ``@`` counts: everything between ``://`` (or the start, if there is
    none) and the last ``@`` is hidden, whether or not it parses.
    """
    at = url.rfind("@")
    if at >= 0:
        start = url.find("://")
        start = start + 3 if 0 <= start < at else 0
        url = url[:start] + MASK + url[at:]
    return redact(url)


def redact(text: str) -> str:
    """``text`` with every credential it seems to hold replaced by ``***`` (see the module doc)."""
    if not text:
        return text
    text = _URL_USERINFO.sub(rf"\1{MASK}@", text)
    text = _QUOTED.sub(rf"\1\2\1\3\4\5{MASK}\5", text)
    text = _KEY_VALUE.sub(rf"\1={MASK}", text)
    text = _HEADER.sub(rf"\1\2{MASK}", text)
    text = _NEXT_LINE_SIGNATURE.sub(rf"\1{MASK}", text)
    text = _SCHEME_TOKEN.sub(_scheme_token, text)
    pattern = _secret_pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    return text


def _scheme_token(match: re.Match[str]) -> str:
    return f"{match.group(1) or match.group(2)} {MASK}"


def remember_secret(value: object) -> None:
    """Redact ``value`` (and its URL-encoded form) wherever it appears from now on.

    Core calls this for every credential option given to :func:`leasekit.open`
    (the driver's ``secret_options``) and for the keys inside connection
    strings. Values shorter than ``MIN_SECRET`` characters are ignored.
    """
    global _secret_pattern
    if not isinstance(value, str):
        return
    forms = {value}
    for safe in ("", "/"):
        forms.add(quote(value, safe=safe, errors="surrogatepass"))
    forms = {form for form in forms if len(form) >= MIN_SECRET}
    if not forms or forms <= _secrets.keys():
        return
    with _lock:
        for form in forms:
            _secrets.pop(form, None)
            _secrets[form] = None
        while len(_secrets) > MAX_REMEMBERED:
            del _secrets[next(iter(_secrets))]
        ordered = sorted(_secrets, key=len, reverse=True)  # longest first
        _secret_pattern = re.compile("|".join(re.escape(s) for s in ordered))


def remember_secrets(options: Mapping[str, Any], names: Iterable[str]) -> None:
    """:func:`remember_secret` for each option in ``names``, and for the keys inside it.

    A connection string (``...;AccountKey=K;...``, ``SharedAccessKey=K``) and
    a SAS token (``...&sig=S``) have their secret parts remembered as well.
    """
    for name in names:
        value = options.get(name)
        if isinstance(value, Mapping):  # e.g. {"account_name": ..., "account_key": ...}
            for key, item in value.items():
                if isinstance(key, str) and re.search(_SECRET_WORD, key, re.IGNORECASE):
                    remember_secret(item)
            continue
        if not isinstance(value, str):
            continue
        remember_secret(value)
        for match in _KEY_VALUE.finditer(value):
            remember_secret(match.group(2))


# ------------------------------------------------------------------- logs


class RedactingFilter(logging.Filter):
    """A logging filter that redacts a record's message, arguments and traceback in place.

    leasekit applies it to the SDK loggers it drives (see the module doc); add
    it to a handler to redact every record that handler emits. It never drops
    a record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace the record's message with its redacted text; always keep the record."""
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep what can be shown, redacted
            message = f"{record.msg} {record.args!r}"
        record.msg = redact(message)
        record.args = ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_filter = RedactingFilter()
_names: frozenset[str] = frozenset()
_prefixes: tuple[str, ...] = ()
_previous_factory: Any = None
_active = False
#: Whether our factory is (still) in logging's chain of record factories.
_in_chain = False


def _redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record: logging.LogRecord = _previous_factory(*args, **kwargs)
    if _active and (record.name in _names or record.name.startswith(_prefixes)):
        _filter.filter(record)
    return record


def install_log_redaction(logger_names: Iterable[str]) -> bool:
    """Redact every record of these loggers and their children (and ``leasekit``'s) from now on.

    Idempotent; names add up over calls. Backend drivers call it when they are
    constructed. Returns whether redaction is on: ``False`` when
    ``LEASEKIT_LOG_REDACTION`` is ``off``/``0``/``false``.
    """
    global _names, _prefixes, _previous_factory, _active, _in_chain
    if os.environ.get(ENV_SWITCH, "").strip().lower() in ("off", "0", "false", "no"):
        return False
    with _lock:
        names = _names | set(logger_names) | set(OWN_LOGGERS)
        if names != _names:
            _names = frozenset(names)
            _prefixes = tuple(f"{name}." for name in sorted(names))
        if not _in_chain:
            _previous_factory = logging.getLogRecordFactory()
            logging.setLogRecordFactory(_redacting_factory)
            _in_chain = True
        _active = True
    return True


def uninstall_log_redaction() -> None:
    """Stop redacting log records (the default record factory is put back if it is still ours)."""
    global _active, _in_chain
    with _lock:
        _active = False
        # If another library wrapped our factory since, ours stays in its chain,
        # switched off.
        if logging.getLogRecordFactory() is _redacting_factory:
            logging.setLogRecordFactory(_previous_factory)
            _in_chain = False


def log_redaction_installed() -> frozenset[str]:
    """The logger names whose records are redacted now (empty when it is off)."""
    return _names if _active else frozenset()
