"""leasekit's SQLite backend against persist-queue and litequeue, doing the same work.

Work, for each contender, on a fresh database file in a temporary directory:

1. send phase: ``--messages`` messages of ``--size`` bytes (timed on its own);
2. lease phase: lease up to ``--batch`` messages, complete (ack) every one of
   them, repeat until the queue is empty (timed; this is the headline msg/s).

Contenders (each with its library's defaults, WAL journal in all three):

* ``leasekit (batch complete)`` — ``queue.lease(100)`` then the internal
  ``queue.complete_many(leases)`` (one ``DELETE`` transaction per batch);
  sends with ``queue.send_many`` (500 per transaction). ``synchronous=NORMAL``.
* ``leasekit (complete each)`` — the same, completing with ``lease.complete()``
  one by one (the public API today: one transaction per message).
* ``leasekit FULL`` — batch complete with ``synchronous=FULL`` (fsync every commit).
* ``persist-queue`` — ``SQLiteAckQueue``: ``put`` per message, then ``get`` x100
  and ``ack`` x100 (no batch API; one commit per call; SQLite's default
  ``synchronous=FULL``; acked rows stay in the table, marked acked). Run
  twice: as shipped, and with ``PRAGMA synchronous=NORMAL`` set on its
  (private) connection, to separate fsync cost from the rest.
* ``plain sqlite3`` — the engine's limit: the same work written directly on
  ``sqlite3`` (the backend's table shape and ready index, WAL,
  ``synchronous=NORMAL``): one ``BEGIN IMMEDIATE`` transaction per batch that
  picks the next ``--batch`` visible rows and ``UPDATE … RETURNING`` gives each a
  fresh random receipt and a raised delivery count, then one transaction per
  batch with one ``executemany`` of a ``DELETE`` fenced by each row's id and
  receipt (the batch's total row count checked), as a careful engineer writes
  it (issue 37; before, it deleted row by row in a Python loop, which made the
  limit slower and the ratio look better). No lease objects, no deadlines, no
  events: what any leased SQLite queue has to ask of the database.
* ``litequeue`` — ``LiteQueue``: ``put`` per message (autocommit), ``pop`` x100
  (one ``IMMEDIATE`` transaction each), ``done`` x100 inside one
  ``transaction()``; ``synchronous=NORMAL``; done rows stay in the table.

Run (the numbers in docs/benchmarks/sqlite.md came from this command)::

    .venv/bin/python benchmarks/bench_sqlite.py --messages 20000 --batch 100 --repeat 3

Against the engine's limit (issue 25; docs/benchmarks.md "Per-message cost")::

    .venv/bin/python benchmarks/bench_sqlite.py --only leasekit --only plain \
        --batch 10 --batch 100 --repeat 5 --memory 50000

Where leasekit's time goes (issue 37; docs/benchmarks.md "SQLite against the
careful plain loop")::

    .venv/bin/python benchmarks/bench_sqlite.py --split --batch 10 --batch 100 \
        --messages 10000 --repeat 15 --dir /dev/shm

``--split`` adds two rows between the plain loop and leasekit: leasekit's own
SQL statements run straight on ``sqlite3`` (what its promises ask of the
engine: the pick in delivery order with the TTL and group rules, the columns a
lease needs, the TTL in the fence), and its driver alone (``receive`` +
``delete``, no core); then prints the CPU per message each step adds. Every
ratio is also given per round (the two runs of a round are made one after the
other, so machine drift falls on both).

``--memory N`` also holds ``N`` leases (100-byte bodies) in a ``LeaseKeeper`` and
reports the Python memory each costs (tracemalloc: the lease, its message, its
record and its keeper entry; SQLite's own pages are not Python memory).

Ratios are leasekit (batch complete) lease-phase msg/s divided by the peer's.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import leasekit

#: (send seconds, lease+complete seconds, lease+complete CPU seconds of this process)
Runner = Callable[[Path, list[bytes], int], tuple[float, float, float]]


@dataclass
class Result:
    name: str
    send: list[float]
    lease: list[float]
    cpu: list[float]

    def rate(self, phase: str, messages: int) -> float:
        times = self.send if phase == "send" else self.lease
        return messages / statistics.median(times)

    def cpu_per_message(self, messages: int) -> float:
        """Median CPU µs this process spent per message in the lease phase."""
        return statistics.median(self.cpu) / messages * 1e6

    def spread(self, messages: int) -> str:
        """The slowest and fastest lease-phase rate, as text."""
        rates = [messages / t for t in self.lease]
        return f"{min(rates):,.0f}–{max(rates):,.0f}"


def run_leasekit(
    directory: Path, bodies: list[bytes], batch: int, *, each: bool = False, sync: str = "NORMAL"
) -> tuple[float, float, float]:
    queue = leasekit.open(
        "sqlite", path=str(directory / "lk.db"), queue="bench", create=True, synchronous=sync
    )
    with queue:
        start = time.perf_counter()
        queue.send_many(bodies)
        sent = time.perf_counter()
        cpu = time.process_time()
        done = 0
        while leases := queue.lease(batch, duration=60):
            if each:
                for lease in leases:
                    lease.complete()
            else:
                results = queue.complete_many(leases)
                assert not any(results), results
            done += len(leases)
        end = time.perf_counter()
        cpu = time.process_time() - cpu
    assert done == len(bodies), (done, len(bodies))
    return sent - start, end - sent, cpu


_PLAIN_SCHEMA = """
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    id TEXT NOT NULL,
    body BLOB NOT NULL,
    properties TEXT,
    enqueued_at REAL NOT NULL,
    visible_at REAL NOT NULL,
    expires_at REAL,
    delivery_count INTEGER NOT NULL DEFAULT 0,
    receipt TEXT
);
CREATE INDEX messages_ready ON messages (queue, visible_at, seq);
"""
_PLAIN_LEASE = """
UPDATE messages
SET visible_at = :until, delivery_count = delivery_count + 1,
    receipt = CAST(seq AS TEXT) || '.' || lower(hex(randomblob(8)))
