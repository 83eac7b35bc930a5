"""``Queue.peek_dead_letters(after=...)``: the next page of dead letters, where the store pages."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import leasekit


def _dead(queue: leasekit.Queue, n: int) -> list[str]:
    ids = [queue.send(f"m{i}".encode()) for i in range(n)]
    left = set(ids)
    while left:
        for lease in queue.lease(max_messages=10, duration=30):
            lease.dead_letter("boom")
            left.discard(lease.message.id)
    return ids


@pytest.fixture(params=["memory", "sqlite"])
def queue(request: pytest.FixtureRequest, tmp_path: Path):
    name = f"paging-{uuid.uuid4().hex}"
    url = f"memory://{name}" if request.param == "memory" else f"sqlite:///{tmp_path}/p.db?queue=p"
    with leasekit.open(url, create=True) as opened:
        yield opened


def test_pages_follow_each_other_oldest_first(queue: leasekit.Queue) -> None:
    ids = _dead(queue, 7)
    first = queue.peek_dead_letters(3)
    second = queue.peek_dead_letters(3, after=first[-1].id)
    third = queue.peek_dead_letters(3, after=second[-1].id)
    assert [dl.id for dl in first + second + third] == ids
    assert queue.peek_dead_letters(3, after=ids[-1]) == []


def test_after_a_dead_letter_that_is_gone_is_refused(queue: leasekit.Queue) -> None:
    ids = _dead(queue, 2)
    assert queue.redrive(1) == 1
    with pytest.raises(leasekit.InvalidArgument, match="read from the oldest again"):
        queue.peek_dead_letters(5, after=ids[0])
    with pytest.raises(leasekit.InvalidArgument, match="after must be"):
        queue.peek_dead_letters(5, after="")


def test_sqlite_reads_one_page_of_rows_by_index(tmp_path: Path) -> None:
    import sqlite3

    url = f"sqlite:///{tmp_path}/plan.db?queue=p"
    with leasekit.open(url, create=True) as queue:
        _dead(queue, 3)
    conn = sqlite3.connect(tmp_path / "plan.db")
    plans = [
        " ".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, args).fetchall())
        for sql, args in [
            ("SELECT min(seq) FROM leasekit_dead_letters WHERE queue = ? AND id = ?", ("p", "x")),
            (
                "SELECT id FROM leasekit_dead_letters WHERE queue = ? AND seq > ? "
                "ORDER BY seq LIMIT ?",
                ("p", 1, 10),
            ),
        ]
    ]
    assert "USING COVERING INDEX leasekit_dead_letters_id" in plans[0]
    assert "USING INDEX leasekit_dead_letters_queue" in plans[1] and "TEMP B-TREE" not in plans[1]
