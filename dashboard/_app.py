"""The dashboard's pages and JSON API, over the public :class:`~leasekit.Queue` API."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import leasekit
from leasekit import errors
from leasekit.capabilities import COUNT_FIELDS
from leasekit.lease_report import event_order
from leasekit.queue import Queue
from leasekit.redaction import redact, redact_url
from leasekit.spi import DeadLetter, Driver

from ._guard import Access, Guard, Settings
from ._render import BadInput, parse_duration, render_body, seconds_text, sign, unsign
from ._sampler import ConsumerSource, QueueTarget, Sampler, min_interval

__all__ = ["DEFAULT_HOSTS", "Dashboard", "app"]

_HERE = Path(__file__).parent
#: Host headers answered by default: the loopback names.
DEFAULT_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
#: Dead letters per page: default and most.
PAGE = 20
MAX_PAGE = 100
#: Most dead letters one page or one dry run reads from the backend (the public
#: API reads from the oldest; deeper pages and filters see no further).
MAX_SCAN = 2000
#: Most dead letters one redrive moves (the ids counted by its dry run).
MAX_PLAN = 1000
#: Redrive plans kept (oldest dropped), and how long one stays valid (seconds).
MAX_PLANS = 32
PLAN_TTL = 600.0
#: Default redrive rate (dead letters per second).
REDRIVE_RATE = 50.0
#: Leases the Leases page lists (the oldest first); the rest are counted, not listed.
MAX_LEASE_ROWS = 500
#: Messages one peek shows, at most.
MAX_PEEK = 10
#: Largest test message body sent from the page (bytes).
MAX_SEND = 64 * 1024
#: Largest form a POST may carry (bytes): a test message, percent-encoded.
MAX_FORM = 4 * MAX_SEND

#: What looking at visible messages costs, by backend: (badge, explanation).
PEEK_COST: dict[str, tuple[str, str]] = {
    "memory": ("free", "a peek reads messages without leasing them."),
    "sqlite": ("free", "a peek reads messages without leasing them."),
    "postgresql": ("free", "a peek is a SELECT; no lease is taken."),
    "azure-storage-queue": ("free", "Peek Messages changes nothing (at most 32)."),
    "aliyun-mns": ("free", "BatchPeekMessage changes nothing (at most 16)."),
    "aws-sqs": (
        "counts as a delivery",
        "SQS cannot peek: a peek is a receive that raises each message's receive count "
        "and can push it into the dead-letter queue.",
    ),
    "azure-service-bus": (
        "cannot see locks",
        "a Service Bus peek shows messages whether or not they are locked.",
    ),
}


def _can_peek(driver: Driver) -> bool:
    return type(driver).peek is not Driver.peek


@dataclass(eq=False)
class Job:
    """A redrive running (or done) on a thread: exactly the ids its dry run counted."""

    id: str
    qid: str
    ids: frozenset[str]
    rate: float
    moved: list[str] = field(default_factory=list)
    state: str = "running"
    error: str | None = None
    started: float = field(default_factory=time.time)
    ended: float | None = None

    @property
    def failures(self) -> list[tuple[str, str]]:
        """Each counted id not moved, and why (once the job ended)."""
        if self.state == "running":
            return []
        why = self.error or "no longer a dead letter (re-driven or removed since the count)"
        moved = set(self.moved)
        return [(i, why) for i in sorted(self.ids - moved)]


@dataclass(eq=False)
class Plan:
    """A dry run's result: the ids it counted, for the confirm button."""

    id: str
    qid: str
    ids: tuple[str, ...]
    more: bool
    reason: str
    older_than: str
    made: float = field(default_factory=time.monotonic)