WHERE seq IN (
    SELECT seq FROM messages WHERE queue = :queue AND visible_at <= :now
    ORDER BY visible_at, seq LIMIT :limit
)
RETURNING seq, id, body, delivery_count, receipt
"""
_PLAIN_DELETE = "DELETE FROM messages WHERE seq = ? AND receipt = ? AND queue = ?"


def run_plain_sqlite(
    directory: Path, bodies: list[bytes], batch: int
) -> tuple[float, float, float]:
    """The same lease/complete work straight on ``sqlite3``: the engine's limit."""
    conn = sqlite3.connect(directory / "plain.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(_PLAIN_SCHEMA)
    try:
        start = time.perf_counter()
        for first in range(0, len(bodies), 500):
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO messages (queue, id, body, enqueued_at, visible_at) "
                "VALUES ('bench', ?, ?, ?, ?)",
                [(os.urandom(16).hex(), body, now, now) for body in bodies[first : first + 500]],
            )
            conn.execute("COMMIT")
        sent = time.perf_counter()
        cpu = time.process_time()
        done = 0
        while True:
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            rows = conn.execute(
                _PLAIN_LEASE, {"until": now + 60, "queue": "bench", "now": now, "limit": batch}
            ).fetchall()
            conn.execute("COMMIT")
            if not rows:
                break
            conn.execute("BEGIN IMMEDIATE")
            deleted = conn.executemany(
                _PLAIN_DELETE, [(seq, receipt, "bench") for seq, _i, _b, _c, receipt in rows]
            ).rowcount
            conn.execute("COMMIT")
            assert deleted == len(rows), (deleted, len(rows))
            done += len(rows)
        end = time.perf_counter()
        cpu = time.process_time() - cpu
    finally:
        conn.close()
    assert done == len(bodies), (done, len(bodies))
    return sent - start, end - sent, cpu


