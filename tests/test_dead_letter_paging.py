"""``Queue.peek_dead_letters(after=...)``: the next page of dead letters, where the store pages."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

import leasekit
from leasekit.emulators.postgres import LocalPostgres


def _dead(queue: leasekit.Queue, n: int) -> list[str]:
    ids = [queue.send(f"m{i}".encode()) for i in range(n)]
    left = set(ids)
    while left:
        for lease in queue.lease(max_messages=10, duration=30):
            lease.dead_letter("boom")
            left.discard(lease.message.id)
    return ids


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def queue(request: pytest.FixtureRequest, tmp_path: Path):
    name = f"paging-{uuid.uuid4().hex}"
    if request.param == "postgresql":
        server = request.getfixturevalue("postgres_server")
        url = f"{server.url()}?queue={name[:40]}&schema=paging"
    elif request.param == "memory":
        url = f"memory://{name}"
    else:
        url = f"sqlite:///{tmp_path}/p.db?queue=p"
    with leasekit.open(url, create=True) as opened:
        yield opened
        if request.param == "postgresql":
            opened.delete_queue()


def test_a_tampered_cursor_is_refused_before_any_row_is_read(queue: leasekit.Queue) -> None:
    _dead(queue, 2)
    for tampered in ("not-a-dead-letter-id", str(uuid.uuid4())):
        with pytest.raises(leasekit.InvalidArgument, match="read from the oldest again"):
            queue.peek_dead_letters(5, after=tampered)


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


def test_postgresql_reads_one_page_of_rows_by_index(postgres_server: LocalPostgres) -> None:
    """Both statements of a page use an index and read a page of rows, not the queue's all."""
    server = postgres_server
    with leasekit.open(f"{server.url()}?queue=plan&schema=paging_plan", create=True) as queue:
        ids = _dead(queue, 300)
        server.psql("ANALYZE paging_plan.dead_letters")
        queue_id = "(SELECT id FROM paging_plan.queues WHERE name = 'plan')"
        plans = [
            server.psql(f"SET enable_seqscan = off; EXPLAIN (ANALYZE, COSTS OFF) {sql}")
            for sql in (
                "SELECT min(seq) FROM paging_plan.dead_letters "
                f"WHERE queue_id = {queue_id} AND id = '{ids[150]}'",
                "SELECT id FROM paging_plan.dead_letters "
                f"WHERE queue_id = {queue_id} AND seq > 150 ORDER BY seq LIMIT 10",
            )
        ]
        assert "dead_letters_id" in plans[0], plans[0]
        # An index in seq order (the (queue_id, seq) one, or the primary key while the
        # queue is the table's only one), no sort, no row read and thrown away: 10 rows.
        assert "Index Scan" in plans[1] and "Sort" not in plans[1], plans[1]
        assert "Seq Scan" not in plans[1] and "Rows Removed" not in plans[1], plans[1]
        assert re.search(r"on dead_letters \(actual [^)]*rows=10(\.00)? ", plans[1]), plans[1]
        page = queue.peek_dead_letters(10, after=ids[150])
        assert [dl.id for dl in page] == ids[151:161]
        queue.delete_queue()