class Dashboard:
    """The state behind one dashboard app: its queues, consumers, plans and redrive jobs."""

    def __init__(
        self,
        queues: Sequence[str | Queue],
        *,
        consumers: Iterable[str] = (),
        conformance: Iterable[str | Path] = (),
        interval: float = 2.0,
        options: dict[str, Any] | None = None,
        redrive_rate: float = REDRIVE_RATE,
        sampler: Sampler | None = None,
    ) -> None:
        if isinstance(queues, str | Queue):
            queues = [queues]
        if not queues:
            raise errors.InvalidArgument("the dashboard needs at least one queue (URL or Queue)")
        for item in queues:
            if not isinstance(item, str | Queue):
                raise errors.InvalidArgument(f"a queue is a URL or a leasekit.Queue, got {item!r}")
        _positive(interval, "interval")
        _positive(redrive_rate, "redrive_rate")
        # Everything that can be refused first: no queue is opened for nothing.
        self.conformance = [_load_report(Path(p)) for p in conformance]
        self.consumers = [ConsumerSource(_leases_url(url)) for url in consumers]
        self.targets: dict[str, QueueTarget] = {}
        self.shown: dict[str, str] = {}
        self._owned: list[Queue] = []
        for item in queues:
            if isinstance(item, Queue):
                queue = item
                shown = f"{queue.driver.scheme}:{queue.name}"
            else:
                try:
                    queue = leasekit.open(item, **(options or {}))
                except BaseException:
                    for opened in self._owned:
                        opened.close()
                    raise
                self._owned.append(queue)
                shown = redact_url(item)
            qid = _slug(queue.name, self.targets)
            every = max(float(interval), min_interval(queue.driver.scheme))
            self.targets[qid] = QueueTarget(queue, every)
            self.shown[qid] = shown
        self.redrive_rate = float(redrive_rate)
        self.plans: OrderedDict[str, Plan] = OrderedDict()
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()
        self.sampler = sampler or Sampler.shared()
        for target in self.targets.values():
            self.sampler.add(target)
        for source in self.consumers:
            self.sampler.add(source)

    def viewed(self) -> None:
        """A page or API request came: keep sampling (see ``_sampler.IDLE``)."""
        self.sampler.wanted([*self.targets.values(), *self.consumers])

    def sample_now(self) -> None:
        """Sample every queue and consumer at once on this thread (tests, the first page)."""
        for target in self.targets.values():
            target.sample()
        for source in self.consumers:
            source.sample()

    def close(self) -> None:
        """Stop sampling; close the queues this dashboard opened from URLs."""
        for target in self.targets.values():
            self.sampler.remove(target)
        for source in self.consumers:
            self.sampler.remove(source)
        for queue in self._owned:
            queue.close()

    def target(self, qid: str) -> QueueTarget:
        """The queue ``qid``, or a 404 page."""
        target = self.targets.get(qid)
        if target is None:
            raise HTTPException(404, f"no queue {qid!r} on this dashboard")
        return target

    # ----------------------------------------------------------- figures

    def queue_row(self, qid: str) -> dict[str, Any]:
        """One queue's figures for the Queues page and ``/api/queues``."""
        target = self.targets[qid]
        queue = target.queue
        caps = queue.capabilities
        counted = caps.counted if caps.queue_stats else frozenset()
        last = target.samples[-1] if target.samples else None
        counts: dict[str, int | None] = {}
        for name in COUNT_FIELDS:
            counts[name] = None if last is None else getattr(last.stats, name)
        # The backlog charted: visible where the backend tells it, else all messages.
        field = next((f for f in ("visible", "total") if f in counted), None)
        points = [
            (s.at, getattr(s.stats, field))
            for s in target.samples
            if field is not None and getattr(s.stats, field) is not None
        ]
        # Its net rate between samples (in minus out, per second).
        rates = [(b - a) / (tb - ta) for (ta, a), (tb, b) in itertools.pairwise(points) if tb > ta]
        return {
            "id": qid,
            "name": queue.name,
            "backend": queue.driver.scheme,
            "url": self.shown[qid],
            "counts": counts,
            "not_reported": sorted(set(COUNT_FIELDS) - counted),
            "not_reported_why": (
                "this backend reports no counts (capabilities.queue_stats is false)"
                if not caps.queue_stats
                else "not in this backend's capabilities.counted"
            ),
            # Aged to now: the sample may be up to its interval old.
            "oldest_age": (
                None
                if last is None or last.stats.oldest_age is None
                else last.stats.oldest_age + max(0.0, time.time() - last.at)
            ),
            "oldest_age_why": (
                "the queue is empty"
                if caps.reports_oldest_age
                else "this backend does not report it (capabilities.reports_oldest_age is false)"
            ),
            "charted": field,
            "history": [value for _, value in points],
            "rates": rates,
            "rate_per_s": rates[-1] if rates else None,
            "sampled_at": None if last is None else last.at,
            "interval": target.interval,
            "error": target.error,
            "error_at": target.error_at,
        }

    def leases(self) -> dict[str, Any]:
        """Every reporting consumer's leases, and the lost-lease timelines merged by message."""
        now = time.time()
        rows: list[dict[str, Any]] = []
        consumers: list[dict[str, Any]] = []
        merged: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for source in self.consumers:
            report = source.report or {}
            stale = None if source.ok_at is None else now - source.ok_at
            who = report.get("consumer") or {}
            label = str(who.get("label") or source.url)
            consumers.append(
                {
                    "label": label,
                    "url": redact_url(source.url),
                    "error": source.error,
                    "report_age": stale,
                }
            )
            answering = source.error is None
            for lease in report.get("leases", []) if isinstance(report, dict) else []:
                if not isinstance(lease, dict):
                    continue
                expires = _num(lease.get("expires_at"))
                left = None if expires is None else expires - now
                if answering:
                    status = "held"
                elif left is not None and left < 0:
                    status = "lost (its consumer stopped answering and the lease ended)"
                else:
                    status = "unknown (its consumer stopped answering)"
                rows.append(
                    {
                        "consumer": label,
                        "queue": str(lease.get("queue", "")),
                        "message_id": str(lease.get("message_id", "")),
                        "leased_for": _age(now, lease.get("leased_at")),
                        "time_left": left,
                        "renewals": lease.get("renewals"),
                        "last_lateness": _num(lease.get("last_lateness")),
                        "delivery_count": lease.get("delivery_count"),
                        "checkpoint_age": _num(lease.get("checkpoint_age")),
                        "status": status,
                    }
                )
                if not answering and left is not None and left < 0:
                    key = (str(lease.get("queue", "")), str(lease.get("message_id", "")))
                    merged.setdefault(key, []).append(
                        {
                            "event": "lost",
                            "at": expires,
                            "consumer": label,
                            "delivery_count": lease.get("delivery_count"),
                            "reason": "its consumer stopped answering and the lease ended "
                            "(seen by the dashboard)",
                        }
                    )
            for timeline in report.get("timelines", []) if isinstance(report, dict) else []:
                if not isinstance(timeline, dict):
                    continue
                key = (str(timeline.get("queue", "")), str(timeline.get("message_id", "")))
                for event in timeline.get("events", []):
                    if isinstance(event, dict):
                        merged.setdefault(key, []).append(event)
        timelines: list[tuple[float, dict[str, Any]]] = []
        for (queue, message_id), events in merged.items():
            events.sort(key=event_order)
            latest = max(_num(e.get("at")) or 0.0 for e in events)
            timelines.append(
                (
                    latest,
                    {
                        "queue": queue,
                        "message_id": message_id,
                        "events": [
                            {
                                "event": str(e.get("event", "")),
                                "ago": _age(now, e.get("at")),
                                "at": _num(e.get("at")),
                                "consumer": str(e.get("consumer", "")),
                                "detail": _detail(e),
                            }
                            for e in events
                        ],
                    },
                )
            )
        timelines.sort(key=lambda item: -item[0])
        rows.sort(key=lambda row: -(row["leased_for"] or 0.0))
        return {
            "consumers": consumers,
            "leases": rows[:MAX_LEASE_ROWS],
            "leases_not_listed": max(0, len(rows) - MAX_LEASE_ROWS),
            "timelines": [t for _, t in timelines[:100]],
        }

    # -------------------------------------------------------- dead letters

    def read_dead_letters(
        self,
        qid: str,
        *,
        reason: str,
        older_than: float | None,
        offset: int,
        after: str | None,
        size: int,
    ) -> DeadLetterPage:
        """A page of ``qid``'s dead letters matching the filter, after the dead letter ``after``.

        Where the backend pages (``Queue.peek_dead_letters(after=...)``) a page reads
        from where the last one ended: a page and one more unfiltered, at most
        :data:`MAX_SCAN` rows while a filter searches (the next page goes on from
        there). Elsewhere it reads from the oldest, ``offset`` plus a page, and a
        filter sees the oldest ``MAX_SCAN`` only.
        """
        target = self.targets[qid]
        if target.can_page is not False:
            try:
                page = _read_after(target.queue, reason, older_than, after, size)
                if after is not None:
                    target.can_page = True
                return page
            except errors.UnsupportedOperation:
                target.can_page = False
        return _read_from_oldest(target.queue, reason, older_than, offset, size)

    def dry_run(self, qid: str, reason: str, older_text: str) -> Plan:
        """Count the dead letters a redrive with this filter would move, and keep their ids."""
        older = parse_duration(older_text, "older than")
        queue = self.targets[qid].queue
        letters = queue.peek_dead_letters(MAX_SCAN)
        ids: list[str] = []
        for letter in letters:
            if _matches(letter, reason, older) and letter.id not in ids:
                ids.append(letter.id)
        more = len(ids) > MAX_PLAN or len(letters) >= MAX_SCAN
        plan = Plan(secrets.token_urlsafe(12), qid, tuple(ids[:MAX_PLAN]), more, reason, older_text)
        with self._lock:
            self.plans[plan.id] = plan
            while len(self.plans) > MAX_PLANS:
                self.plans.popitem(last=False)
        return plan

    def start_redrive(self, qid: str, plan_id: str) -> Job:
        """Move exactly the dead letters ``plan_id`` counted, on a thread, at the rate limit."""
        with self._lock:
            plan = self.plans.pop(plan_id, None)
        if plan is None or plan.qid != qid or time.monotonic() - plan.made > PLAN_TTL:
            raise BadInput("this dry run is unknown or expired; count again")
        if not plan.ids:
            raise BadInput("the dry run counted no dead letters: nothing to redrive")
        job = Job(uuid.uuid4().hex[:12], qid, frozenset(plan.ids), self.redrive_rate)
        with self._lock:
            self.jobs[job.id] = job
            while len(self.jobs) > MAX_PLANS:
                self.jobs.popitem(last=False)
        queue = self.targets[qid].queue
        threading.Thread(
            target=self._redrive, args=(queue, job), name="leasekit-dashboard-redrive", daemon=True
        ).start()
        return job

    @staticmethod
    def _redrive(queue: Queue, job: Job) -> None:
        from leasekit.redrive import redrive

        gap = 1.0 / job.rate if job.rate > 0 else 0.0
        last = [time.monotonic() - gap]

        def progress(letter: DeadLetter) -> None:
            job.moved.append(letter.id)
            wait = last[0] + gap - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the rate limit: one dead letter per gap
            last[0] = time.monotonic()

        try:
            redrive(queue, len(job.ids), where=lambda dl: dl.id in job.ids, progress=progress)
            job.state = "done"
        except Exception as exc:
            job.error = f"{type(exc).__name__}: {redact(str(exc))}"
            job.state = "failed"
        finally:
            job.ended = time.time()


