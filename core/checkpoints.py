"""Checkpoint stores: where a message's progress is kept when the queue service cannot keep it.

A checkpoint (:meth:`leasekit.Lease.checkpoint`) is progress saved for one
message while its lease is held; the next holder reads it as
``lease.message.checkpoint`` and resumes from there. Where the service can
carry it (``capabilities.native_checkpoint``: Azure Storage Queue rewrites the
message text, SQLite and memory keep it with the message), no store is needed.
Elsewhere (Service Bus, MNS, SQS) give :func:`leasekit.open` a
``checkpoint_store``: a :class:`CheckpointStore`, such as
:class:`SqliteCheckpointStore`.

How a stale holder is fenced off, exactly:

1. core writes the store only after the service confirmed, by a renewal made
   for that checkpoint, that the holder's receipt is current; a holder whose
   message was leased again gets :class:`~leasekit.LeaseLost` from the renewal
   (where the backend detects stale receipts) and writes nothing;
2. every save carries the holder's ``delivery_count`` as its *generation*, and
   a store writes only if no later generation saved already. A holder that
   passed step 1 and then stalled (its lease ran out, someone else leased the
   message and saved) is refused at step 2: its ``checkpoint()`` raises
   ``LeaseLost`` and the new holder's checkpoint stands. Where the backend
   cannot detect stale receipts (SQS) step 2 is the fence.

Completing or dead-lettering a message discards its checkpoint (after the
service confirmed it). If the process dies between the two, the entry stays
until ``retention`` purges it; it is never read again, since the message is gone.

A store on a shared database: implement the four methods over one table keyed
by ``(namespace, message_id)``, with the save as one conditional upsert (see
:class:`SqliteCheckpointStore`'s statement; PostgreSQL:
``INSERT ... ON CONFLICT (namespace, id) DO UPDATE SET ... WHERE
checkpoints.generation <= EXCLUDED.generation``, ``rowcount`` 1 when written).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

from .sqlite_store import SqliteRecords

__all__ = ["CheckpointStore", "MemoryCheckpointStore", "SqliteCheckpointStore"]


@runtime_checkable
class CheckpointStore(Protocol):
    """Keeps the last checkpoint of each message. Implementations must be thread-safe."""

    def load(self, message_id: str) -> bytes | None:
        """The last checkpoint saved for ``message_id``, or ``None``."""
        ...

    def save(self, message_id: str, data: bytes, generation: int) -> bool:
        """Save ``data`` for ``message_id`` unless a later ``generation`` saved already.

        Returns whether it was written (a save of the same generation overwrites).
        """
        ...

    def discard(self, message_id: str) -> None:
        """Forget ``message_id``'s checkpoint (nothing happens if it has none)."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...


class MemoryCheckpointStore:
    """An in-process store (for tests, and for workers that share one process)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, bytes]] = {}
        self._lock = threading.Lock()

    def load(self, message_id: str) -> bytes | None:
        """The last checkpoint of ``message_id``."""
        with self._lock:
            entry = self._entries.get(message_id)
        return None if entry is None else entry[1]

    def save(self, message_id: str, data: bytes, generation: int) -> bool:
        """Save unless a later generation saved."""
        with self._lock:
            entry = self._entries.get(message_id)
            if entry is not None and entry[0] > generation:
                return False
            self._entries[message_id] = (generation, bytes(data))
            return True

    def discard(self, message_id: str) -> None:
        """Forget ``message_id``."""
        with self._lock:
            self._entries.pop(message_id, None)

    def close(self) -> None:
        """Forget everything."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


#: The conditional upsert of a save: written when new, or when no later generation is stored.
_SAVE = (
    "INSERT INTO leasekit_checkpoints (namespace, id, generation, data, saved_at) "
    "VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (namespace, id) DO UPDATE SET "
    "generation = excluded.generation, data = excluded.data, saved_at = excluded.saved_at "
    "WHERE leasekit_checkpoints.generation <= excluded.generation"
)


class SqliteCheckpointStore(SqliteRecords):
    """A durable store in a SQLite file, shared safely by several processes on one machine.

    Parameters:
        path: the database file (created if missing).
        namespace: separates the message ids of different queues sharing one file.
        retention: seconds to keep a checkpoint nobody discarded (a worker died
            between completing a message and discarding its checkpoint); ``None``:
            forever. Keep it longer than a message can live in its queue.
    """

    TABLE = "leasekit_checkpoints"
    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS leasekit_checkpoints ("
        "namespace TEXT NOT NULL, id TEXT NOT NULL, generation INTEGER NOT NULL, "
        "data BLOB NOT NULL, saved_at REAL NOT NULL, "
        "PRIMARY KEY (namespace, id)) WITHOUT ROWID"
    )
    WRITTEN_AT = "saved_at"

    def __init__(
        self, path: str, *, namespace: str = "", retention: float | None = 14 * 24 * 3600.0
    ) -> None:
        super().__init__(path, namespace=namespace, retention=retention)

    def __repr__(self) -> str:
        return f"<SqliteCheckpointStore {self.path!r} namespace={self.namespace!r}>"

    def load(self, message_id: str) -> bytes | None:
        """The last checkpoint of ``message_id`` (in this namespace)."""
        with self._lock:
            row = (
                self._db()
                .execute(
                    "SELECT data FROM leasekit_checkpoints WHERE namespace = ? AND id = ?",
                    (self.namespace, message_id),
                )
                .fetchone()
            )
        return None if row is None else bytes(row[0])

    def save(self, message_id: str, data: bytes, generation: int) -> bool:
        """One conditional upsert; purge old entries now and then."""
        now = time.time()
        with self._lock:
            db = self._db()
            cursor = db.execute(_SAVE, (self.namespace, message_id, generation, bytes(data), now))
            written = cursor.rowcount == 1
            self._purge(db, now)
        return written

    def discard(self, message_id: str) -> None:
        """Forget ``message_id``'s checkpoint."""
        with self._lock:
            self._db().execute(
                "DELETE FROM leasekit_checkpoints WHERE namespace = ? AND id = ?",
                (self.namespace, message_id),
            )
