"""The embedded SQLite backend: leasekit's durable default, one file, no server.

URLs:
    ``sqlite:///orders.db?queue=orders`` (three slashes: a path relative to the
    working directory; four: absolute, ``sqlite:////var/lib/app/q.db?queue=jobs``).
    Keyword form: ``leasekit.open("sqlite", path="orders.db", queue="orders")``.
    Options: ``clock`` (keyword only), ``busy_timeout`` (s), ``synchronous``
    (``NORMAL`` or ``FULL``), ``max_message_size`` (bytes).

Delivery semantics:
    At least once. Several threads and several processes may lease from the same
    file at once: a receive is one write transaction, so a message is never
    handed to two holders. Each delivery gets a fresh receipt (``seq.token``),
    so a stale receipt is refused (``LeaseLost``); a receipt whose lease expired
    but whose message nobody re-leased still works. Renew keeps the receipt.
    Checkpoints are native: a column of the message's row (up to
    ``max_message_size`` bytes), written in the same statement as the renewal
    and only while the receipt is current; deleted with the message.
    Delivery order: by visibility time, then send order. Ordered groups
    (``send(..., group=...)``): a grouped row is eligible only while it is its
    group's oldest live row (the head) and visible, so a leased or abandoned head
    holds its group, comes back first, and one message per group goes per
    receive; the rule holds across processes, as a receive is one transaction.
    A receive scans the visible rows in delivery order, so a deep group whose
    head is leased costs a scan of its rows per poll. Dead letters go to a
    table in the same file. The file uses WAL; with ``synchronous=NORMAL`` (the
    default) a power loss can lose the last transactions but never corrupts the
    file, and a process crash loses nothing; ``FULL`` syncs every commit.

Limits:
    Leases 0.01 s – 30 days at millisecond resolution; 500 messages per receive,
    delete, renew and send call; bodies up to ``max_message_size`` (1 MiB by
    default). No native long poll: core polls with backoff (5–100 ms).
    ``Queue.stats()`` counts are exact (one read): visible, leased, delayed (sent
    with a delay, or abandoned with one), dead-lettered, and their total.

Raw types:
    ``lease.raw`` is ``None``. SDK errors are :class:`sqlite3.Error`.

Errors:
    Missing queue → ``QueueNotFound``; stale or malformed receipt, completed or
    TTL-expired message → ``LeaseLost``; ``database is locked`` beyond the busy
    timeout → ``BackendUnavailable`` (retried by core).
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from leasekit import dead_letter_format as marks
from leasekit.capabilities import Capabilities
from leasekit.clock import Clock, SystemClock, to_datetime
from leasekit.errors import InvalidURL
from leasekit.hookspecs import hookimpl
from leasekit.options import as_choice, as_float, as_int, as_object, as_text
from leasekit.registry import BackendSpec
from leasekit.spi import (
    CheckpointEntry,
    DeadLetter,
    Driver,
    DriverError,
    ErrorCode,
    OutgoingMessage,
    ParsedURL,
    QueueStats,
    RawMessage,
    ReceivedRows,
    Visibility,
    received,
)

T = TypeVar("T")

__all__ = ["SqliteDeadLetters", "SqliteDriver"]

DAY = 24 * 3600.0
#: Per-call batch limit: one receive or delete of this many is one transaction;
#: larger batches hold the write lock longer and starve other processes.
BATCH = 500
#: How often (seconds) a driver sweeps messages whose time-to-live passed.
PURGE_EVERY = 1.0
#: Longest busy timeout: SQLite takes it in milliseconds as a 32-bit int.
MAX_BUSY_TIMEOUT = (2**31 - 1) / 1000
#: Largest body: SQLite's default limit on a BLOB (SQLITE_MAX_LENGTH).
MAX_LENGTH = 1_000_000_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS leasekit_queues (
    name TEXT PRIMARY KEY,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS leasekit_messages (
    seq INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    id TEXT NOT NULL,
    body BLOB NOT NULL,
    properties TEXT,
    enqueued_at REAL NOT NULL,
    visible_at REAL NOT NULL,
    expires_at REAL,
    delivery_count INTEGER NOT NULL DEFAULT 0,
    receipt TEXT,
    checkpoint BLOB
);
CREATE INDEX IF NOT EXISTS leasekit_messages_ready
    ON leasekit_messages (queue, visible_at, seq);
CREATE INDEX IF NOT EXISTS leasekit_messages_ttl
    ON leasekit_messages (queue, expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS leasekit_dead_letters (
    seq INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    id TEXT NOT NULL,
    body BLOB NOT NULL,
    properties TEXT,
    enqueued_at REAL NOT NULL,
    delivery_count INTEGER NOT NULL,
    reason TEXT,
    dead_lettered_at REAL NOT NULL,
    visible_at REAL NOT NULL DEFAULT 0,
    receipt TEXT
);
CREATE INDEX IF NOT EXISTS leasekit_dead_letters_queue ON leasekit_dead_letters (queue, seq);
CREATE INDEX IF NOT EXISTS leasekit_dead_letters_id ON leasekit_dead_letters (queue, id);
"""

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

