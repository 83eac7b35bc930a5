"""``leasekit demo --chunks N``: resumable work, with and without checkpoints, under kills.

Each message is a job of ``chunks`` small steps. Worker processes (a
:class:`~leasekit.Consumer` each, ``pass_lease=True``) run the steps one by
one; with checkpoints on, after each step the handler saves the next step's
number with :meth:`leasekit.Lease.checkpoint`, and a handler that gets a
redelivered message starts at ``message.checkpoint``. Every step run is
written to a table. Every ``kill_every`` seconds a random worker is SIGKILLed
and replaced: its messages come back when their leases end, to be run again.

The demo runs the same jobs twice, without checkpoints and with them, and
reports the steps run beyond the ``messages x chunks`` the work needs (the
work *redone*), in all and per kill. Run ``python -m leasekit.demo_resumable
worker ...`` is the worker process.
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
import time
from dataclasses import dataclass
from pathlib import Path

from .consumer import Consumer
from .lease import Lease
from .registry import open as open_queue

__all__ = ["ResumableRun", "resumable_rows", "run_resumable", "run_resumable_pair"]

QUEUE = "resumable"
#: Seconds one step of a job takes (the handler sleeps it: the "work").
STEP = 0.02


@dataclass
class ResumableRun:
    """What one run measured: steps run, steps redone, kills, seconds."""

    checkpoints: bool
    messages: int
    chunks: int
    steps_run: int
    steps_redone: int
    checkpoints_saved: int
    workers_killed: int
    seconds: float
    completed: bool

    @property
    def redone_per_kill(self) -> float:
        """Steps redone per worker killed (the kills differ between runs of unequal length)."""
        return self.steps_redone / self.workers_killed if self.workers_killed else 0.0


def _db(directory: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(
        directory / "steps.db", timeout=30, isolation_level=None, check_same_thread=False
    )
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS steps (message_id TEXT, step INTEGER, pid INTEGER)")
    conn.execute("CREATE TABLE IF NOT EXISTS saves (message_id TEXT, step INTEGER)")
    return conn


def worker_main(directory: Path, chunks: int, lease: float, checkpoints: bool) -> None:
    """One worker process: run the jobs of the queue, step by step, until SIGTERM or SIGKILL."""
    queue = open_queue("sqlite", path=str(directory / "queue.db"), queue=QUEUE)
    steps = _db(directory)  # one handler thread (concurrency=1) uses it

    def conn() -> sqlite3.Connection:
        return steps

    def handler(held: Lease) -> None:
        saved = held.message.checkpoint if checkpoints else None
        start = int(saved) if saved else 0
        for step in range(start, chunks):
            held.check()  # a lease found lost stops the work (cooperative)
            time.sleep(STEP)
            conn().execute(
                "INSERT INTO steps VALUES (?, ?, ?)", (held.message.id, step, os.getpid())
            )
            if checkpoints:
                held.checkpoint(str(step + 1).encode())
                conn().execute("INSERT INTO saves VALUES (?, ?)", (held.message.id, step + 1))

    consumer = Consumer(
        queue, handler, concurrency=1, lease_duration=lease, pass_lease=True, shutdown_grace=2
    )
    consumer.run()
    queue.close()


def _start(
    directory: Path, chunks: int, lease: float, checkpoints: bool
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "leasekit.demo_resumable", "worker", str(directory)]
    command += ["--chunks", str(chunks), "--lease", str(lease)]
    if checkpoints:
        command.append("--checkpoints")
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def run_resumable(
    *,
    checkpoints: bool,
    messages: int = 24,
    chunks: int = 20,
    workers: int = 3,
    lease: float = 1.0,
    kill_every: float = 1.0,
    time_limit: float = 300.0,
    seed: int = 23,
) -> ResumableRun:
    """Run the jobs once (with or without checkpoints) under kills; see the module docstring."""
    if min(messages, chunks, workers) < 1:
        raise ValueError("messages, chunks and workers must be at least 1")
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="leasekit-resumable-") as tmp:
        path = Path(tmp)
        _db(path).close()
        start = time.monotonic()
        killed = 0
        with open_queue("sqlite", path=str(path / "queue.db"), queue=QUEUE, create=True) as queue:
            queue.send_many([b"job-%d" % i for i in range(messages)])
            procs = [_start(path, chunks, lease, checkpoints) for _ in range(workers)]
            next_kill = time.monotonic() + kill_every
            completed = False
            try:
                while time.monotonic() - start < time_limit:
                    counts = queue.stats()
                    if not (counts.visible or counts.leased or counts.delayed):
                        completed = True
                        break
                    if time.monotonic() >= next_kill:
                        victim = rng.randrange(len(procs))
                        procs[victim].send_signal(signal.SIGKILL)
                        procs[victim].wait()
                        killed += 1
                        procs[victim] = _start(path, chunks, lease, checkpoints)
                        next_kill = time.monotonic() + kill_every
                    time.sleep(0.05)  # the parent only watches; the work is in the workers
            finally:
                for proc in procs:
                    proc.send_signal(signal.SIGTERM)
                for proc in procs:
                    try:
                        proc.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        seconds = round(time.monotonic() - start, 1)
        conn = _db(path)
        try:
            (steps,) = conn.execute("SELECT count(*) FROM steps").fetchone()
            (saves,) = conn.execute("SELECT count(*) FROM saves").fetchone()
        finally:
            conn.close()
    return ResumableRun(
        checkpoints=checkpoints,
        messages=messages,
        chunks=chunks,
        steps_run=int(steps),
        steps_redone=int(steps) - messages * chunks,
        checkpoints_saved=int(saves),
        workers_killed=killed,
        seconds=seconds,
        completed=completed,
    )


def run_resumable_pair(**options: object) -> tuple[ResumableRun, ResumableRun]:
    """The same jobs and kill schedule without checkpoints, then with them."""
    without = run_resumable(checkpoints=False, **options)  # type: ignore[arg-type]
    with_ = run_resumable(checkpoints=True, **options)  # type: ignore[arg-type]
    return without, with_


def resumable_rows(runs: tuple[ResumableRun, ...]) -> list[tuple[str, ...]]:
    """A table of the runs: a header row, then one row per run."""
    rows: list[tuple[str, ...]] = [
        ("", "steps needed", "steps run", "redone", "redone %", "kills", "redone/kill", "s")
    ]
    for run in runs:
        needed = run.messages * run.chunks
        rows.append(
            (
                "with checkpoints" if run.checkpoints else "without checkpoints",
                str(needed),
                str(run.steps_run),
                str(run.steps_redone),
                f"{100 * run.steps_redone / needed:.0f}",
                str(run.workers_killed),
                f"{run.redone_per_kill:.1f}",
                f"{run.seconds:g}",
            )
        )
    return rows


def _worker_cli(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m leasekit.demo_resumable worker")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--checkpoints", action="store_true")
    args = parser.parse_args(argv)
    worker_main(args.directory, args.chunks, args.lease, args.checkpoints)


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"]:
        sys.exit("usage: python -m leasekit.demo_resumable worker DIRECTORY [--chunks N] ...")
    _worker_cli(sys.argv[2:])
