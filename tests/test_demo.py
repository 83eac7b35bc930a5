"""A shorter run of the demo asserts the same invariants: every message processed, none lost."""

from __future__ import annotations

import pytest

from leasekit.demo import run_demo

pytestmark = pytest.mark.slow


def test_demo_survives_killed_and_frozen_workers(tmp_path: object) -> None:
    summary = run_demo(
        messages=600,
        workers=2,
        concurrency=3,
        lease=1.0,
        kill_every=0.8,
        directory=str(tmp_path),
        progress=False,
        timeout=90,
        seed=7,
    )
    assert summary.ok, summary
    assert summary.processed == 600
    assert summary.left_in_queue == 0 and summary.dead_lettered == 0
    assert summary.workers_killed + summary.workers_frozen >= 2
    assert summary.handler_runs >= 600
