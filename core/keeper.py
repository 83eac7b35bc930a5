"""The lease keeper: renews held leases before they expire, and never pretends.

A worker takes a short physical lease and the keeper renews it while the work
goes on, so a crash is recovered after one short lease, not a long one, and a
hung worker lets go after ``max_lifetime``. Leases longer than the backend can
hold physically (Service Bus's fixed lock) are kept the same way, in steps.

Design: one scheduler thread keeps a timer wheel of every held lease and wakes
at the earliest renewal point; due leases are grouped by queue and duration and
renewed in the backend's batch size. Each queue has its own *lane* of renewal
threads, so one unresponsive endpoint delays no other queue's renewals.

The keeper never pretends: a renewal call carries a deadline of the time left
on its leases (it never outlives them), and while it is in flight the
scheduler watches each lease's own deadline (:attr:`Lease.time_left`, core's
clock). A lease whose deadline passes is marked lost then, within a scheduler
tick, whether or not its renewal call has returned; on a backend that cannot
detect stale receipts, a renewal that returns after the deadline counts as
lost too. No lock is held across a network call, so ``lease.complete()`` and
``lease.lost`` never wait for a hung renewal, and :meth:`LeaseKeeper.stop`
returns within ``stop_timeout`` seconds, cancelling queued renewals.

Progress is measured, not guessed (:meth:`LeaseKeeper.progress`, for health
checks): the scheduler stamps a heartbeat each time it wakes, at least every
``HEARTBEAT`` seconds, and each lease remembers the renewal point it is waiting
on, so "renewals due but not done, and for how long" is read off the held
leases when asked, at no cost to the renewals themselves.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING

from . import errors
from .lease import Lease
from .message import LeaseState
from .options import MAX_SECONDS, as_items, check_callable, check_int, check_number

if TYPE_CHECKING:
    from .queue import Queue

__all__ = ["KeeperProgress", "KeeperStats", "LeaseKeeper"]

_log = logging.getLogger("leasekit.keeper")

#: Width of a timer-wheel bucket: a renewal may run up to this much early.
TICK = 0.01
#: Due renewals within this window are renewed together with the earliest one;
#: renewing a little early costs nothing and turns 100k timers into batches.
COALESCE = 0.05
#: Renewal points are spread over this fraction of the lease (earlier, never later).
JITTER = 0.1
#: Default for ``stop_timeout``: how long ``stop()`` waits for renewal calls in flight.
STOP_TIMEOUT = 2.0
#: A failed renewal is retried at most this fraction of the lease's time left
#: later (the retry policy's backoff, up to 2 s, is cut to it): a network back
#: before the lease ends still gets a few tries, not one drawn after the end.
RETRY_WITHIN = 0.25
#: The scheduler wakes at least this often, idle or not, and stamps its heartbeat:
#: a heartbeat older than this (plus scheduling noise) means the scheduler is stuck.
HEARTBEAT = 1.0
#: Emptied timer-wheel buckets kept for reuse (their lists), at most.
SPARE_BUCKETS = 1024
#: Whole-run lateness is counted by the millisecond up to this many (later: one bucket).
LATENESS_MS = 10_000


@dataclass
class KeeperStats:
    """Counters of what the keeper did (read them any time; approximate while running)."""

    held: int = 0
    renewed: int = 0
    renew_calls: int = 0
    lost: int = 0
    transient_failures: int = 0
    released_at_max_lifetime: int = 0
    #: Renewal lateness (seconds after the planned renewal point), last 100k samples.
    lateness: list[float] = field(default_factory=list, repr=False)
    #: Renewal lateness over the keeper's whole life, by the millisecond: ``[0]``
    #: renewals that started on time (or early), ``[i]`` those late by more than
    #: ``i - 1`` and at most ``i`` ms, the last those later than that. Fixed size.
    lateness_counts: list[int] = field(default_factory=lambda: [0] * (LATENESS_MS + 2), repr=False)
    #: The latest renewal over the keeper's whole life (seconds).
    lateness_max: float = 0.0

    def lateness_percentile(self, q: float, *, whole_run: bool = False) -> float:
        """The ``q`` quantile (0–1) of renewal lateness in seconds; 0 with no samples.

        Of the last 100,000–200,000 renewals (:attr:`lateness`), or with
        ``whole_run`` of every renewal since the keeper started
        (:attr:`lateness_counts`: rounded up to the millisecond, never above
        :attr:`lateness_max`).
        """
        if whole_run:
            counts = self.lateness_counts
            total = sum(counts)
            if not total:
                return 0.0
            rank = min(total - 1, int(q * total))
            seen = 0
            for ms, count in enumerate(counts[:-1]):
                seen += count
                if seen > rank:
                    return min(ms / 1000, self.lateness_max)
            return self.lateness_max  # in the last bucket: later than it counts
        if not self.lateness:
            return 0.0
        ordered = sorted(self.lateness)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def _count(self, lateness: Sequence[float]) -> None:
        """Add a batch's lateness to the whole-run counts (call under the keeper's lock)."""
        counts = self.lateness_counts
        late = [seconds for seconds in lateness if seconds > 0.0]
        counts[0] += len(lateness) - len(late)  # most renewals start early or on time
        if late:
            top = len(counts) - 1
            for seconds in late:
                counts[min(top, math.ceil(seconds * 1000))] += 1
            self.lateness_max = max(self.lateness_max, max(late))


@dataclass(frozen=True)
class KeeperProgress:
    """Whether a keeper makes progress, measured when asked (see :meth:`LeaseKeeper.progress`)."""

    #: The scheduler thread runs (started, not stopped, alive).
    running: bool
    #: Seconds since the scheduler last woke (it wakes at least every ``HEARTBEAT``
    #: seconds); ``None`` before it started.
    heartbeat_age: float | None
    #: Leases being kept alive.
    held: int
    #: Renewals past their renewal point and not done: not yet dispatched, queued,
    #: in flight or retrying after a failure.
    overdue: int
    #: Seconds the oldest of them has waited past its renewal point (0.0 if none).
    oldest_overdue: float


@dataclass(eq=False, slots=True)
class _Held:
    lease: Lease
    duration: float | None
    release_at: float | None
    #: Bumped on every reschedule: timer entries of an older generation are ignored.
    generation: int = 0
    #: When the entry is next looked at (a renewal point, a retry, or the deadline).
    due: float = 0.0
    active: bool = True
    in_flight: bool = False
    failures: int = 0
    #: The renewal point the entry was dispatched for (for lateness).
    planned: float = 0.0
    #: The renewal point it has waited on since its last successful renewal (kept
    #: across retries): how overdue its renewal is.
    since: float = 0.0
    #: Its loss was counted and reported (once, whichever path found it first).
    reported_lost: bool = False


@dataclass(eq=False, slots=True)
class _Flight:
    """One renewal batch in flight; its timer entry is the watchdog of the batch's deadlines.

    Filed in the timer wheel by ``number`` (an int), not by reference, and
    forgotten when its call returns: a batch lives as long as its call, not
    until its watchdog's time (its leases' deadline, seconds later), so it dies
    young instead of being promoted for a full collection to scan.
    """

    number: int
    helds: list[_Held]
    due: float


class _Lane:
    """Renewal calls for one queue, on threads of its own (at most ``workers``).

    A queue whose endpoint hangs ties up only its own lane; the threads are
    daemons, made on demand, and every call they make carries a deadline, so a
    hung one ends when its leases would have.
    """

    def __init__(self, name: str, workers: int) -> None:
        self._name = name
        self._workers = workers
        self._jobs: deque[Callable[[], None]] = deque()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False

    def submit(self, job: Callable[[], None]) -> bool:
        """Queue ``job``; ``False`` if the lane is closed."""
        with self._cond:
            if self._closed:
                return False
            self._jobs.append(job)
            if self._idle == 0 and len(self._threads) < self._workers:
                thread = threading.Thread(
                    target=self._work,
                    name=f"leasekit-renew-{self._name}-{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._cond.notify()
            return True

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._jobs and not self._closed:
                    self._cond.wait()
                self._idle -= 1
                if self._closed:
                    return
                job = self._jobs.popleft()
            try:
                job()
            except Exception:
                _log.exception("renewal job failed on queue %r", self._name)
            del job  # the batch is freed now, not when this thread takes its next job

    def close(self) -> int:
        """Stop taking jobs and drop the queued ones; return how many were dropped."""
        with self._cond:
            self._closed = True
            dropped = len(self._jobs)
            self._jobs.clear()
            self._cond.notify_all()
            return dropped

    def join(self, until: float) -> list[threading.Thread]:
        """Join the lane's threads until ``until`` (monotonic); return those still running."""
        for thread in self._threads:
            thread.join(max(0.0, until - time.monotonic()))
        return [thread for thread in self._threads if thread.is_alive()]


