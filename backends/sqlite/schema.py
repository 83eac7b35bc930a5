"""The tables leasekit keeps in a SQLite file, and the columns added to older files."""

from __future__ import annotations

import sqlite3

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
