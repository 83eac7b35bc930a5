"""One sampler per process: every queue's counts and every consumer's leases, in the background.

Pages never call a backend for counts: they read the samples kept here. Each
queue is sampled no more often than its backend's minimum interval
(:data:`MIN_INTERVAL`), however many pages, tabs or mounted apps look at it, so
no page multiplies calls to a cloud service. A failed sample is kept as the
queue's error (redacted), shown by the page, and the next one is tried on
schedule: the page recovers by itself when the backend does.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from leasekit import errors
from leasekit.queue import Queue
from leasekit.redaction import redact
from leasekit.spi import QueueStats

__all__ = ["IDLE", "MIN_INTERVAL", "ConsumerSource", "QueueTarget", "Sampler"]

#: Shortest time between two samples of one queue, by backend scheme. Local
#: stores are cheap to count; a cloud service bills (or throttles) each call.
MIN_INTERVAL: dict[str, float] = {
    "memory": 0.5,
    "sqlite": 1.0,
    "postgresql": 2.0,
    "azure-storage-queue": 10.0,
    "azure-service-bus": 10.0,
    "aws-sqs": 10.0,
    "aliyun-mns": 10.0,
    "gcp-pubsub": 10.0,
}
#: For a backend not listed above.
DEFAULT_MIN_INTERVAL = 5.0
#: Samples kept per queue (the chart's width).
HISTORY = 120
#: How often a consumer's ``/leases`` is read, and how long one read may take.
CONSUMER_INTERVAL = 1.0
CONSUMER_TIMEOUT = 2.0
#: Seconds after the last page or API request for which a dashboard's queues and
#: consumers are still sampled; then sampling stops until the next request (so a
#: dashboard left running and unwatched makes no calls to a cloud service).
IDLE = 120.0
#: Largest ``/leases`` answer read (bytes).
MAX_REPORT = 4 * 1024 * 1024


#: Consumers are reached directly, never through an HTTP(S)_PROXY from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Sample:
    """A queue's counts at one moment (wall-clock seconds)."""

    at: float
    stats: QueueStats


@dataclass(eq=False)
class QueueTarget:
    """One queue a dashboard shows, and what the sampler last learnt about it."""

    queue: Queue
    interval: float
    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=HISTORY))
    error: str | None = None
    error_at: float | None = None
    next_at: float = 0.0
    sampling: bool = False
    #: Sampled only until then (monotonic): a dashboard nobody looks at stops calling.
    wanted_until: float = field(default_factory=lambda: time.monotonic() + IDLE)
    #: Whether the backend pages dead letters (``peek_dead_letters(after=...)``);
    #: ``None`` until a page found out.
    can_page: bool | None = None

    def sample(self) -> None:
        """Read the counts now (on the sampler's thread, or a test's)."""
        now = time.time()
        try:
            stats = self.queue.stats()
        except errors.UnsupportedOperation:
            self.error = None
            return
        except Exception as exc:  # a backend down must not stop the sampler
            self.error = f"{type(exc).__name__}: {redact(str(exc))}"
            self.error_at = now
            return
        self.samples.append(Sample(now, stats))
        self.error = None


@dataclass(eq=False)
class ConsumerSource:
    """A consumer's ``/leases`` endpoint and its last report."""

    url: str
    report: dict[str, Any] | None = None
    ok_at: float | None = None
    error: str | None = None
    next_at: float = 0.0
    sampling: bool = False
    #: Sampled only until then (monotonic): a dashboard nobody looks at stops calling.
    wanted_until: float = field(default_factory=lambda: time.monotonic() + IDLE)

    def sample(self) -> None:
        """Read the consumer's report now."""
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        try:
            with _DIRECT.open(request, timeout=CONSUMER_TIMEOUT) as response:
                data = json.loads(response.read(MAX_REPORT))
            if not isinstance(data, dict) or not isinstance(data.get("leases"), list):
                raise ValueError("not a lease report")
        except urllib.error.HTTPError as exc:
            self.error = f"HTTP {exc.code} (is the consumer's HealthServer given leases=?)"
            return
        except Exception as exc:
            reason = getattr(exc, "reason", None) or exc
            self.error = f"not answering: {redact(str(reason))}"
            return
        self.report = data
        self.ok_at = time.time()
        self.error = None


class Sampler:
    """The process's one background sampler (:meth:`shared`); targets come and go with apps."""

    _shared: ClassVar[Sampler | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._targets: list[QueueTarget | ConsumerSource] = []
        self._thread: threading.Thread | None = None

    @classmethod
    def shared(cls) -> Sampler:
        """The process's sampler (made on first use)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = Sampler()
            return cls._shared

    def add(self, target: QueueTarget | ConsumerSource) -> None:
        """Sample ``target`` from now on."""
        with self._lock:
            if target not in self._targets:
                self._targets.append(target)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="leasekit-dashboard-sampler", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def wanted(self, targets: Iterable[QueueTarget | ConsumerSource]) -> None:
        """Someone looks at ``targets``: keep sampling them for :data:`IDLE` seconds more."""
        now = time.monotonic()
        woke = False
        for target in targets:
            woke = woke or target.wanted_until < now
            target.wanted_until = now + IDLE
        if woke:
            self._wake.set()

    def remove(self, target: QueueTarget | ConsumerSource) -> None:
        """Stop sampling ``target``."""
        with self._lock:
            if target in self._targets:
                self._targets.remove(target)

    def _run(self) -> None:
        while True:
            self._wake.wait(0.1)
            self._wake.clear()
            now = time.monotonic()
            with self._lock:
                due = [
                    t
                    for t in self._targets
                    if t.next_at <= now and not t.sampling and t.wanted_until >= now
                ]
                for target in due:
                    target.sampling = True
            for target in due:
                # Each on a short-lived thread: one slow backend delays no other queue.
                threading.Thread(
                    target=self._sample,
                    args=(target,),
                    name="leasekit-dashboard-sample",
                    daemon=True,
                ).start()

    @staticmethod
    def _sample(target: QueueTarget | ConsumerSource) -> None:
        interval = target.interval if isinstance(target, QueueTarget) else CONSUMER_INTERVAL
        sample: Callable[[], None] = target.sample
        try:
            sample()
        finally:
            target.next_at = time.monotonic() + interval
            target.sampling = False


def min_interval(scheme: str) -> float:
    """The shortest time between two samples of a queue on ``scheme``."""
    return MIN_INTERVAL.get(scheme, DEFAULT_MIN_INTERVAL)
