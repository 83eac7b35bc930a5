"""The PostgreSQL backend, against a real server the tests start (``postgres_server``).

The conformance suite covers the portable semantics (also through
``leasekit.aio``); the tests here cover what is PostgreSQL's own: URLs and
libpq parameters, the schema and its migrations, the lease-batch renewal (one
row per batch, exact fencing when a batch is split or given back), error
classification, and deadlines applied to the server and the socket.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

import leasekit
from leasekit import (
    AuthenticationFailed,
    BackendUnavailable,
    InvalidArgument,
    InvalidURL,
    Lease,
    LeaseKeeper,
    LeaseLost,
    QueueNotFound,
    UnsupportedOperation,
)
from leasekit.backends import postgresql
from leasekit.backends.postgresql import SCHEMA_VERSION, PostgresqlDriver
from leasekit.conformance import AsyncUrlHarness, ConformanceSuite, UrlHarness
from leasekit.deadline import deadline
from leasekit.emulators.postgres import LocalPostgres
from leasekit.error_mapping import wrap_error
from leasekit.queue import Queue
from leasekit.retry import RetryPolicy
from leasekit.spi import ErrorCode, OutgoingMessage, ReceivedRows

# --------------------------------------------------------------- conformance


class TestPostgresqlConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, postgres_server: LocalPostgres) -> Iterator[UrlHarness]:
        harness = UrlHarness(postgres_server.url())
        yield harness
        harness.close()


class TestPostgresqlConformanceThroughAsyncio(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, postgres_server: LocalPostgres) -> Iterator[AsyncUrlHarness]:
        harness = AsyncUrlHarness(postgres_server.url())
        yield harness
        harness.close()


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def queue(postgres_server: LocalPostgres) -> Iterator[Queue]:
    q = leasekit.open(postgres_server.url(), queue=f"t-{uuid.uuid4().hex[:12]}", create=True)
    try:
        yield q
    finally:
        q.delete_queue()
        q.close()


def _open(server: LocalPostgres, name: str, **options: Any) -> Queue:
    return leasekit.open(server.url(), queue=name, **options)


def _messages(server: LocalPostgres, schema: str = "leasekit") -> list[tuple[str, ...]]:
    """``(seq, lease_id, xmin)`` of every message row: xmin changes when a row is rewritten."""
    out = server.psql(f"SELECT seq, lease_id, xmin FROM {schema}.messages ORDER BY seq")
    return [tuple(line.split("|")) for line in out.split()]


def _leases(server: LocalPostgres) -> dict[str, str]:
    out = server.psql("SELECT id, xmin FROM leasekit.leases ORDER BY id")
    return dict(line.split("|") for line in out.split())  # type: ignore[misc]


# ---------------------------------------------------------------------- URLs


def test_url_with_a_user_and_a_socket_directory_opens_a_queue(
    postgres_server: LocalPostgres,
) -> None:
    name = f"sock-{uuid.uuid4().hex[:8]}"
    url = (
        f"postgresql://postgres@/postgres?host={postgres_server.socket_dir}"
        f"&port={postgres_server.port}&queue={name}"
    )
    with leasekit.open(url, create=True) as q:
        q.send(b"over the socket")
        [lease] = q.lease(1, duration=5)
        assert lease.message.body == b"over the socket"
        lease.complete()
        assert str(postgres_server.socket_dir) in repr(q.driver)
        q.delete_queue()


def test_postgres_alias_and_the_dsn_keyword_open_the_same_queue(
    postgres_server: LocalPostgres,
) -> None:
    name = f"alias-{uuid.uuid4().hex[:8]}"
    with leasekit.open(postgres_server.url(), queue=name, create=True) as first:
        first.send(b"one")
        alias = f"postgres://postgres@{postgres_server.host}:{postgres_server.port}/postgres"
        with leasekit.open(f"{alias}?queue={name}") as second:
            assert [lz.message.body for lz in second.lease(1, duration=5)] == [b"one"]
        with leasekit.open("postgresql", queue=name, dsn=postgres_server.dsn()) as third:
            assert third.stats().leased == 1
        first.delete_queue()


def test_libpq_parameters_pass_through_and_unknown_ones_are_refused_at_open(
    postgres_server: LocalPostgres,
) -> None:
    url = postgres_server.url() + "?queue=q&sslmode=disable&application_name=lk-test"
    with leasekit.open(url, create=True) as q:
        q.send(b"x")
        names = postgres_server.psql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lk-test'"
        )
        assert int(names) >= 1
        q.delete_queue()
    with pytest.raises(InvalidURL) as info:
        leasekit.open(postgres_server.url() + "?queue=q&no_such_libpq_option=1")
    assert "no_such_libpq_option" in str(info.value)


def test_a_password_in_the_query_string_is_refused_without_echoing_it() -> None:
    with pytest.raises(InvalidURL) as info:
        leasekit.open("postgresql://u@h/db?queue=q&password=HUNTER2SECRET")
    assert "password" in str(info.value) and "HUNTER2SECRET" not in str(info.value)


def test_bad_options_are_refused_naming_them() -> None:
    for options, named in (
        ({"pool_size": "0"}, "pool_size"),
        ({"max_message_size": "x"}, "max_message_size"),
        ({"schema": ""}, "schema"),
    ):
        with pytest.raises(InvalidURL) as info:
            leasekit.open("postgresql://u@h/db?queue=q", **options)
        assert named in str(info.value)
    with pytest.raises(InvalidURL, match="queue"):
        leasekit.open("postgresql://u@h/db")


def test_opening_makes_no_connection() -> None:
    # Port 1 refuses connections: open() must not notice; the first call does.
    q = leasekit.open(
        "postgresql://u@127.0.0.1:1/db?queue=q", retry=RetryPolicy(attempts=1), call_timeout=3
    )
    with pytest.raises(BackendUnavailable):
        q.send(b"x")
    q.close()


# -------------------------------------------------------------------- schema


def test_create_makes_the_schema_in_the_named_schema_and_delete_removes_the_queue(
    postgres_server: LocalPostgres,
) -> None:
    schema = f"lk_{uuid.uuid4().hex[:8]}"
    with _open(postgres_server, "jobs", schema=schema, create=True) as q:
        tables = postgres_server.psql(
            f"SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables "
            f"WHERE schemaname = '{schema}'"
        ).strip()
        assert tables == "dead_letters,leases,messages,queues,schema_version"
        version = postgres_server.psql(f"SELECT max(version) FROM {schema}.schema_version")
        assert int(version) == SCHEMA_VERSION
        q.send(b"x")
        q.delete_queue()
        assert postgres_server.psql(f"SELECT count(*) FROM {schema}.queues").strip() == "0"
        assert postgres_server.psql(f"SELECT count(*) FROM {schema}.messages").strip() == "0"
        with pytest.raises(QueueNotFound):
            q.send(b"y")
    with (
        _open(postgres_server, "jobs", schema=f"{schema}_none") as missing,
        pytest.raises(QueueNotFound),
    ):
        missing.lease(1)


def test_a_queue_made_by_this_version_opens_in_the_next(
    postgres_server: LocalPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = f"lk_{uuid.uuid4().hex[:8]}"
    with _open(postgres_server, "jobs", schema=schema, create=True) as q:
        q.send(b"made by this version", properties={"k": "v"})
    # The next version adds a migration; opening (without create) brings the schema up.
    following = (SCHEMA_VERSION + 1, ("ALTER TABLE {s}.messages ADD COLUMN priority integer",))
    monkeypatch.setattr(postgresql.schema, "MIGRATIONS", [*postgresql.MIGRATIONS, following])
    with _open(postgres_server, "jobs", schema=schema) as q:
        [lease] = q.lease(1, duration=5)
        assert lease.message.body == b"made by this version"
        assert lease.message.properties == {"k": "v"}
        lease.complete()
    version = postgres_server.psql(f"SELECT max(version) FROM {schema}.schema_version")
    assert int(version) == SCHEMA_VERSION + 1
    columns = postgres_server.psql(
        f"SELECT count(*) FROM information_schema.columns WHERE table_schema = '{schema}' "
        "AND table_name = 'messages' AND column_name = 'priority'"
    )
    assert int(columns) == 1
    # And this version refuses a schema newer than it knows, saying so.
    monkeypatch.setattr(postgresql.schema, "MIGRATIONS", postgresql.MIGRATIONS[:-1])
    with (
        _open(postgres_server, "jobs", schema=schema) as q,
        pytest.raises(UnsupportedOperation, match="upgrade leasekit"),
    ):
        q.send(b"x")


# ------------------------------------------------------- lease-batch renewal


def test_renewing_a_whole_receive_batch_rewrites_one_row_and_no_message(
    postgres_server: LocalPostgres,
) -> None:
    schema = f"lk_{uuid.uuid4().hex[:8]}"
    with _open(postgres_server, "jobs", schema=schema, create=True) as q:
        q.send_many([b"%d" % i for i in range(50)])
        leases = q.lease(50, duration=30)
        before = _messages(postgres_server, schema)
        batches = postgres_server.psql(f"SELECT id, xmin FROM {schema}.leases").split()
        assert len(batches) == 1, "one receive made one lease batch"
        assert q.renew_many(leases, 60) == [None] * 50
        assert _messages(postgres_server, schema) == before, "a message row was rewritten"
        after = postgres_server.psql(f"SELECT id, xmin FROM {schema}.leases").split()
        assert len(after) == 1 and after != batches, "the batch row was not renewed"
        assert all(lz.time_left > 45 for lz in leases)
        q.delete_queue()


def test_renewing_part_of_a_batch_moves_it_and_the_rest_expires_on_time(
    postgres_server: LocalPostgres,
) -> None:
    schema = f"lk_{uuid.uuid4().hex[:8]}"
    with _open(postgres_server, "jobs", schema=schema, create=True) as q:
        q.send_many([b"kept", b"let go"])
        kept, let_go = sorted(q.lease(2, duration=1.5), key=lambda lz: lz.message.body)
        assert q.renew_many([kept], 30) == [None]
        rows = postgres_server.psql(
            f"SELECT count(DISTINCT lease_id) FROM {schema}.messages"
        ).strip()
        assert rows == "2", "the renewed message did not move to a batch of its own"
        # The one not renewed comes back when its own lease ends, not later.
        [again] = q.lease(1, duration=30, wait=1.5 + 3)
        assert again.message.body == b"let go" and again.message.delivery_count == 2
        assert q.lease(1, duration=30, wait=0) == [], "the renewed message came back"
        with pytest.raises(LeaseLost):
            let_go.complete()
        kept.complete()
        again.complete()
        q.delete_queue()


def test_a_stale_receipt_renewed_with_the_new_holders_changes_nothing(
    postgres_server: LocalPostgres,
) -> None:
    with _open(postgres_server, f"stale-{uuid.uuid4().hex[:8]}", create=True) as q:
        q.send_many([b"a", b"b"])
        first = q.lease(2, duration=0.5)
        second = q.lease(2, duration=30, wait=3)
        assert {lz.message.body for lz in second} == {b"a", b"b"}
        # The old receipts, in one renewal call with the new holders' receipts.
        old = [Lease(q, lz.message, lz.receipt, lz.expires_at, 30, lz.raw_message) for lz in first]
        results = q.renew_many([*old, *second], 30)
        assert [type(r) for r in results[:2]] == [LeaseLost, LeaseLost]
        assert results[2:] == [None, None]
        assert q.complete_many(second) == [None, None]
        q.delete_queue()


def test_the_keeper_renews_a_receive_batch_in_one_call_without_rewriting_messages(
    postgres_server: LocalPostgres,
) -> None:
    schema = f"lk_{uuid.uuid4().hex[:8]}"
    with _open(postgres_server, "jobs", schema=schema, create=True) as q:
        q.send_many([b"%d" % i for i in range(100)])
        leases = q.lease(100, duration=1.0)
        before = _messages(postgres_server, schema)
        with LeaseKeeper(renew_at=0.5) as keeper:
            keeper.add_many(leases)  # one receive, added in one call
            deadline = time.monotonic() + 10
            while keeper.stats.renewed < 300 and time.monotonic() < deadline:
                time.sleep(0.05)  # waiting for renewals to happen, not synchronising
            assert keeper.stats.lost == 0
            assert keeper.stats.renewed >= 300
            # Every renewal renewed all 100 in one call, as one row: no message rewritten.
            assert keeper.stats.renewed == 100 * keeper.stats.renew_calls
            assert _messages(postgres_server, schema) == before
            assert int(postgres_server.psql(f"SELECT count(*) FROM {schema}.leases")) == 1
        assert q.complete_many(leases) == [None] * 100
        q.delete_queue()


# ------------------------------------------------------------- batched settles


@pytest.mark.parametrize("action", ["delete", "abandon"])
def test_a_settle_batch_answers_per_receipt_when_some_are_stale_malformed_or_repeated(
    postgres_server: LocalPostgres, action: str
) -> None:
    """One statement settles the batch; only a short answer names which receipts worked."""
    with _open(postgres_server, f"mixed-{uuid.uuid4().hex[:8]}", create=True) as q:
        driver = q.driver
        q.send_many([b"a", b"b", b"c"])
        a, b, c = (m.receipt for m in driver.receive(3, 30.0, 0.0))
        seq, _, token = a.partition(".")
        stale = f"{seq}.{int(token) % 9_000_000_000_000_000 + 1}"  # the right row, a wrong token
        receipts = [a, stale, "1.\u00b2", f"{b},{c}", "", b, c, "12345678901234567890.1", a]
        call = driver.delete if action == "delete" else partial(driver.abandon, delay=60.0)
        results = call(receipts)
        settled = [r is None for r in results]
        # a, b and c settle (each repeat of a settled receipt reads as settled);
        # the stale token, the malformed ones and the too-long number do not.
        assert settled == [True, False, False, False, False, True, True, False, True]
        for result in results:
            if result is not None:
                assert isinstance(result, Exception) and "stale" in str(result)
        assert all(r is not None for r in call([a, b, c])), "a receipt worked twice"
        # One receipt holding a comma, among well-formed ones only, is one bad receipt.
        q.send_many([b"f", b"g", b"h"])
        f, g, h = (m.receipt for m in driver.receive(3, 30.0, 0.0))
        assert [r is None for r in call([f, f"{g},{h}"])] == [True, False]
        assert call([g, h]) == [None, None], "the comma receipt settled g or h"
        # A whole batch that matches answers with its count alone.
        q.send_many([b"d", b"e"])
        fresh = [m.receipt for m in driver.receive(2, 30.0, 0.0)]
        assert call(fresh) == [None, None]
        q.delete_queue()


def test_a_batch_of_only_malformed_receipts_still_finds_a_missing_queue(
    postgres_server: LocalPostgres,
) -> None:
    name = f"gone-{uuid.uuid4().hex[:8]}"
    q = _open(postgres_server, name, create=True)
    driver = q.driver
    q.delete_queue()
    with pytest.raises(Exception) as caught:
        driver.delete(["not-a-receipt"])
    assert getattr(caught.value, "code", None) is ErrorCode.QUEUE_NOT_FOUND
    q.close()


# ------------------------------------------------------------------ deadlines


def test_a_statement_blocked_by_a_lock_is_bounded_by_the_call_deadline(
    postgres_server: LocalPostgres,
) -> None:
    import psycopg

    name = f"locked-{uuid.uuid4().hex[:8]}"
    with _open(postgres_server, name, create=True, call_timeout=1.0) as q:
        q.send(b"x")
        with psycopg.connect(postgres_server.url()) as blocker:
            blocker.execute("LOCK TABLE leasekit.messages IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                q.send(b"y")
            took = time.monotonic() - started
            blocker.rollback()
        assert took < 1.0 + 0.5, f"the send waited {took:.2f} s on a 1 s deadline"
        [lease] = q.lease(1, duration=5)  # the queue works again
        lease.complete()
        q.delete_queue()


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "sqlstate, code, retryable",
    [
        ("40P01", ErrorCode.UNAVAILABLE, True),  # deadlock
        ("40001", ErrorCode.UNAVAILABLE, True),  # serialization failure
        ("57P01", ErrorCode.UNAVAILABLE, True),  # admin shutdown (a restart)
        ("57P03", ErrorCode.UNAVAILABLE, True),  # cannot connect now (starting up)
        ("08006", ErrorCode.UNAVAILABLE, True),  # connection failure
        ("53300", ErrorCode.UNAVAILABLE, True),  # too many connections
        ("57014", ErrorCode.UNAVAILABLE, False),  # statement_timeout: the deadline passed
        ("28P01", ErrorCode.UNAUTHENTICATED, False),
        ("42501", ErrorCode.UNAUTHENTICATED, False),
        ("3F000", ErrorCode.QUEUE_NOT_FOUND, False),
        ("42P01", ErrorCode.QUEUE_NOT_FOUND, False),
        ("54000", ErrorCode.TOO_LARGE, False),
        # A value the server cannot take (class 22: data exception) is the caller's.
        ("22P02", ErrorCode.INVALID_ARGUMENT, False),
        ("22P05", ErrorCode.INVALID_ARGUMENT, False),  # a NUL in jsonb
        ("3D000", ErrorCode.QUEUE_NOT_FOUND, False),  # no such database
        ("28000", ErrorCode.UNAUTHENTICATED, False),  # role or pg_hba.conf
        ("42704", ErrorCode.INVALID_ARGUMENT, False),  # a setting that does not exist
        ("42703", ErrorCode.UNKNOWN, False),  # any other: BackendError, not retried
    ],
)
def test_errors_are_classified_by_sqlstate(sqlstate: str, code: ErrorCode, retryable: bool) -> None:
    import psycopg

    driver = PostgresqlDriver(queue="q", host="127.0.0.1")
    exc = psycopg.errors.lookup(sqlstate)("test")
    assert driver.error_code(exc) is code
    assert driver.is_retryable(exc) is retryable
    assert driver.backend_code(exc) == sqlstate


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ('connection is bad: invalid sslmode value: "bogus"', ErrorCode.INVALID_ARGUMENT),
        (
            'connection to server at "h" failed: FATAL:  database "x" does not exist',
            ErrorCode.QUEUE_NOT_FOUND,
        ),
        ('failed: FATAL:  role "x" does not exist', ErrorCode.UNAUTHENTICATED),
        ('failed: FATAL:  password authentication failed for user "x"', ErrorCode.UNAUTHENTICATED),
        ("failed: FATAL:  no pg_hba.conf entry for host", ErrorCode.UNAUTHENTICATED),
        ('failed: FATAL:  unrecognized configuration parameter "x"', ErrorCode.INVALID_ARGUMENT),
        ("failed: server does not support SSL, but SSL was required", ErrorCode.INVALID_ARGUMENT),
        # Not final: a server starting, full, or unreachable; another database state.
        ("failed: FATAL:  the database system is starting up", ErrorCode.UNAVAILABLE),
        ("failed: FATAL:  sorry, too many clients already", ErrorCode.UNAVAILABLE),
        (
            'failed: FATAL:  database "x" is not currently accepting connections',
            ErrorCode.UNAVAILABLE,
        ),
        ("failed: Connection refused", ErrorCode.UNAVAILABLE),
    ],
)
def test_a_refused_connection_is_classified_by_its_words(message: str, code: ErrorCode) -> None:
    """libpq gives a failed connection no SQLSTATE: what no retry mends is read from its words."""
    import psycopg

    driver = PostgresqlDriver(queue="q", host="127.0.0.1")
    exc = psycopg.OperationalError(f"connection failed: {message}")
    assert driver.error_code(exc) is code
    assert driver.is_retryable(exc) is (code is ErrorCode.UNAVAILABLE)


def test_a_lost_connection_and_an_empty_pool_are_transient() -> None:
    import psycopg
    from psycopg_pool import PoolTimeout

    driver = PostgresqlDriver(queue="q", host="127.0.0.1")
    for exc in (psycopg.OperationalError("server closed the connection"), PoolTimeout("x")):
        assert driver.error_code(exc) is ErrorCode.UNAVAILABLE
        assert driver.is_retryable(exc)


def test_import_leasekit_imports_no_psycopg() -> None:
    code = "import sys, leasekit; leasekit.open('memory://q'); print('psycopg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_wrong_password_is_authentication_failed(postgres_server: LocalPostgres) -> None:
    role = f"lk_{uuid.uuid4().hex[:8]}"
    postgres_server.create_role(role, "right-password")
    url = (
        f"postgresql://{role}@{postgres_server.host}:{postgres_server.port}/postgres"
        f"?queue=q&schema={role}"
    )
    with leasekit.open(url, password="wrong-password") as q:
        with pytest.raises(AuthenticationFailed) as info:
            q.send(b"x")
        assert "wrong-password" not in str(info.value)
    with leasekit.open(url, password="right-password", create=True) as q:
        q.send(b"x")
        q.delete_queue()


def test_prepared_statements_can_be_turned_off_for_a_transaction_pooler(
    postgres_server: LocalPostgres,
) -> None:
    url = f"{postgres_server.url()}?queue=noprep-{uuid.uuid4().hex[:8]}&prepared_statements=false"
    with leasekit.open(url, create=True) as q:
        assert q.driver._shared.kwargs["prepare_threshold"] is None  # type: ignore[attr-defined]
        for _ in range(3):  # more than the threshold would prepare after
            q.send(b"x")
            [lease] = q.lease(1, duration=5)
            lease.complete()
        q.delete_queue()


def test_the_receive_is_planned_once_not_at_every_call(postgres_server: LocalPostgres) -> None:
    """Its limit is written into the statement, so the server keeps one generic plan.

    With ``LIMIT $n`` the generic plan's cost is a guess (a tenth of the table),
    and on a queue of some size the server planned every receive anew (~500 us of
    its CPU a call): ``pg_prepared_statements`` counts the custom plans made.
    """
    name = f"plans-{uuid.uuid4().hex[:8]}"
    with _open(postgres_server, name, create=True, pool_size=1) as q:
        for _ in range(6):
            q.send_many([b"x"] * 500)
        # Statistics, as autovacuum gathers them on a busy table: with them the
        # server knew the table's size and planned each call for its limit.
        postgres_server.psql("ANALYZE leasekit.messages")
        for _ in range(20):
            leases = q.lease(10, duration=30)
            assert len(leases) == 10
            q.complete_many(leases)
        with q.driver._connection() as conn:  # type: ignore[attr-defined]
            rows = conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE %s",
                ["%picked AS%"],
            ).fetchall()
        q.delete_queue()
    generic, custom = (sum(row[i] for row in rows) for i in (0, 1))
    # Prepared at the second call (psycopg), custom for the first five runs, then
    # the generic plan for good: 13 of the 18 prepared runs (was 0 of 18).
    assert custom <= 5 and generic >= 20 - 2 - 5, (generic, custom)


def test_a_checkpoint_store_is_read_for_messages_received_as_rows(
    postgres_server: LocalPostgres,
) -> None:
    """The receive gives plain rows; with a store, core reads each one's checkpoint."""
    store = leasekit.MemoryCheckpointStore()
    name = f"rows-{uuid.uuid4().hex[:8]}"
    with _open(postgres_server, name, create=True, checkpoint_store=store) as q:
        q.send_many([b"a", b"b"])
        with deadline(10.0):
            rows = q.driver.receive(2, 0.5, 0.0)  # leased for half a second, then back
        assert isinstance(rows, ReceivedRows)
        store.save(rows[1].id, b"half-way", 1)
        leases = q.lease(2, duration=30, wait=5)
        assert {lease.message.id: lease.message.checkpoint for lease in leases} == {
            rows[0].id: None,
            rows[1].id: b"half-way",
        }
        q.complete_many(leases)
        q.delete_queue()


