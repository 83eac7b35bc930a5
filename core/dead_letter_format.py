"""The dead-letter copy's format: the properties that mark a dead letter, written and read.

A dead letter carries its story in three properties, the same on every backend
(core's copy-then-delete, and a native store's messages as a driver shows them):

==============================  ===========================================
``leasekit-dead-letter-reason``  why (``Lease.dead_letter(reason)``)
``leasekit-original-id``         the message id in the original queue
``leasekit-delivery-count``      how often it had been delivered
==============================  ===========================================

and a re-driven message the reason it had been dead-lettered for. This module
is the format only (no policy): drivers with a native dead-letter store import
it to mark what they store (:func:`marked`); :mod:`leasekit.dead_letters` moves
messages and reads the copies back with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from datetime import datetime

from .message import Message
from .spi import DeadLetter, OutgoingMessage, QueueStats, RawMessage

__all__ = [
    "DELIVERY_COUNT",
    "ORIGINAL_ID",
    "POISON_SUFFIX",
    "REASON",
    "REDRIVEN_REASON",
    "SHORT_REASON",
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
