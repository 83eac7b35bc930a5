"""``leasekit demo``: at-least-once processing that survives workers killed mid-message.

A producer enqueues a few thousand messages into the embedded SQLite default;
several worker processes consume them with short physical leases kept alive by
a :class:`~leasekit.LeaseKeeper`, an idempotency store and a handler with a
visible side effect; every few seconds the demo SIGKILLs a worker in the middle
of its messages and starts a replacement. The killed worker's leases run out
and its messages come back to the others. At the end it checks:

- every message was processed (its effect exists) and none is left or dead-lettered;
- redeliveries happened (messages leased more than once);
- duplicates were suppressed by the idempotency store (redelivered messages whose
  handler had already succeeded were completed without running it again);
- handler re-runs, where a worker died between its effect and the record, are
  counted and shown: this is the documented limit of at-least-once processing.

Run ``python -m leasekit.demo worker ...`` is the worker process; users run
``leasekit demo``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .consumer import Consumer
from .idempotency import SqliteIdempotencyStore
from .message import Message
from .registry import open as open_queue

__all__ = ["DemoSummary", "run_demo"]

QUEUE = "demo"


@dataclass
class DemoSummary:
    """What the demo measured; ``ok`` is true when every invariant held."""

    messages: int
    processed: int
    handler_runs: int
    handler_reruns: int
    redeliveries: int
    duplicates_suppressed: int
    workers_killed: int
    workers_frozen: int
    left_in_queue: int
    dead_lettered: int
    seconds: float
    ok: bool


# --------------------------------------------------------------------- worker


def _effects_db(directory: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(
        directory / "effects.db", timeout=30, isolation_level=None, check_same_thread=False
    )
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS effects (message_id TEXT, delivery INTEGER, pid INTEGER)"
    )
    conn.execute(
        "CREATE TABLE IF NOT EXISTS suppressed (message_id TEXT, delivery INTEGER, pid INTEGER)"
    )
    return conn


class _Effects:
    """The handler's side effect: one row per run, through a connection per thread."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.local = threading.local()

    def write(self, table: str, message_id: str, delivery: int) -> None:
        """Insert one row into ``effects`` or ``suppressed``."""
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = _effects_db(self.directory)
        conn.execute(
            f"INSERT INTO {table} (message_id, delivery, pid) VALUES (?, ?, ?)",
            (message_id, delivery, os.getpid()),
        )


class _CountingStore(SqliteIdempotencyStore):
    """The real SQLite store, also noting each suppressed duplicate for the summary."""

    def __init__(self, path: str, effects: _Effects) -> None:
        super().__init__(path, namespace=QUEUE)
        self.effects = effects

    def seen(self, message_id: str) -> bool:
        """Check the store; note a hit (always a redelivery)."""
        hit = super().seen(message_id)
        if hit:
            self.effects.write("suppressed", message_id, 0)
        return hit


def worker_main(directory: Path, concurrency: int, lease: float) -> None:
    """One worker process: consume the demo queue until SIGTERM (or SIGKILL)."""
    effects = _Effects(directory)
    store = _CountingStore(str(directory / "processed.db"), effects)
    queue = open_queue("sqlite", path=str(directory / "queue.db"), queue=QUEUE)
    rng = random.Random(os.getpid())

    def handler(message: Message) -> None:
        time.sleep(rng.uniform(0.005, 0.02))  # the work, before and after its effect
        effects.write("effects", message.id, message.delivery_count)
        time.sleep(rng.uniform(0.005, 0.02))

    consumer = Consumer(
        queue,
        handler,
        concurrency=concurrency,
        lease_duration=lease,
        max_deliveries=50,
        idempotency=store,
        shutdown_grace=5,
    )
    consumer.run()
    queue.close()
    store.close()


# --------------------------------------------------------------------- parent


def _count(directory: Path, sql: str) -> int:
    conn = sqlite3.connect(directory / "effects.db", timeout=30)
    try:
        (value,) = conn.execute(sql).fetchone()
        return int(value or 0)
    finally:
        conn.close()


