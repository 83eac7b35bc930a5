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

The run stops at a time limit (by default scaled to the message count, see
:func:`default_time_limit`). Messages not processed by then are *unprocessed*,
not lost: the workers are stopped and the demo reads back, by message id, what
is left in the queue (it leases every remaining message once and gives it back,
so their delivery counts go up by one). A message is *lost* only if it was sent
and is neither processed, nor in the queue, nor dead-lettered.

Run ``python -m leasekit.demo worker ...`` is the worker process; users run
``leasekit demo``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .consumer import Consumer
from .errors import LeaseError
from .idempotency import SqliteIdempotencyStore
from .lease import Lease
from .message import Message
from .queue import Queue
from .registry import open as open_queue

__all__ = ["DemoSummary", "account", "default_time_limit", "run_demo", "summary_rows", "verdict"]

QUEUE = "demo"

#: Messages per second the demo processed with its defaults (3 workers x 4 handler
#: threads, a kill or freeze every 1.5 s) on a 2-core machine: 216 msg/s for 3,000
#: messages, 286 msg/s for 20,000 (``run_demo(messages=N, progress=False)``). The
#: handler sleeps 10-40 ms per message, so the rate scales with handler threads.
MEASURED_RATE = 200.0
MEASURED_THREADS = 12
#: The default time limit allows this many times the measured time, plus a fixed
#: start-up allowance: slower machines and busy CI runners must not hit it.
TIME_LIMIT_FACTOR = 3.0
TIME_LIMIT_BASE = 60.0
#: How long the end-of-run audit holds each leftover message while it reads the queue's ids.
_AUDIT_LEASE = 120.0


@dataclass
class DemoSummary:
    """What the demo measured.

    ``ok`` is true when every message was processed and nothing is left, lost or
    dead-lettered. ``timed_out`` says the run stopped at its time limit; then
    ``unprocessed`` messages were not processed yet, and ``lost`` counts, by id,
    those that are not in the queue either (0 unless a promise was broken).
    """

    messages: int
    processed: int
    unprocessed: int
    lost: int
    handler_runs: int
    handler_reruns: int
    redeliveries: int
    duplicates_suppressed: int
    workers_killed: int
    workers_frozen: int
    left_in_queue: int
    dead_lettered: int
    seconds: float
    time_limit: float
    timed_out: bool
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


def default_time_limit(messages: int, workers: int = 3, concurrency: int = 4) -> float:
    """The time limit a run of ``messages`` gets unless one is given, in seconds.

    :data:`TIME_LIMIT_FACTOR` times the time the measured rate needs (scaled down
    for fewer handler threads than the defaults, never up for more: the machine's
    cores bound it too), plus :data:`TIME_LIMIT_BASE`.
    """
    threads = workers * concurrency
    rate = MEASURED_RATE * min(1.0, threads / MEASURED_THREADS)
    return round(TIME_LIMIT_BASE + TIME_LIMIT_FACTOR * messages / rate)


