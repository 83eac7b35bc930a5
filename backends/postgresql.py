"""The PostgreSQL backend: leased queues in the database people already run.

URLs:
    ``postgresql://[user@]host[:port]/dbname?queue=NAME`` (alias ``postgres://``).
    Every query parameter other than leasekit's own (``queue``, ``schema``,
    ``pool_size``, ``max_message_size``, ``prepared_statements``) is libpq's, so
    ``postgresql://postgres@/postgres?host=/run/pg&queue=jobs`` (a socket
    directory) and ``?sslmode=verify-full`` work. Keyword form:
    ``leasekit.open("postgresql", queue="jobs", dsn=os.environ["DATABASE_URL"])``,
    where ``dsn`` is any libpq connection string or URI, and any other keyword is
    a libpq parameter (``host=``, ``sslmode=``...). A password comes from the
    keyword ``password=``, the ``dsn``, libpq's environment (``PGPASSWORD``) or
    ``.pgpass``, or the URL's ``user:password@`` (percent-decoded as libpq does:
    ``%40`` for ``@``...); it never appears in a repr, an error, a log line or
    CLI output. libpq checks every parameter's value when the queue is opened,
    connecting nowhere (``sslmode=bogus`` is ``InvalidURL`` from ``open()``).
    ``schema`` (default ``leasekit``) names the schema that holds the tables;
    ``pool_size`` the most connections (default 10).

Delivery semantics:
    At least once, across any number of processes and machines. A receive takes
    messages with ``FOR UPDATE SKIP LOCKED`` (no two receivers wait on each other
    or get the same message) and makes one *lease batch* row holding the batch's
    expiry (expired batches are given back to the queue by receives, at most every
    100 ms and whenever a receive comes up short); each message points at its
    batch and carries its own random token, so a receipt (``seq.token``) is
    valid for that delivery only. Renewing every message of a batch rewrites one
    row, not one per message; renewing some of them moves those into a new
    batch (see ``docs/backends/postgresql.md``).
    Settling checks the token: a stale receipt is refused (``LeaseLost``) and
    changes nothing. A receipt whose lease expired but whose message nobody
    re-leased still works. Renew keeps the receipt. Delivery order: by
    visibility time, then send order. Ordered groups (``send(..., group=...)``,
    ``ordered=True``): a grouped row is eligible only while it is its group's
    oldest live row (the head) and visible, and the receive locks that head row,
    so a leased or abandoned head holds its group, comes back first, and one
    message per group goes per receive (``docs/ordering.md``). No deduplication
    (``deduplicates=False``). Dead letters go to a table of their own, with
    their group, and are re-driven from it (each leased in its row).
    Times are the server's clock.

Limits:
    Leases 0.01 s – 30 days at millisecond resolution; 500 messages per receive,
    delete, renew and send call; bodies up to ``max_message_size`` (1 MiB by
    default; PostgreSQL's own limit is 1 GB). No long poll: core polls with
    backoff (5–100 ms). ``Queue.stats()`` counts are exact: visible, leased,
    delayed, dead-lettered. Any PostgreSQL ≥ 13, no extension.

Raw types:
    ``lease.raw`` is ``None``. SDK errors are :class:`psycopg.Error` (and
    :class:`psycopg_pool.PoolTimeout`).

Errors:
    Missing queue, schema or database → ``QueueNotFound``; stale or malformed
    receipt, completed or TTL-expired message → ``LeaseLost``; a lost
    connection, a server restarting, a pool with no free connection in time, a
    serialization failure or deadlock → ``BackendUnavailable`` (retried by
    core); a refused password or role → ``AuthenticationFailed``; a value the
    server cannot store (class 22, a NUL) or a setting it refuses →
    ``InvalidArgument``. What no retry mends is never retried. After a cut, a
    waiting call has a connection made at once rather than waiting for the
    pool's reconnect schedule (see :meth:`_Shared._wait_for_one`). Every call
    is bounded by core's deadline: the server's ``statement_timeout`` and, for
    a hung network, the connection's socket being shut down when the deadline
    passes.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import os
import re
import select
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from leasekit import dead_letter_format as marks
from leasekit.capabilities import Capabilities
from leasekit.deadline import DeadlineExceeded, call_timeout
from leasekit.errors import InvalidURL
from leasekit.hookspecs import hookimpl
from leasekit.options import as_bool, as_int, as_text
from leasekit.redaction import install_log_redaction, remember_secret
from leasekit.registry import BackendSpec
from leasekit.spi import (
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
)

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresqlDriver"]

DAY = 24 * 3600.0
#: Per-call batch limit: one receive, renew, delete or send of this many is one
#: transaction of a few statements; larger ones hold row locks longer.
BATCH = 500
#: How often (seconds) a driver deletes messages whose time-to-live passed.
PURGE_EVERY = 5.0
#: Most expired lease batches one receive gives back to the queue: bounds the
#: receive's work after a crash left many batches behind (the rest follow).
REAP_LIMIT = 200
#: A receive gives expired lease batches back at most this often (seconds), and
#: whenever it finds fewer messages than asked for: under load, an expired
#: message is back within this long, and a receive is one statement, not two.
REAP_EVERY = 0.1
#: A connection between two calls waits in the driver's own idle list, not the
#: pool (a pool round costs more client CPU than the statements' own work at
#: small batches); after this many seconds out of the pool it is given back at
#: the end of its next call, so the pool's lifetime and idle rules still apply.
KEEP_FOR = 60.0
#: Default connect timeout given to libpq (whole seconds; libpq's floor is 2).
CONNECT_TIMEOUT = 5
#: Seconds the pool keeps retrying one failed connection before it gives up and
#: lets the next call that needs one start afresh (see ``_Shared.get``).
RECONNECT_TIMEOUT = 3.0
#: After a connection was found cut, a call waiting for one does not wait for the
#: pool's reconnect schedule (1 s, then 2 s...: a short cut's end would be noticed
#: up to 2 s late): it has a connection made for it at once, and again this many
#: seconds after each failed attempt, until its deadline. Shorter notices a cut's
#: end sooner; each attempt in a refusing network is one failed connect.
REDIAL_EVERY = 0.1
#: How often (seconds) a call waiting for such a connection also asks the pool
#: (which may have reconnected first).
DIAL_POLL = 0.02
#: A call waiting for the pool (all its connections in use) looks this often
#: (seconds) whether a cut was found meanwhile, to stop waiting on the pool's schedule.
WAIT_SLICE = 0.5
#: Loggers of the SDK whose records are redacted.
SDK_LOGGERS = ("psycopg", "psycopg.pool")
#: Server-side statement timeouts are set in these steps (ms) rather than to
#: the exact deadline, so a connection is re-``SET`` only when the step changes;
#: the exact deadline is kept on the client (the socket is shut down at it).
TIMEOUT_STEPS_MS = (250, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000, 300_000, 3_600_000)
#: Grace (seconds) after a call's deadline before its connection is cut: lets the
#: server's own statement_timeout answer first when the network is fine.
CUT_GRACE = 0.05
#: libpq options a URL or keyword may carry that are credentials.
SECRET_OPTIONS = frozenset({"password", "sslpassword", "dsn"})
#: leasekit's own options (the others are libpq's).
OWN_OPTIONS = ("queue", "schema", "pool_size", "max_message_size", "prepared_statements", "dsn")

#: SQLSTATE classes and codes that mean "try again": connection exceptions (08),
#: insufficient resources (53), operator intervention (57: admin shutdown,
#: crash shutdown, cannot connect now; not 57014, a cancelled statement),
#: serialization failure and deadlock (40001, 40P01).
_RETRYABLE_STATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "55P03"})
_RETRYABLE_CLASSES = ("08", "53")


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
        ),
    ),
]

_QUEUE_ID = "(SELECT id FROM {s}.queues WHERE name = %(queue)s)"

#: Rows are inserted in the list's order (``ORDER BY r.n``), so ``seq`` is the
#: send order a group's messages are handed out in.
_SEND = (
    "INSERT INTO {s}.messages (queue_id, id, body, properties, enqueued_at, visible_at, "
    "discard_at, grp) "
    "SELECT q.id, r.id, r.body, r.props, now(), now() + make_interval(secs => r.delay), "
    "CASE WHEN r.ttl IS NULL THEN NULL ELSE now() + make_interval(secs => r.ttl) END, r.grp "
    "FROM {s}.queues q, unnest(%(ids)s::uuid[], %(bodies)s::bytea[], %(props)s::jsonb[], "
    "%(delays)s::float8[], %(ttls)s::float8[], %(groups)s::text[]) WITH ORDINALITY "
    "AS r(id, body, props, delay, ttl, grp, n) WHERE q.name = %(queue)s ORDER BY r.n"
)

#: Give the messages of expired lease batches back to the queue (visible since
#: their batch expired), deleting the batches; a renewal holding a batch's row
#: lock is skipped (and rechecked by the lock: a renewed batch is not expired).
_REAP = (
    "WITH expired AS (DELETE FROM {s}.leases WHERE id IN ("
    "SELECT id FROM {s}.leases WHERE queue_id = " + _QUEUE_ID + " AND expires_at <= now() "
    "ORDER BY expires_at LIMIT %(reap)s FOR UPDATE SKIP LOCKED) RETURNING id, expires_at) "
    "UPDATE {s}.messages m SET lease_id = NULL, visible_at = e.expires_at "
    "FROM expired e WHERE m.lease_id = e.id"
)

_PURGE = (
    "DELETE FROM {s}.messages WHERE queue_id = " + _QUEUE_ID + " AND discard_at IS NOT NULL "
    "AND discard_at <= now()"
)

#: One receive: pick visible messages (skipping rows other receivers hold),
#: make one lease batch for them, and point each at it with a fresh token.
#:
#: Ordered groups: a grouped row is picked only while it is its group's head —
#: no older live row (not past its TTL) of the group exists, leased or not — so
#: a leased or abandoned head holds its group and at most one row per group is
#: picked. The lock is taken on the head row itself: a receiver that finds the
#: head locked (another receive is taking it) skips it, and the group's next row
#: is not a head while that row exists; a head taken and committed meanwhile is
#: rechecked on its new version (``lease_id`` set) and dropped. A group moves
#: on only when its head row is deleted (completed, dead-lettered, purged) or
#: its TTL passed (then it can no longer be settled either).
_RECEIVE = (
    "WITH q AS " + _QUEUE_ID + ", "
    "picked AS (SELECT m.seq, m.visible_at AS was FROM {s}.messages m "
    "WHERE m.queue_id = (SELECT id FROM q) AND m.lease_id IS NULL AND m.visible_at <= now() "
    "AND (m.discard_at IS NULL OR m.discard_at > now()) "
    "AND (m.grp IS NULL OR NOT EXISTS (SELECT 1 FROM {s}.messages h "
    "WHERE h.queue_id = m.queue_id AND h.grp = m.grp AND h.seq < m.seq "
    "AND (h.discard_at IS NULL OR h.discard_at > now()))) "
    "ORDER BY m.visible_at, m.seq LIMIT %(limit)s FOR UPDATE OF m SKIP LOCKED), "
    "batch AS (INSERT INTO {s}.leases (queue_id, expires_at) "
    "SELECT (SELECT id FROM q), now() + make_interval(secs => %(seconds)s) "
    "WHERE EXISTS (SELECT 1 FROM picked) RETURNING id, expires_at), "
    "taken AS (UPDATE {s}.messages m SET lease_id = batch.id, visible_at = batch.expires_at, "
    "delivery_count = m.delivery_count + 1, "
    "token = floor(random() * 9007199254740991)::bigint + 1 "
    "FROM picked, batch WHERE m.seq = picked.seq "
    "RETURNING m.seq, m.id, m.body, m.properties, m.enqueued_at, m.delivery_count, m.token, "
    "batch.expires_at, picked.was, m.grp) "
    # In delivery order (visible since, then sent); the receipt made here, as text.
    "SELECT id::text, body, properties, enqueued_at, delivery_count, "
    "seq::text || '.' || token::text, expires_at, grp FROM taken ORDER BY was, seq"
)

_EXISTS = "SELECT 1 FROM {s}.queues WHERE name = %(queue)s"

#: The receipts of a call, given as one text parameter (``"seq.token,seq.token"``,
#: checked by :data:`_RECEIPTS` first) and split by the server: one parameter to
#: send instead of two arrays built and quoted element by element in Python.
_PAIRS = (
    "(SELECT split_part(x, '.', 1)::bigint AS seq, split_part(x, '.', 2)::bigint AS token "
    "FROM unnest(string_to_array(%(receipts)s, ',')) AS x) AS r"
)

#: Message numbers given as one text parameter (``"seq,seq"``), split by the server.
_SEQS = "string_to_array(%(seqs)s, ',')::bigint[]"

#: Lock the lease batches of the given messages, in id order (no deadlock between
#: two renewals): a receive's reaping skips them, a concurrent renewal waits.
_LOCK_BATCHES = (
    "SELECT l.id FROM {s}.leases l WHERE l.id IN ("
    "SELECT lease_id FROM {s}.messages WHERE seq = ANY(" + _SEQS + ")) "
    "ORDER BY l.id FOR UPDATE OF l"
)

#: After the lock: each message's token, batch, time-to-live, and how many
#: messages its batch holds (a batch renewed as a whole needs all of them).
_RENEW_STATE = (
    "WITH mine AS (SELECT seq, token, lease_id, "
    "(discard_at IS NOT NULL AND discard_at <= now()) AS dead FROM {s}.messages "
    "WHERE seq = ANY(" + _SEQS + ") AND queue_id = " + _QUEUE_ID + "), "
    "members AS (SELECT lease_id, count(*) AS n FROM {s}.messages "
    "WHERE lease_id IN (SELECT lease_id FROM mine) GROUP BY lease_id) "
    "SELECT mine.seq, mine.token, mine.lease_id, mine.dead, members.n "
    "FROM mine LEFT JOIN members USING (lease_id)"
)

_RENEW_BATCHES = (
    "UPDATE {s}.leases SET expires_at = now() + make_interval(secs => %(seconds)s) "
    "WHERE id = ANY(%(batches)s) RETURNING id, expires_at"
)

#: Some messages of a batch (or messages whose expired batch was given back and
#: nobody re-leased): a new batch for them, fenced by each token.
_RENEW_MOVE = (
    "WITH batch AS (INSERT INTO {s}.leases (queue_id, expires_at) "
    "SELECT " + _QUEUE_ID + ", now() + make_interval(secs => %(seconds)s) RETURNING id, "
    "expires_at) "
    "UPDATE {s}.messages m SET lease_id = batch.id, visible_at = batch.expires_at "
    "FROM batch, " + _PAIRS + " "
    "WHERE m.seq = r.seq AND m.token = r.token "
    "AND (m.discard_at IS NULL OR m.discard_at > now()) "
    "RETURNING m.seq, batch.expires_at"
)

_HELD = (
    "FROM " + _PAIRS + " "
    "WHERE m.seq = r.seq AND m.token = r.token AND m.queue_id = " + _QUEUE_ID + " "
    "AND (m.discard_at IS NULL OR m.discard_at > now())"
)

#: A settle answers with one row: how many it settled and, only when that is
#: fewer than it was given, which (``seq.token``: a stale receipt of a message
#: settled by its current one in the same call is told apart), so a full batch
#: decodes one number, not a row per message.
_SETTLED = (
    "SELECT count(*)::int, CASE WHEN count(*) < %(n)s "
    "THEN array_agg(seq::text || '.' || token::text) END FROM done"
)

_DELETE = (
    "WITH done AS (DELETE FROM {s}.messages m USING "
    + _HELD[5:]
    + " RETURNING m.seq, r.token) "
    + _SETTLED
)

_ABANDON = (
    "WITH done AS (UPDATE {s}.messages m SET lease_id = NULL, token = NULL, "
    "visible_at = now() + make_interval(secs => %(delay)s) "
    + _HELD
    + " RETURNING m.seq, r.token) "
    + _SETTLED
)

_DEAD_LETTER = (
    "WITH gone AS (DELETE FROM {s}.messages m USING " + _HELD[5:] + " "
    "RETURNING m.queue_id, m.id, m.body, m.properties, m.enqueued_at, m.delivery_count, "
    "m.grp) "
    "INSERT INTO {s}.dead_letters (queue_id, id, body, properties, enqueued_at, "
    "delivery_count, reason, grp) SELECT queue_id, id, body, properties, enqueued_at, "
    "delivery_count, %(reason)s, grp FROM gone RETURNING seq"
)

_DEAD_LETTERS = (
    "SELECT id, body, reason, delivery_count, properties, grp FROM {s}.dead_letters "
    "WHERE queue_id = " + _QUEUE_ID + " ORDER BY seq LIMIT %(limit)s"
)

_PEEK = (
    "SELECT m.seq, m.id, m.body, m.properties, m.enqueued_at, m.delivery_count, m.visible_at "
    "FROM {s}.messages m LEFT JOIN {s}.leases l ON l.id = m.lease_id "
    "WHERE m.queue_id = " + _QUEUE_ID + " AND (m.discard_at IS NULL OR m.discard_at > now()) "
    "AND ((m.lease_id IS NULL AND m.visible_at <= now()) OR l.expires_at <= now()) "
    "ORDER BY m.visible_at, m.seq LIMIT %(limit)s"
)

_STATS = (
    "SELECT "
    "count(*) FILTER (WHERE (m.lease_id IS NULL AND m.visible_at <= now()) "
    "OR l.expires_at <= now()), "
    "count(*) FILTER (WHERE l.expires_at > now()), "
    "count(*) FILTER (WHERE m.lease_id IS NULL AND m.visible_at > now()), "
    "(SELECT count(*) FROM {s}.dead_letters d WHERE d.queue_id = q.id) "
    "FROM {s}.queues q LEFT JOIN {s}.messages m ON m.queue_id = q.id "
    "AND (m.discard_at IS NULL OR m.discard_at > now()) "
    "LEFT JOIN {s}.leases l ON l.id = m.lease_id "
    "WHERE q.name = %(queue)s GROUP BY q.id"
)


#: Lease up to ``limit`` free dead letters of the queue, oldest first: each gets a
#: new token (its receipt ``seq.token``) and is hidden until the lease ends.
_RECEIVE_DEAD = (
    "WITH picked AS (SELECT d.seq FROM {s}.dead_letters d WHERE d.queue_id = " + _QUEUE_ID + " "
    "AND (d.visible_at IS NULL OR d.visible_at <= now()) ORDER BY d.seq "
    "LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
    "UPDATE {s}.dead_letters d SET visible_at = now() + make_interval(secs => %(seconds)s), "
    "token = floor(random() * 9007199254740991)::bigint + 1 FROM picked WHERE d.seq = picked.seq "
    "RETURNING d.seq, d.id::text, d.body, d.properties, d.delivery_count, d.reason, "
    "d.dead_lettered_at, d.seq::text || '.' || d.token::text, d.visible_at, d.grp"
)

_HELD_DEAD = (
    "FROM " + _PAIRS + " WHERE d.seq = r.seq AND d.token = r.token AND d.queue_id = " + _QUEUE_ID
)

_RENEW_DEAD = (
    "UPDATE {s}.dead_letters d SET visible_at = now() + make_interval(secs => %(seconds)s) "
    + _HELD_DEAD
    + " RETURNING d.seq::text || '.' || d.token::text, d.visible_at"
)

_DELETE_DEAD = (
    "DELETE FROM {s}.dead_letters d USING "
    + _HELD_DEAD[5:]
    + " RETURNING d.seq::text || '.' || d.token::text"
)

_ABANDON_DEAD = (
    "UPDATE {s}.dead_letters d SET visible_at = now() + make_interval(secs => %(delay)s), "
    "token = NULL " + _HELD_DEAD + " RETURNING d.seq::text || '.' || r.token::text"
)


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``postgresql`` and its alias ``postgres``."""
    driver = "leasekit.backends.postgresql:PostgresqlDriver"
    return [
        BackendSpec(
            name="postgres", driver=driver, extra="postgresql", description="alias of postgresql"
        ),
        BackendSpec(
            name="postgresql",
            driver=driver,
            extra="postgresql",
            description="queues in PostgreSQL ≥ 13 (SKIP LOCKED, batch-renewed leases), "
            "one machine or many",
        ),
    ]