def test_the_watchdog_keeps_only_the_calls_in_flight(queue: Queue) -> None:
    """Finished calls leave its heap when they end, not when their deadline passes."""
    watchdog = postgresql.watchdog._WATCHDOG
    for _ in range(200):
        queue.stats()
    with watchdog._cond:
        # 200 calls made: a heap of them all is the leak; a few left below a call
        # still in flight (another test's, in this process) are not.
        assert len(watchdog._heap) < 100, f"{len(watchdog._heap)} finished calls in the heap"


def _sleeping(watchdog: postgresql.watchdog._Watchdog) -> float:
    """When the watchdog thread next wakes on its own, once it is waiting (5 s at most)."""
    until = time.monotonic() + 5
    while time.monotonic() < until:
        with watchdog._cond:
            if watchdog._wakes_at:
                return watchdog._wakes_at
        time.sleep(0.005)  # a poll with a deadline
    raise AssertionError("the watchdog thread never went to sleep")


class _CountingCondition(threading.Condition):
    """A condition that counts its notifications."""

    notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_a_call_due_later_than_the_watchdogs_wake_does_not_wake_it() -> None:
    """Waking the thread for every call cost two context switches a call (#21)."""
    watchdog = postgresql.watchdog._Watchdog()
    cond = watchdog._cond = _CountingCondition(watchdog._lock)
    watchdog.hold()
    a, b = socket.socketpair()
    try:
        first = watchdog.watch(a.fileno(), 30.0)
        assert first is not None
        _sleeping(watchdog)  # until the first call's deadline
        watchdog.unwatch(first[0])
        before = cond.notified
        for _ in range(50):  # calls one after another, each due after that wake
            watched = watchdog.watch(a.fileno(), 30.0)
            assert watched is not None
            watchdog.unwatch(watched[0])
        assert cond.notified == before, f"{cond.notified - before} calls woke the watchdog"
    finally:
        watchdog.release()
        a.close()
        b.close()


