"""Connection parameters: libpq's rules for URLs, decoding and checking, before any connection."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from leasekit.errors import InvalidURL
from leasekit.redaction import remember_secret

from .settings import CONNECT_TIMEOUT, OWN_OPTIONS


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _unquote(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


def _conninfo(dsn: str, libpq: Mapping[str, str | int]) -> tuple[str, dict[str, Any]]:
    """Check the connection parameters (no network I/O): the conninfo and keyword parameters.

    A password (from ``password=`` or inside the ``dsn``) is remembered for
    redaction, and kept out of the conninfo string (given to libpq as a keyword).
    """
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    if not isinstance(dsn, str):
        raise InvalidURL("postgresql: dsn must be a libpq connection string or URI")
    params: dict[str, Any] = {}
    for key, value in libpq.items():
        if key in OWN_OPTIONS:
            continue
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise InvalidURL(f"postgresql: option {key} must be text or a number")
        params[key] = str(value)
    try:
        merged = conninfo_to_dict(dsn or _make_conninfo({}), **params)
        _make_conninfo(merged)  # libpq parses it: an unknown keyword is refused here
    except ProgrammingError as exc:
        # libpq's message names the bad keyword; it never quotes a value.
        text = str(exc).split("\n")[0]
        raise InvalidURL(f"postgresql: a connection parameter is refused: {text}") from None
    for secret in ("password", "sslpassword"):
        found = merged.get(secret)
        if isinstance(found, str) and found:
            remember_secret(found)
    _check_values(merged)
    merged.setdefault("connect_timeout", str(CONNECT_TIMEOUT))
    merged.setdefault("application_name", "leasekit")
    # Autocommit: a call of one statement is one round trip (no COMMIT after it);
    # the calls that need a transaction open one explicitly.
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 2}
    for secret in ("password", "sslpassword"):
        if merged.get(secret) is not None:
            kwargs[secret] = merged.pop(secret)
    return _make_conninfo(merged), kwargs


#: Where :func:`_check_values` points libpq instead of the server: a Unix socket
#: directory that does not exist, so the check connects nowhere.
_NOWHERE = "/nonexistent-leasekit-check"
#: libpq options whose integer value libpq checks only once a TCP connection is
#: made (the others, ``port`` and the enumerations, it checks before connecting).
_INTEGER_OPTIONS = (
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)


def _check_values(params: Mapping[str, Any]) -> None:
    """Have libpq check the parameters' values now, connecting nowhere; else ``InvalidURL``.

    libpq checks a value (``sslmode=bogus``, a port that is no number, a
    ``service`` not defined...) only when a connection starts, and then the
    failure reads like any failed connection, which would be retried without
    end. So a connection is started here with every host replaced by a Unix
    socket in a directory that does not exist (and ``hostaddr`` emptied): libpq
    checks every option first and fails on the missing socket, without any
    network I/O, when the options are good. Its message names the option and
    the value it refused (never a password: libpq checks none).
    """
    import ipaddress

    from psycopg import pq

    def listed(key: str, env: str) -> list[str]:
        value = params.get(key)
        text = str(value) if value not in (None, "") else os.environ.get(env, "")
        return text.split(",") if text else []

    for key in _INTEGER_OPTIONS:
        value = params.get(key)
        if value is not None and not re.fullmatch(r"\s*[+-]?[0-9]+\s*", str(value)):
            raise InvalidURL(f"postgresql: {key} must be a whole number, not {value!r}")
    hostaddrs = listed("hostaddr", "PGHOSTADDR")
    for address in hostaddrs:
        if address:
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise InvalidURL(f"postgresql: hostaddr {address!r} is not an IP address") from None
    hosts = max(len(listed("host", "PGHOST")), len(hostaddrs), 1)
    probe = {k: v for k, v in params.items() if v is not None}
    probe["host"] = ",".join([_NOWHERE] * hosts)
    probe["hostaddr"] = ""
    if probe.get("gssencmode") == "require":  # GSSAPI cannot run over a Unix socket
        probe["gssencmode"] = "prefer"
    conn = pq.PGconn.connect_start(_make_conninfo(probe).encode())
    try:
        if conn.status == pq.ConnStatus.OK:  # pragma: no cover (nothing listens there)
            return
        text = conn.error_message.decode("utf-8", "replace")
    finally:
        conn.finish()
    if _NOWHERE in text:
        return  # every option was accepted: only the (missing) socket failed
    first = text.strip().splitlines()[0] if text.strip() else "refused"
    raise InvalidURL(f"postgresql: a connection parameter is refused: {first}")


def _make_conninfo(params: Mapping[str, Any]) -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo("", **{k: v for k, v in params.items() if v is not None})


def _describe(conninfo: str, kwargs: Mapping[str, Any]) -> str:
    """``host:port/dbname`` for a repr: never the user, never a password."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(conninfo)
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = params.get("port")
    db = params.get("dbname") or "?"
    return f"{host}{':' + str(port) if port else ''}/{db}"
