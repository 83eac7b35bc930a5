"""Re-driving dead letters: moving them back to the queue they came from, none lost.

Each dead letter goes back in three steps, every one through core's usual machinery:

1. **lease** it in the dead-letter place (the queue's native store through
   :meth:`Driver.dead_letter_store`, or the dead-letter queue core copies to:
   the service's named one, or ``<queue>-poison``), so no other re-drive takes it;
2. **send** it back to the queue: its body and its own properties, with the
   reason it was dead-lettered for in :data:`~leasekit.dead_letters.REDRIVEN_REASON`;
3. **complete** the dead letter.

An interruption at any point (a crash, a kill, an error) leaves every message
in one of the two places: before step 2 it is still a dead letter (hidden until
its lease ends, then visible to the next re-drive); between 2 and 3 it is in
both (a duplicate — delivery is at least once anyway); after 3 only in the
queue. Never in neither.

Dead letters that ``older_than`` or ``where`` leave out are kept leased (and
renewed) until the re-drive ends, so one pass sees each dead letter once, and
then given back at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from . import dead_letters, errors
from .keeper import LeaseKeeper
from .lease import Lease
from .options import check_callable, check_int, check_number
from .spi import DeadLetter, Driver

if TYPE_CHECKING:
    from .queue import Queue

__all__ = ["BATCH", "LEASE", "Progress", "redrive"]

_log = logging.getLogger("leasekit.redrive")

#: Dead letters one receive takes. Larger is faster; each one taken and not yet
#: moved waits hidden (for one lease at most, if the re-drive dies).
BATCH = 10
#: The lease on a dead letter being moved (seconds, where the backend lets one be
#: chosen): how long one stays hidden if the re-drive dies before moving it.
LEASE = 30.0

#: Called after each dead letter is moved back: ``progress(letter)``.
Progress = Callable[[DeadLetter], None]


def redrive(
    queue: Queue,
    limit: int | None = None,
    *,
    older_than: float | timedelta | None = None,
    where: Callable[[DeadLetter], bool] | None = None,
    progress: Progress | None = None,
    lease_duration: float | None = None,
) -> int:
    """Move up to ``limit`` dead letters of ``queue`` back to it; return how many moved.

    Parameters
    ----------
        queue: the queue whose dead letters go back to it.
        limit: most dead letters to move (``None``: all there are).
        older_than: only those dead-lettered at least this long ago (seconds or a
            ``timedelta``; where the backend cannot tell when, none match).
        where: only those for which ``where(letter)`` is true.
        progress: called with each dead letter once it is moved.
        lease_duration: the lease on each dead letter while it moves (default
            :data:`LEASE`; a fixed lock where the backend has one).

    Raises
    ------
        InvalidArgument: a bad ``limit``, ``older_than``, ``where`` or ``progress``.
        UnsupportedOperation: the backend cannot re-drive (no dead-letter store to
            lease from).
        LeaseError: a backend error; what was moved stays moved, the rest stays dead.
    """
    if limit is not None:
        check_int(limit, "limit", minimum=1)
    age = _seconds(older_than)
    if where is not None:
        check_callable(where, "where")
    if progress is not None:
        check_callable(progress, "progress")
    native = queue.capabilities.native_dead_letter
    source = _dead_letter_source(queue, lease_duration)
    moved = 0
    taken: list[Lease] = []  # every dead letter this pass leased; those unsettled go back
    keeper = LeaseKeeper()  # keeps the ones left out hidden until the pass ends
    try:
        with source:
            try:
                while limit is None or moved < limit:
                    want = BATCH if limit is None else min(BATCH, limit - moved)
                    try:
                        leases = source.lease(min(want, source.capabilities.max_receive_batch))
                    except errors.QueueNotFound:
                        if native or taken:
                            raise
                        return 0  # no dead-letter queue yet: nothing was ever dead-lettered
                    if not leases:
                        break
                    taken += leases
                    for lease in leases:
                        if limit is not None and moved >= limit:
                            break
                        letter = dead_letters.from_message(lease.message)
                        if not _wanted(letter, age, where):
                            keeper.add(lease)
                            continue
                        _move(queue, lease, letter)
                        moved += 1
                        if progress is not None:
                            progress(letter)
                    taken = [lease for lease in taken if not lease.state.settled]
            finally:
                keeper.discard_many(taken)
                _give_back(source, taken)
    finally:
        keeper.stop()
    return moved


def _dead_letter_source(queue: Queue, lease_duration: float | None) -> Queue:
    """A queue over ``queue``'s dead letters (the caller closes it).

    Raises:
        UnsupportedOperation: the backend has no dead-letter place to lease from.
    """
    queue._require_open()
    driver: Driver
    if queue.capabilities.native_dead_letter:
        try:
            driver = queue.driver.dead_letter_store()
        except NotImplementedError:
            raise errors.UnsupportedOperation(
                f"{queue.driver.scheme} cannot re-drive dead letters (its driver has no "
                "dead_letter_store)"
            ) from None
    else:
        driver = queue._dead_letters.open_queue()
    caps = driver.capabilities
    if lease_duration is None:
        lease_duration = LEASE
    if caps.fixed_lease is not None:
        lease_duration = caps.fixed_lease
    lease_duration = min(max(lease_duration, caps.min_lease), caps.max_lease)
    try:
        # The source's own class: this module needs Queue for its types only, so
        # that queue.py (whose redrive() calls in here) and it form no import circle.
        return type(queue)(
            driver,
            lease_duration=lease_duration,
            retry=queue.retry_policy,
            call_timeout=queue.call_timeout,
        )
    except BaseException:
        driver.close()
        raise


def _wanted(
    letter: DeadLetter, age: float | None, where: Callable[[DeadLetter], bool] | None
) -> bool:
    if age is not None:
        if letter.enqueued_at is None:
            return False
        if (datetime.now(UTC) - letter.enqueued_at).total_seconds() < age:
            return False
    return where is None or bool(where(letter))


def _move(queue: Queue, lease: Lease, letter: DeadLetter) -> None:
    """Send ``letter`` back to ``queue``, then complete its lease (the order that loses nothing)."""
    properties = queue.capabilities.supports_properties
    # A dead letter of an ordered group goes back to the end of its group.
    group = lease.message.group if queue.capabilities.ordered else None
    for message in dead_letters.redriven(letter, properties=properties):
        try:
            queue.send(message.body, properties=dict(message.properties), group=group)
            break
        except errors.MessageTooLarge:
            if not message.properties:
                raise
            _log.warning("re-driven %r too large with its reason; sending it without", letter.id)
    lease.complete()


def _give_back(source: Queue, leases: list[Lease]) -> None:
    """Abandon the dead letters not moved (visible to the next re-drive at once)."""
    held = [lease for lease in leases if not lease.state.settled]
    if not held:
        return
    with contextlib.suppress(errors.LeaseError):
        source.abandon_many(held)


def _seconds(older_than: float | timedelta | None) -> float | None:
    if older_than is None:
        return None
    if isinstance(older_than, timedelta):
        older_than = older_than.total_seconds()
    return check_number(older_than, "older_than", minimum=0)