def run_leasekit_statements(
    directory: Path, bodies: list[bytes], batch: int
) -> tuple[float, float, float]:
    """leasekit's own SQL, run straight on ``sqlite3``: what its promises ask of the engine.

    The statements the driver runs for a receive and a complete (the pick in
    delivery order with the TTL and group rules, the update returning what a
    lease needs, the fenced delete), on a file the driver made, with no Python
    around them but the loop: the driver's and core's work is what the
    ``driver`` and ``leasekit`` rows add to this one.
    """
    from leasekit.backends.sqlite import statements as backend

    path = directory / "statements.db"
    send = _fill(path, bodies)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    try:
        cpu = time.process_time()
        start = time.perf_counter()
        done = 0
        while True:
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            picked = [
                seq
                for (seq,) in conn.execute(
                    backend._PICK, {"queue": "bench", "now": now, "limit": batch}
                )
            ]
            rows = (
                conn.execute(
                    backend._receive_statement(len(picked)), (now + 60, *picked)
                ).fetchall()
                if picked
                else []
            )
            conn.execute("COMMIT")
            if not rows:
                break
            receipts = [row[6] for row in rows]
            sql = backend._fenced(backend._DELETE, 0, len(receipts), returning=False)
            conn.execute("BEGIN IMMEDIATE")
            deleted = conn.execute(sql, (*receipts, "bench", now)).rowcount
            conn.execute("COMMIT")
            assert deleted == len(rows), (deleted, len(rows))
            done += len(rows)
        end = time.perf_counter()
        cpu = time.process_time() - cpu
    finally:
        conn.close()
    assert done == len(bodies), (done, len(bodies))
    return send, end - start, cpu


def run_leasekit_driver(
    directory: Path, bodies: list[bytes], batch: int
) -> tuple[float, float, float]:
    """The SQLite driver alone (``receive`` + ``delete``), without core: no leases made."""
    from leasekit.backends.sqlite import SqliteDriver
    from leasekit.spi import ReceivedRows

    path = directory / "driver.db"
    send = _fill(path, bodies)
    driver = SqliteDriver(queue="bench", path=str(path))
    try:
        cpu = time.process_time()
        start = time.perf_counter()
        done = 0
        while messages := driver.receive(batch, 60.0, 0.0):
            if isinstance(messages, ReceivedRows):
                receipts = [row[5] for row in messages.rows]
            else:
                receipts = [message.receipt for message in messages]
            results = driver.delete(receipts)
            assert not any(results), results
            done += len(messages)
        end = time.perf_counter()
        cpu = time.process_time() - cpu
    finally:
        driver.close()
    assert done == len(bodies), (done, len(bodies))
    return send, end - start, cpu


def _fill(path: Path, bodies: list[bytes]) -> float:
    """Make a leasekit queue ``bench`` in ``path`` holding ``bodies``; the seconds it took."""
    start = time.perf_counter()
    with leasekit.open("sqlite", path=str(path), queue="bench", create=True) as queue:
        queue.send_many(bodies)
    return time.perf_counter() - start


def held_lease_bytes(directory: Path, count: int, size: int) -> tuple[float, float]:
    """Python memory per held lease with its keeper entry (tracemalloc), ``count`` leases.

    Also the CPU µs per lease of ``LeaseKeeper.add_many`` in batches of 100.
    """
    import gc
    import tracemalloc

    queue = leasekit.open("sqlite", path=str(directory / "held.db"), queue="held", create=True)
    keeper = leasekit.LeaseKeeper()
    try:
        queue.send_many([os.urandom(size) for _ in range(count)])
        queue.lease(10, duration=600)  # warm every code path and cache first
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        held = []
        while len(held) < count - 10 and (batch := queue.lease(100, duration=600)):
            held.extend(batch)
            keeper.add_many(batch)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        second = leasekit.LeaseKeeper()  # add_many's CPU, without tracemalloc's
        try:
            cpu = time.process_time()
            for start in range(0, len(held), 100):
                second.add_many(held[start : start + 100])
            add = (time.process_time() - cpu) / len(held) * 1e6
        finally:
            second.stop()
        return (after - before) / len(held), add
    finally:
        keeper.stop()
        queue.close()


