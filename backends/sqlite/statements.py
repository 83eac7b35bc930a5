"""The SQL the driver runs for a receive, a fenced settle and a checkpoint."""

from __future__ import annotations

import functools

#: The messages a receive takes, in delivery order (then updated by seq, in
#: the same transaction; RETURNING has no order, so the order comes from here).
_PICK = """
SELECT seq FROM leasekit_messages AS m
WHERE queue = :queue AND visible_at <= :now AND (expires_at IS NULL OR expires_at > :now)
AND (grp IS NULL OR seq = (
    SELECT min(h.seq) FROM leasekit_messages AS h
    WHERE h.queue = :queue AND h.grp = m.grp AND (h.expires_at IS NULL OR h.expires_at > :now)
))
ORDER BY visible_at, seq
LIMIT :limit
"""

_RECEIVE = """
UPDATE leasekit_messages
SET visible_at = ?,
    delivery_count = delivery_count + 1,
    receipt = CAST(seq AS TEXT) || '.' || lower(hex(randomblob(8)))
WHERE seq IN ({})
RETURNING seq, id, body, properties, enqueued_at, delivery_count, receipt, checkpoint, grp
"""

_DELETE = "DELETE FROM leasekit_messages"
_HELD = "seq = ? AND receipt = ? AND queue = ? AND (expires_at IS NULL OR expires_at > ?)"
#: A checkpoint: the data and the new visibility, only while the receipt is current.
_CHECKPOINT = f"UPDATE leasekit_messages SET visible_at = ?, checkpoint = ? WHERE {_HELD}"


_RECEIVE_DEAD = """
UPDATE leasekit_dead_letters
SET visible_at = :until,
    receipt = CAST(seq AS TEXT) || '.' || lower(hex(randomblob(8)))
WHERE seq IN (
    SELECT seq FROM leasekit_dead_letters
    WHERE queue = :queue AND visible_at <= :now ORDER BY seq LIMIT :limit
)
RETURNING seq, id, body, properties, delivery_count, reason, dead_lettered_at, receipt, grp
"""


@functools.lru_cache(maxsize=64)
def _receive_statement(count: int) -> str:
    """:data:`_RECEIVE` for ``count`` picked rows."""
    return _RECEIVE.format(", ".join("?" * count))


@functools.lru_cache(maxsize=64)
def _fenced(statement: str, own: int, count: int, *, returning: bool = True) -> str:
    """``statement`` (``UPDATE … SET …`` or ``DELETE FROM …``) on ``count`` held receipts.

    Parameters: the statement's own ``own``, then the ``count`` receipts, the
    queue and now. Returns the receipt of each row it changed. Each receipt is
    bound once and read twice: as text for the fence, and ``CAST … AS INTEGER``
    (its leading digits) for the row number it names, so SQLite finds the rows by
    primary key (``+queue`` keeps it from scanning the queue's index instead, its
    choice otherwise even for one row). A malformed receipt names row 0, which
    no row has (``seq`` starts at 1). Without ``returning``, only the count of
    changed rows tells what it did.
    """
    first = own + 1
    numbers = range(first, first + count)
    rows = ", ".join(f"CAST(?{n} AS INTEGER)" for n in numbers)
    receipts = ", ".join(f"?{n}" for n in numbers)
    queue = first + count
    return (
        f"{statement} WHERE seq IN ({rows}) AND receipt IN ({receipts}) AND +queue = ?{queue} "
        f"AND (expires_at IS NULL OR expires_at > ?{queue + 1})"
        + (" RETURNING receipt" if returning else "")
    )