def _start_worker(directory: Path, concurrency: int, lease: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leasekit.demo",
            "worker",
            str(directory),
            "--concurrency",
            str(concurrency),
            "--lease",
            str(lease),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def run_demo(
    *,
    messages: int = 3000,
    workers: int = 3,
    concurrency: int = 4,
    lease: float = 2.0,
    kill_every: float = 1.5,
    directory: str | None = None,
    timeout: float = 120.0,
    progress: bool = True,
    seed: int | None = None,
) -> DemoSummary:
    """Run the demo and return its summary (see the module docstring).

    Parameters:
        messages: how many messages the producer enqueues.
        workers: worker processes running at once.
        concurrency: handler threads per worker.
        lease: the physical lease in seconds (short: the keeper renews it).
        kill_every: seconds between SIGKILLs of a random worker.
        directory: where the SQLite files go (a temporary directory if ``None``).
        timeout: give up (and report failure) after this many seconds.
        progress: show a live rich progress bar.
        seed: seed for choosing which worker to kill.
    """
    if messages < 1 or workers < 1 or concurrency < 1:
        raise ValueError("messages, workers and concurrency must be at least 1")
    rng = random.Random(seed)
    tmp = None
    if directory is None:
        tmp = tempfile.TemporaryDirectory(prefix="leasekit-demo-")
        directory = tmp.name
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    _effects_db(path).close()
    start = time.monotonic()
    with open_queue("sqlite", path=str(path / "queue.db"), queue=QUEUE, create=True) as queue:
        for first in range(0, messages, 500):
            queue.send_many(
                [f"order-{i}".encode() for i in range(first, min(first + 500, messages))]
            )
        procs = [_start_worker(path, concurrency, lease) for _ in range(workers)]
        killed = frozen_count = 0
        frozen: dict[int, float] = {}  # worker index -> when to resume it
        next_kill = time.monotonic() + kill_every
        deadline = start + timeout
        display = _Progress(messages) if progress else None
        try:
            while time.monotonic() < deadline:
                processed = _count(path, "SELECT count(DISTINCT message_id) FROM effects")
                if display is not None:
                    display.update(processed, killed, frozen_count)
                if processed >= messages and not frozen:
                    counts = queue.stats()
                    if not counts.visible and not counts.leased and not counts.delayed:
                        break
                now = time.monotonic()
                for index, resume_at in list(frozen.items()):
                    if now >= resume_at:
                        procs[index].send_signal(signal.SIGCONT)
                        del frozen[index]
                if processed < messages and now >= next_kill:
                    candidates = [i for i in range(len(procs)) if i not in frozen]
                    victim = rng.choice(candidates) if candidates else None
                    if victim is not None and (killed + frozen_count) % 3 == 2:
                        # A hung worker: frozen past its leases, then resumed.
                        procs[victim].send_signal(signal.SIGSTOP)
                        frozen[victim] = now + lease * 1.5 + 0.5
                        frozen_count += 1
                    elif victim is not None:
                        procs[victim].send_signal(signal.SIGKILL)
                        procs[victim].wait()
                        killed += 1
                        procs[victim] = _start_worker(path, concurrency, lease)
                    next_kill = now + kill_every
                time.sleep(0.1)  # progress refresh; the work happens in the workers
        finally:
            if display is not None:
                display.close()
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        counts = queue.stats()
    summary = DemoSummary(
        messages=messages,
        processed=_count(path, "SELECT count(DISTINCT message_id) FROM effects"),
        handler_runs=_count(path, "SELECT count(*) FROM effects"),
        handler_reruns=0,
        redeliveries=_count(path, "SELECT count(*) FROM effects WHERE delivery > 1")
        + _count(path, "SELECT count(*) FROM suppressed"),
        duplicates_suppressed=_count(path, "SELECT count(*) FROM suppressed"),
        workers_killed=killed,
        workers_frozen=frozen_count,
        left_in_queue=(counts.visible or 0) + (counts.leased or 0) + (counts.delayed or 0),
        dead_lettered=counts.dead_lettered or 0,
        seconds=round(time.monotonic() - start, 1),
        ok=False,
    )
    summary.handler_reruns = summary.handler_runs - summary.processed
    summary.ok = (
        summary.processed == messages and summary.left_in_queue == 0 and summary.dead_lettered == 0
    )
    if tmp is not None:
        tmp.cleanup()
    return summary


class _Progress:
    """A live rich progress bar of processed messages and kills."""

    def __init__(self, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.progress = Progress(
            TextColumn("[bold]processing"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[killed]} killed, {task.fields[frozen]} frozen"),
            TextColumn("{task.elapsed:.1f} s"),
        )
        self.task = self.progress.add_task("demo", total=total, killed=0, frozen=0)
        self.progress.start()

    def update(self, done: int, killed: int, frozen: int) -> None:
        """Show progress."""
        self.progress.update(self.task, completed=done, killed=killed, frozen=frozen)

    def close(self) -> None:
        """Stop the display."""
        self.progress.stop()


def summary_rows(summary: DemoSummary) -> list[tuple[str, str]]:
    """The summary as (label, value) rows for printing."""
    labels = {
        "messages": "messages sent",
        "processed": "messages processed",
        "left_in_queue": "left in the queue (lost)",
        "dead_lettered": "dead-lettered",
        "workers_killed": "workers SIGKILLed mid-message",
        "workers_frozen": "workers frozen past their leases (SIGSTOP), then resumed",
        "redeliveries": "redeliveries (leased again after a kill or freeze)",
        "duplicates_suppressed": "duplicates suppressed by the idempotency store",
        "handler_reruns": "handler re-runs (effect done, not yet recorded, when stopped)",
        "handler_runs": "handler runs in total",
        "seconds": "seconds",
    }
    data = asdict(summary)
    return [(label, str(data[key])) for key, label in labels.items()]


def _worker_cli(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m leasekit.demo worker")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease", type=float, default=2.0)
    args = parser.parse_args(argv)
    worker_main(args.directory, args.concurrency, args.lease)


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"]:
        sys.exit("usage: python -m leasekit.demo worker DIRECTORY [--concurrency N] [--lease S]")
    _worker_cli(sys.argv[2:])