def test_a_call_due_sooner_than_the_watchdogs_wake_is_cut_in_time() -> None:
    watchdog = postgresql.watchdog._Watchdog()
    watchdog.hold()
    a, b = socket.socketpair()
    try:
        slow = watchdog.watch(a.fileno(), 60.0)
        assert slow is not None
        _sleeping(watchdog)  # asleep until the slow call's deadline
        started = time.monotonic()
        hung = watchdog.watch(b.fileno(), 0.05)
        assert hung is not None
        a.settimeout(10)
        assert a.recv(1) == b"", "the hung call's socket was not shut down"
        elapsed = time.monotonic() - started
        assert hung[1] == [True]
        assert elapsed < 0.05 + postgresql.settings.CUT_GRACE + 2.0, f"cut after {elapsed:.2f} s"
        assert slow[1] == [False], "the slow call, not yet due, was cut"
        watchdog.unwatch(slow[0])
    finally:
        watchdog.release()
        a.close()
        b.close()


def test_the_statement_timeout_follows_each_calls_deadline(queue: Queue) -> None:
    """Set only when the step changes; a call with less time gets the lower step at once."""
    driver = queue.driver

    def setting() -> str:
        with driver._connection() as conn:  # type: ignore[attr-defined]
            row = conn.execute("SHOW statement_timeout").fetchone()
            assert row is not None
            return str(row[0])

    expected = [(30, "30s"), (0.3, "500ms"), (0.24, "250ms"), (0.2, "250ms"), (29, "30s")]
    for seconds, shown in expected:
        with deadline(seconds):
            assert setting() == shown, f"a call of {seconds} s"
    assert setting() == "0", "a call without a deadline has no server-side limit"


