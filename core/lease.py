"""A lease on one message: renew it, then complete, abandon or dead-letter it once."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .errors import LeaseLost
from .lease_record import LeaseBatch, LeaseRecord
from .message import _SET as _MESSAGE_SET
from .message import NO_PROPERTIES, LeaseState, Message
from .options import check_callable
from .spi import RawMessage, ReceivedRows

if TYPE_CHECKING:
    from .queue import Queue

__all__ = ["Lease"]

_new = object.__new__


class Lease:
    """A message held invisible for a while, and the receipt that proves it.

    Create leases with :meth:`Queue.lease`; never construct one yourself.

    A lease is ``HELD`` until it is completed, abandoned, dead-lettered or found
    lost; after that every settling call raises :class:`LeaseStateError` (or
    :class:`LeaseLost` again for a lost lease). All methods are thread-safe: a
    keeper thread may renew while the handler completes, and the handler's
    call then uses the newest receipt. No lock is held across a network call:
    reading a lease (``receipt``, ``state``, ``lost``) never waits for one.

    Used as a context manager, leaving the block without settling abandons the
    lease so the message is redelivered at once.
    """

    # No RawMessage is kept (its fields are the message's; ``raw_message`` rebuilds
    # it): a held lease is the Lease, its LeaseRecord and its Message.
    __slots__ = ("__weakref__", "_queue", "_raw", "_record", "message", "received_at")

    def __init__(
        self,
        queue: Queue,
        message: Message,
        receipt: str,
        expires_at: datetime,
        duration: float,
        raw_message: RawMessage,
        *,
        deadline: float | None = None,
        batch: LeaseBatch | None = None,
        received_at: float | None = None,
    ) -> None:
        self._queue = queue
        self.message = message
        self._raw = raw_message.raw
        #: :func:`time.monotonic` when the message was received.
        self.received_at = time.monotonic() if received_at is None else received_at
        if deadline is None:  # no call to measure from: the backend's expiry, by this clock
            deadline = self.received_at + max(0.0, expires_at.timestamp() - time.time())
        if batch is None:
            batch = LeaseBatch(queue.events)
        self._record = LeaseRecord.create(receipt, expires_at, deadline, duration, batch)

    @classmethod
    def _received(
        cls,
        queue: Queue,
        message: Message,
        raw: Any,
        record: LeaseRecord,
        received_at: float,
    ) -> Lease:
        """A lease as a receive makes it, without ``__init__``'s defaults (one per message)."""
        lease = _new(cls)
        lease._queue = queue
        lease.message = message
        lease._raw = raw
        lease.received_at = received_at
        lease._record = record
        return lease

    # ------------------------------------------------------------- properties

    @property
    def queue(self) -> Queue:
        """The queue this lease came from."""
        return self._queue

    @property
    def receipt(self) -> str:
        """The newest receipt (it changes on renew where the backend rotates receipts)."""
        return self._record.receipt

    @property
    def expires_at(self) -> datetime:
        """When the current physical lease ends, as the backend said (UTC)."""
        return self._record.expires_at

    @property
    def time_left(self) -> float:
        """Seconds until the lease ends by leasekit's own clock (negative once it has).

        Measured from the start of the call that set the lease, so it never
        runs later than the backend's expiry, whatever the clocks say.
        """
        return self._record.time_left()

    @property
    def deadline(self) -> float:
        """When the lease ends by leasekit's own clock, on :func:`time.monotonic`."""
        return self._record.deadline

    @property
    def duration(self) -> float:
        """The physical lease duration last set, in seconds."""
        return self._record.duration

    @property
    def state(self) -> LeaseState:
        """The lease's state."""
        return self._record.state

    @property
    def lost(self) -> threading.Event:
        """Set when the lease is found lost (by a settle or a renew, or by the keeper at expiry).

        Wait on it (``lease.lost.wait(timeout)``) or poll it (``lease.lost.is_set()``).
        The event is made the first time it is asked for (six objects the garbage
        collector tracks): to poll many leases, ``lease.lost_error is not None`` is
        the same answer and makes nothing.
        """
        return self._record.lost_event()

    @property
    def raw(self) -> Any:
        """The SDK's own message object (the escape hatch; backend-specific)."""
        return self._raw

    @property
    def raw_message(self) -> RawMessage:
        """The message as the driver returned it, with the lease's current receipt and expiry.

        For core and vendors (a driver's ``dead_letter`` and ``checkpoint`` get
        it); made when asked for, so a held lease keeps no second copy.
        """
        message = self.message
        record = self._record
        return RawMessage(
            id=message.id,
            body=message.body,
            receipt=record.receipt,
            delivery_count=message.delivery_count,
            enqueued_at=message.enqueued_at,
            visible_until=record.expires_at,
            properties=message.properties,
            raw=self._raw,
            checkpoint=message.checkpoint if self._queue.capabilities.native_checkpoint else None,
            group=message.group,
        )

    @property
    def can_abandon_with_delay(self) -> bool:
        """Whether :meth:`abandon` accepts a delay greater than zero on this backend."""
        return self._queue.capabilities.max_abandon_delay > 0

    def __repr__(self) -> str:
        return (
            f"<Lease id={self.message.id!r} state={self.state.value} "
            f"delivery_count={self.message.delivery_count} "
            f"expires_at={self.expires_at.isoformat()}>"
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
        _raise_first(self._queue.renew_many([self], duration))

    def checkpoint(self, data: bytes) -> None:
        """Save ``data`` as this message's progress; the lease stays held (and is renewed).

        The next holder reads it as ``message.checkpoint`` and resumes from there;
        the body and properties do not change. Completing or dead-lettering the
        message discards it. See :meth:`Queue.checkpoint`.

        Raises:
            UnsupportedOperation: the backend keeps no checkpoints and the queue was
                opened without a ``checkpoint_store``.
            LeaseLost: the receipt is stale or a later holder saved a checkpoint
                (nothing was saved; the lease is marked lost).
            LeaseStateError: the lease was already settled.
        """
        self._queue.checkpoint(self, data)

    def group_state(self) -> bytes | None:
        """The state kept with this message's group (Service Bus session state); ``None``: none.

        See :meth:`Queue.group_state`.
        """
        return self._queue.group_state(self)

    def set_group_state(self, state: bytes | None) -> None:
        """Replace (``None``: clear) the state kept with this message's group.

        See :meth:`Queue.set_group_state`.
        """
        self._queue.set_group_state(self, state)

    def complete(self) -> None:
        """Delete the message: it is never delivered again.

        Raises:
            LeaseLost: the receipt is stale; the message may be someone else's now.
            LeaseStateError: the lease was already settled.
        """
        self._queue._complete_one(self)

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
        _raise_first(self._queue.abandon_many([self], delay=delay))

    def dead_letter(self, reason: str) -> None:
        """Move the message to the dead-letter place with ``reason``; it is not redelivered.

        Raises:
            InvalidArgument: an empty or non-string reason (no call made).
            LeaseLost: the receipt is stale.
            LeaseStateError: the lease was already settled.
        """
        self._queue.dead_letter(self, reason)

    @property
    def lost_error(self) -> LeaseLost | None:
        """The error that marked the lease lost, or ``None`` while it is not lost."""
        return self._record.lost_error

    def expire(self, reason: str | None = None) -> LeaseLost | None:
        """Mark the lease lost if its time is up by leasekit's clock (:attr:`time_left`).

        The keeper calls this at each kept lease's deadline, whether or not a
        renewal call is still in flight; a holder without a keeper may call it
        too. Returns the error if this call marked the lease lost.
        """
        return self._record.expire(self, reason=reason)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease was found lost; a handler may call it often."""
        lost = self._record.lost_error
        if lost is not None:
            raise LeaseLost(str(lost), backend_code=lost.backend_code)

    def on_lost(self, callback: Callable[[Lease, LeaseLost], None]) -> None:
        """Call ``callback(lease, error)`` when the lease is found lost (at once if it is).

        Raises:
            InvalidArgument: ``callback`` is not callable.
        """
        check_callable(callback, "callback")
        error = self._record.on_lost(callback)
        if error is not None:
            callback(self, error)

    def remove_on_lost(self, callback: Callable[[Lease, LeaseLost], None]) -> None:
        """Forget a callback given to :meth:`on_lost` (nothing happens if it is not there)."""
        self._record.remove_on_lost(callback)

    # -------------------------------------------------------- context manager

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.state is LeaseState.HELD:
            with contextlib.suppress(LeaseLost):
                self.abandon()


def _raise_first(results: list[Any]) -> None:
    """Raise the error of a batch of one, if it has one."""
    error = results[0]
    if isinstance(error, BaseException):
        raise error


def leases_from_rows(
    queue: Queue, rows: ReceivedRows, duration: float, deadline: float, received_at: float
) -> list[Lease]:
    """The leases of a receive that gave plain rows (:class:`~leasekit.spi.ReceivedRows`).

    The same objects :meth:`LeaseOperations.leases_from` makes from
    :class:`RawMessage` objects (a :class:`Message`, a :class:`LeaseRecord`, a
    :class:`Lease` for each row; tested field by field), made in one loop with
    no call per object: between two network calls the calls and the
    :class:`RawMessage` cost twice the objects themselves (measured on
    PostgreSQL, batches of 100: 2.8 against 1.0 µs a message in a tight loop).
    For a lease duration the receive set (not ``lease_set_after_receive``) and
    no checkpoint store.
    """
    shared = LeaseBatch(queue.events)
    mutex = shared.mutex
    held = LeaseState.HELD
    decode = rows.decode
    new_message, new_record, new_lease = _new, _new, _new
    set_id, set_body, set_count, set_enqueued, set_properties, set_checkpoint, set_group = (
        _MESSAGE_SET
    )
    leases = []
    for message_id, body, properties, enqueued_at, count, receipt, until, group in rows.rows:
        message = new_message(Message)
        set_id(message, message_id)
        set_body(message, body)
        set_count(message, count)
        set_enqueued(message, enqueued_at)
        set_properties(message, (properties and decode(properties)) or NO_PROPERTIES)
        set_checkpoint(message, None)
        set_group(message, group)
        record = new_record(LeaseRecord)  # as LeaseRecord.create sets it
        record.receipt = receipt
        record.expires_at = until
        record.deadline = deadline
        record.duration = duration
        record.state = held
        record.busy = None
        record.lost_error = None
        record.checkpoints = 0
        record._batch = shared
        record._mutex = mutex
        record._on_lost = None
        record._lost_event = None
        lease = new_lease(Lease)  # as Lease._received sets it
        lease._queue = queue
        lease.message = message
        lease._raw = None
        lease.received_at = received_at
        lease._record = record
        leases.append(lease)
    return leases
