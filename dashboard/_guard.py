"""The dashboard's door: host allowlist, token login, access, CSRF origin checks, headers, bounds.

Every request passes here before any page runs:

1. its ``Host`` must be one the dashboard answers to (DNS rebinding);
2. with a token, a session cookie is needed; ``?token=`` on a GET exchanges the
   token for an HttpOnly ``SameSite=Strict`` cookie and redirects to the same
   page without it;
3. the access function (all / read-only / forbidden) is asked, and a change
   (any method but GET and HEAD) is refused unless access is ``"all"``; the
   handlers check again;
4. a change must come from this origin (``Sec-Fetch-Site``, else ``Origin``);
   the handler then checks the form's CSRF token;
5. at most ``max_connections`` requests are served at once (503 beyond);
6. every answer carries a strict Content-Security-Policy (no inline script) and
   no-store, same-origin referrer, no-sniff, no-framing headers.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable, Iterable
from http.cookies import SimpleCookie
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from leasekit.redaction import redact

__all__ = ["COOKIE", "CSP", "Access", "Guard", "Settings"]

Access = Literal["all", "read-only", "forbidden"]

COOKIE = "leasekit_dashboard"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null".
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
SAFE_METHODS = frozenset({"GET", "HEAD"})
_log = logging.getLogger("leasekit.dashboard")


class Settings:
    """What the guard enforces (made by :func:`leasekit.dashboard.app`)."""

    def __init__(
        self,
        *,
        secret: bytes,
        token: str | None,
        read_only: bool,
        allowed_hosts: Iterable[str],
        access: Callable[[Any], Access] | None,
        max_connections: int,
    ) -> None:
        self.secret = secret
        self.token = token
        self.read_only = read_only
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self.access = access
        self.max_connections = max_connections
        self.session = hmac.new(secret, b"session:" + (token or "").encode(), hashlib.sha256)
        self.csrf = hmac.new(secret, b"csrf", hashlib.sha256).hexdigest()

    def session_value(self) -> str:
        """The cookie value a correct token buys."""
        return self.session.hexdigest()

    def access_for(self, request: Any) -> Access:
        """The request's access: the host's function, capped by ``read_only``."""
        level: Access = "all" if self.access is None else self.access(request)
        if level not in ("all", "read-only", "forbidden"):
            level = "forbidden"
        if self.read_only and level == "all":
            level = "read-only"
        return level


def host_of(value: str) -> str:
    """The host of a ``Host`` header, without its port, lower case (``[::1]`` stays bracketed)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value.split("]", 1)[0] + "]"
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Guard:
    """ASGI middleware enforcing :class:`Settings` (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.active = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        settings = self.settings
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method = scope["method"]

        async def send_secure(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        host = host_of(headers.get("host", ""))
        if host not in settings.allowed_hosts:
            await _plain(send_secure, 400, "This dashboard does not answer to that Host header.")
            return
        if self.active >= settings.max_connections:
            await _plain(send_secure, 503, "Too many requests at once; try again.", retry=True)
            return
        self.active += 1
        try:
            await self._pass(scope, receive, send_secure, headers, method)
        finally:
            self.active -= 1

    async def _pass(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], method: str
    ) -> None:
        settings = self.settings
        if settings.token is not None:
            cookie = SimpleCookie()
            try:
                cookie.load(headers.get("cookie", ""))
            except Exception:
                cookie = SimpleCookie()
            have = cookie.get(COOKIE)
            good = have is not None and hmac.compare_digest(
                have.value.encode(), settings.session_value().encode()
            )
            if not good:
                query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
                given = query.get("token")
                if (
                    method in SAFE_METHODS
                    and given is not None
                    and hmac.compare_digest(given.encode(), settings.token.encode())
                ):
                    await self._login(scope, send, query)
                    return
                await _plain(
                    send,
                    401,
                    "Open the dashboard with the URL it printed when it started "
                    "(it holds a one-time token).",
                )
                return
        from starlette.requests import Request

        level = settings.access_for(Request(scope))
        scope.setdefault("state", {})["access"] = level
        if level == "forbidden":
            await _plain(send, 403, "You may not see this dashboard.")
            return
        if method not in SAFE_METHODS:
            if level != "all":
                await _plain(send, 403, "This dashboard is read-only: changes are refused.")
                return
            # A browser says where a request comes from: Sec-Fetch-Site (all current
            # ones), else Origin, which must name this very host and port.
            site = headers.get("sec-fetch-site")
            origin = headers.get("origin")
            if site is not None:
                if site != "same-origin":
                    await _plain(send, 403, "Cross-site request refused.")
                    return
            elif origin is not None and origin.split("://", 1)[-1].lower() != (
                headers.get("host", "").lower()
            ):
                await _plain(send, 403, "Cross-origin request refused.")
                return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:  # a page's bug: one redacted log line, no traceback shown
            _log.error(
                "page %s failed: %s: %s", scope.get("path"), type(exc).__name__, redact(str(exc))
            )
            if not started:
                await _plain(send, 500, "The page failed; the dashboard's log says why.")

    async def _login(self, scope: Scope, send: Send, query: dict[str, str]) -> None:
        query.pop("token", None)
        root = scope.get("root_path", "")
        path = scope.get("path", "/") or "/"
        if root and not path.startswith(root):
            path = root + path
        target = path + ("?" + urlencode(query) if query else "")
        cookie = (
            f"{COOKIE}={self.settings.session_value()}; HttpOnly; SameSite=Strict; "
            f"Path={root or '/'}"
        )
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", target.encode("latin-1", "replace")),
                    (b"set-cookie", cookie.encode()),
                    (b"content-length", b"0"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})


async def _plain(send: Send, status: int, text: str, *, retry: bool = False) -> None:
    body = (
        f"<!doctype html><meta charset=utf-8><title>leasekit dashboard</title><p>{text}</p>\n"
    ).encode()
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
    ]
    if retry:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
