"""Dead-lettering where a backend has no store of its own: the copy, and the queue it goes to.

Without a native dead-letter store, core copies the message to a dead-letter
queue — the one the service names (:meth:`Driver.dead_letter_queue`, e.g. SQS's
redrive target) or ``<queue>-poison`` (Azure Functions' convention) — and then
deletes the original: copy first, so a failure in between leaves a duplicate,
never a lost message. The copy keeps the body and the original properties and
adds three properties, :mod:`leasekit.dead_letter_format` (re-exported here).

**A copy too large for the queue** (a body near the maximum) is sent smaller,
the same way on every backend: first with the reason cut to
:data:`SHORT_REASON` characters, then with none of the three properties, only
the body and its own properties. A poison message is never left to loop
because its reason did not fit.

:class:`DeadLetters` does this for a :class:`~leasekit.Queue`: it finds the
dead-letter queue (asked once), opens and creates it on first use, moves a
leased message there (or to the backend's own store, where it has one), reads
the copies back, counts them and deletes ``<queue>-poison`` with its queue.
"""

from __future__ import annotations

import logging
import threading
from functools import partial
from typing import TYPE_CHECKING

from . import errors
from .dead_letter_format import (
    DELIVERY_COUNT,
    ORIGINAL_ID,
    POISON_SUFFIX,
    REASON,
    REDRIVEN_REASON,
    SHORT_REASON,
    copies,
    from_message,
    marked,
    read,
    redriven,
    with_total,
)
from .deadline import deadline
from .error_mapping import wrap_error
from .spi import DeadLetter, Driver, OutgoingMessage

if TYPE_CHECKING:
    from .call_runner import CallRunner
    from .lease import Lease

__all__ = [
    "DELIVERY_COUNT",
    "ORIGINAL_ID",
    "POISON_SUFFIX",
    "REASON",
    "REDRIVEN_REASON",
    "SHORT_REASON",
    "DeadLetters",
    "copies",
    "from_message",
    "marked",
    "read",
    "redriven",
    "with_total",
]

#: Not asked yet (``Driver.dead_letter_queue`` may be ``None``).
_UNKNOWN = object()

_log = logging.getLogger("leasekit")


class DeadLetters:
    """Where one queue's dead letters go, and the copy-then-delete that moves them there.

    Parameters
    ----------
        runner: the queue's :class:`~leasekit.call_runner.CallRunner` (its driver,
            its retries and error mapping).

    The dead-letter queue's driver is opened on first use and kept until
    :meth:`close`; thread-safe.
    """

    __slots__ = ("_lock", "_named", "_runner", "_target")

    def __init__(self, runner: CallRunner) -> None:
        self._runner = runner
        self._target: Driver | None = None  # where core copies dead letters (opened on first use)
        self._named: object = _UNKNOWN
        self._lock = threading.Lock()

    @property
    def target(self) -> Driver | None:
        """The driver of the queue core copies dead letters to, once opened; else ``None``."""
        return self._target

    def move(self, lease: Lease, receipt: str, reason: str) -> None:
        """Dead-letter ``lease`` (taken, with ``receipt``): natively, or copy then delete.

        Without a native store the copy goes first and the original is deleted
        after, so a failure in between leaves a duplicate, never a lost message.
        Raises the leasekit error of the step that failed.
        """
        runner = self._runner
        driver = runner.driver
        if runner.capabilities.native_dead_letter:
            raw = lease.raw_message
            runner.call("dead-letter", lambda: driver.dead_letter(receipt, reason, raw))
            return
        target = self.target_driver()
        supports = target.capabilities.supports_properties
        for keeps, copy in copies(lease.message, reason, properties=supports):
            try:
                self._send_one(target, copy, "dead-letter (send the copy)")
                break
            except errors.MessageTooLarge:
                # One rule for every backend: a smaller copy, never a message left to loop.
                _log.warning(
                    "dead-letter copy of %r too large for %r; trying it %s",
                    lease.message.id,
                    target.queue,
                    keeps,
                )
        else:  # pragma: no cover - the last copy is the message as it was received
            raise errors.MessageTooLarge(f"message {lease.message.id!r} fits no dead-letter copy")
        [deleted] = runner.call(
            "dead-letter (delete the original)", partial(driver.delete, [receipt])
        )
        if deleted is not None:
            raise runner.entry_error(deleted, "dead-letter (delete the original)")

    def _send_one(self, driver: Driver, message: OutgoingMessage, doing: str) -> str:
        """Send one message through ``driver`` (the driver's own checks first); raise its error."""
        try:
            driver.validate(message)
        except Exception as exc:
            raise wrap_error(driver, exc, f"{doing} on {driver.queue!r}") from exc
        [result] = self._runner.call(doing, partial(driver.send, [message]))
        if isinstance(result, BaseException):
            error = wrap_error(driver, result, f"{doing} on {driver.queue!r}")
            if error is not result:
                error.__cause__ = result
            raise error
        return result

    def peek(self, limit: int) -> list[DeadLetter]:
        """Read up to ``limit`` copies back from the dead-letter queue, without removing them."""
        target = self.target_driver()
        peeked = self._runner.call("read dead letters", lambda: target.peek(limit))
        return [read(raw) for raw in peeked]

    def count(self) -> int | None:
        """All messages of the queue core dead-letters to (0 if it does not exist yet).

        ``None`` where that cannot be counted.
        """
        if self._target is not None:
            target, opened = self._target, False
        else:
            try:
                named = self.named_queue()
                target = self._sibling(named or self._runner.name + POISON_SUFFIX)
            except errors.UnsupportedOperation:  # no sibling(): the backend cannot dead-letter
                return None
            opened = True
        try:
            if not target.capabilities.queue_stats:
                return None
            return with_total(self._runner.call("dead-letter queue stats", target.stats)).total
        except errors.QueueNotFound:
            return 0
        finally:
            if opened:
                target.close()

    def delete_poison_queue(self) -> None:
        """Delete ``<queue>-poison`` (nothing if the backend has no siblings)."""
        runner = self._runner
        try:
            poison = self._sibling(runner.name + POISON_SUFFIX)
        except errors.UnsupportedOperation:
            return
        try:
            with deadline(runner.call_timeout):
                runner.call("delete poison queue", poison.delete_queue)
        finally:
            if poison is not self._target:
                poison.close()

    def named_queue(self) -> str | None:
        """The dead-letter queue the service names (asked once), or ``None``."""
        if self._named is _UNKNOWN:
            driver = self._runner.driver
            self._named = self._runner.call("find the dead-letter queue", driver.dead_letter_queue)
        named = self._named
        return named if isinstance(named, str) else None

    def open_queue(self) -> Driver:
        """A new driver on the queue dead letters are copied to; the caller closes it."""
        return self._sibling(self.named_queue() or self._runner.name + POISON_SUFFIX)

    def _sibling(self, name: str) -> Driver:
        driver = self._runner.driver
        return self._runner.call("open the dead-letter queue", lambda: driver.sibling(name))

    def target_driver(self) -> Driver:
        """The queue core copies dead letters to (``<queue>-poison``: made on first use)."""
        with self._lock:
            if self._target is not None:
                return self._target
            named = self.named_queue()
            target = self._sibling(named or self._runner.name + POISON_SUFFIX)
            if named is None:
                try:
                    self._runner.call("create the poison queue", target.create_queue)
                except BaseException:
                    target.close()
                    raise
            self._target = target
            return target

    def close(self) -> None:
        """Close the dead-letter queue's driver, if it was opened."""
        if self._target is not None:
            self._target.close()
