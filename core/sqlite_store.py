"""One SQLite file of records per namespace: what the built-in SQLite stores share.

:class:`~leasekit.SqliteIdempotencyStore` (processed ids) and
:class:`~leasekit.SqliteCheckpointStore` (checkpoints) each keep one table,
keyed by ``(namespace, id)``, in a WAL-mode file opened on first use; rows older
than ``retention`` are purged now and then as records are written.
"""

from __future__ import annotations

import sqlite3
import threading

__all__ = ["SqliteRecords"]

#: Seconds between purges of old rows (a purge runs as a record is written).
PURGE_EVERY = 60.0


class SqliteRecords:
    """A table of records in one SQLite file, shared by threads; a subclass names the table.

    Parameters
    ----------
        path: the database file (created if missing).
        namespace: separates the records of different queues sharing one file.
        retention: seconds to keep a record (``None``: forever).
    """

    #: The table, its ``CREATE TABLE`` statement and its time column (set by a subclass).
    TABLE = ""
    SCHEMA = ""
    WRITTEN_AT = ""

    def __init__(self, path: str, *, namespace: str, retention: float | None) -> None:
        self.path = path
        self.namespace = namespace
        self.retention = retention
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._last_purge = 0.0

    def _db(self) -> sqlite3.Connection:
        """The connection (call with the lock held), opened and the table made on first use."""
        if self._conn is None:
            conn = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(self.SCHEMA)
            self._conn = conn
        return self._conn

    def _purge(self, db: sqlite3.Connection, now: float) -> None:
        """Delete this namespace's rows older than ``retention`` (at most every ``PURGE_EVERY``)."""
        if self.retention is None or now - self._last_purge <= PURGE_EVERY:
            return
        self._last_purge = now
        db.execute(
            f"DELETE FROM {self.TABLE} WHERE namespace = ? AND {self.WRITTEN_AT} < ?",
            (self.namespace, now - self.retention),
        )

    def count(self) -> int:
        """How many records are kept in this namespace."""
        with self._lock:
            (n,) = (
                self._db()
                .execute(
                    f"SELECT count(*) FROM {self.TABLE} WHERE namespace = ?", (self.namespace,)
                )
                .fetchone()
            )
        return int(n)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
