"""Health of a worker: liveness (it makes progress) and readiness (it reaches its queue).

A :class:`~leasekit.Consumer` or :class:`~leasekit.aio.AsyncConsumer` answers
``health()`` with a :class:`Health`, measured rather than guessed:

- **live** while nothing that must make progress is stuck: the worker loop
  comes back when it said it would (each step announces how long it may take:
  a wait for room, a receive bounded by its long poll plus the queue's
  ``call_timeout``, a pause after a failure), an asyncio consumer's event
  loop runs its ticks (a blocked loop shows at once, not only when a receive
  overstays), and the keeper's scheduler keeps
  its heartbeat (it wakes at least every second) and gets its renewals done,
  late for none of these by more than ``stuck_after``. A consumer that has
  stopped is not live; one not started yet is (nothing is stuck), but not
  ready.
- **ready** while live and the last receive reached the queue: not while
  receives fail, nor while one has waited ``slow_receive`` seconds past its
  long poll (a network that swallows requests), nor before the first returned.

:class:`HealthServer` serves them over HTTP for Kubernetes-style probes:
``GET /livez`` and ``GET /readyz`` answer 200 or 503 with a JSON body that
says why. It runs on a thread of its own (standard library ``http.server``),
so it answers while an asyncio consumer's event loop is blocked, and then
reports that consumer not live.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from . import errors
from .keeper import HEARTBEAT, KeeperProgress
from .options import MAX_SECONDS, check_number
from .redaction import redact

if TYPE_CHECKING:
    from http.server import HTTPServer

__all__ = [
    "SLOW_RECEIVE",
    "STUCK_AFTER",
    "Health",
    "HealthLimits",
    "HealthServer",
    "WorkerPulse",
    "assess",
]

_log = logging.getLogger("leasekit.health")

#: Default ``stuck_after``: seconds the worker loop may be late, the keeper's
#: heartbeat old or a renewal overdue before the worker counts as stuck. Longer
#: than a scheduling hiccup or a slow call, shorter than a probe's patience.
STUCK_AFTER = 10.0
#: Default ``slow_receive``: seconds past its long poll a receive may wait before
#: the queue counts as unreachable (a timeout ends it later, at ``call_timeout``).
SLOW_RECEIVE = 5.0


@dataclass(frozen=True)
class HealthLimits:
    """When a worker counts as stuck (not live) or cut off from its queue (not ready).

    Parameters:
        stuck_after: seconds the loop may be late, the keeper's heartbeat old, or
            a renewal overdue.
        slow_receive: seconds a receive may wait beyond its long poll.
    """

    stuck_after: float = STUCK_AFTER
    slow_receive: float = SLOW_RECEIVE

    def __post_init__(self) -> None:
        check_number(self.stuck_after, "stuck_after", above=0, maximum=MAX_SECONDS)
        check_number(self.slow_receive, "slow_receive", above=0, maximum=MAX_SECONDS)


@dataclass(frozen=True)
class Health:
    """A worker's liveness and readiness, with the reasons and the measurements behind them."""

    live: bool
    ready: bool
    #: Why it is not live (empty when live).
    live_problems: tuple[str, ...] = ()
    #: Why it is not ready (empty when ready); "not live" is one of them.
    ready_problems: tuple[str, ...] = ()
    #: What was measured: seconds (rounded to ms), counts, the last receive error.
    details: dict[str, float | int | str | bool | None] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The whole result as plain JSON-ready data."""
        return {
            "live": self.live,
            "ready": self.ready,
            "live_problems": list(self.live_problems),
            "ready_problems": list(self.ready_problems),
            "details": dict(self.details),
        }


class WorkerPulse:
    """What a worker loop records as it goes, for :func:`assess`.

    Each method is a few attribute writes (no lock): the loop calls them on
    every step, and any thread may read them. The loop announces how long its
    next step may take (:meth:`expect`, :meth:`receiving`); being late for that
    is what "stuck" means.
    """

    def __init__(self) -> None:
        #: ``new``, ``running``, ``stopping`` (giving back leases), ``stopped``.
        self.state = "new"
        #: Monotonic time the loop said it would be back by.
        self.back_by: float | None = None
        self.receiving_since: float | None = None
        self.receive_wait = 0.0
        self.last_receive: float | None = None
        self.failures = 0
        self.last_error: str | None = None
        #: An event loop's tick (monotonic), stamped every ``tick_every`` seconds
        #: by an asyncio worker; ``None`` for a threaded one.
        self.tick: float | None = None
        self.tick_every = 0.0

    def begin(self) -> None:
        """The worker starts (again): forget the previous run."""
        self.receiving_since = self.last_receive = self.last_error = None
        self.failures = 0
        self.tick = None
        self.back_by = time.monotonic()
        self.state = "running"

    def ticked(self, every: float) -> None:
        """The event loop ran this tick; the next comes ``every`` seconds later."""
        self.tick = time.monotonic()
        self.tick_every = every

    def stopping(self) -> None:
        """The loop ended; the worker is giving back leases and letting handlers finish."""
        self.state = "stopping"

    def end(self) -> None:
        """The worker stopped."""
        self.state = "stopped"

    def expect(self, seconds: float) -> None:
        """The loop's next step takes at most ``seconds``."""
        self.back_by = time.monotonic() + seconds

    def receiving(self, wait: float, bound: float) -> None:
        """A receive starts: long poll ``wait`` seconds, returns within ``bound``."""
        now = time.monotonic()
        self.receiving_since = now
        self.receive_wait = wait
        self.back_by = now + bound

    def received(self) -> None:
        """The receive reached the queue (with or without messages)."""
        self.last_receive = time.monotonic()
        self.receiving_since = None
        self.failures = 0
        self.last_error = None

    def failed(self, error: BaseException) -> None:
        """The receive failed (the loop retries)."""
        self.receiving_since = None
        self.failures += 1
        self.last_error = f"{type(error).__name__}: {redact(str(error))}"