class LeaseKeeper:
    """Keeps leases alive by renewing them before they expire.

    Parameters:
        renew_at: renew when this fraction of the physical lease remains (0.3: at 70 %).
        margin: but never later than this many seconds before expiry (a floor for short leases).
        max_lifetime: stop renewing a lease this many seconds after it was added
            (``None``: renew until released); the message then comes back to the queue.
        workers: threads making renewal calls, per queue (each queue has its own,
            so a hung endpoint delays no other queue's renewals).
        on_lost: called as ``on_lost(lease, error)`` when a lease is found lost.
        stop_timeout: how long :meth:`stop` waits for renewal calls in flight.

    Usable on its own::

        with LeaseKeeper() as keeper:
            with keeper.hold(lease):
                work()
                lease.complete()

    The keeper starts its threads on first use; :meth:`stop` (or leaving the
    ``with`` block) stops them. A lease is reported lost (its state, its
    ``lost`` event, ``on_lost``) once its time is up without a renewal, even
    while the renewal call hangs.
    """

    def __init__(
        self,
        *,
        renew_at: float = 0.3,
        margin: float = 0.5,
        max_lifetime: float | None = None,
        workers: int = 4,
        on_lost: Callable[[Lease, errors.LeaseLost], None] | None = None,
        stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        check_number(renew_at, "renew_at", above=0, below=1)
        check_number(margin, "margin", minimum=0, maximum=MAX_SECONDS)
        if max_lifetime is not None:
            check_number(max_lifetime, "max_lifetime", above=0, maximum=MAX_SECONDS)
        check_int(workers, "workers", minimum=1)
        if on_lost is not None:
            check_callable(on_lost, "on_lost")
        check_number(stop_timeout, "stop_timeout", minimum=0, maximum=MAX_SECONDS)
        self.renew_at = renew_at
        self.margin = margin
        self.max_lifetime = max_lifetime
        self.on_lost = on_lost
        self.stop_timeout = stop_timeout
        self.stats = KeeperStats()
        self._workers = workers
        # A timer wheel: TICK-wide buckets of entries and their generations, and a heap
        # of bucket keys. An entry is a held lease (a renewal or retry point) or the
        # number of a batch in flight (its watchdog, generation 0). A bucket is one flat
        # list (entry, generation, entry, ...), not a tuple per entry: every renewal
        # files its lease again, and an object that lives until the next renewal
        # (seconds) outlives the young GC generations: promoted objects bring full
        # collections, each of which walks every held lease. For the same reason an
        # emptied bucket's list is kept for reuse (``_spare``), not made anew.
        self._buckets: dict[int, list[_Held | int]] = {}
        self._keys: list[int] = []
        self._spare: list[list[_Held | int]] = []
        self._flights: dict[int, _Flight] = {}  # in flight, by number
        self._numbers = itertools.count(1)
        self._held: dict[Lease, _Held] = {}  # by identity: no int per lease
        self._lanes: dict[int, _Lane] = {}
        self._cond = threading.Condition()
        self._state = "new"
        self._thread: threading.Thread | None = None
        self._heartbeat: float | None = None  # monotonic; written by the scheduler only

    def __repr__(self) -> str:
        return f"<LeaseKeeper {self._state} holding={len(self._held)}>"

    # ------------------------------------------------------------- lifecycle

    def start(self) -> LeaseKeeper:
        """Start the scheduler thread (idempotent); renewal threads start on demand."""
        with self._cond:
            if self._state == "running":
                return self
            if self._state == "stopped":
                raise errors.LeaseStateError("a stopped LeaseKeeper cannot be restarted")
            self._state = "running"
            self._thread = threading.Thread(target=self._run, name="leasekit-keeper", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing; return within ``stop_timeout`` seconds.

        Queued renewals are cancelled; renewal calls in flight get until
        ``stop_timeout`` to return (each carries its own deadline, so one still
        running ends by itself when its leases' time is up). Held leases are
        not settled: their physical leases run out and the messages come back
        unless their holders settle them.
        """
        with self._cond:
            if self._state != "running":
                self._state = "stopped"
                return
            self._state = "stopped"
            self._cond.notify_all()
            thread = self._thread
            lanes = list(self._lanes.values())
        until = time.monotonic() + self.stop_timeout
        if thread is not None and thread is not threading.current_thread():
            thread.join()  # the scheduler makes no network call: it ends at once
        cancelled = sum(lane.close() for lane in lanes)
        running = [t for lane in lanes for t in lane.join(until)]
        if running:
            _log.warning(
                "LeaseKeeper stopped with %d renewal call(s) still in flight; each ends "
                "by its deadline",
                len(running),
            )
        if cancelled:
            _log.debug("LeaseKeeper stopped: %d queued renewal(s) cancelled", cancelled)
        with self._cond:
            self._held.clear()
            self._buckets.clear()
            self._keys.clear()
            self._spare.clear()
            self._flights.clear()
            self._lanes.clear()
            self.stats.held = 0

    close = stop

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---------------------------------------------------------------- leases

    def add(
        self,
        lease: Lease,
        *,
        duration: float | None = None,
        max_lifetime: float | None = None,
    ) -> None:
        """Start keeping ``lease`` alive.

        Parameters:
            lease: a held lease.
            duration: the physical lease for each renewal (the lease's own if ``None``).
            max_lifetime: overrides the keeper's ``max_lifetime`` for this lease.

        Raises:
            LeaseStateError: the lease is already settled, or the keeper is stopped.
            InvalidLeaseDuration: ``duration`` is out of the backend's range.
        """
        self.add_many([lease], duration=duration, max_lifetime=max_lifetime)

    def add_many(
        self,
        leases: Sequence[Lease],
        *,
        duration: float | None = None,
        max_lifetime: float | None = None,
    ) -> None:
        """Start keeping several leases alive (one lock round for all; see :meth:`add`).

        Raises:
            LeaseStateError: a lease is already settled (none is added), or the keeper is stopped.
            InvalidLeaseDuration: ``duration`` is out of the backend's range.
        """
        leases = as_items(leases, "leases")
        for lease in leases:
            if not isinstance(lease, Lease):
                raise errors.InvalidArgument(f"a LeaseKeeper keeps leases, got {lease!r}")
            if lease.state is not LeaseState.HELD:
                raise errors.LeaseStateError(
                    f"cannot keep message {lease.message.id!r}: the lease is already "
                    f"{lease.state.value}"
                )
        lifetime = self.max_lifetime if max_lifetime is None else max_lifetime
        if lifetime is not None:
            check_number(lifetime, "max_lifetime", above=0, maximum=MAX_SECONDS)
        checked: dict[int, float] = {}  # one duration check per queue
        if duration is not None:
            for lease in leases:
                if id(lease.queue) not in checked:
                    checked[id(lease.queue)] = lease.queue.check_duration(duration)
        self.start()
        now = time.monotonic()
        release_at = None if lifetime is None else now + lifetime
        entries = []
        spread = random.random()  # one draw per call: leases added together stay together
        due = 0.0
        key: tuple[float, float] | None = None
        for lease in leases:
            held = _Held(lease, checked.get(id(lease.queue)), release_at)
            if (lease.deadline, lease.duration) != key:  # leases of one receive share one
                key = (lease.deadline, lease.duration)
                due = self._first_due(lease, spread)
            held.due = due
            entries.append(held)
        with self._cond:
            if self._state != "running":
                raise errors.LeaseStateError("the LeaseKeeper is stopped")
            for held in entries:
                previous = self._held.get(held.lease)
                if previous is not None:
                    previous.active = False
                self._held[held.lease] = held
                self._push(held)
            self.stats.held = len(self._held)
        for held in entries:
            # A driver that learns of losses itself (Service Bus: a reset connection
            # drops its locks) has core mark them at once; count and report those
            # here at once too, not as a silent drop at the lease's next due time.
            if held.lease.queue.driver.reports_lost_leases:
                found = held.lease._record.on_lost(partial(self._lost_elsewhere, held))
                if found is not None:
                    self._lost_elsewhere(held, held.lease, found)

    def discard(self, lease: Lease) -> None:
        """Stop keeping ``lease`` alive (it stays leased until it expires or is settled)."""
        self.discard_many([lease])

    def discard_many(self, leases: Iterable[Lease]) -> None:
        """Stop keeping several leases alive, in one lock round."""
        with self._cond:
            for lease in leases:
                held = self._held.pop(lease, None)
                if held is not None:
                    held.active = False
            self.stats.held = len(self._held)

    @contextmanager
    def hold(
        self,
        lease: Lease,
        *,
        duration: float | None = None,
        max_lifetime: float | None = None,
    ) -> Iterator[Lease]:
        """Keep ``lease`` alive for a ``with`` block; it is released from the keeper on exit."""
        self.add(lease, duration=duration, max_lifetime=max_lifetime)
        try:
            yield lease
        finally:
            self.discard(lease)

    def __contains__(self, lease: object) -> bool:
        return lease in self._held

    def __len__(self) -> int:
        return len(self._held)

    # --------------------------------------------------------------- progress

    def progress(self) -> KeeperProgress:
        """Measure whether the keeper makes progress (for health checks; any thread).

        Takes no lock the scheduler needs: it reads the heartbeat and a snapshot
        of the held leases (one pass over them, only when asked), so a stuck
        keeper can still be asked, and asking never delays a renewal.
        """
        now = time.monotonic()
        thread = self._thread
        heartbeat = self._heartbeat
        helds = list(self._held.values())  # one atomic copy; no lock taken
        overdue = 0
        oldest = 0.0
        for held in helds:
            waiting = held.since if held.in_flight or held.failures else held.due
            late = now - waiting
            if late > 0:
                overdue += 1
                oldest = max(oldest, late)
        return KeeperProgress(
            running=self._state == "running" and thread is not None and thread.is_alive(),
            heartbeat_age=None if heartbeat is None else max(0.0, now - heartbeat),
            held=len(helds),
            overdue=overdue,
            oldest_overdue=oldest,
        )

    # ------------------------------------------------------------- scheduling

    def _first_due(self, lease: Lease, spread: float) -> float:
        """Monotonic time of a newly added lease's first renewal.

        The first renewal point is spread up to ``JITTER`` of the lease earlier,
        by ``spread`` (0–1, drawn at random once per :meth:`add_many` call), so
        a burst of receives does not stay one burst forever, while the leases of
        one receive, added in one call, share their first renewal call too; later
        renewals move each batch as a whole (see ``_renew``), so leases renewed
        together stay together and share a batch call. (A backend that renews a
        receive batch as one row, such as PostgreSQL's, then never splits it.)
        """
        jitter = spread * JITTER * lease.duration
        return lease.deadline - self._lead(lease.duration) - jitter

    def _lead(self, duration: float) -> float:
        """How long before expiry to renew a lease of ``duration`` seconds."""
        lead = max(self.renew_at * duration, self.margin)
        return min(lead, duration * 0.5)  # short leases: renew at half-time at the latest

    def _push(self, entry: _Held | _Flight) -> None:
        """File ``entry`` at its due time (rounded down: at most TICK early); call with the lock."""
        filed: _Held | int
        if isinstance(entry, _Held):
            entry.generation += 1
            filed, generation = entry, entry.generation
        else:
            filed, generation = entry.number, 0
        key = int(entry.due / TICK)
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.append(filed)
            bucket.append(generation)
            return
        bucket = self._spare.pop() if self._spare else []
        bucket.append(filed)
        bucket.append(generation)
        self._buckets[key] = bucket
        heapq.heappush(self._keys, key)
        if self._keys[0] == key:
            self._cond.notify()

    def _run(self) -> None:
        """The scheduler thread: wake at the earliest due entry, renew or expire it."""
        while True:
            with self._cond:
                batch = self._take_due()
                if batch is None:
                    return
                renew, expiring = self._sort_due(batch)
            for held in expiring:
                reason = (
                    "the renewal kept failing until the lease expired" if held.failures else None
                )
                error = held.lease.expire(reason)
                if error is not None:
                    self._report_lost(held, error)
            if renew:
                self._dispatch(renew)

    def _take_due(self) -> list[_Held | _Flight] | None:
        """Wait until something is due (or stop); return the due entries, ``None`` to stop."""
        keys = self._keys
        while self._state == "running":
            now = time.monotonic()
            self._heartbeat = now
            limit = int((now + COALESCE) / TICK)
            if keys and keys[0] <= limit:
                due: list[_Held | _Flight] = []
                flights = self._flights
                while keys and keys[0] <= limit:
                    bucket = self._buckets.pop(heapq.heappop(keys))
                    pairs = iter(bucket)
                    for entry, generation in zip(pairs, pairs, strict=True):
                        if isinstance(entry, int):  # a batch's watchdog: still in flight?
                            flight = flights.get(entry)
                            if flight is not None:
                                due.append(flight)
                        elif entry.active and entry.generation == generation:
                            due.append(entry)
                    bucket.clear()
                    if len(self._spare) < SPARE_BUCKETS:
                        self._spare.append(bucket)
                return due
            timeout = keys[0] * TICK - COALESCE - now if keys else HEARTBEAT
            self._cond.wait(min(timeout, HEARTBEAT))
        return None

    def _sort_due(self, due: list[_Held | _Flight]) -> tuple[list[_Held], list[_Held]]:
        """Split due entries (lock held): leases to renew, and leases whose time is up.

        A batch in flight is due at the earliest deadline of its leases: those
        whose time is up while the call hangs are marked lost (by the caller,
        without the lock); the batch is looked at again at the next deadline.
        """
        now = time.monotonic()
        renew: list[_Held] = []
        expiring: list[_Held] = []
        for entry in due:
            if isinstance(entry, _Flight):
                waiting = [h for h in entry.helds if h.in_flight and h.active]
                expiring += [h for h in waiting if now >= h.lease.deadline]
                later = [h.lease.deadline for h in waiting if now < h.lease.deadline]
                if later:
                    entry.due = min(later)
                    self._push(entry)
                continue
            held = entry
            if held.in_flight:
                continue  # its batch's watchdog looks after it
            lease = held.lease
            if lease.state is not LeaseState.HELD:
                self._forget(held)  # settled, or found lost by its holder
                continue
            if now >= lease.deadline:
                expiring.append(held)
                continue
            renew.append(held)
        return renew, expiring

    def _dispatch(self, due: list[_Held]) -> None:
        """Group due leases by queue and duration; hand each batch to its queue's lane."""
        groups: dict[tuple[int, float], list[_Held]] = {}
        now = time.monotonic()
        for held in due:
            if held.release_at is not None and now >= held.release_at:
                self._release(held)
                continue
            lease = held.lease
            wanted = held.duration if held.duration is not None else lease.duration
            seconds = lease.queue.renewable_for(lease, wanted)  # the backend's total cap
            if seconds is None:
                self._release(held)
                continue
            if seconds < wanted and held.duration is None:
                # Capped: keep asking for the lease's own duration, not the shortened
                # one this renewal sets, so the keeper lets go rather than renew in slivers.
                held.duration = wanted
            groups.setdefault((id(lease.queue), seconds), []).append(held)
        lateness = self.stats.lateness
        if len(lateness) > 200_000:
            del lateness[:100_000]
        with self._cond:
            if self._state != "running":
                return
            for (queue_id, seconds), group in groups.items():
                queue = group[0].lease.queue
                lane = self._lanes.get(queue_id)
                if lane is None:
                    lane = self._lanes[queue_id] = _Lane(queue.name, self._workers)
                size = max(1, queue.capabilities.max_renew_batch)
                for start in range(0, len(group), size):
                    batch = group[start : start + size]
                    for held in batch:
                        held.in_flight = True
                        held.planned = held.due
                        if not held.failures:
                            held.since = held.due
                    number = next(self._numbers)
                    flight = _Flight(number, batch, min(held.lease.deadline for held in batch))
                    self._flights[number] = flight
                    self._push(flight)  # the watchdog of the batch's deadlines
                    lane.submit(partial(self._renew, flight, seconds))

    def _release(self, held: _Held) -> None:
        """Stop renewing (max lifetime or the backend's total cap reached).

        The message comes back to the queue when its physical lease runs out.
        """
        with self._cond:
            if self._held.get(held.lease) is held:
                del self._held[held.lease]
            held.active = False
            self.stats.released_at_max_lifetime += 1
            self.stats.held = len(self._held)
        _log.warning(
            "stopped renewing message %r (max lifetime or the backend's total lease cap); "
            "it returns to the queue",
            held.lease.message.id,
        )

    def _renew(self, flight: _Flight, seconds: float) -> None:
        """A lane's job: renew one batch, then reschedule, retry or report each lease."""
        group = flight.helds
        started = time.monotonic()
        # Lateness is measured when the renewal call starts, queueing included.
        lateness = [max(0.0, started - held.planned) for held in group]
        self.stats.lateness.extend(lateness)
        leases = [held.lease for held in group]
        queue: Queue = leases[0].queue
        results: list[errors.LeaseError | errors.LeaseStateError | None]
        try:
            results = queue.renew_many(leases, seconds, lateness=lateness)
        except Exception as exc:  # e.g. the queue was closed under us
            error = exc if isinstance(exc, errors.LeaseError) else errors.BackendError(str(exc))
            results = [error] * len(leases)
        self.stats.renew_calls += 1
        now = time.monotonic()
        # One random offset for the whole batch: its leases stay together (one call
        # next time too) while batches drift apart, so a burst of leases spreads out.
        lead = self._lead(seconds) + random.random() * JITTER * seconds
        lost: list[tuple[_Held, errors.LeaseLost]] = []
        with self._cond:
            self._flights.pop(flight.number, None)  # its watchdog entry is ignored now
            self.stats._count(lateness)
            for held, result in zip(group, results, strict=True):
                held.in_flight = False
                if isinstance(result, errors.LeaseLost):
                    if held.active:  # report it even while stopping
                        lost.append((held, result))
                        self._forget(held)
                    continue
                if not held.active or self._state != "running":
                    continue
                lease = held.lease
                if result is None:
                    self.stats.renewed += 1
                    held.failures = 0
                    held.due = lease.deadline - lead
                    self._push(held)
                elif isinstance(result, errors.LeaseStateError):
                    self._forget(held)  # settled by its holder meanwhile
                else:
                    if not isinstance(result, errors.BackendUnavailable):
                        _log.warning("renewal of %r failed: %s", lease.message.id, result)
                    self._retry(held, now)
        for held, error in lost:
            self._report_lost(held, error)

    def _retry(self, held: _Held, now: float) -> None:
        """A failed renewal (lock held): retry with backoff; at the deadline the lease is lost."""
        self.stats.transient_failures += 1
        held.failures += 1
        backoff = held.lease.queue.retry_policy.backoff(held.failures)
        left = held.lease.deadline - now
        held.due = min(now + min(backoff, RETRY_WITHIN * left), held.lease.deadline)
        self._push(held)

    def _lost_elsewhere(self, held: _Held, lease: Lease, error: errors.LeaseLost) -> None:
        """A kept lease core marked lost outside the keeper (a driver's report): report it."""
        if held.active:
            self._report_lost(held, error)

    def _report_lost(self, held: _Held, error: errors.LeaseLost) -> None:
        """Count a lost lease and tell ``on_lost``, once per lease (no lock held).

        Two paths can find the same loss at the lease's deadline: the scheduler
        expiring it while its renewal hangs, and that renewal coming back
        ``LeaseLost`` as its call's deadline (the lease's) runs out.
        """
        with self._cond:
            if held.reported_lost:
                return
            held.reported_lost = True
            self.stats.lost += 1
            self._forget(held)
        if self.on_lost is not None:
            try:
                self.on_lost(held.lease, error)
            except Exception:
                _log.exception("keeper on_lost callback failed for %r", held.lease)

    def _forget(self, held: _Held) -> None:
        held.active = False
        if self._held.get(held.lease) is held:
            del self._held[held.lease]
        self.stats.held = len(self._held)
