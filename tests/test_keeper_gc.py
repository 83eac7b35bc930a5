"""What holding many leases costs the garbage collector, and the keeper's whole-run lateness.

A process holding 100,000 leases pauses for every full collection (each walks
every object the leases keep alive) and Python runs one when the objects
promoted since the last exceed a quarter of the long-lived ones. So a held
lease is a fixed, small number of tracked objects; a renewal leaves no tracked
object behind per lease (so renewals promote next to nothing); and a settled,
discarded lease is freed by its reference count, not left for a collection.
Counted here, not timed. The library never tunes or disables the collector:
these tests switch it off only to see what reference counting alone frees.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import leasekit
from leasekit.aio import AsyncQueue
from leasekit.backends.memory import MemoryDriver
from leasekit.keeper import LATENESS_MS, KeeperStats
from leasekit.message import LeaseState
from leasekit.queue import Queue


@pytest.fixture
def queue() -> Iterator[Queue]:
    q = leasekit.open("memory", queue=f"keeper-gc-{time.monotonic_ns()}", create=True)
    yield q
    q.delete_queue()
    q.close()


@contextmanager
def _no_collector() -> Iterator[None]:
    """The collector off for one check (reference counting alone frees what dies)."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_whole_run_lateness_counts_every_renewal_by_the_millisecond() -> None:
    stats = KeeperStats()
    stats._count([0.0, 0.0, 0.0005, 0.001, 0.0021, 12.0])
    counts = stats.lateness_counts
    assert len(counts) == LATENESS_MS + 2
    assert (counts[0], counts[1], counts[3], counts[-1]) == (2, 2, 1, 1)
    assert sum(counts) == 6 and stats.lateness_max == 12.0
    assert stats.lateness_percentile(0.0, whole_run=True) == 0.0
    assert stats.lateness_percentile(0.5, whole_run=True) == 0.001  # rank 3: (0, 1] ms
    assert stats.lateness_percentile(0.7, whole_run=True) == 0.003  # rounded up
    assert stats.lateness_percentile(1.0, whole_run=True) == 12.0  # the max, not a bucket
    assert KeeperStats().lateness_percentile(0.99, whole_run=True) == 0.0
    stats._count([0.0005])
    assert stats.lateness_percentile(1.0, whole_run=True) == 12.0
    lone = KeeperStats()
    lone._count([0.0004])
    assert math.isclose(lone.lateness_percentile(1.0, whole_run=True), 0.0004)


def test_whole_run_lateness_counts_each_renewal_the_window_may_drop(queue: Queue) -> None:
    queue.send_many([b"%d" % i for i in range(50)])
    leases = queue.lease(50, duration=0.3)
    with leasekit.LeaseKeeper() as keeper:
        keeper.add_many(leases)
        deadline = time.monotonic() + 10
        while keeper.stats.renewed < 150 and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the keeper's progress, with a deadline
        keeper.stats.lateness.clear()  # the window may drop old samples; the counts never do
        keeper.discard_many(leases)
        renewed = keeper.stats.renewed  # first: a batch adds to both under one lock
        assert sum(keeper.stats.lateness_counts) >= renewed >= 150
        assert keeper.stats.lateness_percentile(0.99, whole_run=True) < 1.0
    queue.complete_many(leases)


def test_a_kept_lease_is_four_tracked_objects(queue: Queue) -> None:
    n = 500
    queue.send_many([b"x"] * n)
    with leasekit.LeaseKeeper() as keeper:
        before = _tracked()
        leases = queue.lease(n, duration=30)
        keeper.add_many(leases)
        per_lease = (_tracked() - before) / n
        # the Lease, its LeaseRecord and its Message, and the keeper's entry for it
        assert per_lease <= 4.05, per_lease
        keeper.discard_many(leases)
    queue.complete_many(leases)


def test_renewals_leave_no_tracked_object_per_lease(queue: Queue) -> None:
    n = 500
    queue.send_many([b"x"] * n)
    # Short leases, so that renewals come quickly; 3 s, not shorter, so that a
    # loaded machine (twelve test workers on two cores) lets none lapse: with
    # 1.5 s leases one of 500 was lost in a fresh clone's run.
    leases = queue.lease(n, duration=3)
    with leasekit.LeaseKeeper() as keeper:
        keeper.add_many(leases)
        deadline = time.monotonic() + 30
        while keeper.stats.renewed < n and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the keeper's progress, with a deadline
        before, renewed = _tracked(), keeper.stats.renewed
        while keeper.stats.renewed < renewed + 3 * n and time.monotonic() < deadline:
            time.sleep(0.02)
        grown = _tracked() - before
        assert keeper.stats.renewed >= renewed + 3 * n and keeper.stats.lost == 0
        assert grown < n / 10, f"{grown} tracked objects more after {3 * n} renewals"
        keeper.discard_many(leases)
    queue.complete_many(leases)


def test_settled_leases_of_a_stopped_keeper_are_freed_by_reference_counting(
    queue: Queue,
) -> None:
    queue.send_many([b"x"] * 20)
    leases = queue.lease(20, duration=0.3)
    refs = [weakref.ref(lease) for lease in leases]
    keeper = leasekit.LeaseKeeper()
    keeper.add_many(leases)
    deadline = time.monotonic() + 10
    while keeper.stats.renewed < 40 and time.monotonic() < deadline:
        time.sleep(0.02)  # polling the keeper's progress, with a deadline
    with _no_collector():
        queue.complete_many(leases)
        keeper.stop()
        del leases
        alive = sum(ref() is not None for ref in refs)
    assert keeper.stats.renewed >= 40
    assert alive == 0, f"{alive} of 20 leases need the collector to be freed (a cycle)"


def test_asking_an_async_lease_whether_it_is_lost_makes_no_event() -> None:
    """``wait_lost`` on a held lease makes no threading.Event (six objects) for it."""

    async def main() -> None:
        name = f"keeper-gc-aio-{time.monotonic_ns()}"
        async with AsyncQueue(leasekit.open("memory", queue=name, create=True)) as queue:
            await queue.send(b"held")
            [lease] = await queue.lease(1, duration=30)
            assert await lease.wait_lost(0) is False
            assert lease.lease._record._lost_event is None
            lease.lease._record.lose(lease.lease, leasekit.LeaseLost("taken"))
            assert await lease.wait_lost(0) is True
            assert lease.lost.is_set()  # made when asked for, already set
            await queue.delete_queue()

    asyncio.run(main())


def test_a_batch_renewed_together_where_stale_receipts_pass_loses_only_the_expired() -> None:
    """The together path (a keeper's batch) leaves a batch with an expired lease to the other."""
    driver = MemoryDriver(queue=f"keeper-gc-stale-{time.monotonic_ns()}")
    driver.capabilities = driver.capabilities.replace(detects_stale_receipts=False)
    queue = Queue(driver)
    queue.create()
    try:
        queue.send_many([b"a", b"b", b"c"])
        leases = queue.lease(3, duration=30)
        leases[1]._record.deadline = time.monotonic() - 1  # its time is up by core's clock
        results = queue.renew_many(leases, 30)
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], leasekit.LeaseLost)
        assert [lease.state for lease in leases] == [
            LeaseState.HELD,
            LeaseState.LOST,
            LeaseState.HELD,
        ]
        assert all(lease._record.busy is None for lease in leases), "each given back"
        assert queue.renew_many([leases[0], leases[2]], 30) == [None, None]  # together again
        queue.complete_many([leases[0], leases[2]])
    finally:
        queue.delete_queue()
        queue.close()
