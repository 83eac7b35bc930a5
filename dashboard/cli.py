"""``leasekit dashboard``: serve the app with uvicorn on 127.0.0.1, behind a one-time token."""

from __future__ import annotations

import ipaddress
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from leasekit import errors

from ._app import DEFAULT_HOSTS, app

__all__ = ["MAX_CONNECTIONS", "serve"]

#: Connections uvicorn serves at once (503 beyond); the app bounds requests too.
MAX_CONNECTIONS = 64


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(
    urls: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8050,
    read_only: bool = False,
    consumers: Sequence[str] = (),
    conformance: Sequence[Path] = (),
    allowed_hosts: Sequence[str] = (),
    no_token: bool = False,
    options: dict[str, Any] | None = None,
) -> None:
    """Run the dashboard until interrupted; print the login URL (with its token) once.

    Raises:
        InvalidArgument: ``no_token`` with an address other than loopback.
    """
    import uvicorn

    if no_token and not is_loopback(host):
        raise errors.InvalidArgument(
            f"--no-token is refused on {host!r}: another address than loopback needs the token"
        )
    token = None if no_token else secrets.token_urlsafe(24)
    hosts = list(DEFAULT_HOSTS)
    if not is_loopback(host):
        hosts.append(host)
    hosts += list(allowed_hosts)
    application = app(
        list(urls),
        read_only=read_only,
        token=token,
        allowed_hosts=hosts,
        consumers=consumers,
        conformance=conformance,
        options=options,
        max_connections=MAX_CONNECTIONS,
    )
    shown = host if ":" not in host else f"[{host}]"
    where = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else shown}:{port}/"
    login = where if token is None else f"{where}?token={token}"
    print(
        f"leasekit dashboard{' (read-only)' if read_only else ''}: open {login}\n"
        "(the token is shown once; it buys this browser a session cookie)",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        application,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=5,
        proxy_headers=False,
        server_header=False,
    )