class _ProcessedIds:
    """The ids of messages whose effect exists, read incrementally from ``effects``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ids: set[str] = set()
        self._last_row = 0

    def refresh(self) -> int:
        """Read the effects written since the last call; return how many messages are done."""
        conn = sqlite3.connect(self.directory / "effects.db", timeout=30)
        try:
            rows = conn.execute(
                "SELECT rowid, message_id FROM effects WHERE rowid > ? ORDER BY rowid",
                (self._last_row,),
            ).fetchall()
        finally:
            conn.close()
        if rows:
            self._last_row = rows[-1][0]
            self.ids.update(message_id for _, message_id in rows)
        return len(self.ids)


def _ids_in_queue(queue: Queue, expected: int, wait: float) -> set[str]:
    """The ids of the ``expected`` messages left in ``queue``, read by leasing each once.

    Stopped workers' leases lapse within ``wait`` seconds; every message leased
    here is given back (abandoned) before returning.
    """
    seen: set[str] = set()
    held: list[Lease] = []
    batch = queue.capabilities.max_receive_batch
    deadline = time.monotonic() + wait
    try:
        while len(seen) < expected and (left := deadline - time.monotonic()) > 0:
            leases = queue.lease(batch, duration=_AUDIT_LEASE, wait=min(0.5, left))
            held.extend(leases)
            seen.update(lease.message.id for lease in leases)
    finally:
        for lease in held:
            with contextlib.suppress(LeaseError):
                lease.abandon()
    return seen


def account(
    sent: Iterable[str], processed: set[str], in_queue: set[str], dead: set[str]
) -> tuple[int, int]:
    """Split the sent messages that were not processed into (still in the queue, lost).

    Parameters:
        sent: the ids of every message sent.
        processed: the ids whose effect exists.
        in_queue: the ids left in the queue.
        dead: the ids dead-lettered.

    Returns:
        How many unprocessed messages are still in the queue, and how many are lost
        (neither processed, nor in the queue, nor dead-lettered).
    """
    unprocessed = set(sent) - processed
    lost = unprocessed - in_queue - dead
    return len(unprocessed & in_queue), len(lost)


def run_demo(
    *,
    messages: int = 3000,
    workers: int = 3,
    concurrency: int = 4,
    lease: float = 2.0,
    kill_every: float = 1.5,
    directory: str | None = None,
    time_limit: float | None = None,
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
        time_limit: stop after this many seconds and report what is unprocessed
            (default: :func:`default_time_limit`).
        progress: show a live rich progress bar.
        seed: seed for choosing which worker to kill.
    """
    if messages < 1 or workers < 1 or concurrency < 1:
        raise ValueError("messages, workers and concurrency must be at least 1")
    if time_limit is None:
        time_limit = default_time_limit(messages, workers, concurrency)
    if not time_limit > 0:
        raise ValueError(f"time_limit must be > 0 seconds, got {time_limit!r}")
    rng = random.Random(seed)
    tmp = None
    if directory is None:
        tmp = tempfile.TemporaryDirectory(prefix="leasekit-demo-")
        directory = tmp.name
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    _effects_db(path).close()
    done = _ProcessedIds(path)
    start = time.monotonic()
    timed_out = False
    with open_queue("sqlite", path=str(path / "queue.db"), queue=QUEUE, create=True) as queue:
        sent: list[str] = []
        for first in range(0, messages, 500):
            sent += queue.send_many(
                [f"order-{i}".encode() for i in range(first, min(first + 500, messages))]
            )
        procs = [_start_worker(path, concurrency, lease) for _ in range(workers)]
        killed = frozen_count = 0
        frozen: dict[int, float] = {}  # worker index -> when to resume it
        next_kill = time.monotonic() + kill_every
        deadline = start + time_limit
        display = _Progress(messages) if progress else None
        try:
            while True:
                processed = done.refresh()
                if display is not None:
                    display.update(processed, killed, frozen_count)
                if processed >= messages and not frozen:
                    counts = queue.stats()
                    if not counts.visible and not counts.leased and not counts.delayed:
                        break
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
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
        seconds = round(time.monotonic() - start, 1)
        processed = done.refresh()
        counts = queue.stats()
        left = (counts.visible or 0) + (counts.leased or 0) + (counts.delayed or 0)
        dead_lettered = counts.dead_lettered or 0
        lost = 0
        if processed < messages:
            # Read back by id what is left, once the stopped workers' leases lapse.
            in_queue = _ids_in_queue(queue, left, wait=lease + 2) if left else set()
            dead = (
                {d.id for d in queue.peek_dead_letters(dead_lettered)} if dead_lettered else set()
            )
            _, lost = account(sent, done.ids, in_queue, dead)
    summary = DemoSummary(
        messages=messages,
        processed=processed,
        unprocessed=messages - processed,
        lost=lost,
        handler_runs=_count(path, "SELECT count(*) FROM effects"),
        handler_reruns=0,
        redeliveries=_count(path, "SELECT count(*) FROM effects WHERE delivery > 1")
        + _count(path, "SELECT count(*) FROM suppressed"),
        duplicates_suppressed=_count(path, "SELECT count(*) FROM suppressed"),
        workers_killed=killed,
        workers_frozen=frozen_count,
        left_in_queue=left,
        dead_lettered=dead_lettered,
        seconds=seconds,
        time_limit=time_limit,
        timed_out=timed_out,
        ok=False,
    )
    summary.handler_reruns = summary.handler_runs - summary.processed
    summary.ok = (
        summary.processed == messages
        and summary.left_in_queue == 0
        and summary.dead_lettered == 0
        and summary.lost == 0
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
    rows = [
        ("messages sent", summary.messages),
        ("processed", summary.processed),
        ("unprocessed at the time limit, still in the queue", summary.unprocessed - summary.lost),
        ("lost (neither processed, queued nor dead-lettered)", summary.lost),
        ("left in the queue (processed or not)", summary.left_in_queue),
        ("dead-lettered", summary.dead_lettered),
        ("workers SIGKILLed mid-message", summary.workers_killed),
        ("workers frozen past their leases (SIGSTOP), then resumed", summary.workers_frozen),
        ("redeliveries (leased again after a kill or freeze)", summary.redeliveries),
        ("duplicates suppressed by the idempotency store", summary.duplicates_suppressed),
        ("handler re-runs (effect done, not yet recorded, when stopped)", summary.handler_reruns),
        ("handler runs in total", summary.handler_runs),
        ("seconds", summary.seconds),
        ("time limit (seconds)", f"{summary.time_limit:g}"),
    ]
    return [(label, str(value)) for label, value in rows]


def verdict(summary: DemoSummary) -> tuple[str, str]:
    """How the run ended, as ``(outcome, sentence)``.

    The outcome is ``"ok"`` (everything processed, nothing left, lost or
    dead-lettered), ``"time limit"`` (stopped with unprocessed messages, all of
    them still in the queue: nothing lost) or ``"failed"`` (a message lost or
    dead-lettered).
    """
    if summary.ok:
        return "ok", (
            "every message processed, none lost; duplicates of work already recorded "
            "were suppressed by the idempotency store"
        )
    if summary.lost or summary.dead_lettered or not summary.timed_out:
        return "failed", (
            f"{summary.lost} messages lost and {summary.dead_lettered} dead-lettered "
            f"of {summary.messages}"
        )
    if summary.unprocessed:
        return "time limit", (
            f"stopped after {summary.time_limit:g} s with {summary.processed} of "
            f"{summary.messages} processed; the other {summary.unprocessed} are still in "
            "the queue, none lost (a longer --time-limit processes them)"
        )
    return "time limit", (
        f"stopped after {summary.time_limit:g} s with every message processed; "
        f"{summary.left_in_queue} processed messages are still in the queue (a worker "
        "died before completing them), none lost"
    )


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