# ------------------------------------------------------------------ helpers


@dataclass(frozen=True)
class DeadLetterPage:
    """One page of dead letters and where the next one starts."""

    letters: list[DeadLetter]
    #: The next page reads after this dead letter (``None``: from the offset).
    next_after: str | None
    more: bool
    #: Rows this page read from the backend.
    scanned: int
    #: A filter's search stopped at ``MAX_SCAN`` rows before filling the page.
    capped: bool


def _read_after(
    queue: Queue, reason: str, older_than: float | None, after: str | None, size: int
) -> DeadLetterPage:
    filtered = bool(reason) or older_than is not None
    chunk = max(2 * size, 100) if filtered else size + 1
    matches: list[DeadLetter] = []
    scanned = 0
    last = after
    exhausted = False
    while len(matches) <= size and scanned < MAX_SCAN:
        want = min(chunk, MAX_SCAN - scanned)
        batch = (
            queue.peek_dead_letters(want)
            if last is None
            else queue.peek_dead_letters(want, after=last)
        )
        scanned += len(batch)
        matches += [dl for dl in batch if _matches(dl, reason, older_than)]
        if batch:
            last = batch[-1].id
        if len(batch) < want:
            exhausted = True
            break
    page = matches[:size]
    if len(matches) > size:
        return DeadLetterPage(page, page[-1].id, True, scanned, False)
    if exhausted:
        return DeadLetterPage(page, None, False, scanned, False)
    return DeadLetterPage(page, last, True, scanned, True)  # the search goes on from `last`


