"""A settle or renew call's ``timeout`` bounds the whole call, not each backend-sized chunk.

The driver here settles and renews one message per call (as MNS abandons and
Azure Storage Queue does everything) and every such call hangs until core's
deadline for it has passed, then fails each entry as a blackholed socket with
that deadline as its timeout would. The network version of the same bound runs
through the fault proxy in ``tests/test_faults.py``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from leasekit import Queue, errors
from leasekit.backends.memory import MemoryBroker, MemoryDriver
from leasekit.deadline import DeadlineExceeded, time_left
from leasekit.message import LeaseState
from leasekit.spi import Visibility

#: Leases per test: sixteen one-message calls, as in the reported case.
LEASES = 16
#: What a caller allows the whole call.
TIMEOUT = 0.5
#: Slack over ``TIMEOUT`` for the scheduler on a busy 2-core machine.
SLACK = 0.5


class _OneAtATimeBlackhole(MemoryDriver):
    """One message per settle/renew call; while ``hang``, each call outlives core's deadline.

    With ``slow`` set, each call takes that long instead and hangs only when
    core's deadline leaves it less.
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.capabilities = self.capabilities.replace(max_delete_batch=1, max_renew_batch=1)
        self.hang = False
        self.hang_receipts: set[str] = set()  # hang for these only (if not empty)
        self.slow = 0.0  # else: answer after this long, if core's deadline allows it
        self.calls = 0
        self.given: list[float] = []  # the time left each call was given

    def _blackhole(self, receipts: Sequence[str]) -> list[DeadlineExceeded] | None:
        if self.slow:
            self.calls += 1
            self.given.append(time_left() or 0.0)
            if self.given[-1] > self.slow:
                time.sleep(self.slow)
                return None
        elif not self.hang or (self.hang_receipts and not self.hang_receipts & set(receipts)):
            return None
        else:
            self.calls += 1
        while (left := time_left()) is not None and left > 0:
            time.sleep(left)  # a socket whose timeout is core's deadline: no answer
        return [DeadlineExceeded("no answer before the deadline") for _ in receipts]

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        failed = self._blackhole(receipts)
        return list(failed) if failed is not None else super().delete(receipts)

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        failed = self._blackhole(receipts)
        return list(failed) if failed is not None else super().abandon(receipts, delay)

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        failed = self._blackhole(receipts)
        if failed is not None:
            return list(failed)
        return super().change_visibility(receipts, seconds)


def _queue(call_timeout: float | None = None) -> tuple[Queue, _OneAtATimeBlackhole]:
    driver = _OneAtATimeBlackhole(queue="blackhole", broker=MemoryBroker())
    queue = Queue(driver, call_timeout=call_timeout)
    queue.create()
    queue.send_many([b"m%d" % i for i in range(LEASES)])
    return queue, driver


def _assert_all_unavailable_and_held(results: Sequence[object], leases: Sequence[object]) -> None:
    assert all(isinstance(r, errors.BackendUnavailable) for r in results), results
    assert all(lease.state is LeaseState.HELD for lease in leases)  # type: ignore[attr-defined]


def test_abandon_many_timeout_bounds_the_whole_call_and_later_chunks_make_no_call() -> None:
    queue, driver = _queue()
    leases = queue.lease(LEASES, duration=30)
    driver.hang = True
    started = time.monotonic()
    results = queue.abandon_many(leases, timeout=TIMEOUT)
    elapsed = time.monotonic() - started
    assert elapsed < TIMEOUT + SLACK, f"abandon_many(timeout={TIMEOUT}) took {elapsed:.2f} s"
    assert driver.calls == 1  # the first chunk used the whole deadline; no later chunk called
    _assert_all_unavailable_and_held(results, leases)
    driver.hang = False
    assert queue.abandon_many(leases) == [None] * LEASES  # released: usable again at once


def test_complete_many_default_timeout_is_one_deadline_over_all_the_leases() -> None:
    # Without a timeout, the whole call gets the least time left on its leases,
    # at most the queue's call_timeout: here call_timeout, as the leases are long.
    queue, driver = _queue(call_timeout=TIMEOUT)
    leases = queue.lease(LEASES, duration=30)
    driver.hang = True
    started = time.monotonic()
    results = queue.complete_many(leases)
    elapsed = time.monotonic() - started
    assert elapsed < TIMEOUT + SLACK, f"complete_many took {elapsed:.2f} s"
    assert driver.calls == 1
    _assert_all_unavailable_and_held(results, leases)
    driver.hang = False
    assert queue.complete_many(leases) == [None] * LEASES


def test_renew_many_with_a_timeout_bounds_the_whole_call() -> None:
    queue, driver = _queue()
    leases = queue.lease(LEASES, duration=30)
    driver.hang = True
    started = time.monotonic()
    results = queue.renew_many(leases, timeout=TIMEOUT)
    elapsed = time.monotonic() - started
    assert elapsed < TIMEOUT + SLACK, f"renew_many(timeout={TIMEOUT}) took {elapsed:.2f} s"
    assert driver.calls == 1
    _assert_all_unavailable_and_held(results, leases)
    driver.hang = False
    assert queue.renew_many(leases) == [None] * LEASES


def test_renew_many_without_a_timeout_keeps_a_deadline_per_chunk() -> None:
    # The keeper's way: one hung chunk uses up its own lease's time, and the
    # next chunk still gets a call with a deadline of its own.
    queue, driver = _queue()
    hung, other = queue.lease(2, duration=0.5)
    driver.hang_receipts = {hung.receipt}
    driver.hang = True
    results = queue.renew_many([hung, other])
    assert isinstance(results[0], errors.BackendUnavailable)
    assert results[1] is None
    assert driver.calls == 1


def test_each_chunk_gets_at_most_what_is_left_of_the_call() -> None:
    # Each call answers after 0.2 s: within a 0.5 s call, two chunks settle,
    # the third is given the 0.1 s left and runs out, the fourth is not sent.
    queue, driver = _queue()
    leases = queue.lease(4, duration=30)
    driver.slow = 0.2
    results = queue.complete_many(leases, timeout=TIMEOUT)
    assert results[:2] == [None, None]
    assert all(isinstance(r, errors.BackendUnavailable) for r in results[2:]), results
    assert driver.calls == 3
    assert driver.given[0] <= TIMEOUT
    assert driver.given[1] <= TIMEOUT - 0.2
    assert driver.given[2] <= TIMEOUT - 0.4
    assert [lease.state for lease in leases] == [LeaseState.COMPLETED] * 2 + [LeaseState.HELD] * 2