#: The defaults (shown by ``leasekit backends``); ``max_message_size`` can change per queue.
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
    properties_hold_nul=False,  # text cannot hold U+0000 (core refuses it before a call)
    native_dead_letter=True,
    delivery_count=True,
    queue_stats=True,
    counts=frozenset({"visible", "leased", "delayed", "dead_lettered"}),
    inspect_dead_letters=True,
    ordered=True,
)

#: Largest body: PostgreSQL's limit on one field (1 GB), less a margin.
MAX_FIELD = 1_000_000_000


def _lost(what: str) -> DriverError:
    return DriverError(ErrorCode.LEASE_LOST, what, backend_code="LeaseLost")


#: One well-formed receipt (ASCII digits only: ``str.isdigit`` would let ``"²"`` by).
_RECEIPT = re.compile(r"[0-9]{1,18}\.[0-9]{1,18}")
#: A comma-joined list of well-formed receipts, checked in one match.
_RECEIPTS = re.compile(r"[0-9]{1,18}\.[0-9]{1,18}(?:,[0-9]{1,18}\.[0-9]{1,18})*")


def _receipt(receipt: str) -> tuple[int, int] | None:
    """``(seq, token)`` from ``"seq.token"``; ``None`` if malformed (it reads as stale)."""
    if not isinstance(receipt, str) or _RECEIPT.fullmatch(receipt) is None:
        return None
    head, _, tail = receipt.partition(".")
    return int(head), int(tail)


