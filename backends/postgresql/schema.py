"""The schema leasekit keeps in PostgreSQL, as ordered migrations."""

from __future__ import annotations

# ----------------------------------------------------------------- schema

#: The current schema version (the last migration's).
SCHEMA_VERSION = 3

#: Migrations, in order: (version, statements). ``{s}`` is the schema. A queue
#: made by one version opens in the next: the next version appends to this list,
#: and a driver brings an older schema up to date on first use.
MIGRATIONS: list[tuple[int, tuple[str, ...]]] = [
    (
        1,
        (
            """CREATE TABLE {s}.queues (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                name text NOT NULL UNIQUE,
                created_at timestamptz NOT NULL DEFAULT now()
            )""",
            # One row per message. lease_id: the lease batch holding it (NULL: not
            # leased; then visible_at says when it is visible). token: the current
            # delivery's receipt token (NULL: no receipt is valid).
            """CREATE TABLE {s}.messages (
                seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                queue_id bigint NOT NULL,
                id uuid NOT NULL,
                body bytea NOT NULL,
                properties jsonb,
                enqueued_at timestamptz NOT NULL,
                visible_at timestamptz NOT NULL,
                discard_at timestamptz,
                delivery_count integer NOT NULL DEFAULT 0,
                lease_id bigint,
                token bigint
            )""",
            """CREATE INDEX messages_ready ON {s}.messages (queue_id, visible_at, seq)
                WHERE lease_id IS NULL""",
            """CREATE INDEX messages_lease ON {s}.messages (lease_id)
                WHERE lease_id IS NOT NULL""",
            """CREATE INDEX messages_ttl ON {s}.messages (queue_id, discard_at)
                WHERE discard_at IS NOT NULL""",
            # One row per lease batch: what the keeper rewrites to renew a batch.
            # Small rows, rewritten often: room on each page for HOT-free churn.
            """CREATE TABLE {s}.leases (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                queue_id bigint NOT NULL,
                expires_at timestamptz NOT NULL
            ) WITH (fillfactor = 70)""",
            "CREATE INDEX leases_expiry ON {s}.leases (queue_id, expires_at)",
            """CREATE TABLE {s}.dead_letters (
                seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                queue_id bigint NOT NULL,
                id uuid NOT NULL,
                body bytea NOT NULL,
                properties jsonb,
                enqueued_at timestamptz NOT NULL,
                delivery_count integer NOT NULL,
                reason text,
                dead_lettered_at timestamptz NOT NULL DEFAULT now()
            )""",
            "CREATE INDEX dead_letters_queue ON {s}.dead_letters (queue_id, seq)",
        ),
    ),
    (
        2,
        (
            # Ordered groups: the group a message was sent in (NULL: unordered),
            # kept in dead letters too; the index finds a group's head (its
            # oldest row). Adding a nullable column rewrites no row.
            "ALTER TABLE {s}.messages ADD COLUMN grp text",
            "ALTER TABLE {s}.dead_letters ADD COLUMN grp text",
            """CREATE INDEX messages_group ON {s}.messages (queue_id, grp, seq)
                WHERE grp IS NOT NULL""",
        ),
    ),
    (
        3,
        (
            # Re-driving: a dead letter is leased as a message is (hidden until
            # visible_at, fenced by its token), so two re-drives never move the
            # same one. NULL: never leased (visible). No row is rewritten.
            "ALTER TABLE {s}.dead_letters ADD COLUMN visible_at timestamptz",
            "ALTER TABLE {s}.dead_letters ADD COLUMN token bigint",
            # Paging the dead letters by id (the dashboard's cursor): one index read
            # finds where a page starts, then (queue_id, seq) reads one page.
            "CREATE INDEX IF NOT EXISTS dead_letters_id ON {s}.dead_letters (queue_id, id)",
        ),
    ),
]