def assess(
    pulse: WorkerPulse, keeper: KeeperProgress | None, limits: HealthLimits | None = None
) -> Health:
    """Judge a worker from its pulse and its keeper's progress (``None``: no keeper yet)."""
    limits = limits or HealthLimits()
    stuck = limits.stuck_after
    now = time.monotonic()
    live: list[str] = []
    ready: list[str] = []
    details: dict[str, float | int | str | bool | None] = {"state": pulse.state}
    late = 0.0 if pulse.back_by is None else max(0.0, now - pulse.back_by)
    receiving = None if pulse.receiving_since is None else now - pulse.receiving_since
    details.update(
        loop_late=_ms(late),
        last_receive_age=None if pulse.last_receive is None else _ms(now - pulse.last_receive),
        receive_failures=pulse.failures,
        last_receive_error=pulse.last_error,
        receiving_for=None if receiving is None else _ms(receiving),
    )
    if pulse.state == "stopped":
        live.append("the consumer has stopped")
    elif pulse.state == "new":
        ready.append("the consumer has not started")
    elif pulse.state == "stopping":
        ready.append("the consumer is stopping")
    elif late > stuck:
        live.append(f"the worker loop is {late:.1f} s late (stuck for more than {stuck:g} s)")
    if pulse.tick is not None and pulse.state in ("running", "stopping"):
        blocked = max(0.0, now - pulse.tick - pulse.tick_every)
        details["event_loop_late"] = _ms(blocked)
        if blocked > stuck:
            live.append(f"the event loop has been blocked for {blocked:.1f} s")
    if keeper is not None and pulse.state in ("running", "stopping"):
        beat = keeper.heartbeat_age
        details.update(
            keeper_running=keeper.running,
            keeper_heartbeat_age=None if beat is None else _ms(beat),
            leases_held=keeper.held,
            renewals_overdue=keeper.overdue,
            oldest_overdue_renewal=_ms(keeper.oldest_overdue),
        )
        if beat is not None and not keeper.running:
            live.append("the lease keeper is not running")
        elif beat is not None and beat - HEARTBEAT > stuck:
            live.append(
                f"the lease keeper's scheduler is {beat - HEARTBEAT:.1f} s late (it last ran "
                f"{beat:.1f} s ago)"
            )
        if keeper.oldest_overdue > stuck:
            live.append(
                f"{keeper.overdue} lease renewal(s) overdue, the oldest by "
                f"{keeper.oldest_overdue:.1f} s"
            )
    if pulse.state == "running":
        if pulse.failures:
            ready.append(f"{pulse.failures} receive(s) failed in a row: {pulse.last_error}")
        elif receiving is not None and receiving > pulse.receive_wait + limits.slow_receive:
            ready.append(
                f"a receive has waited {receiving:.1f} s (its long poll is "
                f"{pulse.receive_wait:g} s): the queue does not answer"
            )
        elif pulse.last_receive is None:
            ready.append("no receive has returned yet")
    if live:
        ready.insert(0, "not live")
    return Health(
        live=not live,
        ready=not ready,
        live_problems=tuple(live),
        ready_problems=tuple(ready),
        details=details,
    )


def _ms(seconds: float) -> float:
    return round(seconds, 3)


# ----------------------------------------------------------------- HTTP server


class SupportsHealth(Protocol):
    """Anything with a ``health()`` method (a Consumer, an AsyncConsumer)."""

    def health(self, limits: HealthLimits | None = None) -> Health: ...