def _joined(receipts: Sequence[str]) -> tuple[str, bool]:
    """The well-formed receipts as one ``"seq.token,..."`` text, and whether all were.

    One join and one regular-expression match for a whole batch (and a count of
    its commas: one receipt holding a comma, ``"1.2,3.4"``, would otherwise
    pass as two); only a batch holding a malformed receipt is checked one by one.
    """
    try:
        text = ",".join(receipts)
    except TypeError:
        text = ""
    else:
        if text.count(",") == len(receipts) - 1 and _RECEIPTS.fullmatch(text) is not None:
            return text, True
    return ",".join(r for r in receipts if _receipt(r) is not None), False


def _props(value: Any) -> dict[str, str]:
    if not value:
        return {}
    loaded = json.loads(value) if isinstance(value, str) else value
    return {str(k): str(v) for k, v in dict(loaded).items()}


# --------------------------------------------------------------- deadlines


class _Watchdog:
    """Cuts a connection whose call outlived its deadline: one daemon thread per process.

    A statement the server runs too long is stopped by the server's
    ``statement_timeout``; a call whose network hangs (no answer at all) is
    stopped here, by shutting down the connection's socket, which makes libpq's
    wait return with an error at once. The connection is then broken and the
    pool replaces it. A call that finished is unregistered first (under the
    lock), so a connection back in the pool is never cut.

    Every open pool holds the watchdog (:meth:`hold`); when the last one is
    closed (:meth:`release`), its thread ends before ``close()`` returns.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # watch/unwatch hold the plain lock (a C-level ``with``); the thread waits
        # on a condition over the same lock.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int]] = []
        self._calls: dict[int, tuple[int, list[bool]]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._users = 0
        #: When the thread wakes next on its own (monotonic; 0: not waiting). A
        #: call whose deadline comes later needs no wake-up: the thread finds it
        #: then. Waking it for every call costs two context switches a call.
        self._wakes_at = 0.0

    def after_fork(self) -> None:
        """In a forked child: none of the parent's calls, pools or thread are this process's.

        The parent's lock may have been held by one of its other threads at the
        fork (it would stay locked here): the child starts with new ones.
        """
        self._reset()

    def hold(self) -> None:
        """An open pool uses the watchdog."""
        with self._cond:
            self._users += 1

    def release(self) -> None:
        """A pool was closed; the last one ends the thread (and waits for it, briefly)."""
        with self._cond:
            self._users = max(0, self._users - 1)
            if self._users:
                return
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)

    def watch(self, fd: int, timeout: float | None) -> tuple[int, list[bool]] | None:
        """Watch the call on socket ``fd`` for ``timeout`` seconds: its key and ``[cut]``.

        ``None`` when there is nothing to watch (no deadline, no socket). The
        caller gives the key to :meth:`unwatch` when the call ends (in a ``finally``).
        """
        if timeout is None or fd < 0:
            return None
        cut = [False]
        key = next(self._ids)
        due = time.monotonic() + timeout + CUT_GRACE
        with self._lock:
            self._calls[key] = (fd, cut)
            heapq.heappush(self._heap, (due, key))
            if self._thread is None:  # none yet, released, or ended (see _run)
                self._thread = threading.Thread(
                    target=self._run, name="leasekit-postgresql-watchdog", daemon=True
                )
                self._thread.start()
            elif due < self._wakes_at:
                self._cond.notify()
        return key, cut

    def unwatch(self, key: int) -> None:
        """The call ended: its connection is not to be cut.

        Finished calls at the top of the heap are dropped here: calls mostly end
        in the order they began, so the heap holds about the calls in flight,
        not every call of the last ``timeout`` seconds (thousands a second under
        load) for the watchdog thread to pop at once, holding the lock.
        """
        with self._lock:
            self._calls.pop(key, None)
            heap, calls = self._heap, self._calls
            while heap and heap[0][1] not in calls:
                heapq.heappop(heap)

    @contextmanager
    def guard(self, fd: int, timeout: float | None) -> Iterator[list[bool]]:
        """Watch the call on socket ``fd`` for ``timeout`` seconds; yields ``[cut]``."""
        watched = self.watch(fd, timeout)
        try:
            yield [False] if watched is None else watched[1]
        finally:
            if watched is not None:
                self.unwatch(watched[0])

    def _run(self) -> None:
        me = threading.current_thread()
        try:
            self._watch_calls(me)
        finally:
            with self._lock:  # ended (released, or an error): the next call starts another
                if self._thread is me:
                    self._thread = None

    def _watch_calls(self, me: threading.Thread) -> None:
        while True:
            with self._cond:
                while True:
                    if self._thread is not me:
                        return  # released: no pool left to watch
                    now = time.monotonic()
                    while self._heap and self._heap[0][1] not in self._calls:
                        heapq.heappop(self._heap)  # finished in time
                    if self._heap and self._heap[0][0] <= now:
                        _, key = heapq.heappop(self._heap)
                        fd, cut = self._calls.pop(key)
                        cut[0] = True
                        _shutdown(fd)
                        continue
                    wait = self._heap[0][0] - now if self._heap else 60.0
                    self._wakes_at = now + wait
                    self._cond.wait(wait)
                    self._wakes_at = 0.0


#: The process's watchdog, shared by every pool.
_WATCHDOG = _Watchdog()

#: This process's id, kept current across forks: ``os.getpid()`` is a system
#: call, and a pool checks whose it is on every call.
_PROCESS = [os.getpid()]


#: Every pool holder of this process: a forked child renews their locks.
_ALL_SHARED: weakref.WeakSet[_Shared] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A child has none of its parent's threads: a lock one of them held stays locked."""
    _PROCESS[0] = os.getpid()
    _WATCHDOG.after_fork()
    for shared in list(_ALL_SHARED):
        shared.lock = threading.Lock()
        # The parent's idle connections are the parent's: dropped here, not
        # closed (psycopg leaves a connection of another process alone).
        shared.idle_lock = threading.Lock()
        shared.idle = []
        shared.waiting = 0
        shared.own = 0
        shared.dialing = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def _shutdown(fd: int) -> None:
    """Shut the socket ``fd`` down both ways (its blocked reader wakes with EOF); keep the fd."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def _timeout_band(wanted_ms: float) -> tuple[float, float, int]:
    """The server-side statement_timeout for a call of ``wanted_ms``: ``(low, high, step)``.

    ``step`` (ms) is the first of :data:`TIMEOUT_STEPS_MS` at or above the time
    wanted (0, no limit, past an hour); every time in ``(low, high]`` gets it.
    """
    low = 0.0
    for step in TIMEOUT_STEPS_MS:
        if wanted_ms <= step:
            return low, float(step), step
        low = float(step)
    return low, math.inf, 0


#: libpq's transaction status of a connection outside any transaction.
_IDLE = 0


def _closed_by_server(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server closed this idle connection (a restart, a cut network).

    No round trip: an idle connection has nothing to read unless the server
    closed it (EOF, a reset, or a FATAL message before closing), so a readable
    socket means it is gone.
    """
    try:
        fd = conn.pgconn.socket
        readable, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError, Exception):
        return True
    return bool(readable)


