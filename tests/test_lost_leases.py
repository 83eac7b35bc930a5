"""A driver that learns of lost leases without a call reports them; core marks them lost at once.

The memory driver stands in for Service Bus (whose connection watch is tested
through the fault proxy in tests/backends/test_azure_service_bus*.py): it says
it reports lost leases, and the test calls the report core gave it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leasekit import LeaseLost, LeaseState
from leasekit.backends.memory import MemoryBroker, MemoryDriver
from leasekit.queue import Queue
from leasekit.spi import DriverError, ErrorCode


class ReportingDriver(MemoryDriver):
    reports_lost_leases = True


def _gone() -> DriverError:
    return DriverError(ErrorCode.LEASE_LOST, "the connection is gone", backend_code="Gone")


@pytest.fixture
def queue() -> Iterator[Queue]:
    q = Queue(ReportingDriver(queue="lost", broker=MemoryBroker()))
    q.create()
    try:
        yield q
    finally:
        q.close()


def test_core_gives_a_reporting_driver_a_report_once_it_holds_leases(queue: Queue) -> None:
    assert queue.driver.leases_lost is None
    queue.send(b"x")
    queue.lease(1)
    assert callable(queue.driver.leases_lost)


def test_reported_leases_are_lost_at_once_and_each_reported_once(queue: Queue) -> None:
    queue.send_many([b"a", b"b", b"c"])
    a, b, c = queue.lease(3)
    told: list[tuple[bytes, LeaseLost]] = []
    for lease in (a, b, c):
        lease.on_lost(lambda lz, error: told.append((lz.message.body, error)))
    report = queue.driver.leases_lost
    assert report is not None
    report([a.receipt, b.receipt, "never-held"], _gone())
    report([a.receipt], _gone())  # a second report changes nothing
    assert a.state is LeaseState.LOST and b.state is LeaseState.LOST
    assert a.lost.is_set() and b.lost.is_set()
    assert c.state is LeaseState.HELD
    assert sorted(body for body, _ in told) == [b"a", b"b"]
    error = told[0][1]
    assert error.backend_code == "Gone" and isinstance(error.__cause__, DriverError)
    with pytest.raises(LeaseLost):
        a.complete()
    c.complete()


def test_a_settled_lease_is_not_marked_lost(queue: Queue) -> None:
    queue.send(b"x")
    [lease] = queue.lease(1)
    lease.complete()
    report = queue.driver.leases_lost
    assert report is not None
    report([lease.receipt], _gone())
    assert lease.state is LeaseState.COMPLETED


def test_an_error_that_is_not_a_lost_lease_still_loses_it(queue: Queue) -> None:
    queue.send(b"x")
    [lease] = queue.lease(1)
    report = queue.driver.leases_lost
    assert report is not None
    report([lease.receipt], DriverError(ErrorCode.UNAVAILABLE, "reset"))
    assert lease.state is LeaseState.LOST
    with pytest.raises(LeaseLost, match="reset"):
        lease.check()


def test_a_driver_that_does_not_report_gets_nothing(broker: MemoryBroker) -> None:
    q = Queue(MemoryDriver(queue="quiet", broker=broker))
    q.create()
    q.send(b"x")
    q.lease(1)
    assert q.driver.leases_lost is None
    q.close()


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker()