def _forked(child: Callable[[], bool]) -> int:
    """Fork; the child runs ``child`` and exits 0 if it answered true (1 otherwise). The pid."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            status = 0 if child() else 1
        finally:
            os._exit(status)
    return pid


def _exit_code(pid: int, what: str, within: float = 15.0) -> int:
    """The forked child's exit code; it is killed (and the test fails) if not done ``within``."""
    until = time.monotonic() + within
    while True:
        done, waited = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(waited)
        if time.monotonic() > until:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the child did not finish: {what}")
        time.sleep(0.05)  # a poll with a deadline


def test_a_forked_child_makes_its_own_pool_and_watchdog(postgres_server: LocalPostgres) -> None:
    """The process id is kept by a fork hook (no system call per call): a child still knows."""
    url = postgres_server.url()
    with leasekit.open(url, queue=f"fork-{uuid.uuid4().hex[:8]}", create=True) as queue:
        queue.send(b"parent")
        [lease] = queue.lease(1, duration=30)  # the parent's pool and watchdog at work
        lease.complete()
        parents = queue.driver._shared.pool  # type: ignore[attr-defined]

        def child() -> bool:
            queue.send(b"child")
            [lease] = queue.lease(1, duration=30)
            lease.complete()
            watchdogs = [
                t for t in threading.enumerate() if t.name == "leasekit-postgresql-watchdog"
            ]
            mine = queue.driver._shared.pool  # type: ignore[attr-defined]
            return lease.message.body == b"child" and mine is not parents and bool(watchdogs)

        code = _exit_code(_forked(child), "using the queue")
        assert code == 0, "the child could not use the queue"
        queue.send(b"parent again")  # the parent's pool was left alone
        [lease] = queue.lease(1, duration=30)
        assert lease.message.body == b"parent again"
        lease.complete()
        assert queue.driver._shared.pool is parents  # type: ignore[attr-defined]
        queue.delete_queue()


