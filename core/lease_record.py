"""The state of one lease, and the only code that changes it.

The rule: a lease's receipt, expiry, deadline and state are written here and
nowhere else, and never while a network call is in flight under the lease's
lock. A caller that wants to act on a lease *takes* it for one operation
(:meth:`LeaseRecord.take`), makes its backend call holding no lock, then reports
the outcome (:meth:`renewed`, :meth:`settled`, :meth:`failed`) or gives the
lease back unchanged (:meth:`release`). Reading a lease (its receipt, its state,
``lease.lost``) never waits for a call, and a second operation waits only for
the one in flight, never longer than the lease can last.

Two clocks: ``expires_at`` is the backend's view of the expiry (what the service
said, in UTC); ``deadline`` is core's own, on :func:`time.monotonic`: the start
of the call that set the lease plus the duration it asked for. The backend set
the visibility after that call started, so the deadline is never later than the
true expiry, whatever the clocks of the two machines say. Core decides that a
lease is lost by the deadline (:meth:`expire`), not by waiting for a call.

Cost: the leases of one receive share one :class:`LeaseBatch` (a lock, the
condition a waiting operation sleeps on, the events), and a record makes its
``lease.lost`` event and its callback list only when first asked for. A held
lease costs no synchronisation object of its own; the lock is held for a few
field writes only, never across a call, so leases of one batch do not hold each
other up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .errors import LeaseLost, LeaseStateError
from .message import LeaseState

if TYPE_CHECKING:
    from .events import Events
    from .lease import Lease

__all__ = ["RENEW", "SETTLE", "LeaseBatch", "LeaseRecord"]

_log = logging.getLogger("leasekit")

#: The operations a lease can be taken for.
RENEW = "renew"
SETTLE = "settle"
#: Longest a settle waits beyond the lease's deadline for a renewal in flight to
#: report (the keeper marks the lease lost at its deadline, which ends the wait).
BUSY_GRACE = 1.0


_new = object.__new__


class LeaseBatch:
    """What the leases of one receive share: their lock, the condition to wait on, the events.

    Parameters
    ----------
        events: where the ``leasekit_lease_lost`` event goes.
    """

    __slots__ = ("events", "idle", "mutex")

    def __init__(self, events: Events) -> None:
        self.events = events
        self.mutex = threading.Lock()
        #: Notified when a lease of the batch stops being busy; made (under
        #: ``mutex``) by the first operation that has to wait for another.
        self.idle: threading.Condition | None = None

    def wait_idle(self, timeout: float) -> None:
        """Wait (holding ``mutex``) until a lease of the batch is released, or ``timeout``."""
        idle = self.idle
        if idle is None:
            idle = self.idle = threading.Condition(self.mutex)
        idle.wait(timeout)

    def notify_idle(self) -> None:
        """Wake every operation waiting for a lease of the batch (call holding ``mutex``)."""
        if self.idle is not None:
            self.idle.notify_all()


def take_together(records: Sequence[LeaseRecord], operation: str) -> list[str] | None:
    """Take every record for ``operation`` in one hold of their batch's lock; their receipts.

    The common settle of a received batch: every lease of one receive, none
    busy, all held. Returns ``None``, having taken none, when that is not the
    case (leases of several receives, one busy or no longer held, one given
    twice): :meth:`LeaseRecord.take` then takes them one by one.
    """
    batch = records[0]._batch
    with batch.mutex:
        taken = 0
        for record in records:
            if record._batch is not batch or record.busy is not None:
                break
            if record.state is not LeaseState.HELD:
                break
            record.busy = operation
            taken += 1
        else:
            return [record.receipt for record in records]
        for record in records[:taken]:  # never seen free by another: the lock was held
            record.busy = None
    return None


def settled_together(records: Sequence[LeaseRecord], state: LeaseState) -> list[int]:
    """:meth:`LeaseRecord.settled` for each record; one hold of the lock when they share it.

    Returns the positions of the records that were reported lost while their
    call was in flight (almost always none): those stay lost.
    """
    batch = records[0]._batch
    rest: Sequence[LeaseRecord] = ()
    lost: list[int] = []
    with batch.mutex:
        for i, record in enumerate(records):
            if record._batch is not batch:  # another receive's: under its own lock, below
                rest = records[i:]
                break
            record.busy = None
            if record.state is LeaseState.HELD:
                record.state = state
            elif record.state is LeaseState.LOST:
                lost.append(i)
        batch.notify_idle()
    first = len(records) - len(rest)
    for i, record in enumerate(rest, first):
        if record.settled(state) is not None:
            lost.append(i)
    return lost


class LeaseRecord:
    """Receipt, expiry, deadline and state of one lease; the one writer of them.

    Parameters
    ----------
        receipt: the receipt from the receive.
        expires_at: the backend's expiry (UTC).
        deadline: core's expiry on :func:`time.monotonic`.
        duration: the physical lease duration set by the receive.
        batch: what it shares with the leases of its receive (the lock, the events;
            the ``leasekit_lease_lost`` event goes there, once, when the lease is found lost).
    """

    __slots__ = (
        "_batch",
        "_lost_event",
        "_mutex",
        "_on_lost",
        "busy",
        "checkpoints",
        "deadline",
        "duration",
        "expires_at",
        "lost_error",
        "receipt",
        "state",
    )

    receipt: str
    expires_at: datetime
    deadline: float
    duration: float
    state: LeaseState
    #: The operation in flight (``RENEW`` or ``SETTLE``), or ``None``.
    busy: str | None
    lost_error: LeaseLost | None
    #: Checkpoints this holder saved (:meth:`checkpointed`).
    checkpoints: int
    _batch: LeaseBatch
    _mutex: threading.Lock
    _on_lost: list[Callable[[Lease, LeaseLost], None]] | None  # made on first use
    _lost_event: threading.Event | None  # made on first use

    @classmethod
    def create(
        cls, receipt: str, expires_at: datetime, deadline: float, duration: float, batch: LeaseBatch
    ) -> LeaseRecord:
        """A held lease's record (the parameters are the class's).

        A class method, not ``__init__``: a receive makes one per message, and
        setting the slots of an object from ``object.__new__`` skips the call.
        """
        record = _new(cls)
        record.receipt = receipt
        record.expires_at = expires_at
        record.deadline = deadline
        record.duration = duration
        record.state = LeaseState.HELD
        record.busy = None
        record.lost_error = None
        record.checkpoints = 0
        record._batch = batch
        record._mutex = batch.mutex
        record._on_lost = None
        record._lost_event = None
        return record

    # ------------------------------------------------------------------ reads

    def time_left(self) -> float:
        """Seconds until the deadline (negative once it passed)."""
        return self.deadline - time.monotonic()

    def lost_event(self) -> threading.Event:
        """The event set when the lease is found lost (made on first use, set if lost already)."""
        event = self._lost_event
        if event is None:
            with self._mutex:
                if self._lost_event is None:
                    self._lost_event = threading.Event()
                    if self.state is LeaseState.LOST:
                        self._lost_event.set()
                event = self._lost_event
        return event

    def unusable(self, action: str, message_id: str) -> LeaseLost | LeaseStateError | None:
        """The error for using a lease that is no longer held, or ``None`` if it is held."""
        state = self.state
        if state is LeaseState.HELD:
            return None
        if state is LeaseState.LOST:
            lost = self.lost_error
            return LeaseLost(
                f"cannot {action} message {message_id!r}: the lease was lost earlier ({lost})",
                backend_code=lost.backend_code if lost is not None else None,
            )
        return LeaseStateError(
            f"cannot {action} message {message_id!r}: the lease is already "
            f"{state.value}. Each lease is settled once; lease the message again "
            "to work on it."
        )

    # ------------------------------------------------------------- operations

    def take(
        self, operation: str, action: str, message_id: str
    ) -> str | LeaseLost | LeaseStateError:
        """Take the lease for ``operation``; return the receipt to use.

        Returns an error instead when the lease is not held. Waits for an
        operation in flight, at most until the deadline plus :data:`BUSY_GRACE`.
        """
        with self._mutex:
            if self.busy is not None:
                limit = self.deadline + BUSY_GRACE
                while self.busy is not None:
                    remaining = limit - time.monotonic()
                    if remaining <= 0:
                        break
                    self._batch.wait_idle(remaining)
                if self.busy is not None:
                    return LeaseLost(
                        f"cannot {action} message {message_id!r}: its {self.busy} call has "
                        "not returned and the lease's time is up"
                    )
            if self.state is not LeaseState.HELD:
                error = self.unusable(action, message_id)
                assert error is not None
                return error
            self.busy = operation
            return self.receipt

    def release(self) -> None:
        """Give the lease back unchanged (the operation made no call, or changed nothing)."""
        with self._mutex:
            self.busy = None
            self._batch.notify_idle()

    def renewed(
        self,
        owner: Lease,
        receipt: str,
        expires_at: datetime,
        seconds: float,
        started: float,
        *,
        late_is_lost: bool,
    ) -> LeaseLost | None:
        """Record a renewal that asked for ``seconds`` in a call started at ``started``.

        With ``late_is_lost`` (a backend that cannot detect stale receipts), a
        renewal that returned after the lease's deadline cannot prove nobody
        else took the message meanwhile: the lease is marked lost instead, and
        the error returned. A lease already found lost stays lost.
        """
        now = time.monotonic()
        with self._mutex:
            self.busy = None
            self._batch.notify_idle()
            if self.state is not LeaseState.HELD:
                return self.lost_error if self.state is LeaseState.LOST else None
            if late_is_lost and now > self.deadline:
                late = now - self.deadline
                error = LeaseLost(
                    f"the renewal returned {late:.1f} s after the lease ended; this backend "
                    "cannot tell whether another consumer took the message meanwhile"
                )
            else:
                self.receipt = receipt
                self.expires_at = expires_at
                self.deadline = started + seconds
                self.duration = seconds
                return None
        self.lose(owner, error)
        return error

    def checkpointed(self) -> None:
        """Record that a checkpoint of this holder was saved (after the call that saved it)."""
        with self._mutex:
            self.checkpoints += 1

    def settled(self, state: LeaseState) -> LeaseLost | None:
        """Record that the lease was completed, abandoned or dead-lettered.

        A lease's outcome is decided once: one already reported lost (its deadline
        passed while the settle call was in flight, and the keeper said so) stays
        lost even though the call then succeeded, and its error is returned for
        the caller to raise, so that ``on_lost`` and the settle never disagree.
        """
        with self._mutex:
            self.busy = None
            self._batch.notify_idle()
            if self.state is LeaseState.HELD:
                self.state = state
                return None
            return self.lost_error if self.state is LeaseState.LOST else None

    def failed(self, owner: Lease, error: BaseException) -> None:
        """Record a failed operation of ``owner``: held still, unless ``error`` says it is lost."""
        self.release()
        if isinstance(error, LeaseLost):
            self.lose(owner, error)

    def expire(self, owner: Lease, *, reason: str | None = None) -> LeaseLost | None:
        """Mark the lease lost if its deadline has passed (core's clock); return the error."""
        now = time.monotonic()
        if self.state is not LeaseState.HELD or now < self.deadline:
            return None
        late = now - self.deadline
        detail = reason or "no renewal came in time"
        if self.busy:
            detail += f"; its {self.busy} call has not returned"
        error = LeaseLost(f"the lease ended {late:.1f} s ago ({detail})")
        return error if self.lose(owner, error) else None

    def lose(self, owner: Lease, error: LeaseLost) -> bool:
        """Mark the lease lost; fire the event, callbacks and hook once. True if it was held.

        ``owner`` is the :class:`~leasekit.Lease` of this record (given to the
        callbacks and the hook). A record keeps no reference to its lease: with
        one, every lease would be a reference cycle that only the garbage
        collector frees (measured: 8 % of a SQLite lease+complete loop).
        """
        with self._mutex:
            if self.state is not LeaseState.HELD:
                return False
            self.state = LeaseState.LOST
            self.lost_error = error
            callbacks, self._on_lost = self._on_lost or (), None
            event = self._lost_event
            self._batch.notify_idle()
        if event is not None:
            event.set()  # else: made already set when first asked for
        for callback in callbacks:
            try:
                callback(owner, error)
            except Exception:
                _log.exception("on_lost callback failed for %r", owner)
        self._batch.events.emit("leasekit_lease_lost", lease=owner, error=error)
        return True

    def on_lost(self, callback: Callable[[Lease, LeaseLost], None]) -> LeaseLost | None:
        """Register ``callback``; return the error instead if the lease is lost already."""
        with self._mutex:
            if self.lost_error is None:
                if self._on_lost is None:
                    self._on_lost = []
                self._on_lost.append(callback)
                return None
            return self.lost_error

    def remove_on_lost(self, callback: Callable[[Lease, LeaseLost], None]) -> None:
        """Forget ``callback`` (registered with :meth:`on_lost`), if it is still waiting."""
        with self._mutex:
            if self._on_lost and callback in self._on_lost:
                self._on_lost.remove(callback)

    def __repr__(self) -> str:
        busy: Any = f" busy={self.busy}" if self.busy else ""
        return f"<LeaseRecord {self.state.value}{busy} left={self.time_left():.1f}s>"
