"""Idempotency stores: remember which message ids were processed, so a redelivery is a no-op.

The guarantee, exactly: with a store configured, the :class:`~leasekit.Consumer`
checks the store before calling the handler and records the id only *after*
the handler returned, then completes the lease. So

- a message whose id is recorded is never handed to the handler again (its
  redelivery is completed at once and counted as a suppressed duplicate);
- a message is recorded only if its handler succeeded.

The limit: the handler's own effects and the record are not one transaction.
If the worker dies after the handler's effects but before the record, the
message comes back and the handler runs again. Processing stays at least once;
the store shrinks the window from "until the lease expires" to "between the
handler's last effect and the record". For exactly-once effects, make the
effect itself idempotent (e.g. an upsert keyed by ``message.id``).

Ids are stable across redeliveries on every backend; ids are only unique within
one queue, so a store shared by several queues should be given a ``namespace``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Protocol, runtime_checkable

from .sqlite_store import SqliteRecords

__all__ = ["IdempotencyStore", "MemoryIdempotencyStore", "SqliteIdempotencyStore"]


@runtime_checkable
class IdempotencyStore(Protocol):
    """Remembers processed message ids. Implementations must be thread-safe."""

    def seen(self, message_id: str) -> bool:
        """Whether ``message_id`` was recorded as processed."""
        ...

    def record(self, message_id: str) -> None:
        """Record ``message_id`` as processed (idempotent)."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...


class MemoryIdempotencyStore:
    """An in-process store keeping the most recent ``max_size`` ids.

    Parameters:
        max_size: how many ids to remember; the oldest are forgotten first.
    """

    def __init__(self, max_size: int = 1_000_000) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.max_size = max_size
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def seen(self, message_id: str) -> bool:
        """Whether ``message_id`` was recorded."""
        with self._lock:
            return message_id in self._ids

    def record(self, message_id: str) -> None:
        """Record ``message_id``."""
        with self._lock:
            self._ids[message_id] = None
            self._ids.move_to_end(message_id)
            while len(self._ids) > self.max_size:
                self._ids.popitem(last=False)

    def close(self) -> None:
        """Forget everything."""
        with self._lock:
            self._ids.clear()

    def __len__(self) -> int:
        return len(self._ids)


class SqliteIdempotencyStore(SqliteRecords):
    """A durable store in a SQLite file, shared safely by several processes.

    Parameters:
        path: the database file.
        namespace: separates ids of different queues sharing one file.
        retention: seconds to keep a record; older ones are purged (``None``: forever).
            Keep it longer than the longest time a message can be redelivered.
    """

    TABLE = "leasekit_processed"
    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS leasekit_processed ("
        "namespace TEXT NOT NULL, id TEXT NOT NULL, processed_at REAL NOT NULL, "
        "PRIMARY KEY (namespace, id)) WITHOUT ROWID"
    )
    WRITTEN_AT = "processed_at"

    def __init__(
        self, path: str, *, namespace: str = "", retention: float | None = 7 * 24 * 3600.0
    ) -> None:
        super().__init__(path, namespace=namespace, retention=retention)

    def seen(self, message_id: str) -> bool:
        """Whether ``message_id`` was recorded (in this namespace)."""
        with self._lock:
            row = (
                self._db()
                .execute(
                    "SELECT 1 FROM leasekit_processed WHERE namespace = ? AND id = ?",
                    (self.namespace, message_id),
                )
                .fetchone()
            )
            return row is not None

    def record(self, message_id: str) -> None:
        """Record ``message_id``; purge expired records now and then."""
        now = time.time()
        with self._lock:
            db = self._db()
            db.execute(
                "INSERT OR REPLACE INTO leasekit_processed (namespace, id, processed_at) "
                "VALUES (?, ?, ?)",
                (self.namespace, message_id, now),
            )
            self._purge(db, now)
