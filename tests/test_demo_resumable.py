"""``leasekit demo --chunks``: resumable jobs under kills, with and without checkpoints."""

from __future__ import annotations

from leasekit.demo_resumable import resumable_rows, run_resumable


def test_jobs_resume_from_their_checkpoints_and_every_step_is_run() -> None:
    run = run_resumable(
        checkpoints=True, messages=6, chunks=5, workers=2, lease=2.0, kill_every=0.7
    )
    assert run.completed
    assert run.steps_run >= 6 * 5 and run.steps_redone == run.steps_run - 30
    # A step's row, its checkpoint and the row saying it was saved are three writes, and
    # a kill lands at most once between the first and the last: before the checkpoint,
    # the step is redone; after it, the step is not redone but its save goes unrecorded.
    # Either way one step without a recorded save per kill, at most.
    assert 0 <= run.steps_run - run.checkpoints_saved <= run.workers_killed
    assert run.steps_redone <= run.workers_killed
    header, row = resumable_rows((run,))
    assert header[0] == "" and row[0] == "with checkpoints" and row[1] == "30"


def test_without_checkpoints_the_same_jobs_complete_too() -> None:
    run = run_resumable(checkpoints=False, messages=4, chunks=3, workers=2, kill_every=0.7)
    assert run.completed and run.checkpoints_saved == 0
    assert run.steps_run >= 12