def _read_from_oldest(
    queue: Queue, reason: str, older_than: float | None, offset: int, size: int
) -> DeadLetterPage:
    filtered = bool(reason) or older_than is not None
    want = MAX_SCAN if filtered else min(offset + size + 1, MAX_SCAN)
    letters = queue.peek_dead_letters(want)
    matching = [dl for dl in letters if _matches(dl, reason, older_than)]
    page = matching[offset : offset + size]
    more = len(matching) > offset + size and offset + size < MAX_SCAN
    return DeadLetterPage(page, None, more, len(letters), len(letters) >= MAX_SCAN)


_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise errors.InvalidArgument(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _slug(name: str, taken: dict[str, Any]) -> str:
    base = _SLUG.sub("-", name).strip("-")[:60] or "queue"
    for n in itertools.count(1):
        qid = base if n == 1 else f"{base}~{n}"
        if qid not in taken:
            return qid
    raise AssertionError("unreachable")  # pragma: no cover


def _leases_url(url: str) -> str:
    from leasekit.watch import check_metrics_url

    check_metrics_url(url)
    url = url.rstrip("/")
    return url if url.endswith("/leases") else url + "/leases"


def _load_report(path: Path) -> dict[str, Any]:
    """A conformance report as ``{"backends": {backend: {property: {result, reason}}}}``.

    Reads both shapes the suite writes: one backend (``backend`` and
    ``properties``) and a matrix (``backends``, as ``make compatibility`` makes).
    """
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a conformance report")
        backends = data.get("backends")
        if not isinstance(backends, dict) or not backends:
            backends = {str(data.get("backend", path.stem)): data.get("properties")}
        table: dict[str, dict[str, dict[str, str]]] = {}
        for backend, properties in backends.items():
            if not isinstance(properties, dict):
                raise ValueError("not a conformance report")
            table[str(backend)] = {
                str(prop): {
                    "result": str(row.get("result", "")),
                    "reason": str(row.get("reason", "")),
                }
                for prop, row in properties.items()
                if isinstance(row, dict)
            }
    except (OSError, ValueError) as exc:
        raise errors.InvalidArgument(
            f"cannot read the conformance report {path.name!r} (made by "
            f"`leasekit conformance URL --json PATH`): {exc}"
        ) from exc
    return {"backends": table}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _age(now: float, at: Any) -> float | None:
    at = _num(at)
    return None if at is None else now - at


def _detail(event: dict[str, Any]) -> str:
    parts = []
    if event.get("delivery_count") is not None:
        parts.append(f"delivery {event['delivery_count']}")
    if event.get("renewals"):
        parts.append(f"{event['renewals']} renewal(s)")
    if _num(event.get("lateness")) is not None:
        parts.append(f"last {seconds_text(_num(event.get('lateness')))} late")
    if event.get("reason"):
        parts.append(str(event["reason"]))
    return "; ".join(parts)


def _matches(letter: DeadLetter, reason: str, older_than: float | None) -> bool:
    if reason and reason.lower() not in (letter.reason or "").lower():
        return False
    if older_than is not None:
        if letter.enqueued_at is None:
            return False
        age = (datetime.now(UTC) - letter.enqueued_at).total_seconds()
        if age < older_than:
            return False
    return True


# -------------------------------------------------------------------- pages


def app(
    queues: Sequence[str | Queue] | str | Queue,
    *,
    read_only: bool = False,
    token: str | None = None,
    allowed_hosts: Iterable[str] = DEFAULT_HOSTS,
    access: Callable[[Request], Access] | None = None,
    consumers: Iterable[str] = (),
    conformance: Iterable[str | Path] = (),
    interval: float = 2.0,
    max_connections: int = 64,
    redrive_rate: float = REDRIVE_RATE,
    options: dict[str, Any] | None = None,
) -> Starlette:
    """The dashboard as an ASGI app (mount it under a prefix, or serve it with uvicorn).

    Parameters
    ----------
        queues: queue URLs (opened here, closed on shutdown) or open :class:`~leasekit.Queue`
            objects (the caller keeps them).
        read_only: refuse every change (redrive, send, peek), on the server.
        token: if given, a browser must first open a page with ``?token=TOKEN``;
            it gets an HttpOnly SameSite=Strict session cookie in exchange.
        allowed_hosts: the ``Host`` header values answered (default: loopback names).
        access: ``access(request)`` -> ``"all"``, ``"read-only"`` or ``"forbidden"``,
            asked on every request (the host's own login); ``read_only`` caps it.
        consumers: health-server URLs of consumers serving ``/leases`` (see
            :mod:`leasekit.lease_report`).
        conformance: JSON reports of ``leasekit conformance URL --json PATH``.
        interval: seconds between samples of a queue's counts (never below the
            backend's minimum, see :data:`leasekit.dashboard._sampler.MIN_INTERVAL`).
        max_connections: requests served at once (503 beyond).
        redrive_rate: most dead letters a redrive moves per second.
        options: backend options for the URLs (credentials: never in a URL).

    The :class:`Dashboard` behind it is ``app.state.dashboard``.
    """
    if isinstance(queues, str | Queue):
        queues = [queues]
    if isinstance(max_connections, bool) or not isinstance(max_connections, int):
        raise errors.InvalidArgument(f"max_connections must be an int, got {max_connections!r}")
    if max_connections < 1:
        raise errors.InvalidArgument(f"max_connections must be at least 1, got {max_connections}")
    dash = Dashboard(
        queues,
        consumers=consumers,
        conformance=conformance,
        interval=interval,
        options=options,
        redrive_rate=redrive_rate,
    )
    settings = Settings(
        secret=secrets.token_bytes(32),
        token=token,
        read_only=read_only,
        allowed_hosts=allowed_hosts,
        access=access,
        max_connections=max_connections,
    )
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_HERE / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["dur"] = seconds_text
    env.filters["num"] = lambda v: "—" if v is None else f"{v:,}"
    env.filters["ts"] = lambda v: (
        "—" if v is None else datetime.fromtimestamp(v, UTC).strftime("%H:%M:%S UTC")
    )
    views = _Views(dash, settings, env)
    routes = [
        Route("/", views.queues),
        Route("/queues/{qid}", views.queue),
        Route("/queues/{qid}/dead-letters", views.dead_letters),
        Route("/queues/{qid}/redrive", views.redrive),
        Route("/queues/{qid}/redrive", views.redrive_run, methods=["POST"]),
        Route("/jobs/{job_id}", views.job),
        Route("/queues/{qid}/browse", views.browse),
        Route("/queues/{qid}/peek", views.peek, methods=["POST"]),
        Route("/queues/{qid}/send", views.send, methods=["POST"]),
        Route("/leases", views.leases),
        Route("/capabilities", views.capabilities),
        Route("/api/queues", views.api_queues),
        Route("/api/queues/{qid}/dead-letters", views.api_dead_letters),
        Route("/api/leases", views.api_leases),
        Route("/api/capabilities", views.api_capabilities),
        Route("/api/jobs/{job_id}", views.api_job),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            dash.close()

    inner = Starlette(
        routes=routes,
        exception_handlers={
            HTTPException: views.http_error,
            BadInput: views.bad_input,
            errors.LeaseError: views.backend_error,
        },
        lifespan=lifespan,
    )
    inner.add_middleware(Guard, settings=settings)
    inner.state.dashboard = dash
    inner.state.settings = settings
    return inner


class _Views:
    """The request handlers (each checks access itself as well as the guard)."""

    def __init__(self, dash: Dashboard, settings: Settings, env: jinja2.Environment) -> None:
        self.dash = dash
        self.settings = settings
        self.env = env

    # ------------------------------------------------------------ plumbing

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        self.dash.viewed()
        access = self._access(request)
        html = self.env.get_template(template).render(
            base=request.scope.get("root_path", "").rstrip("/"),
            access=access,
            can_change=access == "all",
            csrf=self.settings.csrf,
            queues=[(qid, t.queue.name) for qid, t in self.dash.targets.items()],
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def _access(self, request: Request) -> Access:
        level = request.scope.get("state", {}).get("access")
        if level is None:
            level = self.settings.access_for(request)
        return level  # type: ignore[no-any-return]

    async def _form(self, request: Request) -> dict[str, str]:
        """The POST's form, after checking access and its CSRF token (else 403)."""
        if self._access(request) != "all":
            raise HTTPException(403, "This dashboard is read-only: changes are refused.")
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            raise HTTPException(
                415, "Changes take an HTML form (application/x-www-form-urlencoded)."
            )
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_FORM:
                raise HTTPException(413, f"A form is at most {MAX_FORM:,} bytes.")
        try:
            form = dict(parse_qsl(raw.decode("utf-8"), max_num_fields=20))
        except (UnicodeDecodeError, ValueError):
            raise BadInput("the form does not parse") from None
        given = form.get("csrf")
        if not isinstance(given, str) or not secrets.compare_digest(given, self.settings.csrf):
            raise HTTPException(403, "The form's CSRF token is missing or wrong; reload the page.")
        return form

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if _wants_json(request):
            return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
        return self.page(request, "error.html", exc.status_code, title="Error", message=exc.detail)

    async def bad_input(self, request: Request, exc: Exception) -> Response:
        if _wants_json(request):
            return JSONResponse({"error": str(exc)}, status_code=400)
        return self.page(request, "error.html", 400, title="Bad request", message=str(exc))

    async def backend_error(self, request: Request, exc: Exception) -> Response:
        text = f"{type(exc).__name__}: {redact(str(exc))}"
        status, title = 502, "The backend said no"
        if isinstance(exc, errors.BackendUnavailable):
            status, title = 503, "The backend is not answering"
        elif isinstance(exc, errors.InvalidArgument):
            status, title = 400, "Bad request"
        elif isinstance(exc, errors.QueueNotFound):
            status, title = 404, "The queue does not exist"
        elif isinstance(exc, errors.UnsupportedOperation):
            status, title = 409, "This backend cannot do that"
        if _wants_json(request):
            return JSONResponse({"error": text}, status_code=status)
        return self.page(request, "error.html", status, title=title, message=text)

    # --------------------------------------------------------------- pages

    async def queues(self, request: Request) -> Response:
        rows = [self.dash.queue_row(qid) for qid in self.dash.targets]
        return self.page(request, "queues.html", rows=rows, now=time.time(), refresh=2)

    async def queue(self, request: Request) -> Response:
        qid = request.path_params["qid"]
        target = self.dash.target(qid)
        return self.page(
            request,
            "queue.html",
            row=self.dash.queue_row(qid),
            buttons=_buttons(target.queue),
            now=time.time(),
            refresh=2,
        )

    async def leases(self, request: Request) -> Response:
        return self.page(
            request,
            "leases.html",
            data=self.dash.leases(),
            have_consumers=bool(self.dash.consumers),
            refresh=1,
        )

    async def dead_letters(self, request: Request) -> Response:
        qid = request.path_params["qid"]
        data = await self._dead_letter_page(request, qid)
        return self.page(request, "dead_letters.html", qid=qid, **data)

    async def _dead_letter_page(self, request: Request, qid: str) -> dict[str, Any]:
        target = self.dash.target(qid)
        params = request.query_params
        reason = (params.get("reason") or "").strip()
        if len(reason) > 200:
            raise BadInput("the reason filter is at most 200 characters")
        older_text = (params.get("older_than") or "").strip()
        older = parse_duration(older_text, "older than")
        size_text = params.get("size") or str(PAGE)
        if not size_text.isdigit() or not 1 <= int(size_text) <= MAX_PAGE:
            raise BadInput(f"size takes 1 to {MAX_PAGE}")
        size = int(size_text)
        offset = 0
        after: str | None = None
        cursor = params.get("cursor")
        if cursor:
            payload = unsign(self.settings.secret, cursor)
            if (
                payload.get("q") != qid
                or payload.get("r") != reason
                or payload.get("o") != older_text
                or not isinstance(payload.get("n"), int)
                or not 0 <= payload["n"] <= 10**9
                or not isinstance(payload.get("a"), str | None)
            ):
                raise BadInput("this cursor belongs to another queue or filter; start again")
            offset = payload["n"]
            after = payload["a"]
        if not target.queue.capabilities.inspect_dead_letters:
            raise errors.UnsupportedOperation(
                f"{target.queue.driver.scheme} cannot read dead letters back "
                "(capabilities.inspect_dead_letters is false)"
            )
        found = await run_in_threadpool(
            partial(
                self.dash.read_dead_letters,
                qid,
                reason=reason,
                older_than=older,
                offset=offset,
                after=after,
                size=size,
            )
        )
        page = found.letters
        next_cursor = None
        if found.more:
            next_cursor = sign(
                self.settings.secret,
                {
                    "q": qid,
                    "r": reason,
                    "o": older_text,
                    "n": offset + len(page),
                    "a": found.next_after,
                },
            )
        now = datetime.now(UTC)
        letters = [
            {
                "id": dl.id,
                "reason": dl.reason,
                "delivery_count": dl.delivery_count,
                "age": None if dl.enqueued_at is None else (now - dl.enqueued_at).total_seconds(),
                "properties": sorted(dl.properties.items()),
                "body": render_body(dl.body),
            }
            for dl in page
        ]
        return {
            "letters": letters,
            "reason": reason,
            "older_than": older_text,
            "size": size,
            "offset": offset,
            "next_cursor": next_cursor,
            "scanned": found.scanned,
            "capped": found.capped,
            "paged": self.dash.targets[qid].can_page is not False,
            "max_scan": MAX_SCAN,
        }

    async def redrive(self, request: Request) -> Response:
        qid = request.path_params["qid"]
        target = self.dash.target(qid)
        params = request.query_params
        reason = (params.get("reason") or "").strip()[:200]
        older_text = (params.get("older_than") or "").strip()
        plan = None
        why_not = _redrive_why_not(target.queue)
        if params.get("dry_run") and why_not is None:
            plan = await run_in_threadpool(self.dash.dry_run, qid, reason, older_text)
        return self.page(
            request,
            "redrive.html",
            qid=qid,
            reason=reason,
            older_than=older_text,
            plan=plan,
            why_not=why_not,
            rate=self.dash.redrive_rate,
            max_plan=MAX_PLAN,
        )

    async def redrive_run(self, request: Request) -> Response:
        qid = request.path_params["qid"]
        target = self.dash.target(qid)
        form = await self._form(request)
        why_not = _redrive_why_not(target.queue)
        if why_not is not None:
            raise BadInput(why_not)
        job = self.dash.start_redrive(qid, form.get("plan", ""))
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{base}/jobs/{job.id}", status_code=303)

    async def job(self, request: Request) -> Response:
        job = self.dash.jobs.get(request.path_params["job_id"])
        if job is None:
            raise HTTPException(404, "no such redrive (jobs are kept while the dashboard runs)")
        return self.page(
            request,
            "job.html",
            job=job,
            qid=job.qid,
            refresh=1 if job.state == "running" else 0,
        )

    async def browse(self, request: Request) -> Response:
        qid = request.path_params["qid"]
        return self.page(request, "browse.html", **self._browse(qid), peeked=None, sent=None)

    def _browse(self, qid: str) -> dict[str, Any]:
        target = self.dash.target(qid)
        driver = target.queue.driver
        cost = PEEK_COST.get(driver.scheme, ("unknown cost", "this backend does not say."))
        return {
            "qid": qid,
            "can_peek": _can_peek(driver),
            "cost": cost,
            "max_peek": MAX_PEEK,
            "max_send": MAX_SEND,
        }

    async def peek(self, request: Request) -> Response:
        qid = request.path_params["qid"]
        target = self.dash.target(qid)
        form = await self._form(request)
        count = form.get("count", "5")
        if not count.isdigit() or not 1 <= int(count) <= MAX_PEEK:
            raise BadInput(f"peek takes 1 to {MAX_PEEK} messages")
        driver = target.queue.driver
        if not _can_peek(driver):
            raise BadInput(f"{driver.scheme} cannot peek at visible messages")
        try:
            raws = await run_in_threadpool(driver.peek, int(count))
        except errors.LeaseError:
            raise
        except Exception as exc:  # the driver's raw error (Queue has no peek to map it)
            raise errors.BackendError(
                f"peek on {target.queue.name!r} failed: {type(exc).__name__}: {redact(str(exc))}"
            ) from exc
        peeked = [
            {
                "id": raw.id,
                "delivery_count": raw.delivery_count,
                "properties": sorted(raw.properties.items()),
                "body": render_body(raw.body),
            }
            for raw in raws
        ]
        return self.page(request, "browse.html", **self._browse(qid), peeked=peeked, sent=None)

    async def send(self, request: Request) -> Response:
        qid = request.path_params["qid"]
        target = self.dash.target(qid)
        form = await self._form(request)
        body = form.get("body", "").encode("utf-8", "surrogatepass")
        if len(body) > MAX_SEND:
            raise BadInput(f"a test message is at most {MAX_SEND:,} bytes")
        caps = target.queue.capabilities
        properties = {"leasekit-dashboard": "test message"} if caps.supports_properties else None
        message_id = await run_in_threadpool(lambda: target.queue.send(body, properties=properties))
        return self.page(request, "browse.html", **self._browse(qid), peeked=None, sent=message_id)

    async def capabilities(self, request: Request) -> Response:
        rows = []
        for qid, target in self.dash.targets.items():
            caps = target.queue.capabilities.as_dict()
            rows.append(
                {
                    "id": qid,
                    "name": target.queue.name,
                    "backend": target.queue.driver.scheme,
                    "caps": sorted(caps.items()),
                    "buttons": _buttons(target.queue),
                }
            )
        return self.page(request, "capabilities.html", rows=rows, reports=self.dash.conformance)

    # ----------------------------------------------------------------- API

    async def api_queues(self, request: Request) -> Response:
        self.dash.viewed()
        return JSONResponse({"queues": [self.dash.queue_row(qid) for qid in self.dash.targets]})

    async def api_leases(self, request: Request) -> Response:
        self.dash.viewed()
        return JSONResponse(self.dash.leases())

    async def api_dead_letters(self, request: Request) -> Response:
        qid = request.path_params["qid"]
        data = await self._dead_letter_page(request, qid)
        letters = [
            {
                "id": dl["id"],
                "reason": dl["reason"],
                "delivery_count": dl["delivery_count"],
                "age": dl["age"],
                "properties": dict(dl["properties"]),
                "size": dl["body"].size,
                "text": dl["body"].text,
                "text_cut": dl["body"].text_cut,
            }
            for dl in data["letters"]
        ]
        return JSONResponse(
            {"letters": letters, "next_cursor": data["next_cursor"], "scanned": data["scanned"]}
        )

    async def api_capabilities(self, request: Request) -> Response:
        return JSONResponse(
            {
                "queues": [
                    {
                        "id": qid,
                        "backend": t.queue.driver.scheme,
                        "capabilities": t.queue.capabilities.as_dict(),
                        "actions": {
                            name: {"works": works, "why_not": why}
                            for name, works, why in _buttons(t.queue)
                        },
                    }
                    for qid, t in self.dash.targets.items()
                ],
                "conformance": self.dash.conformance,
            }
        )

    async def api_job(self, request: Request) -> Response:
        job = self.dash.jobs.get(request.path_params["job_id"])
        if job is None:
            raise HTTPException(404, "no such redrive")
        return JSONResponse(
            {
                "state": job.state,
                "counted": len(job.ids),
                "moved": len(job.moved),
                "failures": [{"id": i, "why": w} for i, w in job.failures],
            }
        )


def _wants_json(request: Request) -> bool:
    """Whether the request is the JSON API's (its errors are JSON too)."""
    root = request.scope.get("root_path", "")
    return request.url.path[len(root) :].startswith("/api/")


def _redrive_why_not(queue: Queue) -> str | None:
    caps = queue.capabilities
    if not caps.inspect_dead_letters:
        return (
            f"{queue.driver.scheme} cannot read dead letters back "
            "(capabilities.inspect_dead_letters is false), so a dry run cannot count them"
        )
    if caps.native_dead_letter and type(queue.driver).dead_letter_store is Driver.dead_letter_store:
        return f"{queue.driver.scheme} has no dead-letter store to redrive from"
    return None


def _buttons(queue: Queue) -> list[tuple[str, bool, str]]:
    """Each action: whether it works on this queue, and why not."""
    caps = queue.capabilities
    driver = queue.driver
    why_redrive = _redrive_why_not(queue)
    return [
        (
            "counts",
            caps.queue_stats,
            "" if caps.queue_stats else "the backend reports no counts (queue_stats)",
        ),
        (
            "dead letters",
            caps.inspect_dead_letters,
            "" if caps.inspect_dead_letters else "cannot read dead letters back",
        ),
        ("redrive", why_redrive is None, why_redrive or ""),
        (
            "peek",
            _can_peek(driver),
            "" if _can_peek(driver) else "the backend's driver cannot peek",
        ),
        ("send a test message", True, ""),
    ]
