"""A lease's outcome is decided once: reported lost, or settled, never both.

Seen in a fault probe on PostgreSQL: the keeper's ``on_lost`` reported a lease
lost at its deadline while its ``complete()`` was in flight, and the complete
then returned success. Now whichever core records first decides: a lease
reported lost while its settle call was in flight stays lost, and the settle
raises that same :class:`LeaseLost` (the message was probably settled — a
redelivery is the at-least-once case, handled like any other). And a
checkpoint whose store write ends after the lease's deadline is no success
either (issue 33, item 7).

The driver here is the memory backend's with its calls held on an event, so
the race is made to happen every time, not by chance.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest

import leasekit
from leasekit import LeaseKeeper, LeaseLost, LeaseState, Queue
from leasekit.backends.memory import MemoryBroker, MemoryDriver

#: A short lease, so the deadline passes quickly in real time (core's clock).
LEASE = 0.4


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.005)


class _HeldDriver(MemoryDriver):
    """Settles and renewals wait for ``release`` once ``hold`` is set (a call in flight)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.hold = False
        self.in_flight = threading.Event()
        self.release = threading.Event()

    def _wait(self) -> None:
        if self.hold:
            self.in_flight.set()
            assert self.release.wait(10), "the test never released the call"

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        self._wait()
        return super().delete(receipts)

    def dead_letter(self, *args: object, **kwargs: object) -> object:
        self._wait()
        return super().dead_letter(*args, **kwargs)  # type: ignore[arg-type]

    def change_visibility(self, receipts: Sequence[str], seconds: float) -> list[object]:
        self._wait()
        return super().change_visibility(receipts, seconds)  # type: ignore[return-value]


def _queue(name: str) -> tuple[Queue, _HeldDriver]:
    driver = _HeldDriver(queue=name, broker=MemoryBroker())
    queue = Queue(driver, call_timeout=30)
    queue.create()
    return queue, driver


def _settle_while_reported_lost(
    settle: Callable[[list[leasekit.Lease]], object], count: int
) -> tuple[list[leasekit.Lease], object, dict[str, LeaseLost]]:
    """Lease ``count``, start ``settle`` with its call held, let the keeper report the loss."""
    queue, driver = _queue(f"race-{count}-{settle.__name__}")
    queue.send_many([b"%d" % i for i in range(count)])
    leases = queue.lease(count, duration=LEASE)
    assert len(leases) == count
    reported: dict[str, LeaseLost] = {}
    outcome: list[object] = []
    with LeaseKeeper(
        on_lost=lambda lease, error: reported.setdefault(lease.message.id, error)
    ) as k:
        driver.hold = True  # the keeper's renewals hang too: nothing extends the lease
        k.add_many(leases)
        worker = threading.Thread(target=lambda: outcome.append(_capture(settle, leases)))
        worker.start()
        assert driver.in_flight.wait(5)
        _wait_until(lambda: len(reported) == count, LEASE + 3, "the keeper to report the loss")
        driver.release.set()  # the settle call now succeeds on the backend
        worker.join(10)
    return leases, outcome[0], reported


def _capture(
    settle: Callable[[list[leasekit.Lease]], object], leases: list[leasekit.Lease]
) -> object:
    try:
        return settle(leases)
    except Exception as exc:
        return exc


def _complete(leases: list[leasekit.Lease]) -> object:
    leases[0].complete()
    return None


def _complete_many(leases: list[leasekit.Lease]) -> object:
    return leases[0]._queue.complete_many(leases)


def _dead_letter(leases: list[leasekit.Lease]) -> object:
    leases[0].dead_letter("poison")
    return None


@pytest.mark.parametrize("settle", [_complete, _dead_letter], ids=["complete", "dead_letter"])
def test_a_lease_reported_lost_while_its_settle_is_in_flight_does_not_settle(
    settle: Callable[[list[leasekit.Lease]], object],
) -> None:
    [lease], outcome, reported = _settle_while_reported_lost(settle, 1)
    assert isinstance(outcome, LeaseLost), f"the settle returned {outcome!r} after on_lost"
    assert outcome is reported[lease.message.id]  # the very error on_lost was given
    assert lease.state is LeaseState.LOST


def test_complete_many_reports_each_lease_reported_lost_meanwhile_as_lost() -> None:
    leases, outcome, reported = _settle_while_reported_lost(_complete_many, 3)
    assert isinstance(outcome, list) and len(outcome) == 3
    for lease, result in zip(leases, outcome, strict=True):
        assert result is reported[lease.message.id], f"{lease.message.id}: {result!r}"
        assert lease.state is LeaseState.LOST


def test_a_settle_that_returns_before_the_deadline_is_a_success_and_no_loss() -> None:
    queue, _ = _queue("race-in-time")
    queue.send(b"x")
    [lease] = queue.lease(1, duration=30)
    reported: list[LeaseLost] = []
    with LeaseKeeper(on_lost=lambda lz, error: reported.append(error)) as keeper:
        keeper.add(lease)
        lease.complete()
    assert lease.state is LeaseState.COMPLETED and reported == []


class _SlowStore(leasekit.MemoryCheckpointStore):
    """A checkpoint store whose save ends only after the lease it saves for has ended."""

    lease: leasekit.Lease | None = None

    def save(self, message_id: str, data: bytes, generation: int) -> bool:
        assert self.lease is not None
        _wait_until(lambda: self.lease is not None and self.lease.time_left < -0.05, 5, "expiry")
        return super().save(message_id, data, generation)


def test_a_checkpoint_whose_store_write_ends_after_the_deadline_is_lost() -> None:
    store = _SlowStore()
    driver = MemoryDriver(queue="slow-store", broker=MemoryBroker())
    driver.capabilities = driver.capabilities.replace(native_checkpoint=False)
    queue = Queue(driver, checkpoint_store=store)
    queue.create()
    queue.send(b"x")
    [lease] = queue.lease(1, duration=LEASE)
    store.lease = lease
    with pytest.raises(LeaseLost, match="checkpoint store's write ended after"):
        lease.checkpoint(b"progress")
    assert lease.state is LeaseState.LOST
    with pytest.raises(LeaseLost):
        lease.complete()
