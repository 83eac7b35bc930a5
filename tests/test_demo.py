"""The demo: a shorter run asserts its invariants; a tiny time limit asserts how an
unfinished run is reported (unprocessed messages are still in the queue, not lost).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import leasekit
from leasekit.demo import (
    MEASURED_RATE,
    _ids_in_queue,
    account,
    default_time_limit,
    run_demo,
    summary_rows,
    verdict,
)


@pytest.mark.slow
def test_demo_survives_killed_and_frozen_workers(tmp_path: Path) -> None:
    summary = run_demo(
        messages=600,
        workers=2,
        concurrency=3,
        lease=1.0,
        kill_every=0.8,
        directory=str(tmp_path),
        progress=False,
        time_limit=90,
        seed=7,
    )
    assert summary.ok, summary
    assert not summary.timed_out
    assert summary.processed == 600
    assert summary.unprocessed == summary.lost == 0
    assert summary.left_in_queue == 0 and summary.dead_lettered == 0
    assert summary.workers_killed + summary.workers_frozen >= 2
    assert summary.handler_runs >= 600
    assert verdict(summary)[0] == "ok"


def test_time_limit_reports_unprocessed_messages_as_still_in_the_queue(tmp_path: Path) -> None:
    started = time.monotonic()
    summary = run_demo(
        messages=6000,  # far more than 6 s of 1 worker x 2 threads can process
        workers=1,
        concurrency=2,
        lease=0.5,
        # Kills at 2.5 s and 5 s: each worker process has 2.5 s to start and process
        # some. A kill every 0.6 s (and a freeze) left the one worker no time to start
        # under a parallel suite beside a busy process: 0 processed in 4 s.
        kill_every=2.5,
        directory=str(tmp_path),
        progress=False,
        time_limit=6,
        seed=3,
    )
    assert time.monotonic() - started < 6 + 10  # stop, audit and shutdown are bounded
    assert summary.timed_out and not summary.ok
    assert summary.workers_killed >= 1
    assert 0 < summary.processed < 6000
    assert summary.unprocessed == 6000 - summary.processed
    assert summary.lost == 0 and summary.dead_lettered == 0
    assert summary.left_in_queue >= summary.unprocessed
    rows = dict(summary_rows(summary))
    assert rows["unprocessed at the time limit, still in the queue"] == str(summary.unprocessed)
    assert rows["lost (neither processed, queued nor dead-lettered)"] == "0"
    assert rows["time limit (seconds)"] == "6"
    outcome, sentence = verdict(summary)
    assert outcome == "time limit"
    assert f"the other {summary.unprocessed} are still in the queue, none lost" in sentence


def test_a_sent_message_missing_from_the_queue_is_counted_as_lost() -> None:
    """The audit reads the queue's ids, including leases of a stopped worker once they lapse."""
    with leasekit.open("memory://demo-audit", create=True) as queue:
        ids = queue.send_many([b"a", b"b", b"c", b"d", b"e"])
        stopped_worker = queue.lease(2, duration=0.3)  # never settled: lapses by itself
        [vanished] = queue.lease(1, duration=30)
        vanished.complete()  # gone from the queue without an effect: a lost message
        in_queue = _ids_in_queue(queue, expected=4, wait=3)
        assert in_queue == set(ids) - {vanished.message.id}
        assert {lease.message.id for lease in stopped_worker} <= in_queue
        stats = queue.stats()
        assert (stats.visible, stats.leased) == (4, 0)  # the audit gave every message back
        processed = {ids[0]}
        assert account(ids, processed, in_queue, dead=set()) == (3, 1)
        assert account(ids, processed, in_queue, dead={vanished.message.id}) == (3, 0)


def test_default_time_limit_scales_with_messages_from_the_measured_rate() -> None:
    measured = 100_000 / MEASURED_RATE
    assert default_time_limit(100_000) >= 2 * measured  # a generous factor
    assert default_time_limit(3000) < default_time_limit(100_000)
    assert default_time_limit(3000, workers=1, concurrency=1) > default_time_limit(3000)
    assert default_time_limit(3000, workers=8, concurrency=8) == default_time_limit(3000)


def test_cli_reports_the_time_limit_at_80_columns(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "leasekit.cli", "demo", "--messages", "2000"]
    argv += ["--workers", "1", "--concurrency", "2", "--lease", "0.5", "--time-limit", "1.5"]
    argv += ["--dir", str(tmp_path)]
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80", "TERM": "dumb"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 3, output
    assert "time limit 1.5 s" in " ".join(output.split())
    assert "TIME LIMIT" in output and "FAILED" not in output
    assert "none lost" in output
    assert "unprocessed at the time limit, still in the queue" in output
    too_wide = [line for line in output.splitlines() if len(line) > 80]
    assert not too_wide, too_wide