# --------------------------------------------------------------- the pool


@dataclass(eq=False)  # compared (and kept in _ALL_SHARED) by identity
class _Shared:
    """What a driver and its siblings share: the pool, the watchdog, the migration state."""

    conninfo: str
    kwargs: dict[str, Any]
    pool_size: int
    pool: ConnectionPool[Any] | None = None
    pid: int = 0
    migrated: bool = False
    watchdog: _Watchdog = field(default_factory=lambda: _WATCHDOG)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Connections out of the pool between two calls, for the next call of any
    #: thread (LIFO); each counts against ``pool_size`` as one in use does.
    idle: list[psycopg.Connection[Any]] = field(default_factory=list)
    #: Callers of this process waiting for a connection from the pool.
    waiting: int = 0
    idle_lock: threading.Lock = field(default_factory=threading.Lock)
    #: A connection was found cut (closed by the server, broken in a call) and the
    #: pool has not lent a live one since: waiting callers have connections made
    #: for them (:meth:`_dial`) rather than wait for the pool's reconnect schedule.
    cut: bool = False
    #: Connections made that way (not the pool's: closed, never given to it); at
    #: most ``pool_size`` at once.
    own: int = 0
    #: A connection is being made for waiting callers (one at a time), and when
    #: (monotonic) the last attempt failed.
    dialing: bool = False
    dial_failed_at: float = -math.inf
    #: The last such attempt's error when no retry mends it (the server refused
    #: the password, role or database: see :func:`_connect_failure`), else None.
    dial_error: Exception | None = None

    def __post_init__(self) -> None:
        _ALL_SHARED.add(self)

    def get(self, timeout: float | None) -> ConnectionPool[Any]:
        """The pool, opened on first use (and anew in a forked child).

        Before the pool opens, one connection is made in the calling thread
        (within ``timeout``): a refused password or a missing database is then
        raised as libpq reported it, where the pool's background connections
        would only time out.
        """
        pool = self.pool
        if pool is not None and self.pid == _PROCESS[0]:
            return pool
        with self.lock:
            if self.pool is not None and self.pid == _PROCESS[0]:
                return self.pool
            import psycopg
            from psycopg_pool import ConnectionPool

            probe: dict[str, Any] = dict(self.kwargs)
            if timeout is not None:
                probe["connect_timeout"] = str(max(2, math.ceil(timeout)))
            psycopg.connect(self.conninfo, **probe).close()

            # A pool must not cross a fork: the child makes its own, and leaves the
            # parent's sockets alone (closing them would end the parent's sessions).
            made: ConnectionPool[Any] = ConnectionPool(
                self.conninfo,
                kwargs=self.kwargs,
                min_size=1,
                max_size=self.pool_size,
                open=False,
                name="leasekit",
                # Give up a failing reconnection soon: the next call that needs a
                # connection starts a fresh attempt (the pool's backoff doubles
                # without bound, which after a long outage would delay recovery).
                reconnect_timeout=RECONNECT_TIMEOUT,
            )
            made.open(wait=False)
            self.pool = made
            self.pid = _PROCESS[0]
            self.watchdog.hold()
            return made

    def take(self, pool: ConnectionPool[Any], until: float) -> psycopg.Connection[Any]:
        """A live connection for one call: the one a call left idle, else the pool's by ``until``.

        A caller that finds none idle is counted as waiting while it asks the
        pool; meanwhile finished calls give their connections to the pool (which
        hands them to the waiters), never to the idle list. Counting and keeping
        happen under one lock, so no connection stays idle while a thread waits.
        Connections the server closed while idle (a restart, a cut) are closed
        and handed back, so the pool replaces them, and the next one is taken.
        After such a cut the caller does not wait for the pool's reconnect
        schedule: see :meth:`_wait_for_one`.
        """
        conn: psycopg.Connection[Any]
        while True:
            with self.idle_lock:
                if not self.idle or self.pool is not pool:
                    self.waiting += 1
                    break
                conn = self.idle.pop()
            if not _closed_by_server(conn):
                return conn
            self.discard(conn, pool)
        try:
            conn = self._wait_for_one(pool, until)
        finally:
            with self.idle_lock:
                self.waiting -= 1
        if not hasattr(conn, "_leasekit_own"):
            conn._leasekit_keep_until = time.monotonic() + KEEP_FOR  # type: ignore[attr-defined]
        return conn

    def _wait_for_one(self, pool: ConnectionPool[Any], until: float) -> psycopg.Connection[Any]:
        """A live connection from the pool by ``until``; after a cut, one made at once.

        The pool replaces a cut connection on its own schedule (at once, then
        after 1 s, then 2 s): a cut that ends just after an attempt is noticed
        up to 2 s late, and a renewal waiting for it loses its leases. So while
        :attr:`cut` is set the caller asks the pool only briefly at a time, and
        between asks a connection is made for it (:meth:`_dial`, in a thread of
        its own, so the call keeps its deadline however long a connect hangs),
        again :data:`REDIAL_EVERY` after each failure: the server is reached as
        soon as it can be. The first live connection the pool lends ends the cut.
        """
        from psycopg_pool import PoolTimeout

        began = time.monotonic()
        while True:
            if self.cut:
                error = self.dial_error
                if error is not None and self.dial_failed_at >= began:
                    # The server answers, and refuses: waiting mends nothing. (A
                    # copy: other waiting callers may raise the same one.)
                    raise type(error)(*error.args) from error
                with self.idle_lock:
                    made = self.idle.pop() if self.idle and self.pool is pool else None
                if made is not None:
                    if not _closed_by_server(made):
                        return made
                    self.discard(made, pool)
                    continue
            left = until - time.monotonic()
            if left <= 0:
                raise PoolTimeout("no connection in time (the server cannot be reached)")
            try:
                conn: psycopg.Connection[Any] = pool.getconn(
                    timeout=min(left, DIAL_POLL if self.cut else WAIT_SLICE)
                )
            except PoolTimeout:
                if until - time.monotonic() <= 0:
                    waited = time.monotonic() - began
                    raise PoolTimeout(f"couldn't get a connection in {waited:.2f} s") from None
                if self.cut:
                    self._start_dial(pool)
                continue
            if not _closed_by_server(conn):
                self.cut = False
                return conn
            self.discard(conn, pool)

    def _start_dial(self, pool: ConnectionPool[Any]) -> None:
        """Start making a connection for the waiting callers, unless one is under way."""
        now = time.monotonic()
        with self.idle_lock:
            if (
                self.dialing
                or self.own >= self.pool_size
                or now - self.dial_failed_at < REDIAL_EVERY
                or self.pool is not pool
            ):
                return
            self.dialing = True
            self.own += 1
        threading.Thread(
            target=self._dial, args=(pool,), name="leasekit-postgresql-connect", daemon=True
        ).start()

    def _dial(self, pool: ConnectionPool[Any]) -> None:
        """Connect (libpq's ``connect_timeout``) and leave the connection idle for the next call."""
        import psycopg

        try:
            conn = psycopg.connect(self.conninfo, **self.kwargs)
        except Exception as exc:
            with self.idle_lock:
                self.dialing = False
                self.own -= 1
                self.dial_error = exc if _connect_failure(exc) is not None else None
                self.dial_failed_at = time.monotonic()
            return
        self.dial_error = None
        conn._leasekit_own = True  # type: ignore[attr-defined]
        conn._leasekit_keep_until = time.monotonic() + KEEP_FOR  # type: ignore[attr-defined]
        with self.idle_lock:
            self.dialing = False
            if self.pool is pool:
                self.idle.append(conn)
                return
        self._close_own(conn)  # the pool was closed meanwhile

    def _close_own(self, conn: psycopg.Connection[Any]) -> None:
        conn.close()
        with self.idle_lock:
            self.own -= 1

    def discard(self, conn: psycopg.Connection[Any], pool: ConnectionPool[Any]) -> None:
        """A connection found cut: close it (the pool replaces its own) and mark the cut."""
        self.cut = True
        if hasattr(conn, "_leasekit_own"):
            self._close_own(conn)
            return
        conn.close()
        pool.putconn(conn)

    def give_back(self, conn: psycopg.Connection[Any], pool: ConnectionPool[Any]) -> None:
        """The end of a call: keep ``conn`` for the next one, or return it to its pool.

        Kept only when no caller waits for the pool, it is healthy (no
        transaction left, not broken), its pool is still this driver's and it
        has not been out for :data:`KEEP_FOR`; anything else goes back to the
        pool, which hands it on, checks, resets or replaces it. The list is
        LIFO, so after a burst its oldest connections may go unused: one out
        for ``KEEP_FOR`` is given back here too, and the pool shrinks as it
        would have (its ``max_idle``). A connection made for a caller after a
        cut (not the pool's) is kept the same way, or else closed. A broken
        connection marks a cut (see :meth:`_wait_for_one`).
        """
        now = time.monotonic()
        if conn.broken:
            self.cut = True
        elif conn.pgconn.transaction_status == _IDLE and now < getattr(
            conn, "_leasekit_keep_until", 0.0
        ):
            with self.idle_lock:
                # Not closed meanwhile; a connection of our own also while callers
                # wait after a cut (they take from this list, not the pool).
                if pool is self.pool and (
                    not self.waiting or (self.cut and hasattr(conn, "_leasekit_own"))
                ):
                    idle = self.idle
                    idle.append(conn)
                    if getattr(idle[0], "_leasekit_keep_until", 0.0) > now:
                        return
                    conn = idle.pop(0)  # the oldest, unused since KEEP_FOR at least
        if hasattr(conn, "_leasekit_own"):
            self._close_own(conn)
        else:
            pool.putconn(conn)

    def close(self) -> None:
        with self.lock:
            pool, self.pool = self.pool, None
        with self.idle_lock:  # after the pool is unset: no call keeps one from now on
            idle, self.idle = self.idle, []
        if pool is not None and self.pid == _PROCESS[0]:
            for conn in idle:
                if hasattr(conn, "_leasekit_own"):
                    self._close_own(conn)
                else:
                    pool.putconn(conn)
            pool.close(timeout=1.0)
            self.watchdog.release()


