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
* ``litequeue`` — ``LiteQueue``: ``put`` per message (autocommit), ``pop`` x100
  (one ``IMMEDIATE`` transaction each), ``done`` x100 inside one
  ``transaction()``; ``synchronous=NORMAL``; done rows stay in the table.

Run (the numbers in docs/benchmarks/sqlite.md came from this command)::

    .venv/bin/python benchmarks/bench_sqlite.py --messages 20000 --batch 100 --repeat 3

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

Runner = Callable[[Path, list[bytes], int], tuple[float, float]]


@dataclass
class Result:
    name: str
    send: list[float]
    lease: list[float]

    def rate(self, phase: str, messages: int) -> float:
        times = self.send if phase == "send" else self.lease
        return messages / statistics.median(times)


def run_leasekit(
    directory: Path, bodies: list[bytes], batch: int, *, each: bool = False, sync: str = "NORMAL"
) -> tuple[float, float]:
    queue = leasekit.open(
        "sqlite", path=str(directory / "lk.db"), queue="bench", create=True, synchronous=sync
    )
    with queue:
        start = time.perf_counter()
        queue.send_many(bodies)
        sent = time.perf_counter()
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
    assert done == len(bodies), (done, len(bodies))
    return sent - start, end - sent


def run_persist_queue(
    directory: Path, bodies: list[bytes], batch: int, *, sync: str | None = None
) -> tuple[float, float]:
    from persistqueue import Empty, SQLiteAckQueue

    queue = SQLiteAckQueue(str(directory / "pq"), auto_resume=False)
    if sync is not None:  # its one connection is private; set like leasekit's default
        queue._conn.execute(f"PRAGMA synchronous={sync}")
    try:
        start = time.perf_counter()
        for body in bodies:
            queue.put(body)
        sent = time.perf_counter()
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
    finally:
        queue.close()
    assert done == len(bodies), (done, len(bodies))
    return sent - start, end - sent


def run_litequeue(directory: Path, bodies: list[bytes], batch: int) -> tuple[float, float]:
    from litequeue import LiteQueue

    queue = LiteQueue(str(directory / "lq.db"))
    texts = [body.decode("latin-1") for body in bodies]  # litequeue stores TEXT
    try:
        start = time.perf_counter()
        for text in texts:
            queue.put(text)
        sent = time.perf_counter()
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
    finally:
        queue.close()
    assert done == len(bodies), (done, len(bodies))
    return sent - start, end - sent


CONTENDERS: dict[str, Runner] = {
    "leasekit (batch complete)": run_leasekit,
    "leasekit (complete each)": lambda d, b, n: run_leasekit(d, b, n, each=True),
    "leasekit FULL (batch complete)": lambda d, b, n: run_leasekit(d, b, n, sync="FULL"),
    "persist-queue SQLiteAckQueue": run_persist_queue,
    "persist-queue SQLiteAckQueue, synchronous=NORMAL": lambda d, b, n: run_persist_queue(
        d, b, n, sync="NORMAL"
    ),
    "litequeue LiteQueue": run_litequeue,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--size", type=int, default=100, help="body size in bytes")
    parser.add_argument("--repeat", type=int, default=3, help="runs each; the median is shown")
    parser.add_argument("--only", action="append", help="run only contenders containing this")
    parser.add_argument("--dir", default=None, help="where to put the database files")
    args = parser.parse_args()

    bodies = [os.urandom(args.size) for _ in range(args.messages)]
    chosen = {
        name: runner
        for name, runner in CONTENDERS.items()
        if not args.only or any(part in name for part in args.only)
    }
    results = {name: Result(name, [], []) for name in chosen}
    for _ in range(args.repeat):
        for name, runner in chosen.items():  # interleaved, so drift hits every contender
            directory = Path(tempfile.mkdtemp(prefix="leasekit-bench-", dir=args.dir))
            try:
                send, lease = runner(directory, bodies, args.batch)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            results[name].send.append(send)
            results[name].lease.append(lease)
            print(f"  {name}: send {send:.3f} s, lease+complete {lease:.3f} s", file=sys.stderr)

    n = args.messages
    base = results.get("leasekit (batch complete)")
    print(
        f"\n{n} messages of {args.size} B, lease/complete in batches of {args.batch}, "
        f"median of {args.repeat}; Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs\n"
    )
    print("| contender | send msg/s | lease+complete msg/s | leasekit ÷ this (lease+complete) |")
    print("| --- | ---: | ---: | ---: |")
    for result in results.values():
        ratio = f"{base.rate('lease', n) / result.rate('lease', n):.2f}×" if base else "—"
        print(
            f"| {result.name} | {result.rate('send', n):,.0f} | "
            f"{result.rate('lease', n):,.0f} | {ratio} |"
        )


if __name__ == "__main__":
    main()