#: The lease columns of ``leasekit_dead_letters`` (for re-driving), added to a
#: file made before they existed.
_DEAD_LETTER_LEASE_COLUMNS = {
    "visible_at": "REAL NOT NULL DEFAULT 0",
    "receipt": "TEXT",
    "grp": "TEXT",
}
#: Columns of ``leasekit_messages`` added to a file made before they existed: the
#: checkpoint, and the ordered group (``NULL``: unordered) with the index that
#: finds a group's head.
_MESSAGE_COLUMNS = {"checkpoint": "BLOB", "grp": "TEXT"}
_GROUP_INDEX = (
    "CREATE INDEX IF NOT EXISTS leasekit_messages_group "
    "ON leasekit_messages (queue, grp, seq) WHERE grp IS NOT NULL"
)

#: Lease free dead letters, oldest first (a re-drive's receive).
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


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``sqlite``."""
    return [
        BackendSpec(
            name="sqlite",
            driver="leasekit.backends.sqlite:SqliteDriver",
            description="durable queues in one SQLite file, safe across processes (the default)",
        )
    ]


def _check_path(path: str) -> None:
    """Refuse a database path SQLite cannot open: a directory, or one in a missing directory.

    ``:memory:`` (a private in-memory database) is SQLite's own.
    """
    if path == ":memory:":
        return
    if os.path.isdir(path):
        raise InvalidURL(f"sqlite: the database path {path!r} is a directory, not a file")
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        raise InvalidURL(
            f"sqlite: the directory of the database path {path!r} does not exist "
            "(SQLite creates the file, not its directory)"
        )


def _lost(what: str) -> DriverError:
    return DriverError(ErrorCode.LEASE_LOST, what, backend_code="LeaseLost")


#: The defaults (shown by ``leasekit backends``); options can change some per queue.
CAPABILITIES = Capabilities(
    min_lease=0.01,
    max_lease=30 * DAY,
    lease_resolution=0.001,
    renew_rotates_receipt=False,
    detects_stale_receipts=True,
    expired_receipt_usable=True,
    max_receive_batch=BATCH,
    max_delete_batch=BATCH,
    max_renew_batch=BATCH,
    max_send_batch=BATCH,
    max_message_size=1024 * 1024,
    max_wait=0.0,
    max_abandon_delay=30 * DAY,
    max_send_delay=30 * DAY,
    max_ttl=3650 * DAY,
    supports_properties=True,
    native_dead_letter=True,
    delivery_count=True,
    queue_stats=True,
    counts=frozenset({"visible", "leased", "delayed", "dead_lettered"}),
    inspect_dead_letters=True,
    native_checkpoint=True,
    ordered=True,
)


class SqliteDriver(Driver):
    """Driver for one queue in a SQLite file.

    Parameters
    ----------
        queue: the queue name.
        path: the database file (created if missing); ``:memory:`` for a private one.
        clock: time source for leases, delays and TTL (wall clock by default).
        busy_timeout: seconds to wait for another process's write lock.
        synchronous: ``NORMAL`` (default) or ``FULL``.
        max_message_size: the largest body in bytes.
    """

    scheme = "sqlite"
    capabilities = CAPABILITIES

    def __init__(
        self,
        queue: str,
        path: str,
        clock: Clock | None = None,
        busy_timeout: float | str = 30.0,
        synchronous: str = "NORMAL",
        max_message_size: int | str = 1024 * 1024,
    ) -> None:
        if not isinstance(queue, str) or not queue:
            raise InvalidURL("sqlite: a queue name is required (?queue=NAME)")
        as_text(queue, "queue")
        if not isinstance(path, str) or not path:
            raise InvalidURL("sqlite: a database path is required (sqlite:///file.db?queue=NAME)")
        as_text(path, "path")
        _check_path(path)
        if clock is not None:
            as_object(clock, "clock", methods=("time",), what="a clock (with a time() method)")
        busy = as_float(busy_timeout, "busy_timeout", minimum=0, maximum=MAX_BUSY_TIMEOUT)
        sync = as_choice(synchronous, "synchronous", ("NORMAL", "FULL"))
        size = as_int(max_message_size, "max_message_size", minimum=1, maximum=MAX_LENGTH)
        self.queue = queue
        self.path = path
        self._clock: Clock = clock or SystemClock()
        self._busy_timeout = busy
        self._synchronous = sync
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._last_purge = 0.0
        #: The last receive found as many messages as it asked for.
        self._busy = False
        self._pid = os.getpid()
        self.capabilities = CAPABILITIES.replace(max_message_size=size)

    @classmethod
    def options_from_url(cls, url: ParsedURL) -> dict[str, Any]:
        """``sqlite:///rel.db?queue=q`` → path ``rel.db``; ``sqlite:////abs.db`` → ``/abs.db``."""
        if url.host:
            raise ValueError(
                f"sqlite URLs have no host (got {url.host!r}); use sqlite:///relative.db "
                "or sqlite:////absolute.db"
            )
        options: dict[str, Any] = dict(url.query)
        path = url.path[1:] if url.path.startswith("/") else url.path
        if path:
            options["path"] = path
        return options

    def __repr__(self) -> str:
        return f"<SqliteDriver {self.path!r} queue={self.queue!r}>"

    # ------------------------------------------------------------- connection

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        # A connection must not cross a fork: open a new one in the child.
        self._pid = os.getpid()
        conn = sqlite3.connect(
            self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout * 1000)}")
        conn.executescript(SCHEMA)
        _add_dead_letter_lease_columns(conn)
        _add_columns(conn, "leasekit_messages", _MESSAGE_COLUMNS)
        conn.execute(_GROUP_INDEX)
        self._conn = conn
        return conn

    def _exists(self, conn: sqlite3.Connection) -> None:
        row = conn.execute("SELECT 1 FROM leasekit_queues WHERE name = ?", (self.queue,)).fetchone()
        if row is None:
            raise DriverError(
                ErrorCode.QUEUE_NOT_FOUND,
                f"queue {self.queue!r} does not exist in {self.path}",
                backend_code="QueueNotFound",
            )

    def _write(self, conn: sqlite3.Connection) -> _Transaction:
        return _Transaction(conn)

    # --------------------------------------------------------------- messages

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Insert messages in one transaction."""
        now = self._clock.time()
        rows = []
        ids: list[str | BaseException] = []
        for m in messages:
            message_id = secrets.token_hex(12)
            ids.append(message_id)
            rows.append(
                (
                    self.queue,
                    message_id,
                    m.body,
                    json.dumps(dict(m.properties)) if m.properties else None,
                    now,
                    now + m.delay,
                    now + m.ttl if m.ttl is not None else None,
                    m.group,
                )
            )
        with self._lock:
            conn = self._connection()
            with self._write(conn):
                self._exists(conn)
                conn.executemany(
                    "INSERT INTO leasekit_messages "
                    "(queue, id, body, properties, enqueued_at, visible_at, expires_at, grp) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
        return ids

    def receive(self, max_messages: int, visibility: float, wait: float) -> Sequence[RawMessage]:
        """Lease up to ``max_messages`` in one transaction (``wait`` is ignored: core polls).

        Plain rows (:class:`~leasekit.spi.ReceivedRows`) unless a message of the
        batch has a checkpoint; in delivery order either way.
        """
        with self._lock:
            conn = self._connection()
            now = self._clock.time()
            if now - self._last_purge >= PURGE_EVERY:
                self._purge(conn, now)
            # Look without the write lock first, so idle pollers do not block writers
            # (not after a receive that found a full batch: the queue is busy then).
            if not self._busy:
                ready = conn.execute(
                    "SELECT 1 FROM leasekit_messages WHERE queue = ? AND visible_at <= ? LIMIT 1",
                    (self.queue, now),
                ).fetchone()
                if ready is None:
                    self._exists(conn)
                    return []
            with self._write(conn):
                picked = [
                    seq
                    for (seq,) in conn.execute(
                        _PICK, {"queue": self.queue, "now": now, "limit": max_messages}
                    )
                ]
                self._busy = len(picked) >= max_messages
                if not picked:  # (a queue with messages exists: no need to look before)
                    self._exists(conn)
                    return []
                rows = conn.execute(
                    _receive_statement(len(picked)), (now + visibility, *picked)
                ).fetchall()
        # Delivery order (visibility time, then send order), as the receive picked them.
        by_seq = {row[0]: row for row in rows}
        until = to_datetime(now + visibility)
        # Messages sent together share their send time: one datetime each time.
        stamps: dict[float, datetime] = {}
        if all(row[7] is None for row in rows):
            # No checkpoint (the common case): plain rows, from which core makes each
            # lease with no RawMessage in between (ReceivedRows' order of fields).
            return ReceivedRows(
                [
                    (
                        message_id,
                        body,
                        props,
                        stamps.get(enqueued_at)
                        or stamps.setdefault(enqueued_at, to_datetime(enqueued_at)),
                        count,
                        receipt,
                        until,
                        group,
                    )
                    for _, message_id, body, props, enqueued_at, count, receipt, _, group in map(
                        by_seq.__getitem__, picked
                    )
                ],
                json.loads,
            )
        return [
            received(
                message_id,
                body,
                receipt,
                count,
                stamps.get(enqueued_at) or stamps.setdefault(enqueued_at, to_datetime(enqueued_at)),
                until,
                json.loads(props) if props else {},
                None,
                None if checkpoint is None else bytes(checkpoint),
                group,
            )
            for _, message_id, body, props, enqueued_at, count, receipt, checkpoint, group in map(
                by_seq.__getitem__, picked
            )
        ]

    def _purge(self, conn: sqlite3.Connection, now: float) -> None:
        self._last_purge = now
        conn.execute(
            "DELETE FROM leasekit_messages WHERE queue = ? AND expires_at IS NOT NULL "
            "AND expires_at <= ?",
            (self.queue, now),
        )

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """Hide each message for ``seconds`` from now, in one transaction."""
        until = self._clock.time() + seconds
        expiry = to_datetime(until)
        return self._update(
            receipts,
            "UPDATE leasekit_messages SET visible_at = ?",
            (until,),
            lambda receipt: Visibility(receipt, expiry),
        )

    def checkpoint(
        self, entries: Sequence[CheckpointEntry], seconds: float
    ) -> list[Visibility | BaseException]:
        """Write each checkpoint and the new visibility in one statement each, one transaction."""
        results: list[Visibility | BaseException] = []
        limit = self.capabilities.max_message_size
        with self._lock:
            conn = self._connection()
            now = self._clock.time()
            until = now + seconds
            with self._write(conn):
                for entry in entries:
                    if len(entry.data) > limit:
                        results.append(
                            DriverError(
                                ErrorCode.TOO_LARGE,
                                f"a checkpoint of {len(entry.data)} bytes is over this "
                                f"queue's {limit}-byte limit",
                                backend_code="CheckpointTooLarge",
                            )
                        )
                        continue
                    receipt = entry.receipt
                    cursor = conn.execute(
                        _CHECKPOINT,
                        (until, entry.data, _seq_of(receipt), receipt, self.queue, now),
                    )
                    if cursor.rowcount == 1:
                        results.append(Visibility(receipt, to_datetime(until)))
                    else:
                        self._exists(conn)
                        results.append(
                            _lost(f"receipt {receipt!r} is stale or its message is gone")
                        )
        return results

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        """Release the messages, visible again after ``delay``; their receipts stop working.

        Clearing the receipt is what makes ``stats()`` count a message abandoned with
        a delay as delayed, not leased. It is cleared by a second statement in the
        same transaction, on the rows the first matched: the fence reads the
        receipt a statement returns, which is the one after it ran.
        """
        return self._update(
            receipts,
            "UPDATE leasekit_messages SET visible_at = ?",
            (self._clock.time() + delay,),
            lambda receipt: None,
            clear=True,
        )

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """Delete the leased messages: one fenced statement, one transaction.

        The common case first: the statement without ``RETURNING``, committed
        when it deleted as many rows as it was given receipts. A row is deleted
        only by its current receipt, and a receipt names one row, so that count
        says every receipt was held (a repeated one, or an old and the current
        receipt of one row, make it fall short). Otherwise it is rolled back and
        :meth:`_update` tells each receipt's outcome, in a transaction of its
        own, as a later call would. ``RETURNING`` costs about 0.5 µs a row (a
        tenth of the delete's cost, measured at batches of 10 and 100).
        """
        count = len(receipts)
        if not count:
            return []
        sql = _fenced(_DELETE, 0, count, returning=False)
        with self._lock:
            conn = self._connection()
            params = (*receipts, self.queue, self._clock.time())
            conn.execute("BEGIN IMMEDIATE")
            try:
                held = conn.execute(sql, params).rowcount == count
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT" if held else "ROLLBACK")
        if held:
            return [None] * count
        return self._update(receipts, _DELETE, (), lambda receipt: None)

    def _update(
        self,
        receipts: Sequence[str],
        statement: str,
        params: tuple[Any, ...],
        ok: Callable[[str], T],
        *,
        clear: bool = False,
    ) -> list[T | BaseException]:
        """Run ``statement`` on every held receipt at once (one transaction); ``ok(receipt)`` each.

        ``statement`` is an ``UPDATE … SET …`` or ``DELETE FROM`` without its
        ``WHERE`` (``params`` are its own). The fence is the one statement's
        ``WHERE``: the rows named, each with its receipt, of this queue, not
        expired. A receipt embeds its row's ``seq`` and is unique: ``seq IN``
        finds the rows by primary key, ``receipt IN`` keeps those whose current
        receipt was given, and the statement returns that receipt (two receipts
        of one row, an old holder's and the current one: only the current matches).
        With ``clear``, the matched rows' receipts are then cleared.
        """
        if not receipts:
            return []
        sql = _fenced(statement, len(params), len(receipts))
        with self._lock:
            conn = self._connection()
            now = self._clock.time()
            with self._write(conn):
                changed = {
                    receipt
                    for (receipt,) in conn.execute(sql, (*params, *receipts, self.queue, now))
                }
                done = [receipt in changed for receipt in receipts]
                if clear and changed:
                    conn.execute(
                        _fenced("UPDATE leasekit_messages SET receipt = NULL", 0, len(changed)),
                        (*changed, self.queue, now),
                    )
                if len(changed) < len(receipts):
                    self._exists(conn)
        results: list[T | BaseException] = []
        for matched, receipt in zip(done, receipts, strict=True):
            if matched:
                results.append(ok(receipt))
            else:
                results.append(_lost(f"receipt {receipt!r} is stale or its message is gone"))
        return results

    def dead_letter(self, receipt: str, reason: str, message: RawMessage) -> None:
        """Move the leased message to the dead-letter table, in one transaction."""
        with self._lock:
            conn = self._connection()
            now = self._clock.time()
            with self._write(conn):
                row = conn.execute(
                    "SELECT seq, id, body, properties, enqueued_at, delivery_count, grp "
                    f"FROM leasekit_messages WHERE {_HELD}",
                    (_seq_of(receipt), receipt, self.queue, now),
                ).fetchone()
                if row is None:
                    self._exists(conn)
                    raise _lost(f"receipt {receipt!r} is stale or its message is gone")
                seq, message_id, body, props, enqueued_at, count, group = row
                conn.execute(
                    "INSERT INTO leasekit_dead_letters (queue, id, body, properties, enqueued_at, "
                    "delivery_count, reason, dead_lettered_at, grp) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (self.queue, message_id, body, props, enqueued_at, count, reason, now, group),
                )
                conn.execute("DELETE FROM leasekit_messages WHERE seq = ?", (seq,))

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        """The oldest ``limit`` dead letters of this queue."""
        with self._lock:
            conn = self._connection()
            self._exists(conn)
            rows = conn.execute(
                "SELECT id, body, reason, delivery_count, properties, dead_lettered_at "
                "FROM leasekit_dead_letters WHERE queue = ? ORDER BY seq LIMIT ?",
                (self.queue, limit),
            ).fetchall()
        return _dead_letters(rows)

    def dead_letters_after(self, after: str, limit: int) -> list[DeadLetter]:
        """The ``limit`` dead letters after ``after``: two index reads, one page of rows."""
        with self._lock:
            conn = self._connection()
            self._exists(conn)
            found = conn.execute(
                "SELECT min(seq) FROM leasekit_dead_letters WHERE queue = ? AND id = ?",
                (self.queue, after),
            ).fetchone()
            if found is None or found[0] is None:
                raise KeyError(after)
            rows = conn.execute(
                "SELECT id, body, reason, delivery_count, properties, dead_lettered_at "
                "FROM leasekit_dead_letters WHERE queue = ? AND seq > ? ORDER BY seq LIMIT ?",
                (self.queue, found[0], limit),
            ).fetchall()
        return _dead_letters(rows)

    def dead_letter_store(self) -> SqliteDeadLetters:
        """The dead letters of this queue, leased and deleted like messages (for re-driving)."""
        return SqliteDeadLetters(
            queue=self.queue,
            path=self.path,
            clock=self._clock,
            busy_timeout=self._busy_timeout,
            synchronous=self._synchronous,
        )

    def stats(self) -> QueueStats:
        """Counts by state, in one read."""
        with self._lock:
            conn = self._connection()
            self._exists(conn)
            now = self._clock.time()
            visible, leased, delayed = conn.execute(
                "SELECT "
                "coalesce(sum(visible_at <= :now), 0), "
                "coalesce(sum(visible_at > :now AND receipt IS NOT NULL), 0), "
                "coalesce(sum(visible_at > :now AND receipt IS NULL), 0) "
                "FROM leasekit_messages WHERE queue = :queue "
                "AND (expires_at IS NULL OR expires_at > :now)",
                {"now": now, "queue": self.queue},
            ).fetchone()
            (dead,) = conn.execute(
                "SELECT count(*) FROM leasekit_dead_letters WHERE queue = ?", (self.queue,)
            ).fetchone()
        return QueueStats(visible=visible, leased=leased, delayed=delayed, dead_lettered=dead)

    def sibling(self, queue: str) -> SqliteDriver:
        """Another queue in the same file."""
        return SqliteDriver(queue=queue, path=self.path, clock=self._clock)

    # ------------------------------------------------------------------ admin

    def create_queue(self) -> None:
        """Create the queue if missing."""
        with self._lock:
            conn = self._connection()
            conn.execute(
                "INSERT OR IGNORE INTO leasekit_queues (name, created_at) VALUES (?, ?)",
                (self.queue, self._clock.time()),
            )

    def delete_queue(self) -> None:
        """Drop the queue, its messages and its dead letters."""
        with self._lock:
            conn = self._connection()
            with self._write(conn):
                for table in ("leasekit_messages", "leasekit_dead_letters"):
                    conn.execute(f"DELETE FROM {table} WHERE queue = ?", (self.queue,))
                conn.execute("DELETE FROM leasekit_queues WHERE name = ?", (self.queue,))

    # ----------------------------------------------------------------- errors

    def error_code(self, exc: BaseException) -> ErrorCode:
        """Locked or busy database → UNAVAILABLE; other sqlite errors → UNKNOWN."""
        if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
            return ErrorCode.UNAVAILABLE
        return super().error_code(exc)

    def backend_code(self, exc: BaseException) -> str | None:
        """The SQLite error name (``SQLITE_BUSY``...) or the driver's own code."""
        name = getattr(exc, "sqlite_errorname", None)
        return name if isinstance(name, str) else super().backend_code(exc)

    def is_retryable(self, exc: BaseException) -> bool:
        """A locked database is worth retrying."""
        return isinstance(exc, sqlite3.OperationalError) and _is_busy(exc)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class SqliteDeadLetters(SqliteDriver):
    """The dead letters of one SQLite queue, as a driver: receive leases, delete removes.

    What :meth:`SqliteDriver.dead_letter_store` returns; the lease lives in the
    dead-letter table's ``visible_at`` and ``receipt`` columns, so a re-drive in
    another process never takes the same dead letter. Sending is refused.
    """

    def __repr__(self) -> str:
        return f"<SqliteDeadLetters {self.path!r} queue={self.queue!r}>"

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Refused: dead letters come from dead-lettering."""
        error = DriverError(ErrorCode.UNSUPPORTED, "sqlite: cannot send to a dead-letter store")
        return [error for _ in messages]

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """Lease up to ``max_messages`` free dead letters, oldest first, in one transaction."""
        with self._lock:
            conn = self._connection()
            now = self._clock.time()
            with self._write(conn):
                self._exists(conn)
                rows = conn.execute(
                    _RECEIVE_DEAD,
                    {
                        "until": now + visibility,
                        "queue": self.queue,
                        "now": now,
                        "limit": max_messages,
                    },
                ).fetchall()
        rows.sort(key=lambda row: row[0])
        until = to_datetime(now + visibility)
        return [
            RawMessage(
                id=message_id,
                body=body,
                receipt=receipt,
                delivery_count=1,
                enqueued_at=to_datetime(dead_lettered_at),
                visible_until=until,
                properties=marks.marked(
                    json.loads(props) if props else {},
                    id=message_id,
                    reason=reason,
                    delivery_count=count,
                ),
                group=group,
            )
            for _, message_id, body, props, count, reason, dead_lettered_at, receipt, group in rows
        ]

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """Hide each leased dead letter for ``seconds`` from now."""
        until = self._clock.time() + seconds
        return self._each_dead(
            receipts,
            "UPDATE leasekit_dead_letters SET visible_at = ? WHERE seq = ? AND receipt = ? "
            "AND queue = ?",
            (until,),
            lambda receipt: Visibility(receipt, to_datetime(until)),
        )

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        """Give the leased dead letters back; their receipts stop working."""
        return self._each_dead(
            receipts,
            "UPDATE leasekit_dead_letters SET visible_at = ?, receipt = NULL WHERE seq = ? "
            "AND receipt = ? AND queue = ?",
            (self._clock.time() + delay,),
            lambda receipt: None,
        )

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """Remove the leased dead letters, in one transaction."""
        return self._each_dead(
            receipts,
            "DELETE FROM leasekit_dead_letters WHERE seq = ? AND receipt = ? AND queue = ?",
            (),
            lambda receipt: None,
        )

    def _each_dead(
        self,
        receipts: Sequence[str],
        statement: str,
        first: tuple[float, ...],
        ok: Callable[[str], T],
    ) -> list[T | BaseException]:
        results: list[T | BaseException] = []
        with self._lock:
            conn = self._connection()
            with self._write(conn):
                for receipt in receipts:
                    cursor = conn.execute(
                        statement, (*first, _seq_of(receipt), receipt, self.queue)
                    )
                    if cursor.rowcount == 1:
                        results.append(ok(receipt))
                    else:
                        self._exists(conn)
                        results.append(
                            _lost(f"dead-letter receipt {receipt!r} is stale or it is gone")
                        )
        return results


def _add_dead_letter_lease_columns(conn: sqlite3.Connection) -> None:
    """Add the dead-letter lease columns to a file made before they existed (idempotent)."""
    _add_columns(conn, "leasekit_dead_letters", _DEAD_LETTER_LEASE_COLUMNS)


def _add_columns(conn: sqlite3.Connection, table: str, columns: dict[str, str]) -> None:
    """Add ``columns`` (name: declaration) missing from ``table`` (idempotent, race-safe)."""
    have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
    for name, declaration in columns.items():
        if name in have:
            continue
        try:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
        except sqlite3.OperationalError as exc:  # another process added it first
            if "duplicate column" not in str(exc).lower():
                raise


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on error)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.conn.execute("COMMIT")
        else:
            self.conn.execute("ROLLBACK")


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


def _seq_of(receipt: str) -> int:
    """The row a receipt names; -1 (no row) for a malformed receipt, which then reads as stale."""
    head, dot, _ = receipt.partition(".")
    if not dot or not head.isdigit():
        return -1
    return int(head)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _dead_letters(rows: list[Any]) -> list[DeadLetter]:
    """Dead-letter rows (id, body, reason, count, properties, when) as ``DeadLetter``."""
    return [
        DeadLetter(
            id=i,
            body=b,
            reason=r,
            delivery_count=c,
            properties=json.loads(p) if p else {},
            enqueued_at=to_datetime(at),
        )
        for i, b, r, c, p, at in rows
    ]
