"""Re-driving PostgreSQL's native dead letters back to their queue (issue 33 item 6).

Against the real server (``postgres_server``): ``Queue.redrive()`` and
``leasekit redrive`` lease each dead letter in its table (so two re-drives
never move one twice), send it back with its properties, reason and group,
then delete it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence

import pytest
from typer.testing import CliRunner

import leasekit
from leasekit import Queue
from leasekit.cli import app
from leasekit.dead_letters import REDRIVEN_REASON
from leasekit.emulators.postgres import LocalPostgres
from leasekit.spi import DriverError, ErrorCode


def _url(server: LocalPostgres, name: str) -> str:
    return f"{server.url()}?queue={name}&schema=redrive"


@pytest.fixture
def url(postgres_server: LocalPostgres) -> Iterator[str]:
    made = _url(postgres_server, f"rd-{uuid.uuid4().hex[:8]}")
    with leasekit.open(made, create=True):
        pass
    yield made
    with leasekit.open(made) as queue:
        queue.delete_queue()


def _dead_letter(queue: Queue, bodies: list[bytes], group: str | None = None) -> None:
    """Send ``bodies`` and dead-letter each (reason ``bad: <body>``)."""
    for body in bodies:
        queue.send(body, properties={"kind": "order"}, group=group)
    left = set(bodies)
    deadline = time.monotonic() + 30
    while left:
        assert time.monotonic() < deadline, f"never leased {left}"
        for lease in queue.lease(10, duration=30):
            lease.dead_letter(f"bad: {lease.message.body.decode()}")
            left.discard(lease.message.body)


def _drain(queue: Queue) -> list[leasekit.Lease]:
    got: list[leasekit.Lease] = []
    while batch := queue.lease(50, duration=30):
        queue.complete_many(batch)
        got += batch
    return got


def test_redrive_moves_every_dead_letter_back_with_its_properties_reason_and_group(
    url: str,
) -> None:
    with leasekit.open(url) as queue:
        _dead_letter(queue, [b"one", b"two"])
        _dead_letter(queue, [b"g1"], group="order-17")
        assert len(queue.peek_dead_letters(10)) == 3
        assert queue.redrive() == 3
        back = _drain(queue)
        assert sorted(lz.message.body for lz in back) == [b"g1", b"one", b"two"]
        for lease in back:
            assert lease.message.properties["kind"] == "order"
            assert lease.message.properties[REDRIVEN_REASON] == (
                f"bad: {lease.message.body.decode()}"
            )
            assert lease.message.delivery_count == 1
        assert {lz.message.body: lz.message.group for lz in back}[b"g1"] == "order-17"
        assert queue.peek_dead_letters(10) == []
        assert queue.stats().dead_lettered == 0
        assert queue.redrive() == 0


def _lost(results: Sequence[object]) -> bool:
    """Whether the one result is the driver's LeaseLost."""
    [result] = results
    return isinstance(result, DriverError) and result.code is ErrorCode.LEASE_LOST


def test_the_dead_letter_store_leases_renews_abandons_and_fences_its_receipts(url: str) -> None:
    with leasekit.open(url) as queue:
        _dead_letter(queue, [b"dl"])
        with (
            Queue(queue.driver.dead_letter_store()) as store,
            Queue(queue.driver.dead_letter_store()) as rival,
        ):
            [first] = store.lease(duration=5)
            assert first.message.body == b"dl"
            assert first.message.properties["leasekit-dead-letter-reason"] == "bad: dl"
            first.renew(duration=5)
            assert rival.lease(duration=5) == []  # hidden while leased, from any handle
            stale_receipt = first.receipt
            first.abandon()
            [again] = rival.lease(duration=5)  # given back: visible at once
            assert again.message.body == b"dl"
            assert again.receipt != stale_receipt
            # The first holder's receipt settles nothing now, nor a used one.
            assert _lost(store.driver.delete([stale_receipt]))
            assert _lost(store.driver.abandon([stale_receipt], 0))
            assert _lost(store.driver.change_visibility([stale_receipt], 5))
            again.complete()
            assert _lost(store.driver.delete([again.receipt]))
        assert queue.peek_dead_letters(10) == []
        assert queue.stats().dead_lettered == 0


def test_two_redrives_at_once_move_each_dead_letter_once(
    url: str, postgres_server: LocalPostgres
) -> None:
    bodies = [b"%d" % i for i in range(60)]
    with leasekit.open(url) as queue:
        _dead_letter(queue, bodies)
    moved: list[int] = []

    def redrive() -> None:
        with leasekit.open(url) as own:  # a handle (and a pool) of its own
            moved.append(own.redrive())

    workers = [threading.Thread(target=redrive) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert sum(moved) == len(bodies), moved
    with leasekit.open(url) as queue:
        counted = Counter(lz.message.body for lz in _drain(queue))
        assert set(counted) == set(bodies)
        assert max(counted.values()) == 1, "a dead letter was moved twice"
        assert queue.peek_dead_letters(1) == []


def test_leasekit_redrive_moves_them_back(url: str) -> None:
    with leasekit.open(url) as queue:
        _dead_letter(queue, [b"a", b"b", b"c"])
    runner = CliRunner()
    dry = runner.invoke(app, ["redrive", url, "--dry-run"], env={"COLUMNS": "100"})
    assert dry.exit_code == 0, dry.output
    assert "would move 3 dead letter(s)" in dry.output
    limited = runner.invoke(app, ["redrive", url, "--limit", "2"], env={"COLUMNS": "100"})
    assert limited.exit_code == 0, limited.output
    assert "moved 2 dead letter(s)" in limited.output and "more are left" in limited.output
    rest = runner.invoke(app, ["redrive", url], env={"COLUMNS": "100"})
    assert rest.exit_code == 0, rest.output
    assert "moved 1 dead letter(s)" in rest.output
    with leasekit.open(url) as queue:
        assert sorted(lz.message.body for lz in _drain(queue)) == [b"a", b"b", b"c"]
        assert queue.peek_dead_letters(1) == []


def test_a_schema_made_before_redrive_is_brought_up_to_date_and_its_dead_letters_move(
    postgres_server: LocalPostgres,
) -> None:
    """Dead letters kept by schema version 2 (no lease columns) re-drive after the upgrade."""
    schema = f"old_{uuid.uuid4().hex[:8]}"
    url = f"{postgres_server.url()}?queue=jobs&schema={schema}"
    with leasekit.open(url, create=True) as queue:
        _dead_letter(queue, [b"old"])
    postgres_server.psql(
        f"ALTER TABLE {schema}.dead_letters DROP COLUMN visible_at, DROP COLUMN token; "
        f"DELETE FROM {schema}.schema_version WHERE version = 3;"
    )
    with leasekit.open(url) as queue:
        assert queue.redrive() == 1
        assert [lz.message.body for lz in _drain(queue)] == [b"old"]
    postgres_server.psql(f"DROP SCHEMA {schema} CASCADE;")
