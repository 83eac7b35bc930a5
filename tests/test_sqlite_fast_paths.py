"""The SQLite driver's two fast paths (issue 37, item 5) keep what the slow ones promised.

A receive gives plain rows (``ReceivedRows``) unless a row of the batch has a
checkpoint, in delivery order either way; a delete runs without ``RETURNING``
and falls back to the per-receipt statement when any receipt was not held, so
a stale, repeated, malformed or expired receipt still gets its own result and
the held ones are still deleted, once.
"""

from __future__ import annotations

from itertools import count
from pathlib import Path

import pytest

import leasekit
from leasekit.backends.sqlite import SqliteDriver
from leasekit.clock import to_datetime
from leasekit.spi import DriverError, ErrorCode, RawMessage, ReceivedRows

_names = count()
START = 1_700_000_000.0


def _queue(tmp_path: Path, clock: leasekit.ManualClock) -> leasekit.Queue:
    return leasekit.open(
        "sqlite",
        path=str(tmp_path / "fast.db"),
        queue=f"fast-{next(_names)}",
        create=True,
        clock=clock,
    )


def _driver(queue: leasekit.Queue) -> SqliteDriver:
    driver = queue.driver
    assert isinstance(driver, SqliteDriver)
    return driver


def test_a_receive_without_checkpoints_gives_plain_rows_in_delivery_order(
    tmp_path: Path,
) -> None:
    clock = leasekit.ManualClock(START)
    with _queue(tmp_path, clock) as queue:
        queue.send_many([b"a", b"b", b"c"])
        queue.send(b"p", properties={"k": "v"})
        [first] = queue.lease(1, duration=30)  # "a", given back later than the others
        clock.advance(1)
        first.abandon()
        clock.advance(1)
        rows = _driver(queue).receive(10, 30.0, 0.0)
        assert isinstance(rows, ReceivedRows)
        # visibility time, then send order: "a" became visible last
        assert [message.body for message in rows] == [b"b", b"c", b"p", b"a"]
        assert [message.delivery_count for message in rows] == [1, 1, 1, 2]
        assert rows[2].properties == {"k": "v"} and rows[0].properties == {}
        assert rows[0].checkpoint is None and rows[0].raw is None
        assert rows[0].visible_until == to_datetime(START + 2 + 30)
        assert rows[0].enqueued_at == to_datetime(START)


def test_a_batch_with_a_checkpoint_gives_raw_messages_in_delivery_order(tmp_path: Path) -> None:
    clock = leasekit.ManualClock(START)
    with _queue(tmp_path, clock) as queue:
        queue.send_many([b"a", b"b", b"c"])
        [first, second] = queue.lease(2, duration=5)
        second.checkpoint(b"half-way")
        clock.advance(31)  # both leases end: the checkpoint was kept with "b"
        messages = _driver(queue).receive(10, 30.0, 0.0)
        assert not isinstance(messages, ReceivedRows)
        assert all(type(message) is RawMessage for message in messages)
        assert [(m.body, m.checkpoint) for m in messages] == [
            (b"c", None),  # visible since it was sent; the others since their leases ended
            (b"a", None),
            (b"b", b"half-way"),
        ]
        assert first.message.id == messages[1].id


def test_leases_from_rows_complete_and_come_back_like_any_other(tmp_path: Path) -> None:
    clock = leasekit.ManualClock(START)
    with _queue(tmp_path, clock) as queue:
        queue.send_many([b"1", b"2", b"3"])
        leases = queue.lease(3, duration=5)
        assert [lease.message.body for lease in leases] == [b"1", b"2", b"3"]
        assert queue.complete_many(leases[:2]) == [None, None]
        clock.advance(6)
        [again] = queue.lease(3, duration=5)
        assert again.message.body == b"3" and again.message.delivery_count == 2


def test_a_delete_of_held_receipts_answers_each_without_returning(tmp_path: Path) -> None:
    with _queue(tmp_path, leasekit.ManualClock(START)) as queue:
        queue.send_many([b"a", b"b"])
        driver = _driver(queue)
        receipts = [message.receipt for message in driver.receive(2, 30.0, 0.0)]
        assert driver.delete(receipts) == [None, None]
        assert driver.delete([]) == []
        assert queue.stats().total == 0


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_stale_receipt_gets_its_own_error_and_the_held_ones_are_deleted(
    tmp_path: Path, where: str
) -> None:
    clock = leasekit.ManualClock(START)
    with _queue(tmp_path, clock) as queue:
        queue.send_many([b"a", b"b", b"c"])
        driver = _driver(queue)
        receipts = [message.receipt for message in driver.receive(3, 30.0, 0.0)]
        position = {"first": 0, "middle": 1, "last": 2}[where]
        stale = receipts[position]
        head, _, _ = stale.partition(".")
        receipts[position] = f"{head}.0000000000000000"  # the right row, not its receipt
        results = driver.delete(receipts)
        assert [r is None for r in results] == [i != position for i in range(3)]
        error = results[position]
        assert error is not None and getattr(error, "code", None) is ErrorCode.LEASE_LOST
        assert queue.stats().leased == 1, "the stale receipt's message stays, still leased"
        assert driver.delete([stale]) == [None], "its current receipt still deletes it"
        assert queue.stats().total == 0


def test_repeated_malformed_and_expired_receipts_are_answered_per_receipt(
    tmp_path: Path,
) -> None:
    clock = leasekit.ManualClock(START)
    with _queue(tmp_path, clock) as queue:
        queue.send(b"a")
        queue.send(b"short-lived", ttl=2)
        driver = _driver(queue)
        first, second = (message.receipt for message in driver.receive(2, 30.0, 0.0))
        clock.advance(3)  # the second's time to live passed
        results = driver.delete([first, "not-a-receipt", first, second])
        assert results[0] is None and results[2] is None, "a repeated receipt: both held"
        assert all(getattr(results[i], "code", None) is ErrorCode.LEASE_LOST for i in (1, 3)), (
            results
        )
        assert queue.stats().total == 0, "the held one went once; the expired one is gone"


def test_a_delete_on_a_deleted_queue_says_so(tmp_path: Path) -> None:
    with _queue(tmp_path, leasekit.ManualClock(START)) as queue:
        queue.send(b"a")
        driver = _driver(queue)
        [receipt] = [message.receipt for message in driver.receive(1, 30.0, 0.0)]
        queue.delete_queue()
        with pytest.raises(DriverError) as caught:
            driver.delete([receipt])
        assert caught.value.code is ErrorCode.QUEUE_NOT_FOUND