def run_persist_queue(
    directory: Path, bodies: list[bytes], batch: int, *, sync: str | None = None
) -> tuple[float, float, float]:
    from persistqueue import Empty, SQLiteAckQueue

    queue = SQLiteAckQueue(str(directory / "pq"), auto_resume=False)
    if sync is not None:  # its one connection is private; set like leasekit's default
        queue._conn.execute(f"PRAGMA synchronous={sync}")
    try:
        start = time.perf_counter()
        for body in bodies:
            queue.put(body)
        sent = time.perf_counter()
        cpu = time.process_time()
        done = 0
        while True:
            items = []
            for _ in range(batch):
                try:
                    items.append(queue.get(block=False, raw=True))
                except Empty:
                    break
            if not items:
                break
            for item in items:
                queue.ack(id=item["pqid"])
            done += len(items)
        end = time.perf_counter()
        cpu = time.process_time() - cpu
    finally:
        queue.close()
    assert done == len(bodies), (done, len(bodies))
    return sent - start, end - sent, cpu


def run_litequeue(directory: Path, bodies: list[bytes], batch: int) -> tuple[float, float, float]:
    from litequeue import LiteQueue

    queue = LiteQueue(str(directory / "lq.db"))
    texts = [body.decode("latin-1") for body in bodies]  # litequeue stores TEXT
    try:
        start = time.perf_counter()
        for text in texts:
            queue.put(text)
        sent = time.perf_counter()
        cpu = time.process_time()
        done = 0
        while True:
            messages = []
            for _ in range(batch):
                message = queue.pop()
                if message is None:
                    break
                messages.append(message)
            if not messages:
                break
            with queue.transaction():
                for message in messages:
                    queue.done(message.message_id)
            done += len(messages)
        end = time.perf_counter()
        cpu = time.process_time() - cpu
    finally:
        queue.close()
    assert done == len(bodies), (done, len(bodies))
    return sent - start, end - sent, cpu


