"""A settle of leases taken together in one backend call keeps the general path's outcomes.

``complete_many`` of one receive's leases that fit one backend call takes a
lean path of its own (issue 37, item 5). Each case here runs on both paths —
``together`` (one call) and ``chunked`` (the backend takes one receipt a call,
so the general path settles them) — and must end the same: the same results,
the same lease states, the same leases usable afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from leasekit import Queue, errors
from leasekit.backends.memory import MemoryBroker, MemoryDriver
from leasekit.deadline import deadline
from leasekit.message import LeaseState
from leasekit.spi import DriverError, ErrorCode

LEASES = 3


class _Stop(BaseException):
    """Not an ``Exception``: core's call runner lets it through, as a ``KeyboardInterrupt``."""


class _Scripted(MemoryDriver):
    """A memory driver whose deletes can fail as a whole or per receipt, counting its calls."""

    def __init__(self, batch: int) -> None:
        super().__init__(queue="together", broker=MemoryBroker())
        self.capabilities = self.capabilities.replace(max_delete_batch=batch)
        self.calls = 0
        self.raise_whole: BaseException | None = None
        self.lose: set[str] = set()  # these receipts' entries fail with LEASE_LOST

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        self.calls += 1
        if self.raise_whole is not None:
            raise self.raise_whole
        kept = [receipt for receipt in receipts if receipt not in self.lose]
        done = iter(super().delete(kept))
        return [
            DriverError(ErrorCode.LEASE_LOST, "stale") if receipt in self.lose else next(done)
            for receipt in receipts
        ]


@pytest.fixture(params=[500, 1], ids=["together", "chunked"])
def queue(request: pytest.FixtureRequest) -> Queue:
    queue = Queue(_Scripted(batch=request.param))
    queue.create()
    queue.send_many([b"m%d" % i for i in range(LEASES)])
    return queue


def _driver(queue: Queue) -> _Scripted:
    driver = queue.driver
    assert isinstance(driver, _Scripted)
    return driver


def test_all_held_are_completed_in_as_few_calls_as_the_backend_takes(queue: Queue) -> None:
    leases = queue.lease(LEASES, duration=30)
    assert queue.complete_many(leases) == [None] * LEASES
    assert [lease.state for lease in leases] == [LeaseState.COMPLETED] * LEASES
    batch = queue.capabilities.max_delete_batch
    assert _driver(queue).calls == (1 if batch >= LEASES else LEASES)
    results = queue.complete_many(leases)
    assert all(isinstance(r, errors.LeaseStateError) for r in results), results


def test_no_leases_make_no_call(queue: Queue) -> None:
    assert queue.complete_many([]) == []
    assert _driver(queue).calls == 0


def test_a_deadline_passed_before_the_call_makes_no_call_and_keeps_them_held(
    queue: Queue,
) -> None:
    leases = queue.lease(LEASES, duration=30)
    with deadline(0.0):
        results = queue.complete_many(leases)
    assert all(isinstance(r, errors.BackendUnavailable) for r in results), results
    assert all("timeout passed" in str(r) for r in results)
    assert [lease.state for lease in leases] == [LeaseState.HELD] * LEASES
    assert _driver(queue).calls == 0
    assert queue.complete_many(leases) == [None] * LEASES, "given back: usable at once"


def test_one_lost_entry_is_lost_and_the_others_completed(queue: Queue) -> None:
    leases = queue.lease(LEASES, duration=30)
    _driver(queue).lose = {leases[1].receipt}
    results = queue.complete_many(leases)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], errors.LeaseLost)
    assert [lease.state for lease in leases] == [
        LeaseState.COMPLETED,
        LeaseState.LOST,
        LeaseState.COMPLETED,
    ]


def test_a_call_failing_as_a_whole_raises_and_leaves_them_held(queue: Queue) -> None:
    leases = queue.lease(LEASES, duration=30)
    driver = _driver(queue)
    driver.raise_whole = DriverError(ErrorCode.QUEUE_NOT_FOUND, "gone")
    with pytest.raises(errors.QueueNotFound):
        queue.complete_many(leases)
    assert driver.calls == 1, "no call after the first failed as a whole"
    assert [lease.state for lease in leases] == [LeaseState.HELD] * LEASES
    driver.raise_whole = None
    assert queue.complete_many(leases) == [None] * LEASES, "none was left taken"


def test_an_interrupted_call_gives_them_back(queue: Queue) -> None:
    leases = queue.lease(LEASES, duration=30)
    driver = _driver(queue)
    driver.raise_whole = _Stop()
    with pytest.raises(_Stop):
        queue.complete_many(leases)
    assert [lease.state for lease in leases] == [LeaseState.HELD] * LEASES
    driver.raise_whole = None
    assert queue.complete_many(leases) == [None] * LEASES, "none was left taken"


def test_a_lost_call_as_a_whole_marks_every_lease_of_the_call_lost(queue: Queue) -> None:
    leases = queue.lease(LEASES, duration=30)
    driver = _driver(queue)
    driver.raise_whole = DriverError(ErrorCode.LEASE_LOST, "all stale")
    with pytest.raises(errors.LeaseLost):
        queue.complete_many(leases)
    together = queue.capabilities.max_delete_batch >= LEASES
    expected = [LeaseState.LOST] * (LEASES if together else 1)
    expected += [LeaseState.HELD] * (LEASES - len(expected))  # chunks not sent: unchanged
    assert [lease.state for lease in leases] == expected