class PostgresqlDriver(Driver):
    """Driver for one queue in a PostgreSQL database.

    Parameters
    ----------
        queue: the queue name.
        dsn: a libpq connection string or URI (``DATABASE_URL``); may hold a password.
        schema: the schema of leasekit's tables (created by ``create=True``).
        pool_size: the most connections this driver (and its siblings) open.
        max_message_size: the largest body in bytes.
        prepared_statements: prepare statements a connection runs twice (turn off
            behind a transaction-mode pooler that cannot carry them).
        **libpq: libpq connection parameters (``host``, ``port``, ``dbname``,
            ``user``, ``password``, ``sslmode``...); they override the ``dsn``'s.
    """

    scheme = "postgresql"
    capabilities = CAPABILITIES
    secret_options: ClassVar[frozenset[str]] = SECRET_OPTIONS
    credential_hint = (
        "give the password as the keyword password=, in dsn=, through PGPASSWORD or "
        ".pgpass, or as user:password@ in the URL"
    )
    #: A ``user[:password]@`` in a ``postgresql://`` URL is libpq's: core lets it
    #: through (redacted everywhere) rather than refusing it.
    url_userinfo: ClassVar[bool] = True

    def __init__(
        self,
        queue: str,
        dsn: str = "",
        schema: str = "leasekit",
        pool_size: int | str = 10,
        max_message_size: int | str = 1024 * 1024,
        prepared_statements: bool | str = True,
        _shared: _Shared | None = None,
        **libpq: str | int,
    ) -> None:
        if not isinstance(queue, str) or not queue:
            raise InvalidURL("postgresql: a queue name is required (?queue=NAME)")
        as_text(queue, "queue")
        as_text(schema, "schema")
        if not schema or len(schema) > 63:
            raise InvalidURL("postgresql: schema must be a name of 1 to 63 characters")
        size = as_int(pool_size, "pool_size", minimum=1, maximum=1000)
        largest = as_int(max_message_size, "max_message_size", minimum=1, maximum=MAX_FIELD)
        prepare = as_bool(prepared_statements, "prepared_statements")
        self.queue = queue
        self.schema = schema
        self.capabilities = CAPABILITIES.replace(max_message_size=largest)
        install_log_redaction(SDK_LOGGERS)
        if _shared is None:
            conninfo, kwargs = _conninfo(dsn, libpq)
            if not prepare:
                kwargs["prepare_threshold"] = None
            _shared = _Shared(conninfo, kwargs, pool_size=size)
        self._shared = _shared
        self._where = _describe(_shared.conninfo, _shared.kwargs)
        self._sql: dict[str, str] = {}
        self._last_purge = 0.0
        self._last_reap = 0.0

    @classmethod
    def options_from_url(cls, url: ParsedURL) -> dict[str, Any]:
        """``postgresql://user@host:port/db?queue=q&sslmode=...`` → leasekit's and libpq's."""
        options: dict[str, Any] = dict(url.query)
        # The URI's parts are percent-decoded as libpq decodes them (a password
        # holding "/", "@", ":", "%" or a space is given as %2F, %40, %3A, %25,
        # %20; "+" stays a plus); the port is a number.
        for key, value in (
            ("host", url.host),
            ("port", url.port),
            ("dbname", url.path.lstrip("/")),
            ("user", url.username),
            ("password", url.password),
        ):
            if value in (None, ""):
                continue
            if isinstance(value, str):
                if key == "password" and value != _unquote(value):
                    remember_secret(value)  # its encoded form is a secret too
                value = _unquote(value)
            options.setdefault(key, value)
        if url.path.count("/") > 1:
            raise ValueError(
                "a postgresql URL names one database: postgresql://host/dbname?queue=NAME"
            )
        return options

    def __repr__(self) -> str:
        return f"<PostgresqlDriver {self._where} schema={self.schema!r} queue={self.queue!r}>"

    # ------------------------------------------------------------- plumbing

    def _q(self, name: str, text: str) -> Any:
        """The statement ``text`` with this driver's schema, composed once, as text.

        Text, not a ``Composed``: psycopg would render a ``Composed`` anew at every
        execution; a string it only encodes (in the connection's encoding), and
        its parsed form is cached by psycopg and, once prepared, by the server.
        """
        rendered = self._sql.get(name)
        if rendered is None:
            from psycopg import sql

            rendered = (
                sql.SQL(text.replace("{s}", "{schema}"))
                .format(schema=sql.Identifier(self.schema))
                .as_string(None)
            )
            self._sql[name] = rendered
        return rendered

    def _receive_statement(self, limit: int) -> str:
        """The receive statement with ``limit`` written in, not a parameter (one per limit).

        With ``LIMIT $n`` PostgreSQL cannot cost a generic plan (it assumes a
        tenth of the table), so on a queue of any size it plans the statement
        anew at every call, custom to the limit given: measured, ~500 us of
        server CPU a call, 5 us a message at batches of 100, a sixth of the
        server's work per message. With the limit written in, the generic plan
        is the custom one and is kept after the first few calls. A caller uses
        a handful of batch sizes; at most :data:`BATCH` statements exist.
        """
        name = f"receive {limit}"
        rendered = self._sql.get(name)
        if rendered is None:
            rendered = self._q(name, _RECEIVE.replace("%(limit)s", str(int(limit))))
        return rendered

    @contextmanager
    def _connection(self, *, migrate: bool = True) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one transaction, bounded by core's deadline.

        The one the last call left idle when there is one, else one from the
        pool (:meth:`_Shared.take`); at the end it is kept for the next call or
        given back (:meth:`_Shared.give_back`).
        """
        timeout = call_timeout(None)
        started = time.monotonic()
        shared = self._shared
        pool = shared.get(timeout)
        conn = shared.take(pool, started + (3600.0 if timeout is None else timeout))
        watched = None
        try:
            left = None if timeout is None else timeout - (time.monotonic() - started)
            fd = conn.pgconn.socket
            watched = shared.watchdog.watch(fd, left)
            try:
                self._statement_timeout(conn, left, fd)
                if migrate and not shared.migrated:
                    self._migrate(conn, create=False)
                yield conn
            except BaseException:
                with conn:  # rolls back what the call left open (a no-op if nothing)
                    raise
            if conn.pgconn.transaction_status != _IDLE:
                conn.commit()  # autocommit: only a call's own BEGIN leaves one open
        except Exception as exc:
            if watched is not None and watched[1][0]:
                raise DeadlineExceeded(
                    "postgresql: the call's deadline passed; its connection was cut"
                ) from exc
            raise
        finally:
            if watched is not None:
                shared.watchdog.unwatch(watched[0])
            shared.give_back(conn, pool)

    def _statement_timeout(
        self, conn: psycopg.Connection[Any], left: float | None, fd: int
    ) -> None:
        """Keep the session's statement_timeout at the step of the time left (SET on a change).

        The connection keeps the band its step serves (and its socket: a
        connection made anew has its server's default again).
        """
        wanted = math.inf if left is None else max(left, 0.001) * 1000
        held = getattr(conn, "_leasekit_timeout", None)
        if held is not None and held[0] == fd and held[1] < wanted <= held[2]:
            return
        low, high, step = _timeout_band(wanted)
        conn.execute("SELECT set_config('statement_timeout', %s, false)", [f"{step}ms"])
        conn._leasekit_timeout = (fd, low, high)  # type: ignore[attr-defined]

    def _migrate(self, conn: psycopg.Connection[Any], *, create: bool) -> None:
        """Bring the schema up to :data:`SCHEMA_VERSION` (creating it if ``create``).

        Serialised across processes by a transaction-level advisory lock. Without
        ``create``, a missing schema is a missing queue.
        """
        from psycopg import sql

        schema = sql.Identifier(self.schema)
        exists = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", [f"{_quote(self.schema)}.schema_version"]
        ).fetchone()
        if not (exists and exists[0]) and not create:
            raise DriverError(
                ErrorCode.QUEUE_NOT_FOUND,
                f"queue {self.queue!r} does not exist: schema {self.schema!r} has no leasekit "
                "tables (open with create=True)",
                backend_code="QueueNotFound",
            )
        with conn.transaction():
            self._migrate_locked(conn, schema)
        self._shared.migrated = True

    def _migrate_locked(self, conn: psycopg.Connection[Any], schema: Any) -> None:
        """The migrations, in the caller's transaction (rolled back whole on an error)."""
        from psycopg import sql

        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"leasekit:{self.schema}"])
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.schema_version (version integer NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(schema)
        )
        row = conn.execute(
            sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_version").format(schema)
        ).fetchone()
        current = int(row[0]) if row else 0
        newest = MIGRATIONS[-1][0] if MIGRATIONS else 0
        if current > newest:
            raise DriverError(
                ErrorCode.UNSUPPORTED,
                f"schema {self.schema!r} is at version {current}, newer than this leasekit "
                f"knows ({newest}): upgrade leasekit",
                backend_code="SchemaTooNew",
            )
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            for statement in statements:
                conn.execute(sql.SQL(statement.replace("{s}", "{schema}")).format(schema=schema))
            conn.execute(
                sql.SQL("INSERT INTO {}.schema_version (version) VALUES (%s)").format(schema),
                [version],
            )

    def _missing(self) -> DriverError:
        return DriverError(
            ErrorCode.QUEUE_NOT_FOUND,
            f"queue {self.queue!r} does not exist in schema {self.schema!r}",
            backend_code="QueueNotFound",
        )

    def _check_exists(self, conn: psycopg.Connection[Any]) -> None:
        if conn.execute(self._q("exists", _EXISTS), {"queue": self.queue}).fetchone() is None:
            raise self._missing()

    # --------------------------------------------------------------- messages

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Insert the messages in one statement; their ids are made here (UUIDs)."""
        from psycopg.types.json import Jsonb

        ids = [uuid.uuid4() for _ in messages]
        params = {
            "queue": self.queue,
            "ids": ids,
            "bodies": [m.body for m in messages],
            "props": [Jsonb(dict(m.properties)) if m.properties else None for m in messages],
            "delays": [float(m.delay) for m in messages],
            "ttls": [None if m.ttl is None else float(m.ttl) for m in messages],
            "groups": [m.group for m in messages],
        }
        with self._connection() as conn:
            cursor = conn.execute(self._q("send", _SEND), params)
            if cursor.rowcount != len(messages):
                raise self._missing()
        return [str(i) for i in ids]

    def receive(self, max_messages: int, visibility: float, wait: float) -> Sequence[RawMessage]:
        """Give expired lease batches back, then lease up to ``max_messages`` (core waits)."""
        params = {
            "queue": self.queue,
            "limit": max_messages,
            "seconds": float(visibility),
            "reap": REAP_LIMIT,
        }
        with self._connection() as conn:
            now = time.monotonic()
            if now - self._last_purge >= PURGE_EVERY:
                self._last_purge = now
                conn.execute(self._q("purge", _PURGE), params)
            reaped = now - self._last_reap >= REAP_EVERY
            if reaped:
                self._reap(conn, params, now)
            # Binary results: bodies and times arrive as they are stored, not
            # hex and text psycopg would parse (a fifth less client CPU per row).
            receive = self._receive_statement(max_messages)
            rows = conn.execute(receive, params, binary=True).fetchall()
            if len(rows) < max_messages and not reaped and self._reap(conn, params, now):
                # Expired batches were given back: take from them too (a rare
                # call, with its limit as a parameter: no statement per remainder).
                params["limit"] = max_messages - len(rows)
                again = self._q("receive", _RECEIVE)
                rows += conn.execute(again, params, binary=True).fetchall()
            if not rows:
                self._check_exists(conn)
                return []
        # Rows as they are, in ReceivedRows' order: core makes each lease from
        # its row, with no RawMessage per message in between.
        return ReceivedRows(rows, _props)

    def _reap(self, conn: psycopg.Connection[Any], params: dict[str, Any], now: float) -> int:
        """Give the messages of expired lease batches back; how many (its own transaction)."""
        self._last_reap = now
        return conn.execute(self._q("reap", _REAP), params).rowcount

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """Renew: a batch all of whose messages are here is one row update; others move.

        Locks the lease batches of the receipts' messages first (id order), then
        reads each message's token and batch: a receipt whose token does not
        match is stale. Batches whose every message is renewed here get one
        ``UPDATE`` of their row; the remaining messages (part of a batch, or of
        an expired batch already given back) move together into one new batch.
        """
        parsed = [_receipt(r) for r in receipts]
        seqs = [p[0] for p in parsed if p is not None]
        results: list[Visibility | BaseException] = [
            _lost(f"receipt {r!r} is stale or its message is gone") for r in receipts
        ]
        if not seqs:
            return results
        params: dict[str, Any] = {
            "queue": self.queue,
            "seqs": ",".join(map(str, seqs)),
            "seconds": float(seconds),
        }
        with self._connection() as conn:
            # Two round trips: BEGIN, lock, read; then the updates and COMMIT. (An
            # error rolls back: leaving the connection's block does.)
            with conn.pipeline():
                conn.execute("BEGIN")
                conn.execute(self._q("lock", _LOCK_BATCHES), params)
                cursor = conn.execute(self._q("renew_state", _RENEW_STATE), params)
            state = {
                seq: (token, batch, dead, members)
                for seq, token, batch, dead, members in cursor.fetchall()
            }
            if not state:
                conn.execute("ROLLBACK")
                self._check_exists(conn)
            members = {batch: n for _, batch, _, n in state.values() if batch is not None}
            covered: dict[int, int] = {}
            held: list[tuple[int, int, int, int | None]] = []  # (position, seq, token, batch)
            for i, p in enumerate(parsed):
                if p is None:
                    continue
                row = state.get(p[0])
                if row is None or row[0] != p[1]:
                    continue
                _, batch, dead, _ = row
                if batch is not None:
                    covered[batch] = covered.get(batch, 0) + 1
                if dead:
                    continue
                held.append((i, p[0], p[1], batch))
            whole = {batch for batch, count in covered.items() if count == members[batch]}
            moving = [(seq, token) for _, seq, token, batch in held if batch not in whole]
            renewed = moved_rows = None
            with conn.pipeline():
                if whole:
                    params["batches"] = sorted(whole)
                    renewed = conn.execute(self._q("renew", _RENEW_BATCHES), params)
                if moving:
                    params["receipts"] = ",".join(f"{s}.{t}" for s, t in moving)
                    moved_rows = conn.execute(self._q("move", _RENEW_MOVE), params)
                if conn.info.transaction_status != _IDLE:
                    conn.execute("COMMIT")
            until: dict[int, datetime] = dict(renewed.fetchall()) if renewed else {}
            moved: dict[int, datetime] = dict(moved_rows.fetchall()) if moved_rows else {}
        for i, seq, _, batch in held:
            if batch is not None and batch in whole:
                expires_at = until.get(batch)
            else:
                expires_at = moved.get(seq)
            if expires_at is not None:
                results[i] = Visibility(receipts[i], expires_at)
        return results

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """Delete the leased messages whose tokens match, in one statement."""
        return self._settle("delete", _DELETE, receipts, {})

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        """Release the messages (visible after ``delay``); their receipts stop working."""
        return self._settle("abandon", _ABANDON, receipts, {"delay": float(delay)})

    def _settle(
        self, name: str, text: str, receipts: Sequence[str], extra: dict[str, Any]
    ) -> list[BaseException | None]:
        """One fenced statement for the batch; per receipt ``None`` (settled) or ``LeaseLost``.

        The statement answers with how many it settled; only when that is fewer
        than given does it name which (then the call checks the queue exists).
        """
        if not receipts:
            return []
        joined, whole = _joined(receipts)
        params = {"queue": self.queue, "receipts": joined, "n": len(receipts), **extra}
        count, done = 0, None
        with self._connection() as conn:
            if joined:
                row = conn.execute(self._q(name, text), params).fetchone()
                if row is not None:
                    count, done = row
            if count < len(receipts) or not whole:
                self._check_exists(conn)
        if whole and count == len(receipts):
            return [None] * len(receipts)
        settled = {_receipt(r) for r in done or ()}
        results: list[BaseException | None] = []
        for r in receipts:
            p = _receipt(r)
            results.append(
                None
                if p is not None and p in settled
                else _lost(f"receipt {r!r} is stale or its message is gone")
            )
        return results

    def dead_letter(self, receipt: str, reason: str, message: RawMessage) -> None:
        """Move the leased message to the dead-letter table, in one statement."""
        p = _receipt(receipt)
        params = {"queue": self.queue, "receipts": receipt if p else "", "reason": reason}
        with self._connection() as conn:
            if conn.execute(self._q("dead_letter", _DEAD_LETTER), params).fetchone() is None:
                self._check_exists(conn)
                raise _lost(f"receipt {receipt!r} is stale or its message is gone")

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        """The oldest ``limit`` dead letters of this queue."""
        with self._connection() as conn:
            rows = conn.execute(
                self._q("dead_letters", _DEAD_LETTERS), {"queue": self.queue, "limit": limit}
            ).fetchall()
            if not rows:
                self._check_exists(conn)
        return [
            DeadLetter(
                id=str(i),
                body=bytes(b),
                reason=r,
                delivery_count=c,
                properties=_props(p),
                group=g,
            )
            for i, b, r, c, p, g in rows
        ]

    def peek(self, limit: int) -> list[RawMessage]:
        """Up to ``limit`` visible messages, without leasing them (no receipt)."""
        with self._connection() as conn:
            rows = conn.execute(self._q("peek", _PEEK), {"queue": self.queue, "limit": limit})
            found = rows.fetchall()
            if not found:
                self._check_exists(conn)
        return [
            RawMessage(
                id=str(message_id),
                body=bytes(body),
                receipt="",
                delivery_count=count,
                enqueued_at=enqueued_at,
                visible_until=visible_at,
                properties=_props(props),
            )
            for _, message_id, body, props, enqueued_at, count, visible_at in found
        ]

    def stats(self) -> QueueStats:
        """Counts by state, in one read."""
        with self._connection() as conn:
            row = conn.execute(self._q("stats", _STATS), {"queue": self.queue}).fetchone()
        if row is None:
            raise self._missing()
        visible, leased, delayed, dead = row
        return QueueStats(visible=visible, leased=leased, delayed=delayed, dead_lettered=dead)

    def sibling(self, queue: str) -> PostgresqlDriver:
        """Another queue in the same schema, on the same pool."""
        return PostgresqlDriver(queue=queue, schema=self.schema, _shared=self._shared)

    def dead_letter_store(self) -> PostgresqlDeadLetters:
        """The queue's dead letters, leased and deleted like messages (for re-driving)."""
        return PostgresqlDeadLetters(queue=self.queue, schema=self.schema, _shared=self._shared)

    # ------------------------------------------------------------------ admin

    def create_queue(self) -> None:
        """Create (or bring up to date) the schema, then the queue if missing."""
        with self._connection(migrate=False) as conn:
            self._migrate(conn, create=True)
            conn.execute(
                self._q(
                    "create",
                    "INSERT INTO {s}.queues (name) VALUES (%(queue)s) ON CONFLICT DO NOTHING",
                ),
                {"queue": self.queue},
            )

    def delete_queue(self) -> None:
        """Drop the queue, its messages, lease batches and dead letters."""
        try:
            with self._connection() as conn:
                params = {"queue": self.queue}
                for table in ("messages", "leases", "dead_letters"):
                    conn.execute(
                        self._q(
                            f"drop_{table}",
                            f"DELETE FROM {{s}}.{table} WHERE queue_id = " + _QUEUE_ID,
                        ),
                        params,
                    )
                conn.execute(
                    self._q("drop_queue", "DELETE FROM {s}.queues WHERE name = %(queue)s"), params
                )
        except DriverError as exc:
            if exc.code is not ErrorCode.QUEUE_NOT_FOUND:
                raise

    # ----------------------------------------------------------------- errors

    def error_code(self, exc: BaseException) -> ErrorCode:
        """Classify a psycopg error by its SQLSTATE (connection errors: UNAVAILABLE)."""
        import psycopg
        from psycopg_pool import PoolTimeout

        if isinstance(exc, DriverError):
            return exc.code
        if isinstance(exc, PoolTimeout | DeadlineExceeded):
            return ErrorCode.UNAVAILABLE
        if isinstance(exc, psycopg.Error):
            state = exc.sqlstate or ""
            if state[:2] == "28":
                return ErrorCode.UNAUTHENTICATED  # invalid_authorization_specification
            if state in _FINAL_STATES:
                return _FINAL_STATES[state]
            if state == "57014":
                return ErrorCode.UNAVAILABLE  # cancelled: statement_timeout (the deadline)
            if state[:2] == "22" or (isinstance(exc, psycopg.DataError) and not state):
                # A value the server (22P05: a NUL in jsonb, "\u0000") or psycopg
                # (a NUL in a text field) cannot store: the caller's to change.
                return ErrorCode.INVALID_ARGUMENT
            if _retryable(exc):
                return ErrorCode.UNAVAILABLE
            if isinstance(exc, psycopg.OperationalError):
                # A failed connection has no SQLSTATE: its words tell a refused
                # database, role or parameter (final) from a network failure.
                return _connect_failure(exc) or ErrorCode.UNAVAILABLE
        return ErrorCode.UNKNOWN

    def backend_code(self, exc: BaseException) -> str | None:
        """The SQLSTATE (``40P01``...) or the driver's own code."""
        state = getattr(exc, "sqlstate", None)
        if isinstance(state, str):
            return state
        return super().backend_code(exc)

    def is_retryable(self, exc: BaseException) -> bool:
        """Connection failures, restarts, serialization failures and deadlocks are retried."""
        import psycopg
        from psycopg_pool import PoolTimeout

        if isinstance(exc, PoolTimeout):
            return True
        if isinstance(exc, psycopg.Error):
            if exc.sqlstate in ("28P01", "28000", "57014"):
                return False
            return _retryable(exc) or (
                isinstance(exc, psycopg.OperationalError)
                and exc.sqlstate is None
                and _connect_failure(exc) is None
            )
        return False

    def close(self) -> None:
        """Close the pool (a sibling shares it; closing either closes it)."""
        self._shared.close()