def test_a_forked_child_is_not_stopped_by_a_lock_held_at_the_fork(
    postgres_server: LocalPostgres,
) -> None:
    """A thread of the parent holding the pool's lock at the fork does not exist in the child."""
    url = postgres_server.url()
    with leasekit.open(url, queue=f"forklock-{uuid.uuid4().hex[:8]}", create=True) as queue:
        queue.send(b"parent")
        shared = queue.driver._shared  # type: ignore[attr-defined]
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            with shared.lock:
                holding.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        assert holding.wait(5)

        def child() -> bool:  # its first call makes its own pool, under that lock
            queue.send(b"child")
            return True

        pid = _forked(child)
        release.set()
        holder.join()
        assert _exit_code(pid, "blocked on a lock held at the fork?") == 0
        leases = queue.lease(5, duration=30)
        assert sorted(lease.message.body for lease in leases) == [b"child", b"parent"]
        queue.complete_many(leases)
        queue.delete_queue()


def _requests(queue: Queue) -> int:
    """How many connections the driver's pool has handed out so far."""
    pool = queue.driver._shared.pool  # type: ignore[attr-defined]
    return int(pool.get_stats().get("requests_num", 0))


def test_a_call_takes_the_connection_the_last_call_left_idle_not_a_pool_round(
    queue: Queue,
) -> None:
    """A pool round (getconn, putconn) cost more client CPU than a batch's statements (#21)."""
    queue.send(b"first")  # opens the pool; the connection then waits in the idle list
    before = _requests(queue)
    for i in range(20):
        queue.send(f"m{i}".encode())
        leases = queue.lease(5, duration=30)
        queue.complete_many(leases)
    assert _requests(queue) == before, "a call went to the pool with a connection idle"
    assert len(queue.driver._shared.idle) == 1  # type: ignore[attr-defined]


