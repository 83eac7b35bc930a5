"""Dead-lettering where a backend has no store of its own: the copy, and the queue it goes to.

Without a native dead-letter store, core copies the message to a dead-letter
queue — the one the service names (:meth:`Driver.dead_letter_queue`, e.g. SQS's
redrive target) or ``<queue>-poison`` (Azure Functions' convention) — and then
deletes the original: copy first, so a failure in between leaves a duplicate,
never a lost message. The copy keeps the body and the original properties and
adds three properties, written and read back here and nowhere else:

==============================  ===========================================
``leasekit-dead-letter-reason``  why (``Lease.dead_letter(reason)``)
``leasekit-original-id``         the message id in the original queue
``leasekit-delivery-count``      how often it had been delivered
==============================  ===========================================

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

import dataclasses
import logging
import threading
from collections.abc import Iterator, Mapping
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING

from . import errors
from .deadline import deadline
from .error_mapping import wrap_error
from .message import Message
from .spi import DeadLetter, Driver, OutgoingMessage, QueueStats, RawMessage

if TYPE_CHECKING:
    from .lease import Lease
    from .queue import Queue

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

#: Where core dead-letters when the service names no queue (Azure Functions' convention).
POISON_SUFFIX = "-poison"
REASON = "leasekit-dead-letter-reason"
ORIGINAL_ID = "leasekit-original-id"
DELIVERY_COUNT = "leasekit-delivery-count"
#: On a re-driven message: the reason it had been dead-lettered for.
REDRIVEN_REASON = "leasekit-redriven-reason"
#: Characters of the reason kept in a copy that did not fit with the whole reason.
SHORT_REASON = 200
_ELLIPSIS = "\u2026"
#: Not asked yet (``Driver.dead_letter_queue`` may be ``None``).
_UNKNOWN = object()

_log = logging.getLogger("leasekit")


def copies(
    message: Message, reason: str, *, properties: bool
) -> Iterator[tuple[str, OutgoingMessage]]:
    """The copies of ``message`` to try, largest first, each with a word on what it keeps.

    ``properties``: whether the backend carries properties (else only the body goes).
    """
    own: Mapping[str, str] = dict(message.properties) if properties else {}
    group = message.group  # an ordered queue's dead-letter queue is ordered too (SQS FIFO)
    if properties:
        marks = {ORIGINAL_ID: message.id, DELIVERY_COUNT: str(message.delivery_count)}
        yield (
            "whole",
            OutgoingMessage(message.body, properties={**own, **marks, REASON: reason}, group=group),
        )
        if len(reason) > SHORT_REASON:
            short = reason[: SHORT_REASON - 1] + _ELLIPSIS
            yield (
                "with its reason shortened",
                OutgoingMessage(
                    message.body, properties={**own, **marks, REASON: short}, group=group
                ),
            )
    yield "without its reason", OutgoingMessage(message.body, properties=own, group=group)


def marked(
    properties: Mapping[str, str], *, id: str, reason: str | None, delivery_count: int | None
) -> dict[str, str]:
    """``properties`` with the dead-letter marks added: how a native store shows a dead letter.

    For :meth:`leasekit.spi.Driver.dead_letter_store`, whose messages read back
    (:func:`read`) as core's copies do.
    """
    marks = {**properties, ORIGINAL_ID: id}
    if reason is not None:
        marks[REASON] = reason
    if delivery_count is not None:
        marks[DELIVERY_COUNT] = str(delivery_count)
    return marks


def read(raw: RawMessage) -> DeadLetter:
    """A dead-letter copy read back: the original id, reason and count where the copy has them.

    A message another producer put on the queue reads with its own id and no
    reason or count.
    """
    return _letter(raw.id, raw.body, raw.properties, raw.enqueued_at)


def from_message(message: Message) -> DeadLetter:
    """A leased dead-letter copy (or dead-letter store message) read back, as :func:`read`."""
    return _letter(message.id, message.body, message.properties, message.enqueued_at)


def _letter(
    id: str, body: bytes, properties: Mapping[str, str], enqueued_at: datetime | None
) -> DeadLetter:
    own = dict(properties)
    reason = own.pop(REASON, None)
    original = own.pop(ORIGINAL_ID, None)
    count = own.pop(DELIVERY_COUNT, None)
    return DeadLetter(
        id=original or id,
        body=body,
        reason=reason,
        delivery_count=int(count) if count is not None and count.isdigit() else None,
        properties=own,
        enqueued_at=enqueued_at,
    )


def with_total(counts: QueueStats) -> QueueStats:
    """``counts`` with ``total`` added up where the driver told visible, leased and delayed."""
    if counts.total is not None:
        return counts
    parts = (counts.visible, counts.leased, counts.delayed)
    if any(part is None for part in parts):
        return counts
    return dataclasses.replace(counts, total=sum(part or 0 for part in parts))


class DeadLetters:
    """Where one queue's dead letters go, and the copy-then-delete that moves them there.

    Parameters
    ----------
        queue: the queue whose messages these are (its driver and call plumbing).

    The dead-letter queue's driver is opened on first use and kept until
    :meth:`close`; thread-safe.
    """

    __slots__ = ("_lock", "_named", "_queue", "_target")

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
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
        queue = self._queue
        driver = queue.driver
        if queue.capabilities.native_dead_letter:
            raw = lease.raw_message
            queue._call("dead-letter", lambda: driver.dead_letter(receipt, reason, raw))
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
        [deleted] = queue._call(
            "dead-letter (delete the original)", partial(driver.delete, [receipt])
        )
        if deleted is not None:
            raise queue._entry_error(deleted, "dead-letter (delete the original)")

    def _send_one(self, driver: Driver, message: OutgoingMessage, doing: str) -> str:
        """Send one message through ``driver`` (the driver's own checks first); raise its error."""
        try:
            driver.validate(message)
        except Exception as exc:
            raise wrap_error(driver, exc, f"{doing} on {driver.queue!r}") from exc
        [result] = self._queue._call(doing, partial(driver.send, [message]))
        if isinstance(result, BaseException):
            error = wrap_error(driver, result, f"{doing} on {driver.queue!r}")
            if error is not result:
                error.__cause__ = result
            raise error
        return result

    def peek(self, limit: int) -> list[DeadLetter]:
        """Read up to ``limit`` copies back from the dead-letter queue, without removing them."""
        target = self.target_driver()
        peeked = self._queue._call("read dead letters", lambda: target.peek(limit))
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
                target = self._sibling(named or self._queue.name + POISON_SUFFIX)
            except errors.UnsupportedOperation:  # no sibling(): the backend cannot dead-letter
                return None
            opened = True
        try:
            if not target.capabilities.queue_stats:
                return None
            return with_total(self._queue._call("dead-letter queue stats", target.stats)).total
        except errors.QueueNotFound:
            return 0
        finally:
            if opened:
                target.close()

    def delete_poison_queue(self) -> None:
        """Delete ``<queue>-poison`` (nothing if the backend has no siblings)."""
        queue = self._queue
        try:
            poison = self._sibling(queue.name + POISON_SUFFIX)
        except errors.UnsupportedOperation:
            return
        try:
            with deadline(queue.call_timeout):
                queue._call("delete poison queue", poison.delete_queue)
        finally:
            if poison is not self._target:
                poison.close()

    def named_queue(self) -> str | None:
        """The dead-letter queue the service names (asked once), or ``None``."""
        if self._named is _UNKNOWN:
            driver = self._queue.driver
            self._named = self._queue._call("find the dead-letter queue", driver.dead_letter_queue)
        named = self._named
        return named if isinstance(named, str) else None

    def open_queue(self) -> Driver:
        """A new driver on the queue dead letters are copied to; the caller closes it."""
        return self._sibling(self.named_queue() or self._queue.name + POISON_SUFFIX)

    def _sibling(self, name: str) -> Driver:
        driver = self._queue.driver
        return self._queue._call("open the dead-letter queue", lambda: driver.sibling(name))

    def target_driver(self) -> Driver:
        """The queue core copies dead letters to (``<queue>-poison``: made on first use)."""
        with self._lock:
            if self._target is not None:
                return self._target
            named = self.named_queue()
            target = self._sibling(named or self._queue.name + POISON_SUFFIX)
            if named is None:
                try:
                    self._queue._call("create the poison queue", target.create_queue)
                except BaseException:
                    target.close()
                    raise
            self._target = target
            return target

    def close(self) -> None:
        """Close the dead-letter queue's driver, if it was opened."""
        if self._target is not None:
            self._target.close()


def redriven(letter: DeadLetter, *, properties: bool) -> Iterator[OutgoingMessage]:
    """The messages to send back for ``letter``, largest first: with the reason, then without.

    The reason goes in :data:`REDRIVEN_REASON` (a reason from an earlier
    re-drive is replaced). ``properties``: whether the queue carries properties.
    """
    own: dict[str, str] = dict(letter.properties) if properties else {}
    own.pop(REDRIVEN_REASON, None)
    if properties:
        reason = letter.reason or "unknown"
        if len(reason) > SHORT_REASON:
            reason = reason[: SHORT_REASON - 1] + _ELLIPSIS
        yield OutgoingMessage(letter.body, properties={**own, REDRIVEN_REASON: reason})
    yield OutgoingMessage(letter.body, properties=own)