class PostgresqlDeadLetters(PostgresqlDriver):
    """The dead letters of one PostgreSQL queue, as a driver: receive leases, delete removes.

    What :meth:`PostgresqlDriver.dead_letter_store` returns. A dead letter's
    lease lives in its row (``visible_at``, ``token``: schema version 3), so a
    re-drive in another process or on another machine never takes the same
    one, and a stale receipt settles nothing. It shares the queue's pool:
    closing it leaves the pool to the queue. Sending is refused.
    """

    def __repr__(self) -> str:
        return f"<PostgresqlDeadLetters {self._where} schema={self.schema!r} queue={self.queue!r}>"

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Refused: dead letters come from dead-lettering."""
        error = DriverError(ErrorCode.UNSUPPORTED, "postgresql: cannot send to a dead-letter store")
        return [error for _ in messages]

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """Lease up to ``max_messages`` free dead letters, oldest first, in one statement."""
        params = {"queue": self.queue, "limit": max_messages, "seconds": float(visibility)}
        with self._connection() as conn:
            rows = conn.execute(self._q("receive_dead", _RECEIVE_DEAD), params).fetchall()
            if not rows:
                self._check_exists(conn)
                return []
        rows.sort(key=lambda row: row[0])
        return [
            RawMessage(
                id=message_id,
                body=bytes(body),
                receipt=receipt,
                delivery_count=1,
                enqueued_at=dead_lettered_at,
                visible_until=until,
                properties=marks.marked(
                    _props(props), id=message_id, reason=reason, delivery_count=count
                ),
                group=group,
            )
            for (
                _,
                message_id,
                body,
                props,
                count,
                reason,
                dead_lettered_at,
                receipt,
                until,
                group,
            ) in rows
        ]

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """Hide each leased dead letter for ``seconds`` from now (its receipt kept)."""
        rows = self._each_dead("renew_dead", _RENEW_DEAD, receipts, {"seconds": float(seconds)})
        until = dict(rows)
        return [
            Visibility(r, until[r]) if r in until else _lost(f"dead-letter receipt {r!r} is stale")
            for r in receipts
        ]

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """Remove the leased dead letters whose tokens match, in one statement."""
        done = {row[0] for row in self._each_dead("delete_dead", _DELETE_DEAD, receipts, {})}
        return _settled_dead(receipts, done)

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        """Give the leased dead letters back (visible after ``delay``); their receipts stop."""
        params = {"delay": float(delay)}
        done = {row[0] for row in self._each_dead("abandon_dead", _ABANDON_DEAD, receipts, params)}
        return _settled_dead(receipts, done)

    def _each_dead(
        self, name: str, text: str, receipts: Sequence[str], extra: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        """Run one fenced statement over the well-formed receipts; the rows it returned."""
        if not receipts:
            return []
        joined, _ = _joined(receipts)
        rows: list[tuple[Any, ...]] = []
        with self._connection() as conn:
            if joined:
                params = {"queue": self.queue, "receipts": joined, **extra}
                rows = conn.execute(self._q(name, text), params).fetchall()
            if len(rows) < len(receipts):
                self._check_exists(conn)
        return rows

    def dead_letter(self, receipt: str, reason: str, message: RawMessage) -> None:
        """Refused: a dead letter is dead-lettered already."""
        raise NotImplementedError("a dead-letter store cannot dead-letter")

    def dead_letter_store(self) -> PostgresqlDeadLetters:
        """Refused: a dead-letter store has no dead letters of its own."""
        raise NotImplementedError("a dead-letter store has no dead-letter store")

    def close(self) -> None:
        """Nothing: the pool is the queue's, closed with it."""


