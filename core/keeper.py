"""The lease keeper: renews held leases before they expire, from one scheduler thread.

A worker takes a short physical lease and the keeper renews it while the work
goes on, so a crash is recovered after one short lease, not a long one, and a
hung worker lets go after ``max_lifetime``. Leases longer than the backend can
hold physically (Service Bus's fixed lock) are kept the same way, in steps.

Design: one scheduler thread keeps a deadline heap of every held lease and wakes
at the earliest renewal point; due leases are grouped by queue and duration and
renewed in the backend's batch size by a small pool, so 100,000 leases cost a
few threads, not 100,000 timers.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType

from . import errors
from .lease import Lease
from .message import LeaseState
from .options import MAX_SECONDS, as_items, check_callable, check_int, check_number
from .queue import Queue

__all__ = ["KeeperStats", "LeaseKeeper"]

_log = logging.getLogger("leasekit.keeper")

#: Width of a timer-wheel bucket: a renewal may run up to this much early.
TICK = 0.01
#: Due renewals within this window are renewed together with the earliest one;
#: renewing a little early costs nothing and turns 100k timers into batches.
COALESCE = 0.05
#: Renewal points are spread over this fraction of the lease (earlier, never later).
JITTER = 0.1
#: First and largest backoff (seconds) after a transient renewal failure.
RETRY_START = 0.1
RETRY_MAX = 2.0
#: Wait before retrying a lease that was busy (its holder was settling it).
BUSY_RETRY = 0.02


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

    def lateness_percentile(self, q: float) -> float:
        """The ``q`` quantile (0–1) of renewal lateness in seconds; 0 with no samples."""
        if not self.lateness:
            return 0.0
        ordered = sorted(self.lateness)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(eq=False)
class _Held:
    lease: Lease
    duration: float | None
    release_at: float | None
    due: float = 0.0
    active: bool = True
    failures: int = 0
    first_failure: float | None = None


class LeaseKeeper:
    """Keeps leases alive by renewing them before they expire.

    Parameters:
        renew_at: renew when this fraction of the physical lease remains (0.3: at 70 %).
        margin: but never later than this many seconds before expiry (a floor for short leases).
        max_lifetime: stop renewing a lease this many seconds after it was added
            (``None``: renew until released); the message then comes back to the queue.
        workers: threads making renewal calls.
        on_lost: called as ``on_lost(lease, error)`` when a lease is found lost.

    Usable on its own::

        with LeaseKeeper() as keeper:
            with keeper.hold(lease):
                work()
                lease.complete()

    The keeper starts its threads on first use; :meth:`stop` (or leaving the
    ``with`` block) stops and joins every thread it started.
    """

    def __init__(
        self,
        *,
        renew_at: float = 0.3,
        margin: float = 0.5,
        max_lifetime: float | None = None,
        workers: int = 4,
        on_lost: Callable[[Lease, errors.LeaseLost], None] | None = None,
    ) -> None:
        check_number(renew_at, "renew_at", above=0, below=1)
        check_number(margin, "margin", minimum=0, maximum=MAX_SECONDS)
        if max_lifetime is not None:
            check_number(max_lifetime, "max_lifetime", above=0, maximum=MAX_SECONDS)
        check_int(workers, "workers", minimum=1)
        if on_lost is not None:
            check_callable(on_lost, "on_lost")
        self.renew_at = renew_at
        self.margin = margin
        self.max_lifetime = max_lifetime
        self.on_lost = on_lost
        self.stats = KeeperStats()
        self._workers = workers
        # A timer wheel: due entries in TICK-wide buckets, and a heap of bucket keys.
        self._buckets: dict[int, list[_Held]] = {}
        self._keys: list[int] = []
        self._held: dict[int, _Held] = {}
        self._cond = threading.Condition()
        self._state = "new"
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"<LeaseKeeper {self._state} holding={len(self._held)}>"

    # ------------------------------------------------------------- lifecycle

    def start(self) -> LeaseKeeper:
        """Start the scheduler thread and the renewal pool (idempotent)."""
        with self._cond:
            if self._state == "running":
                return self
            if self._state == "stopped":
                raise errors.LeaseStateError("a stopped LeaseKeeper cannot be restarted")
            self._state = "running"
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="leasekit-renew")
            self._thread = threading.Thread(target=self._run, name="leasekit-keeper", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing, and stop and join every thread the keeper started.

        Held leases are not settled; their physical leases run out and the
        messages come back unless their holders settle them.
        """
        with self._cond:
            if self._state != "running":
                self._state = "stopped"
                return
            self._state = "stopped"
            self._cond.notify_all()
            thread, pool = self._thread, self._pool
        if thread is not None:
            thread.join()
        if pool is not None:
            pool.shutdown(wait=True)
        with self._cond:
            self._held.clear()
            self._buckets.clear()
            self._keys.clear()
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
                    checked[id(lease.queue)] = lease.queue._check_duration(duration)
        self.start()
        now = time.monotonic()
        release_at = None if lifetime is None else now + lifetime
        entries = []
        for lease in leases:
            held = _Held(lease, checked.get(id(lease.queue)), release_at)
            held.due = self._due(lease, now)
            entries.append(held)
        with self._cond:
            if self._state != "running":
                raise errors.LeaseStateError("the LeaseKeeper is stopped")
            for held in entries:
                previous = self._held.get(id(held.lease))
                if previous is not None:
                    previous.active = False
                self._held[id(held.lease)] = held
                self._push(held)
            self.stats.held = len(self._held)

    def discard(self, lease: Lease) -> None:
        """Stop keeping ``lease`` alive (it stays leased until it expires or is settled)."""
        self.discard_many([lease])

    def discard_many(self, leases: Iterable[Lease]) -> None:
        """Stop keeping several leases alive, in one lock round."""
        with self._cond:
            for lease in leases:
                held = self._held.pop(id(lease), None)
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
        return id(lease) in self._held

    def __len__(self) -> int:
        return len(self._held)

    # ------------------------------------------------------------- scheduling

    def _due(self, lease: Lease, now: float) -> float:
        """Monotonic time of a newly added lease's first renewal.

        The first renewal point is spread up to ``JITTER`` of the lease earlier
        at random, so a burst of leases added together does not stay one burst
        forever; later renewals move each batch as a whole (see ``_renew``), so
        leases renewed together stay together and share a batch call.
        """
        remaining = lease.expires_at.timestamp() - time.time()
        jitter = random.random() * JITTER * lease.duration
        return now + remaining - self._lead(lease.duration) - jitter

    def _lead(self, duration: float) -> float:
        """How long before expiry to renew a lease of ``duration`` seconds."""
        lead = max(self.renew_at * duration, self.margin)
        return min(lead, duration * 0.5)  # short leases: renew at half-time at the latest

    def _push(self, held: _Held) -> None:
        """File ``held`` in the bucket of its due time (rounded down: at most TICK early)."""
        key = int(held.due / TICK)
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.append(held)
            return
        self._buckets[key] = [held]
        heapq.heappush(self._keys, key)
        if self._keys[0] == key:
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self._take_due()
                if batch is None:
                    return
            if batch:
                self._dispatch(batch)

    def _take_due(self) -> list[_Held] | None:
        """Wait until something is due (or stop); return the due entries, ``None`` to stop."""
        keys = self._keys
        while self._state == "running":
            now = time.monotonic()
            limit = int((now + COALESCE) / TICK)
            if keys and keys[0] <= limit:
                due: list[_Held] = []
                while keys and keys[0] <= limit:
                    due.extend(self._buckets.pop(heapq.heappop(keys)))
                return [held for held in due if held.active]
            timeout = keys[0] * TICK - COALESCE - now if keys else None
            self._cond.wait(timeout)
        return None

    def _dispatch(self, due: list[_Held]) -> None:
        groups: dict[tuple[int, float], list[_Held]] = {}
        now = time.monotonic()
        lateness = self.stats.lateness
        for held in due:
            if held.release_at is not None and now >= held.release_at:
                self._release(held)
                continue
            seconds = held.duration if held.duration is not None else held.lease.duration
            caps = held.lease.queue.capabilities
            if caps.max_total_lease is not None:
                # Never ask for more than the backend's total cap since receive (SQS: 12 h).
                allowance = caps.max_total_lease - (now - held.lease.received_at) - 1.0
                allowance = int(allowance / caps.lease_resolution) * caps.lease_resolution
                if allowance < caps.min_lease:
                    self._release(held)
                    continue
                seconds = min(seconds, allowance)
            groups.setdefault((id(held.lease.queue), seconds), []).append(held)
        if len(lateness) > 200_000:
            del lateness[:100_000]
        assert self._pool is not None
        for (_, seconds), group in groups.items():
            size = max(1, group[0].lease.queue.capabilities.max_renew_batch)
            for start in range(0, len(group), size):
                try:
                    self._pool.submit(self._renew, group[start : start + size], seconds)
                except RuntimeError:  # the pool is shutting down
                    return

    def _release(self, held: _Held) -> None:
        """Stop renewing (max lifetime or the backend's total cap reached).

        The message comes back to the queue when its physical lease runs out.
        """
        with self._cond:
            if self._held.get(id(held.lease)) is held:
                del self._held[id(held.lease)]
            held.active = False
            self.stats.released_at_max_lifetime += 1
            self.stats.held = len(self._held)
        _log.warning(
            "stopped renewing message %r (max lifetime or the backend's total lease cap); "
            "it returns to the queue",
            held.lease.message.id,
        )

    def _renew(self, group: list[_Held], seconds: float) -> None:
        started = time.monotonic()
        # Lateness is measured when the renewal call starts, queueing included.
        self.stats.lateness.extend([max(0.0, started - held.due) for held in group])
        leases = [held.lease for held in group]
        queue: Queue = leases[0].queue
        try:
            results = queue._renew_many(leases, seconds)
        except Exception as exc:  # e.g. the queue was closed under us
            results = [
                exc if isinstance(exc, errors.LeaseError) else errors.BackendError(str(exc))
            ] * len(leases)
        self.stats.renew_calls += 1
        now = time.monotonic()
        # One random offset for the whole batch: its leases stay together (one call
        # next time too) while batches drift apart, so a burst of leases spreads out.
        lead = self._lead(seconds) + random.random() * JITTER * seconds
        with self._cond:
            for held, result in zip(group, results, strict=True):
                if isinstance(result, errors.LeaseLost):
                    if held.active:  # report it even while stopping
                        self._lost(held, result)
                    continue
                if not held.active or self._state != "running":
                    continue
                lease = held.lease
                if result is None:
                    self.stats.renewed += 1
                    held.failures = 0
                    held.first_failure = None
                    # The new expiry is at least ``started + seconds``: plan from that
                    # (no datetime arithmetic on the hot path).
                    held.due = started + seconds - lead
                    self._push(held)
                elif result is False:
                    if lease.state is LeaseState.HELD:
                        held.due = now + BUSY_RETRY
                        self._push(held)
                    else:
                        self._forget(held)
                elif isinstance(result, errors.BackendUnavailable | errors.BackendError):
                    self._retry(held, result, now)
                else:
                    assert isinstance(result, errors.LeaseError)
                    _log.error("renewal of %r refused: %s", lease.message.id, result)
                    self._lost(held, errors.LeaseLost(f"renewal refused: {result}"))

    def _retry(self, held: _Held, error: errors.LeaseError, now: float) -> None:
        """Transient failure: retry with backoff until the physical expiry, then lost."""
        self.stats.transient_failures += 1
        held.failures += 1
        remaining = held.lease.expires_at.timestamp() - time.time()
        if remaining <= 0:
            self._lost(
                held,
                errors.LeaseLost(
                    f"renewal kept failing until the lease expired ({error})",
                    backend_code=error.backend_code,
                ),
            )
            return
        backoff = min(RETRY_MAX, RETRY_START * 2 ** (held.failures - 1))
        # Retry at the expiry at the latest; a failure then reports the lease lost.
        held.due = now + max(min(backoff, remaining), 0.01)
        self._push(held)

    def _lost(self, held: _Held, error: errors.LeaseLost) -> None:
        self.stats.lost += 1
        self._forget(held)
        lease = held.lease
        lease._mark_lost(error)
        if self.on_lost is not None:
            try:
                self.on_lost(lease, error)
            except Exception:
                _log.exception("keeper on_lost callback failed for %r", lease)

    def _forget(self, held: _Held) -> None:
        held.active = False
        if self._held.get(id(held.lease)) is held:
            del self._held[id(held.lease)]
        self.stats.held = len(self._held)
