"""The SQLite driver: the SPI translated to SQL on one file."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from leasekit.capabilities import Capabilities
from leasekit.clock import Clock, SystemClock, to_datetime
from leasekit.errors import InvalidURL
from leasekit.options import as_choice, as_float, as_int, as_object, as_text
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

from .schema import (
    _GROUP_INDEX,
    _MESSAGE_COLUMNS,
    SCHEMA,
    _add_columns,
    _add_dead_letter_lease_columns,
)
from .statements import _CHECKPOINT, _DELETE, _HELD, _PICK, _fenced, _receive_statement

T = TypeVar("T")


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
    reports_oldest_age=True,
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
    #: The driver of a queue's dead letters: a subclass of this one, which
    #: :mod:`.dead_letters` sets here when it is imported (so this module imports it not).
    dead_letter_driver: ClassVar[type[SqliteDriver]]
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

    def _purge(self, conn: sqlite3.Connection, now: float) -> None:
        self._last_purge = now
        conn.execute(
            "DELETE FROM leasekit_messages WHERE queue = ? AND expires_at IS NOT NULL "
            "AND expires_at <= ?",
            (self.queue, now),
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

    def dead_letter_store(self) -> SqliteDriver:
        """The dead letters of this queue, leased and deleted like messages (for re-driving)."""
        return self.dead_letter_driver(
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
            visible, leased, delayed, oldest = conn.execute(
                "SELECT "
                "coalesce(sum(visible_at <= :now), 0), "
                "coalesce(sum(visible_at > :now AND receipt IS NOT NULL), 0), "
                "coalesce(sum(visible_at > :now AND receipt IS NULL), 0), "
                "min(enqueued_at) "
                "FROM leasekit_messages WHERE queue = :queue "
                "AND (expires_at IS NULL OR expires_at > :now)",
                {"now": now, "queue": self.queue},
            ).fetchone()
            (dead,) = conn.execute(
                "SELECT count(*) FROM leasekit_dead_letters WHERE queue = ?", (self.queue,)
            ).fetchone()
        return QueueStats(
            visible=visible,
            leased=leased,
            delayed=delayed,
            dead_lettered=dead,
            oldest_age=None if oldest is None else max(0.0, now - oldest),
        )

    def sibling(self, queue: str) -> SqliteDriver:
        """Another queue in the same file."""
        return SqliteDriver(queue=queue, path=self.path, clock=self._clock)

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