def _settled_dead(receipts: Sequence[str], done: set[str]) -> list[BaseException | None]:
    return [None if r in done else _lost(f"dead-letter receipt {r!r} is stale") for r in receipts]


#: What a failed connection's message (libpq gives it no SQLSTATE) says that no
#: retry mends, and what it means: libpq refusing a parameter, the server
#: refusing the database, role, password or a setting. English server messages
#: only (``lc_messages``): a server speaking another language still reads as
#: unreachable, and is retried.
_CONNECT_FAILURES: tuple[tuple[tuple[str, ...], ErrorCode], ...] = (
    (("connection is bad: ",), ErrorCode.INVALID_ARGUMENT),  # libpq refused a parameter
    (("FATAL:  database ", "does not exist"), ErrorCode.QUEUE_NOT_FOUND),  # 3D000
    (("password authentication failed",), ErrorCode.UNAUTHENTICATED),  # 28P01
    (("no password supplied",), ErrorCode.UNAUTHENTICATED),
    (("no pg_hba.conf entry",), ErrorCode.UNAUTHENTICATED),  # 28000
    (("FATAL:  role ", "does not exist"), ErrorCode.UNAUTHENTICATED),  # 28000
    (("is not permitted to log in",), ErrorCode.UNAUTHENTICATED),  # 28000
    (("permission denied for database",), ErrorCode.UNAUTHENTICATED),  # 42501
    (("FATAL:  unrecognized configuration parameter",), ErrorCode.INVALID_ARGUMENT),  # 42704
    (("FATAL:  invalid value for parameter",), ErrorCode.INVALID_ARGUMENT),  # 22023
    (("SSL was required",), ErrorCode.INVALID_ARGUMENT),  # the server has no SSL
)