def test_threads_beyond_the_pool_size_share_its_connections_and_none_starves(
    postgres_server: LocalPostgres,
) -> None:
    """Idle connections serve any thread: more threads than connections all finish."""
    name = f"idle-{uuid.uuid4().hex[:8]}"
    with leasekit.open(postgres_server.url(), queue=name, create=True, pool_size=2) as queue:
        failures: list[BaseException] = []
        done = [0]

        def work() -> None:
            try:
                for i in range(15):
                    queue.send(f"{i}".encode())
                    queue.complete_many(queue.lease(2, duration=30))
                    done[0] += 1
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads), "a thread starved"
        assert failures == []
        assert done[0] == 8 * 15
        pool = queue.driver._shared.pool  # type: ignore[attr-defined]
        assert pool.get_stats()["pool_size"] <= 2, "more connections than pool_size"
        assert len(queue.driver._shared.idle) <= 2  # type: ignore[attr-defined]
        queue.delete_queue()


def test_closing_closes_the_idle_connections(postgres_server: LocalPostgres) -> None:
    name = f"idleclose-{uuid.uuid4().hex[:8]}"
    queue = leasekit.open(postgres_server.url(), queue=name, create=True)
    queue.send(b"x")
    idle = list(queue.driver._shared.idle)  # type: ignore[attr-defined]
    assert len(idle) == 1
    queue.delete_queue()
    queue.close()
    assert all(conn.closed for conn in idle), "an idle connection outlived close()"
    assert queue.driver._shared.idle == []  # type: ignore[attr-defined]


