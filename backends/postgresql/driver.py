"""The PostgreSQL driver: the SPI translated to SQL through psycopg."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from leasekit.capabilities import Capabilities
from leasekit.deadline import DeadlineExceeded, call_timeout
from leasekit.errors import InvalidURL
from leasekit.options import as_bool, as_int, as_text
from leasekit.redaction import install_log_redaction, remember_secret
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

from . import schema as schema_module
from .conninfo import _conninfo, _describe, _quote, _unquote
from .error_codes import _FINAL_STATES, _connect_failure, _retryable
from .pool import _Shared
from .receipts import MAX_FIELD, _joined, _lost, _props, _receipt
from .settings import BATCH, DAY, PURGE_EVERY, REAP_EVERY, REAP_LIMIT, SDK_LOGGERS, SECRET_OPTIONS
from .statements import (
    _ABANDON,
    _DEAD_LETTER,
    _DEAD_LETTER_SEQ,
    _DEAD_LETTERS,
    _DEAD_LETTERS_AFTER,
    _DELETE,
    _EXISTS,
    _LOCK_BATCHES,
    _PEEK,
    _PURGE,
    _QUEUE_ID,
    _REAP,
    _RECEIVE,
    _RENEW_BATCHES,
    _RENEW_MOVE,
    _RENEW_STATE,
    _SEND,
    _STATS,
)
from .watchdog import _IDLE, _timeout_band

if TYPE_CHECKING:
    import psycopg


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
    properties_hold_nul=False,  # text cannot hold U+0000 (core refuses it before a call)
    native_dead_letter=True,
    delivery_count=True,
    queue_stats=True,
    counts=frozenset({"visible", "leased", "delayed", "dead_lettered"}),
    inspect_dead_letters=True,
    ordered=True,
)


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
    #: The driver of a queue's dead letters: a subclass of this one, which
    #: :mod:`.dead_letters` sets here when it is imported (so this module imports it not).
    dead_letter_driver: ClassVar[type[PostgresqlDriver]]
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
        migrations = schema_module.MIGRATIONS  # looked up each time (tests add migrations)
        newest = migrations[-1][0] if migrations else 0
        if current > newest:
            raise DriverError(
                ErrorCode.UNSUPPORTED,
                f"schema {self.schema!r} is at version {current}, newer than this leasekit "
                f"knows ({newest}): upgrade leasekit",
                backend_code="SchemaTooNew",
            )
        for version, statements in migrations:
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

    def _reap(self, conn: psycopg.Connection[Any], params: dict[str, Any], now: float) -> int:
        """Give the messages of expired lease batches back; how many (its own transaction)."""
        self._last_reap = now
        return conn.execute(self._q("reap", _REAP), params).rowcount

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
        return _dead_letters(rows)

    def dead_letters_after(self, after: str, limit: int) -> list[DeadLetter]:
        """The ``limit`` dead letters after ``after``: two index reads, one page of rows."""
        try:
            wanted = uuid.UUID(after)
        except (ValueError, TypeError, AttributeError):
            raise KeyError(after) from None  # no dead letter has such an id
        with self._connection() as conn:
            found = conn.execute(
                self._q("dead_letter_seq", _DEAD_LETTER_SEQ), {"queue": self.queue, "id": wanted}
            ).fetchone()
            if found is None or found[0] is None:
                self._check_exists(conn)
                raise KeyError(after)
            rows = conn.execute(
                self._q("dead_letters_after", _DEAD_LETTERS_AFTER),
                {"queue": self.queue, "seq": found[0], "limit": limit},
            ).fetchall()
        return _dead_letters(rows)

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
        visible, leased, delayed, dead, oldest = row
        return QueueStats(
            visible=visible,
            leased=leased,
            delayed=delayed,
            dead_lettered=dead,
            oldest_age=None if oldest is None else max(0.0, float(oldest)),
        )

    def sibling(self, queue: str) -> PostgresqlDriver:
        """Another queue in the same schema, on the same pool."""
        return PostgresqlDriver(queue=queue, schema=self.schema, _shared=self._shared)

    def dead_letter_store(self) -> PostgresqlDriver:
        """The queue's dead letters, leased and deleted like messages (for re-driving)."""
        return self.dead_letter_driver(queue=self.queue, schema=self.schema, _shared=self._shared)

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


def _dead_letters(rows: Sequence[Any]) -> list[DeadLetter]:
    """Dead letters from rows of (id, body, reason, count, properties, group)."""
    return [
        DeadLetter(
            id=str(i), body=bytes(b), reason=r, delivery_count=c, properties=_props(p), group=g
        )
        for i, b, r, c, p, g in rows
    ]