#: SQLSTATEs (and classes) of errors no retry mends, where psycopg has one.
_FINAL_STATES: dict[str, ErrorCode] = {
    "3D000": ErrorCode.QUEUE_NOT_FOUND,  # invalid_catalog_name: no such database
    "3F000": ErrorCode.QUEUE_NOT_FOUND,  # invalid_schema_name
    "42P01": ErrorCode.QUEUE_NOT_FOUND,  # undefined_table: a table was dropped
    "42501": ErrorCode.UNAUTHENTICATED,  # insufficient_privilege
    "42704": ErrorCode.INVALID_ARGUMENT,  # undefined_object (a setting)
    "22023": ErrorCode.INVALID_ARGUMENT,  # invalid_parameter_value
    "54000": ErrorCode.TOO_LARGE,  # program_limit_exceeded (a field over 1 GB)
}


def _connect_failure(exc: BaseException) -> ErrorCode | None:
    """What a failed connection (no SQLSTATE) means when no retry mends it; else ``None``."""
    text = str(exc)
    for fragments, code in _CONNECT_FAILURES:
        if all(words in text for words in fragments):
            return code
    return None


def _retryable(exc: psycopg.Error) -> bool:
    state = exc.sqlstate or ""
    return state in _RETRYABLE_STATES or state[:2] in _RETRYABLE_CLASSES


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _unquote(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


def _conninfo(dsn: str, libpq: Mapping[str, str | int]) -> tuple[str, dict[str, Any]]:
    """Check the connection parameters (no network I/O): the conninfo and keyword parameters.

    A password (from ``password=`` or inside the ``dsn``) is remembered for
    redaction, and kept out of the conninfo string (given to libpq as a keyword).
    """
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    if not isinstance(dsn, str):
        raise InvalidURL("postgresql: dsn must be a libpq connection string or URI")
    params: dict[str, Any] = {}
    for key, value in libpq.items():
        if key in OWN_OPTIONS:
            continue
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise InvalidURL(f"postgresql: option {key} must be text or a number")
        params[key] = str(value)
    try:
        merged = conninfo_to_dict(dsn or _make_conninfo({}), **params)
        _make_conninfo(merged)  # libpq parses it: an unknown keyword is refused here
    except ProgrammingError as exc:
        # libpq's message names the bad keyword; it never quotes a value.
        text = str(exc).split("\n")[0]
        raise InvalidURL(f"postgresql: a connection parameter is refused: {text}") from None
    for secret in ("password", "sslpassword"):
        found = merged.get(secret)
        if isinstance(found, str) and found:
            remember_secret(found)
    _check_values(merged)
    merged.setdefault("connect_timeout", str(CONNECT_TIMEOUT))
    merged.setdefault("application_name", "leasekit")
    # Autocommit: a call of one statement is one round trip (no COMMIT after it);
    # the calls that need a transaction open one explicitly.
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 2}
    for secret in ("password", "sslpassword"):
        if merged.get(secret) is not None:
            kwargs[secret] = merged.pop(secret)
    return _make_conninfo(merged), kwargs


#: Where :func:`_check_values` points libpq instead of the server: a Unix socket
#: directory that does not exist, so the check connects nowhere.
_NOWHERE = "/nonexistent-leasekit-check"
#: libpq options whose integer value libpq checks only once a TCP connection is
#: made (the others, ``port`` and the enumerations, it checks before connecting).
_INTEGER_OPTIONS = (
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)


def _check_values(params: Mapping[str, Any]) -> None:
    """Have libpq check the parameters' values now, connecting nowhere; else ``InvalidURL``.

    libpq checks a value (``sslmode=bogus``, a port that is no number, a
    ``service`` not defined...) only when a connection starts, and then the
    failure reads like any failed connection, which would be retried without
    end. So a connection is started here with every host replaced by a Unix
    socket in a directory that does not exist (and ``hostaddr`` emptied): libpq
    checks every option first and fails on the missing socket, without any
    network I/O, when the options are good. Its message names the option and
    the value it refused (never a password: libpq checks none).
    """
    import ipaddress

    from psycopg import pq

    def listed(key: str, env: str) -> list[str]:
        value = params.get(key)
        text = str(value) if value not in (None, "") else os.environ.get(env, "")
        return text.split(",") if text else []

    for key in _INTEGER_OPTIONS:
        value = params.get(key)
        if value is not None and not re.fullmatch(r"\s*[+-]?[0-9]+\s*", str(value)):
            raise InvalidURL(f"postgresql: {key} must be a whole number, not {value!r}")
    hostaddrs = listed("hostaddr", "PGHOSTADDR")
    for address in hostaddrs:
        if address:
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise InvalidURL(f"postgresql: hostaddr {address!r} is not an IP address") from None
    hosts = max(len(listed("host", "PGHOST")), len(hostaddrs), 1)
    probe = {k: v for k, v in params.items() if v is not None}
    probe["host"] = ",".join([_NOWHERE] * hosts)
    probe["hostaddr"] = ""
    if probe.get("gssencmode") == "require":  # GSSAPI cannot run over a Unix socket
        probe["gssencmode"] = "prefer"
    conn = pq.PGconn.connect_start(_make_conninfo(probe).encode())
    try:
        if conn.status == pq.ConnStatus.OK:  # pragma: no cover (nothing listens there)
            return
        text = conn.error_message.decode("utf-8", "replace")
    finally:
        conn.finish()
    if _NOWHERE in text:
        return  # every option was accepted: only the (missing) socket failed
    first = text.strip().splitlines()[0] if text.strip() else "refused"
    raise InvalidURL(f"postgresql: a connection parameter is refused: {first}")


def _make_conninfo(params: Mapping[str, Any]) -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo("", **{k: v for k, v in params.items() if v is not None})


def _describe(conninfo: str, kwargs: Mapping[str, Any]) -> str:
    """``host:port/dbname`` for a repr: never the user, never a password."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(conninfo)
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = params.get("port")
    db = params.get("dbname") or "?"
    return f"{host}{':' + str(port) if port else ''}/{db}"