CONTENDERS: dict[str, Runner] = {
    "leasekit (batch complete)": run_leasekit,
    "leasekit (complete each)": lambda d, b, n: run_leasekit(d, b, n, each=True),
    "leasekit FULL (batch complete)": lambda d, b, n: run_leasekit(d, b, n, sync="FULL"),
    "persist-queue SQLiteAckQueue": run_persist_queue,
    "persist-queue SQLiteAckQueue, synchronous=NORMAL": lambda d, b, n: run_persist_queue(
        d, b, n, sync="NORMAL"
    ),
    "litequeue LiteQueue": run_litequeue,
    "plain sqlite3 (UPDATE … RETURNING, executemany fenced DELETE)": run_plain_sqlite,
    "split: leasekit's SQL statements alone": run_leasekit_statements,
    "split: leasekit's SQLite driver alone": run_leasekit_driver,
}
#: The rows of ``--split``, from the engine's limit to the whole of leasekit.
SPLIT = (
    ("the engine's limit (plain loop)", "plain sqlite3"),
    ("leasekit's SQL: pick in delivery order, 9 columns back, TTL fence", "split: leasekit's SQL"),
    ("the driver's Python (rows for core, transactions)", "split: leasekit's SQLite driver"),
    ("core (Lease objects, records, deadlines, events, checks)", "leasekit (batch complete)"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument(
        "--batch", type=int, action="append", help="lease batch size (repeatable; default 100)"
    )
    parser.add_argument("--size", type=int, default=100, help="body size in bytes")
    parser.add_argument("--repeat", type=int, default=3, help="runs each; the median is shown")
    parser.add_argument("--only", action="append", help="run only contenders containing this")
    parser.add_argument("--dir", default=None, help="where to put the database files")
    parser.add_argument(
        "--memory", type=int, default=0, help="also measure bytes per held lease at this many"
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="where leasekit's time goes: also run its SQL alone and its driver alone, "
        "and print the CPU per message each step adds (implies --only for those four)",
    )
    args = parser.parse_args()
    if args.split:
        args.only = [*(args.only or []), "leasekit (batch complete)", "plain", "split:"]
    for batch in args.batch or [100]:
        run_batch(args, batch)
    if args.memory:
        directory = Path(tempfile.mkdtemp(prefix="leasekit-bench-", dir=args.dir))
        try:
            per, add = held_lease_bytes(directory, args.memory, args.size)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        print(
            f"\nPython memory per held lease with its keeper entry: {per:,.0f} B "
            f"({args.memory:,} leases of {args.size}-byte bodies, tracemalloc)"
        )
        print(f"LeaseKeeper.add_many CPU per lease: {add:.1f} µs (batches of 100)")


def run_batch(args: argparse.Namespace, batch: int) -> None:
    """Run every chosen contender at ``batch``, interleaved, and print the table."""

    bodies = [os.urandom(args.size) for _ in range(args.messages)]
    chosen = {
        name: runner
        for name, runner in CONTENDERS.items()
        if not args.only or any(part in name for part in args.only)
    }
    chosen = {name: runner for name, runner in chosen.items() if args.split or "split:" not in name}
    results = {name: Result(name, [], [], []) for name in chosen}
    for _ in range(args.repeat):
        for name, runner in chosen.items():  # interleaved, so drift hits every contender
            directory = Path(tempfile.mkdtemp(prefix="leasekit-bench-", dir=args.dir))
            try:
                send, lease, cpu = runner(directory, bodies, batch)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            results[name].send.append(send)
            results[name].lease.append(lease)
            results[name].cpu.append(cpu)
            print(f"  {name}: send {send:.3f} s, lease+complete {lease:.3f} s", file=sys.stderr)

    n = args.messages
    base = results.get("leasekit (batch complete)")
    print(
        f"\n{n} messages of {args.size} B, lease/complete in batches of {batch}, "
        f"median of {args.repeat}; Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs\n"
    )
    print(
        "| contender | send msg/s | lease+complete msg/s (spread) | "
        "leasekit ÷ this | CPU µs/msg | this ÷ leasekit CPU |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for result in results.values():
        ratio = cpu_ratio = "—"
        if base:
            ratio = f"{base.rate('lease', n) / result.rate('lease', n):.2f}×"
            cpu_ratio = f"{result.cpu_per_message(n) / base.cpu_per_message(n):.2f}×"
        print(
            f"| {result.name} | {result.rate('send', n):,.0f} | "
            f"{result.rate('lease', n):,.0f} ({result.spread(n)}) | {ratio} | "
            f"{result.cpu_per_message(n):.1f} | {cpu_ratio} |"
        )
    plain = next((r for name, r in results.items() if name.startswith("plain sqlite3")), None)
    if base and plain:
        # Paired: each round's two runs were made one after the other, so machine
        # drift falls on both; the spread of the per-round ratios shows the noise.
        paired = [p / b for b, p in zip(base.lease, plain.lease, strict=True)]
        cpu_paired = [p / b for b, p in zip(base.cpu, plain.cpu, strict=True)]
        print(
            f"\nleasekit ÷ plain loop, per round (msg/s): median {statistics.median(paired):.2f} "
            f"({min(paired):.2f}–{max(paired):.2f}); by CPU per message: median "
            f"{statistics.median(cpu_paired):.2f} ({min(cpu_paired):.2f}–{max(cpu_paired):.2f})"
        )
    if args.split:
        print_split(results, n, batch)


def print_split(results: dict[str, Result], messages: int, batch: int) -> None:
    """Each step's CPU µs per message, from the engine's limit up to all of leasekit."""
    print(f"\nWhere leasekit's CPU per message goes, batches of {batch} (medians):\n")
    print("| step | adds µs/msg | total µs/msg | share of leasekit |")
    print("| --- | ---: | ---: | ---: |")
    rows = [
        (step, next(r for name, r in results.items() if name.startswith(prefix)))
        for step, prefix in SPLIT
    ]
    total = rows[-1][1].cpu_per_message(messages)
    before = 0.0
    for step, result in rows:
        here = result.cpu_per_message(messages)
        print(f"| {step} | {here - before:+.1f} | {here:.1f} | {(here - before) / total:.0%} |")
        before = here
    print_core_split(batch)


def print_core_split(batch: int, calls: int = 2000, rounds: int = 7) -> None:
    """Core's own CPU per call, with a driver that answers at once (no SQL), by part.

    ``lease()`` with a receive that returns ``batch`` ready rows, the part of it
    that makes the leases from them (``leases_from_rows``), and ``complete_many``
    with a delete that succeeds at once (a lease + complete pair less the lease
    alone). Every lease is dropped before the next call, as in the loop, so
    freeing them counts in ``lease()``'s rest. Caches stay warm here, unlike
    between two SQLite transactions, so read the parts' shares, not their sum,
    against the loop.
    """
    import json

    from leasekit.clock import to_datetime
    from leasekit.lease import leases_from_rows
    from leasekit.spi import ReceivedRows

    directory = Path(tempfile.mkdtemp(prefix="leasekit-bench-"))
    try:
        queue = leasekit.open("sqlite", path=str(directory / "core.db"), queue="core", create=True)
        now = time.time()
        sent, until = to_datetime(now), to_datetime(now + 60)
        rows = [
            (f"id{i}", b"x" * 100, None, sent, 1, f"{i + 1}.00ff", until, None)
            for i in range(batch)
        ]
        driver = queue.driver
        driver.receive = lambda *_: ReceivedRows(list(rows), json.loads)  # type: ignore[method-assign]
        driver.delete = lambda receipts: [None] * len(receipts)  # type: ignore[method-assign]
        lease_cpu, make_cpu, pair_cpu = [], [], []
        for _ in range(rounds):
            start = time.process_time()
            for _ in range(calls):
                queue.lease(batch, duration=60)
            lease_cpu.append(time.process_time() - start)
            start = time.process_time()
            for _ in range(calls):
                leases_from_rows(queue, ReceivedRows(list(rows), json.loads), 60.0, 0.0, 0.0)
            make_cpu.append(time.process_time() - start)
            start = time.process_time()
            for _ in range(calls):
                queue.complete_many(queue.lease(batch, duration=60))
            pair_cpu.append(time.process_time() - start)
        queue.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    per = {
        name: min(values) / calls * 1e6
        for name, values in (("lease", lease_cpu), ("make", make_cpu), ("pair", pair_cpu))
    }
    per["complete"] = per["pair"] - per["lease"]
    total = per["pair"]
    print(f"\nCore alone, a driver answering at once, batches of {batch} (best of {rounds}):\n")
    print("| part | µs per call | µs per message | share of core |")
    print("| --- | ---: | ---: | ---: |")
    for part, value in (
        ("`lease()`: making the leases (Message, LeaseRecord, Lease per row)", per["make"]),
        (
            "`lease()`: the rest (checks, events, deadline, call runner, poll loop, freeing)",
            per["lease"] - per["make"],
        ),
        (
            "`complete_many()` (checks, take, deadline, call runner, settle, events)",
            per["complete"],
        ),
    ):
        print(f"| {part} | {value:.1f} | {value / batch:.2f} | {value / total:.0%} |")


if __name__ == "__main__":
    main()
