"""A lease on one message: renew it, then complete, abandon or dead-letter it once."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .errors import LeaseLost, LeaseStateError
from .message import LeaseState, Message
from .options import check_callable
from .spi import RawMessage

if TYPE_CHECKING:
    from .queue import Queue

__all__ = ["Lease"]


class Lease:
    """A message held invisible for a while, and the receipt that proves it.

    Create leases with :meth:`Queue.lease`; never construct one yourself.

    A lease is ``HELD`` until it is completed, abandoned, dead-lettered or found
    lost; after that every settling call raises :class:`LeaseStateError` (or
    :class:`LeaseLost` again for a lost lease). All methods are thread-safe: a
    keeper thread may renew while the handler completes, and the handler's
    call then uses the newest receipt.

    Used as a context manager, leaving the block without settling abandons the
    lease so the message is redelivered at once.
    """

    def __init__(
        self,
        queue: Queue,
        message: Message,
        receipt: str,
        expires_at: datetime,
        duration: float,
        raw_message: RawMessage,
    ) -> None:
        self._queue = queue
        self.message = message
        self._receipt = receipt
        self._expires_at = expires_at
        self._duration = duration
        self._raw_message = raw_message
        self._state = LeaseState.HELD
        self._lock = threading.RLock()
        self._lost_error: LeaseLost | None = None
        self._on_lost: list[Callable[[Lease, LeaseLost], None]] = []
        self._lost_event: threading.Event | None = None  # made on first use (most never are)
        #: :func:`time.monotonic` when the message was received.
        self.received_at = time.monotonic()

    # ------------------------------------------------------------- properties

    @property
    def queue(self) -> Queue:
        """The queue this lease came from."""
        return self._queue

    @property
    def receipt(self) -> str:
        """The newest receipt (it changes on renew where the backend rotates receipts)."""
        return self._receipt

    @property
    def expires_at(self) -> datetime:
        """When the current physical lease ends (UTC)."""
        return self._expires_at

    @property
    def duration(self) -> float:
        """The physical lease duration last set, in seconds."""
        return self._duration

    @property
    def state(self) -> LeaseState:
        """The lease's state."""
        return self._state

    @property
    def lost(self) -> threading.Event:
        """Set when the lease is found lost (by a settle or a renew, e.g. the keeper's).

        Wait on it (``lease.lost.wait(timeout)``) or poll it (``lease.lost.is_set()``).
        """
        event = self._lost_event
        if event is None:
            with self._lock:
                if self._lost_event is None:
                    self._lost_event = threading.Event()
                    if self._state is LeaseState.LOST:
                        self._lost_event.set()
                event = self._lost_event
        return event

    @property
    def raw(self) -> Any:
        """The SDK's own message object (the escape hatch; backend-specific)."""
        return self._raw_message.raw

    @property
    def can_abandon_with_delay(self) -> bool:
        """Whether :meth:`abandon` accepts a delay greater than zero on this backend."""
        return self._queue.capabilities.max_abandon_delay > 0

    def __repr__(self) -> str:
        return (
            f"<Lease id={self.message.id!r} state={self._state.value} "
            f"delivery_count={self.message.delivery_count} "
            f"expires_at={self._expires_at.isoformat()}>"
        )

    # ---------------------------------------------------------------- actions

    def renew(self, duration: float | None = None) -> None:
        """Keep the message invisible for ``duration`` seconds from now.

        Parameters
        ----------
            duration: the new physical lease; the last one if ``None``.

        Raises
        ------
            InvalidLeaseDuration: out of the backend's range (no call made).
            LeaseLost: the receipt is stale; the lease is marked lost.
            LeaseStateError: the lease was already settled.
        """
        with self._lock:
            self._require_held("renew")
            seconds = self._queue._physical_duration(duration, self)
            visibility = self._queue._change_visibility(self, seconds)
            self._receipt = visibility.receipt
            self._expires_at = visibility.visible_until
            self._duration = seconds
        self._queue._emit("leasekit_lease_renewed", lease=self)

    def complete(self) -> None:
        """Delete the message: it is never delivered again.

        Raises:
            LeaseLost: the receipt is stale; the message may be someone else's now.
            LeaseStateError: the lease was already settled.
        """
        with self._lock:
            self._require_held("complete")
            self._queue._delete(self)
            self._state = LeaseState.COMPLETED
        self._queue._emit("leasekit_lease_completed", lease=self)

    def abandon(self, delay: float = 0) -> None:
        """Give the message back: visible again now, or after ``delay`` seconds.

        A backend that cannot make it visible at once says so in
        ``capabilities.min_abandon_delay`` (MNS: 1 s); the delay is at least that.

        Raises:
            InvalidArgument: a negative or too long delay (no call made).
            UnsupportedOperation: a delay on a backend that cannot delay.
            LeaseLost: the receipt is stale.
            LeaseStateError: the lease was already settled.
        """
        with self._lock:
            self._require_held("abandon")
            seconds = self._queue._abandon_delay(delay)
            self._queue._abandon(self, seconds)
            self._state = LeaseState.ABANDONED
        self._queue._emit("leasekit_lease_abandoned", lease=self, delay=seconds)

    def dead_letter(self, reason: str) -> None:
        """Move the message to the dead-letter place with ``reason``; it is not redelivered.

        Raises:
            InvalidArgument: an empty or non-string reason (no call made).
            LeaseLost: the receipt is stale.
            LeaseStateError: the lease was already settled.
        """
        with self._lock:
            self._require_held("dead_letter")
            self._queue._dead_letter(self, self._queue._check_reason(reason))
            self._state = LeaseState.DEAD_LETTERED
        self._queue._emit("leasekit_lease_dead_lettered", lease=self, reason=reason)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease was found lost; a handler may call it often."""
        if self._lost_error is not None:
            raise LeaseLost(str(self._lost_error), backend_code=self._lost_error.backend_code)

    def on_lost(self, callback: Callable[[Lease, LeaseLost], None]) -> None:
        """Call ``callback(lease, error)`` when the lease is found lost (at once if it is).

        Raises:
            InvalidArgument: ``callback`` is not callable.
        """
        check_callable(callback, "callback")
        with self._lock:
            if self._lost_error is None:
                self._on_lost.append(callback)
                return
            error = self._lost_error
        callback(self, error)

    # --------------------------------------------------------------- internal

    def _require_held(self, action: str) -> None:
        if self._state is LeaseState.HELD:
            return
        if self._state is LeaseState.LOST:
            assert self._lost_error is not None
            raise LeaseLost(
                f"cannot {action} message {self.message.id!r}: the lease was lost earlier "
                f"({self._lost_error})",
                backend_code=self._lost_error.backend_code,
            )
        raise LeaseStateError(
            f"cannot {action} message {self.message.id!r}: the lease is already "
            f"{self._state.value}. Each lease is settled once; lease the message again "
            "to work on it."
        )

    def _mark_lost(self, error: LeaseLost) -> None:
        """Record that the lease is lost; fire the event and callbacks once."""
        with self._lock:
            if self._state is not LeaseState.HELD:
                return
            self._state = LeaseState.LOST
            self._lost_error = error
            callbacks, self._on_lost = self._on_lost, []
            event = self._lost_event
        if event is not None:
            event.set()  # else: made already set when first asked for
        for callback in callbacks:
            try:
                callback(self, error)
            except Exception:
                self._queue._log.exception("on_lost callback failed for %r", self)
        self._queue._emit("leasekit_lease_lost", lease=self, error=error)

    # -------------------------------------------------------- context manager

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state is LeaseState.HELD:
            with contextlib.suppress(LeaseLost):
                self.abandon()