class HealthServer:
    """Serves a worker's health over HTTP: ``GET /livez`` and ``GET /readyz``.

    Parameters:
        worker: a :class:`~leasekit.Consumer`, an :class:`~leasekit.aio.AsyncConsumer`
            (anything with ``health(limits)``), or a function returning a :class:`Health`.
        host: the address to listen on; ``"0.0.0.0"`` for probes from outside the
            host (Kubernetes probes come to the pod's IP).
        port: the port; 0 picks a free one (see :attr:`port`).
        limits: when the worker counts as stuck or cut off.
        leases: opt-in: a function returning the leases this process holds (a
            :meth:`leasekit.lease_report.LeaseReporter.snapshot`), served at
            ``GET /leases`` for the dashboard; ids and timings only, never a
            receipt or a body. ``None`` (the default): ``/leases`` is 404.

    ``/livez`` answers 200 when live and 503 when not, ``/readyz`` the same for
    ready; the JSON body is :meth:`Health.as_dict` (the problems say why). Any
    other path is 404. A context manager; :meth:`start` returns at once and
    serves on a daemon thread until :meth:`stop`. At most ``MAX_CONNECTIONS``
    (32) connections are served at once, and a client that does not finish
    its request within ``REQUEST_TIMEOUT`` (5 s) is dropped
    (:mod:`leasekit.serving`), so stalled clients cannot pile up threads; when
    all 32 are taken, a new connection evicts the oldest one still sending its
    request, so a flood of slow clients cannot keep a probe from its answer.
    """

    def __init__(
        self,
        worker: SupportsHealth | Callable[[], Health],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: HealthLimits | None = None,
        leases: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise errors.InvalidArgument(f"host must be an address, got {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise errors.InvalidArgument(f"port must be 0-65535, got {port!r}")
        if limits is not None and not isinstance(limits, HealthLimits):
            raise errors.InvalidArgument(f"limits must be a HealthLimits, got {limits!r}")
        method = getattr(worker, "health", None)
        if callable(method):
            self._check: Callable[[], Health] = lambda: method(limits)
        elif callable(worker):
            self._check = worker
        else:
            raise errors.InvalidArgument(
                f"worker must have a health() method or be callable, got {worker!r}"
            )
        if leases is not None and not callable(leases):
            raise errors.InvalidArgument(f"leases must be callable or None, got {leases!r}")
        self._leases = leases
        self._address = (host, port)
        self._server: HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port it listens on (known once started)."""
        if self._server is None:
            return self._address[1]
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (once started)."""
        host = self._address[0]
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        if ":" in shown:
            shown = f"[{shown}]"
        return f"http://{shown}:{self.port}"

    def start(self) -> HealthServer:
        """Bind and start serving on a daemon thread (idempotent).

        Raises:
            BackendUnavailable: the address cannot be bound (in use, not local).
        """
        if self._server is not None:
            return self
        try:
            server = _make_server(self._address, self._check, self._leases)
        except OSError as exc:
            raise errors.BackendUnavailable(
                f"cannot serve health on {self._address[0]}:{self._address[1]}: {exc}"
            ) from exc
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="leasekit-health",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join()

    close = stop

    def __enter__(self) -> HealthServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _make_server(
    address: tuple[str, int],
    check: Callable[[], Health],
    leases: Callable[[], dict[str, Any]] | None = None,
) -> HTTPServer:
    """A bound HTTP server answering ``/livez`` and ``/readyz`` from ``check()``.

    And ``/leases`` from ``leases()``, when given.

    ``http.server`` is imported here, not with the module: ``import leasekit``
    stays as light as it was for workers that serve no health endpoint.
    """
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from .serving import REQUEST_TIMEOUT, BoundedThreadingMixIn, RequestHeadMixIn

    class Handler(RequestHeadMixIn, BaseHTTPRequestHandler):
        server_version = "leasekit-health"
        # A client that stalls mid-request is dropped, not waited for.
        timeout = REQUEST_TIMEOUT

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/leases" and leases is not None:
                try:
                    report = leases()
                except Exception:
                    _log.exception("lease report failed")
                    self._send(500, {"error": "the lease report failed"}, body)
                    return
                self._send(200, report, body)
                return
            if path not in ("/livez", "/readyz"):
                self._send(404, {"error": f"not found: {path or '/'}; try /livez or /readyz"}, body)
                return
            try:
                health = check()
            except Exception as exc:  # a broken check is not a healthy worker
                _log.exception("health check failed")
                self._send(503, {"error": f"the health check failed: {exc!r}"}, body)
                return
            ok = health.live if path == "/livez" else health.ready
            self._send(200 if ok else 503, health.as_dict(), body)

        def _send(self, status: int, payload: dict[str, Any], body: bool) -> None:
            data = (json.dumps(payload, indent=2) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            _log.debug("health %s", format % args)

    class Server(BoundedThreadingMixIn, HTTPServer):
        address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET

        def handle_error(self, request: Any, client_address: Any) -> None:
            """A client gone before its answer is routine (a prober's timeout); log, don't print.

            ``socketserver`` would print every handler error's traceback to stderr.
            """
            error = sys.exc_info()[1]
            if isinstance(error, ConnectionError):  # BrokenPipe, ConnectionReset, ...
                _log.debug("health: %s left before its answer: %r", client_address, error)
                return
            _log.error("health: a request from %s failed", client_address, exc_info=True)

    return Server(address, Handler)