def test_an_idle_connection_the_server_ended_is_replaced_without_an_error(
    queue: Queue, postgres_server: LocalPostgres
) -> None:
    import psycopg

    queue.send(b"before")
    [idle] = queue.driver._shared.idle  # type: ignore[attr-defined]
    backend = idle.info.backend_pid
    with psycopg.connect(postgres_server.url(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [backend])
        until = time.monotonic() + 10
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [backend]).fetchone():
            assert time.monotonic() < until, "the server did not end the backend"
            time.sleep(0.02)  # a poll with a deadline
    [lease] = queue.lease(1, duration=30)  # no error: a live connection was taken
    assert lease.message.body == b"before"
    lease.complete()
    assert idle.closed, "the dead connection was kept"
    [now] = queue.driver._shared.idle  # type: ignore[attr-defined]
    assert now.info.backend_pid != backend


def test_a_connection_out_of_the_pool_for_keep_for_goes_back_to_it(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So the pool's own rules (its lifetime, shrinking when idle) still apply to it."""
    queue.send(b"x")
    queue.driver._shared.idle.clear()  # type: ignore[attr-defined]
    monkeypatch.setattr(postgresql.pool, "KEEP_FOR", 0.0)
    before = _requests(queue)
    for _ in range(3):
        queue.send(b"y")
    assert _requests(queue) == before + 3, "a connection out for KEEP_FOR was kept"
    assert queue.driver._shared.idle == []  # type: ignore[attr-defined]


def test_a_connection_a_burst_left_idle_goes_back_to_the_pool_after_keep_for(
    postgres_server: LocalPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The idle list is LIFO: its oldest connection is given back, not kept for ever."""
    name = f"burst-{uuid.uuid4().hex[:8]}"
    with leasekit.open(postgres_server.url(), queue=name, create=True, pool_size=3) as queue:
        shared = queue.driver._shared  # type: ignore[attr-defined]
        queue.send(b"x")
        pool = shared.pool
        until = time.monotonic() + 10
        burst = [shared.take(pool, until) for _ in range(3)]  # the idle one, two from the pool
        assert shared.idle == [] and shared.waiting == 0
        for conn in burst:
            shared.give_back(conn, pool)
        assert len(shared.idle) == 3
        oldest = shared.idle[0]
        oldest._leasekit_keep_until = 0.0  # as if out of the pool for KEEP_FOR
        queue.send(b"y")  # a call on the newest; its end gives the oldest back
        assert oldest not in shared.idle
        assert len(shared.idle) == 2
        queue.delete_queue()


def test_closing_the_last_queue_ends_the_watchdog_thread(postgres_server: LocalPostgres) -> None:
    def watchdogs() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "leasekit-postgresql-watchdog"]

    others = postgresql.watchdog._WATCHDOG._users  # pools other tests left open in this process
    queues = [
        leasekit.open(postgres_server.url(), queue=f"wd-{uuid.uuid4().hex[:8]}", create=True)
        for _ in range(3)
    ]
    for q in queues:
        q.send(b"x")
    assert len(watchdogs()) == 1, "one watchdog thread for every pool"
    for q in queues:
        q.delete_queue()
        q.close()
    if others == 0:
        assert watchdogs() == []


def test_the_password_may_come_from_libpqs_environment_or_pgpass(
    postgres_server: LocalPostgres, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    role = f"lk_{uuid.uuid4().hex[:8]}"
    password = f"env-{uuid.uuid4().hex}"
    postgres_server.create_role(role, password)
    host, port = postgres_server.host, postgres_server.port
    url = f"postgresql://{role}@{host}:{port}/postgres?queue=q&schema={role}"
    monkeypatch.setenv("PGPASSWORD", password)
    with leasekit.open(url, create=True) as q:
        q.send(b"from PGPASSWORD")
        assert password not in repr(q.driver)
    monkeypatch.delenv("PGPASSWORD")
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"{host}:{port}:postgres:{role}:{password}\n")
    pgpass.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    with leasekit.open(url) as q:
        [lease] = q.lease(1, duration=5)
        assert lease.message.body == b"from PGPASSWORD"
        lease.complete()
        q.delete_queue()


# ------------------------------------------------- NUL characters (issue 33 item 9)


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("property value", OutgoingMessage(b"x", properties={"k": "a\x00b"})),
        ("property name", OutgoingMessage(b"x", properties={"a\x00b": "v"})),
        ("group", OutgoingMessage(b"x", group="g\x00")),
    ],
)
def test_a_nul_the_driver_is_given_anyway_is_invalid_argument_not_retried(
    queue: Queue, what: str, message: OutgoingMessage
) -> None:
    """Core refuses a NUL before any call; one that reaches the driver is the caller's error.

    jsonb cannot hold ``\\u0000`` (22P05) and a text column no NUL (psycopg
    refuses to send it): both mean "change the value", never a backend fault.
    """
    driver = queue.driver
    with pytest.raises(Exception) as info:
        driver.send([message])
    assert driver.error_code(info.value) is ErrorCode.INVALID_ARGUMENT, what
    assert not driver.is_retryable(info.value)
    error = wrap_error(driver, info.value, "send")
    assert isinstance(error, InvalidArgument)


def test_a_nul_in_a_dead_letter_reason_given_to_the_driver_is_invalid_argument(
    queue: Queue,
) -> None:
    driver = queue.driver
    queue.send(b"x")
    [raw] = driver.receive(1, 5, 0)
    with pytest.raises(Exception) as info:
        driver.dead_letter(raw.receipt, "bad\x00reason", raw)
    assert driver.error_code(info.value) is ErrorCode.INVALID_ARGUMENT
    # Nothing changed: still leased (hidden), still in the queue, no dead letter.
    assert queue.lease(1, duration=5) == []
    assert queue.peek_dead_letters(1) == []
    assert driver.delete([raw.receipt]) == [None]


def test_nul_bytes_in_a_body_round_trip_through_the_queue_dead_letters_and_redrive(
    queue: Queue,
) -> None:
    body = b"\x00head\x00\x00tail\x00"
    queue.send(body)
    [lease] = queue.lease(1, duration=5)
    assert lease.message.body == body
    lease.dead_letter("to check the body")
    [letter] = queue.peek_dead_letters(1)
    assert letter.body == body
    assert queue.redrive() == 1
    [back] = queue.lease(1, duration=5)
    assert back.message.body == body
    back.complete()
