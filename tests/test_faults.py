"""Promises under network faults: a fault-injecting proxy between leasekit and each server.

Each scenario runs on the MNS emulator, moto's SQS, Azurite and leasekit's
Service Bus emulator (the ``fault_target`` fixture), the consumer under test
talking through a proxy that a test switches between ``pass``, ``drop`` (reset
every connection) and ``blackhole`` (accept, never answer), and a rival talking
to the server directly. What is asserted is leasekit's promise: a lease is either kept or
reported lost within a second of its expiry, never silently both; no message
is lost; a worker keeps working through outages; and nothing blocks for longer
than a lease or a call timeout.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import pytest
from _fixtures.fault_targets import FaultTarget

import leasekit
from leasekit import LeaseKeeper, LeaseLost, LeaseState, Queue

#: pytest's ``record_property`` fixture: the numbers docs/reliability.md reports.
RecordProperty = Callable[[str, object], None]
T = TypeVar("T")
#: How late (seconds after its deadline) a lease may be reported lost.
LOST_WITHIN = 1.0
#: The Consumer's physical lease in the outage scenarios: longer than a cut.
LEASE = 5


def _wait_until(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """Poll ``condition`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.01)


def _lease_all(queue: Queue, count: int, duration: float | None) -> list[leasekit.Lease]:
    leases: list[leasekit.Lease] = []
    deadline = time.monotonic() + 10
    while len(leases) < count and time.monotonic() < deadline:
        leases += queue.lease(count - len(leases), duration=duration, wait=1)
    assert len(leases) == count, f"leased {len(leases)} of {count}"
    return leases


def test_a_lease_whose_outage_ends_before_its_expiry_is_kept(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    proxied, direct = fault_target.queues(lease=4)
    direct.send(b"kept through the outage")
    [lease] = _lease_all(proxied, 1, duration=4)
    # Renewing at half-time, 2-2.4 s before expiry, the renewal goes into the outage.
    with LeaseKeeper(renew_at=0.5) as keeper, keeper.hold(lease):
        fault_target.proxy.blackhole()
        began = time.monotonic()
        # The outage ends 1.5 s before the lease would: the renewal sent into it was
        # held, not lost, and answers in time. (1 s before, with the renewal due 1.2-1.6 s
        # before expiry, Service Bus lost one in a fresh clone's run: the held renewal
        # reached the emulator after the lock ended, on a machine busy with other tests.)
        _wait_until(lambda: lease.time_left < 1.5, 5, "1.5 s of the lease left")
        fault_target.proxy.pass_()
        record_property("outage_s", round(time.monotonic() - began, 2))
        _wait_until(lambda: keeper.stats.renewed >= 1, 3, "a renewal to succeed")
        record_property("time_left_after_renewal_s", round(lease.time_left, 2))
        assert lease.state is LeaseState.HELD and not lease.lost.is_set()
        assert direct.lease(1) == [], "the message was handed to a rival"
        lease.complete()
    assert keeper.stats.lost == 0
    assert direct.lease(1, wait=1) == [], "the completed message came back"


def test_a_lease_whose_expiry_passes_in_an_outage_is_lost_within_a_second(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    proxied, direct = fault_target.queues(lease=2)
    direct.send_many([b"%d" % i for i in range(5)])
    leases = _lease_all(proxied, 5, duration=2)
    reported: dict[str, float] = {}

    def on_lost(lease: leasekit.Lease, error: LeaseLost) -> None:
        reported.setdefault(lease.message.id, time.monotonic())

    with LeaseKeeper(on_lost=on_lost) as keeper:
        keeper.add_many(leases)
        fault_target.proxy.blackhole()  # the renewals hang; the outage never ends in time
        deadlines = {lease.message.id: time.monotonic() + lease.time_left for lease in leases}
        for lease in leases:
            assert lease.lost.wait(2 + LOST_WITHIN + 1), "a lease past its expiry was not lost"
        _wait_until(lambda: len(reported) == 5, 1, "on_lost for every lease")
        lateness = [reported[i] - deadlines[i] for i in deadlines]
        record_property("reported_lost_after_expiry_max_s", round(max(lateness), 3))
        for lease in leases:
            late = reported[lease.message.id] - deadlines[lease.message.id]
            assert late <= LOST_WITHIN, f"reported {late:.2f} s after the lease ended"
            assert lease.state is LeaseState.LOST
            with pytest.raises(LeaseLost):
                lease.check()
        assert keeper.stats.lost == 5
        # A rival takes the messages while the hung renewals are still in flight...
        rival = _lease_all(direct, 5, duration=None)
        assert {r.message.id for r in rival} == set(deadlines)
        assert all(r.message.delivery_count == 2 for r in rival)
        # ... and when the network comes back, the late renewals change nothing here: on a
        # backend that cannot detect stale receipts they "succeed", and still count as lost.
        fault_target.proxy.pass_()
        for lease in leases:
            with pytest.raises(LeaseLost):
                lease.complete()  # never a second completion of a message the rival holds
    assert direct.complete_many(rival) == [None] * 5
    assert direct.lease(1, wait=1) == []


def test_a_hung_renewal_blocks_neither_reading_nor_settling_the_lease(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    proxied, direct = fault_target.queues(lease=3)
    direct.send(b"x")
    [lease] = _lease_all(proxied, 1, duration=3)
    with LeaseKeeper() as keeper, keeper.hold(lease):
        fault_target.proxy.blackhole()
        _wait_until(lambda: lease._record.busy == "renew", 3, "the renewal to be in flight")
        started = time.monotonic()
        assert not lease.lost.is_set() and lease.state is LeaseState.HELD
        assert lease.receipt and lease.expires_at
        read = time.monotonic() - started
        record_property("read_while_renewal_hangs_ms", round(read * 1000, 2))
        assert read < 0.1, "reading a lease waited for the network"
        left = lease.time_left
        started = time.monotonic()
        with pytest.raises(leasekit.LeaseError):
            lease.complete()  # waits for the hung renewal at most until the lease ends
        waited = time.monotonic() - started
        record_property("complete_returned_after_expiry_s", round(waited - left, 3))
        assert waited <= left + LOST_WITHIN + 0.5
        assert lease.state is LeaseState.LOST


def test_a_hung_endpoint_delays_no_other_queues_renewals(
    fault_target: FaultTarget, tmp_path: object, record_property: RecordProperty
) -> None:
    proxied, direct = fault_target.queues(lease=2)
    direct.send_many([b"%d" % i for i in range(8)])
    hung = _lease_all(proxied, 8, duration=2)
    url = f"sqlite:///{tmp_path}/side.db?queue=side"
    with leasekit.open(url, create=True) as side, leasekit.open(url) as other:
        side.send(b"must not lapse")
        [kept] = side.lease(1, duration=1)
        with LeaseKeeper(workers=2) as keeper:
            keeper.add_many(hung)
            keeper.add(kept)
            fault_target.proxy.blackhole()
            renewed_before = keeper.stats.renewed
            until = time.monotonic() + 4  # four of the sqlite lease's lifetimes
            while time.monotonic() < until:
                assert other.lease(1, duration=5, wait=0.2) == [], "the sqlite lease lapsed"
            assert kept.state is LeaseState.HELD
            assert all(lease.state is LeaseState.LOST for lease in hung)
            record_property("sqlite_renewals_during_outage", keeper.stats.renewed - renewed_before)
            started = time.monotonic()
        stopped = time.monotonic() - started
        record_property("stop_s", round(stopped, 3))
        assert stopped <= keeper.stop_timeout + 0.5, "stop() waited too long"
        kept.complete()


def test_keeper_stop_returns_promptly_while_renewals_hang(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    # 6 s leases: with 3 s ones, a run beside a busy process saw all four expire
    # before any renewal started (each lost "1.5 s ago"), and nothing to stop.
    proxied, direct = fault_target.queues(lease=6)
    direct.send_many([b"%d" % i for i in range(4)])
    leases = _lease_all(proxied, 4, duration=6)
    keeper = LeaseKeeper()
    keeper.add_many(leases)
    fault_target.proxy.blackhole()  # the renewals, due in about 4 s, go into it
    _wait_until(lambda: any(lz._record.busy == "renew" for lz in leases), 8, "renewals in flight")
    started = time.monotonic()
    keeper.stop()
    stopped = time.monotonic() - started
    record_property("stop_s", round(stopped, 3))
    assert stopped <= keeper.stop_timeout + 0.5


class _Cuts:
    """Cut the network (``drop``) for ``length`` seconds every ``every`` seconds."""

    def __init__(self, target: FaultTarget, *, first: float, length: float, every: float) -> None:
        self.target = target
        self.first, self.length, self.every = first, length, every
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        if self._stop.wait(self.first):
            return
        while True:
            self.target.proxy.drop()
            self.count += 1
            if self._stop.wait(self.length):
                break
            self.target.proxy.pass_()
            if self._stop.wait(self.every - self.length):
                return
        self.target.proxy.pass_()

    def __enter__(self) -> _Cuts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_a_consumer_rides_out_repeated_network_cuts(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    """The issue's scenario: a 3 s cut every 10 s while 500 messages are drained."""
    proxied, direct = fault_target.queues(lease=LEASE)
    bodies = [f"{i}-{uuid.uuid4().hex[:6]}".encode() for i in range(500)]
    direct.send_many(bodies)
    handled: Counter[bytes] = Counter()
    lock = threading.Lock()

    def handler(message: leasekit.Message) -> None:
        time.sleep(0.02)
        with lock:
            handled[message.body] += 1

    consumer = leasekit.Consumer(
        proxied, handler, concurrency=4, lease_duration=LEASE, handle_signals=False
    )
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(consumer.run(until_idle=True))
        except BaseException as exc:
            outcome.append(exc)

    began = time.monotonic()
    with _Cuts(fault_target, first=1.0, length=3.0, every=10.0) as cuts:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join(120)
    record_property("run_s", round(time.monotonic() - began, 1))
    record_property("cuts", cuts.count)
    assert not worker.is_alive(), "run() did not finish"
    assert cuts.count >= 1
    assert outcome and isinstance(outcome[0], leasekit.ConsumerStats), f"run() ended: {outcome}"
    stats = outcome[0]
    # A receive whose answer a cut swallowed leased its messages to nobody: they are
    # not lost, they come back when that lease ends (run(until_idle=True) does not
    # wait for invisible messages). Take them as a second consumer would.
    back_by = time.monotonic() + LEASE + 3
    record_property("left_in_flight_by_a_cut", len(set(bodies) - set(handled)))
    while set(bodies) - set(handled) and time.monotonic() < back_by:
        for lease in direct.lease(10, wait=1):
            handled[lease.message.body] += 1
            lease.complete()
    lost = set(bodies) - set(handled)
    duplicates = sum(count - 1 for count in handled.values())
    record_property("lost", len(lost))
    record_property("duplicates", duplicates)
    record_property("settle_retries", stats.settle_retries)
    record_property("receive_errors", stats.receive_errors)
    assert not lost, f"{len(lost)} messages never handled; {stats}"
    allowed = 5
    if fault_target.name == "azure-service-bus":
        # Service Bus drops the locks of a reset connection ("Service Bus does not
        # support recovery of existing AMQP links on a different connection",
        # Microsoft Learn, Message transfers, locks, and settlement): what the
        # consumer held when a cut came (its buffer and its handlers' leases) cannot
        # be completed and is handled again after its lock ends.
        allowed = max(allowed, cuts.count * (consumer.settings.concurrency + consumer.prefetch))
    assert duplicates <= allowed, f"{duplicates} messages handled twice (allowed {allowed})"
    record_property("connections_reset", fault_target.proxy.stats["resets"])
    if fault_target.waits_out_short_cuts:
        # Its calls wait (within their deadlines) for the pool to reconnect: a 3 s cut
        # shows as connections reset under the consumer, not as failed calls.
        assert fault_target.proxy.stats["resets"] >= 1, "the cut never hit the consumer"
    else:
        assert stats.settle_retries + stats.receive_errors >= 1, "the cut never hit the consumer"
    assert direct.lease(1, wait=1) == [], "a handled message is still in the queue"


def test_a_consumer_keeps_receiving_through_an_outage(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    # A receive that meets the outage may wait it out until its call timeout
    # (PostgreSQL waits for a connection that long): 2 s, so two fail within 10 s.
    proxied, direct = fault_target.queues(lease=10, call_timeout=CALL_TIMEOUT)
    handled: list[bytes] = []
    consumer = leasekit.Consumer(
        proxied, lambda m: handled.append(m.body), lease_duration=10, handle_signals=False
    )
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(consumer.run())
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        fault_target.proxy.drop()
        _wait_until(lambda: consumer.stats.receive_errors >= 2, 10, "failed receives")
        assert worker.is_alive() and not outcome, f"run() ended in an outage: {outcome}"
        fault_target.proxy.pass_()
        back = time.monotonic()
        direct.send_many([b"after-%d" % i for i in range(10)])
        _wait_until(lambda: len(handled) == 10, 15, "the messages sent after the outage")
        record_property("handled_10_after_outage_s", round(time.monotonic() - back, 2))
        record_property("receive_errors", consumer.stats.receive_errors)
    finally:
        fault_target.proxy.pass_()
        consumer.stop()
        worker.join(15)
    assert not worker.is_alive()
    assert outcome and isinstance(outcome[0], leasekit.ConsumerStats), f"run() ended: {outcome}"
    assert sorted(handled) == sorted(b"after-%d" % i for i in range(10))


# ------------------------------------------------- every bound holds as a whole

#: The queue's call_timeout in the bound scenarios: what every call must keep to.
CALL_TIMEOUT = 2.0
#: Slack on a bound: scheduling on a shared 2-core machine, a socket's last read.
BOUND_SLACK = 1.0


def test_a_send_ends_by_its_call_timeout_under_a_blackhole(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    proxied, _direct = fault_target.queues(lease=5, call_timeout=CALL_TIMEOUT)
    proxied.send(b"warm up: the connection is open before the partition")
    fault_target.proxy.blackhole()
    started = time.monotonic()
    with pytest.raises(leasekit.BackendUnavailable):
        proxied.send(b"into the blackhole")
    took = time.monotonic() - started
    record_property("send_under_blackhole_s", round(took, 2))
    assert took <= CALL_TIMEOUT + BOUND_SLACK, f"send took {took:.1f} s (call_timeout=2)"


def test_a_settle_batch_ends_by_its_timeout_under_a_blackhole(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    proxied, direct = fault_target.queues(lease=10)
    direct.send_many([b"%d" % i for i in range(16)])
    leases = _lease_all(proxied, 16, duration=10)
    fault_target.proxy.blackhole()
    started = time.monotonic()
    try:  # a batch call that fails as a whole raises; per-lease failures are results
        results: list[object] = list(proxied.abandon_many(leases, timeout=2))
    except leasekit.BackendUnavailable as exc:
        results = [exc] * len(leases)
    took = time.monotonic() - started
    record_property("abandon_many_16_under_blackhole_s", round(took, 2))
    assert took <= 2 + BOUND_SLACK, f"abandon_many(16 leases, timeout=2) took {took:.1f} s"
    assert all(isinstance(r, leasekit.LeaseError) for r in results)


def test_consumer_stop_is_bounded_under_a_blackhole(
    fault_target: FaultTarget, record_property: RecordProperty, request: pytest.FixtureRequest
) -> None:
    """stop() in a partition: the give-backs are bounded calls, run() returns on time."""
    proxied, direct = fault_target.queues(lease=10, call_timeout=CALL_TIMEOUT)
    direct.send_many([b"%d" % i for i in range(12)])
    release = threading.Event()
    started_handlers = threading.Semaphore(0)

    def handler(message: leasekit.Message) -> None:
        started_handlers.release()
        release.wait(30)

    consumer = leasekit.Consumer(
        proxied,
        handler,
        concurrency=2,
        lease_duration=10,
        shutdown_grace=1,
        handle_signals=False,
    )
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(consumer.run()))
    worker.start()
    try:
        for _ in range(2):
            assert started_handlers.acquire(timeout=10), "the handlers never started"
        _wait_until(lambda: consumer.stats.buffered > 0, 10, "messages buffered")
        fault_target.proxy.blackhole()
        began = time.monotonic()
        consumer.stop()
        worker.join(60)
        took = time.monotonic() - began
    finally:
        release.set()
        fault_target.proxy.pass_()
        consumer.stop()
        worker.join(30)
    record_property("run_returned_after_stop_s", round(took, 2))
    # The receive in flight ends by its long poll (1 s) plus call_timeout; the
    # buffered leases are given back in one call bounded by 2 s; running handlers
    # get shutdown_grace (1 s), then their leases are given back in one more.
    bound = (1 + CALL_TIMEOUT) + 2 + 1 + 2 + BOUND_SLACK
    assert took <= bound, f"run() returned {took:.1f} s after stop() (bound {bound:g} s)"
    assert outcome and isinstance(outcome[0], leasekit.ConsumerStats), f"run() ended: {outcome}"


def test_the_first_call_into_a_partition_ends_by_its_call_timeout(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    """A handle opened during a blackhole: its first send and lease (the connection's
    open, handshake and authentication included) end by call_timeout with
    BackendUnavailable, and the same handle works once the partition ends."""
    proxied, direct = fault_target.queues(lease=5, blackholed=True, call_timeout=CALL_TIMEOUT)
    for name, call in (
        ("send", lambda: proxied.send(b"into the partition")),
        ("lease", lambda: proxied.lease(1, wait=0)),
    ):
        started = time.monotonic()
        outcome = _within(call, CALL_TIMEOUT + BOUND_SLACK + 10, f"the first {name}")
        took = time.monotonic() - started
        record_property(f"first_{name}_in_partition_s", round(took, 2))
        assert isinstance(outcome, leasekit.BackendUnavailable), f"{name} gave {outcome!r}"
        assert took <= CALL_TIMEOUT + BOUND_SLACK, f"the first {name} took {took:.1f} s"
    fault_target.proxy.pass_()
    sent = _call_until_it_works(lambda: proxied.send(b"after the partition"), CALL_TIMEOUT * 5)
    leases: list[leasekit.Lease] = []
    deadline = time.monotonic() + 15
    while not any(lz.message.id == sent for lz in leases) and time.monotonic() < deadline:
        leases += _call_until_it_works(lambda: proxied.lease(10, wait=1), CALL_TIMEOUT * 5)
    mine = [lz for lz in leases if lz.message.id == sent]
    assert mine, "the handle did not lease the message it sent after the partition"
    assert mine[0].message.body == b"after the partition"
    assert proxied.complete_many(leases) == [None] * len(leases)
    assert direct.lease(1, wait=1) == [], "a completed message came back"


def _within(call: Callable[[], object], limit: float, what: str) -> object:
    """What ``call()`` returned or raised, run on a thread; fail if it takes over ``limit``."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        pytest.fail(f"{what} did not return within {limit:g} s")
    return outcome[0]


def _call_until_it_works(call: Callable[[], T], within: float) -> T:
    """``call()``, again after each BackendUnavailable (a connection the partition broke)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return call()
        except leasekit.BackendUnavailable:
            if time.monotonic() > deadline:
                raise


def test_a_consumer_started_in_a_partition_stops_within_a_bound(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    """A worker started during an outage: stop() ends run() within its bound."""
    proxied, _direct = fault_target.queues(lease=10, blackholed=True, call_timeout=CALL_TIMEOUT)
    consumer = leasekit.Consumer(proxied, lambda m: None, lease_duration=10, handle_signals=False)
    outcome: list[object] = []
    accepted = fault_target.proxy.stats["accepted"]
    worker = threading.Thread(target=lambda: outcome.append(consumer.run()))
    worker.start()
    try:
        # Its first call has reached the network (the proxy took its connection).
        _wait_until(
            lambda: fault_target.proxy.stats["accepted"] > accepted, 10, "the first connection"
        )
        began = time.monotonic()
        consumer.stop()
        worker.join(60)
        took = time.monotonic() - began
    finally:
        fault_target.proxy.pass_()
        consumer.stop()
        worker.join(30)
    record_property("run_returned_after_stop_s", round(took, 2))
    # The receive in flight ends by its long poll (1 s) plus call_timeout.
    bound = 1 + CALL_TIMEOUT + BOUND_SLACK
    assert took <= bound, f"run() returned {took:.1f} s after stop() (bound {bound:g} s)"
    assert outcome and isinstance(outcome[0], leasekit.ConsumerStats), f"run() ended: {outcome}"


def test_no_lease_is_lost_to_a_short_cut_that_ends_well_before_expiry(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    """A 0.5 s cut ending 4.5 s before 6 s leases expire costs none of them."""
    proxied, direct = fault_target.queues(lease=6)
    direct.send_many([b"%d" % i for i in range(10)])
    leases = _lease_all(proxied, 10, duration=6)
    with LeaseKeeper() as keeper:
        keeper.add_many(leases)
        _wait_until(
            lambda: min(lz.time_left for lz in leases) <= 5.0, 3, "1 s of the leases to pass"
        )
        fault_target.proxy.drop()  # every connection reset; new ones too
        _wait_until(lambda: min(lz.time_left for lz in leases) <= 4.5, 3, "the cut to last 0.5 s")
        fault_target.proxy.pass_()
        # Past the first expiry, and the renewal after it.
        first_expiry = time.monotonic() + max(lz.time_left for lz in leases)
        _wait_until(lambda: time.monotonic() > first_expiry + 1.0, 10, "the first expiry")
        lost = [lz for lz in leases if lz.state is not LeaseState.HELD]
        record_property("lost_of_10", len(lost))
        if fault_target.name == "azure-service-bus":
            # Service Bus drops the locks of a reset connection ("the lock is dropped
            # since Service Bus does not support recovery of existing AMQP links on a
            # different connection", Microsoft Learn, Message transfers, locks, and
            # settlement): every lease received before the cut is lost at the reset
            # (the driver's connection watch reports them, core marks them, the keeper
            # counts and reports them), none is settled, and each comes back when its
            # lock ends.
            assert len(lost) == 10, f"{len(lost)} of 10 lost"
            assert all(lz.state is LeaseState.LOST for lz in lost)
            assert keeper.stats.lost == 10
            assert all(isinstance(r, LeaseLost) for r in proxied.complete_many(leases))
            back = _lease_all(direct, 10, duration=None)
            assert {b.message.id for b in back} == {lz.message.id for lz in leases}
            assert direct.complete_many(back) == [None] * 10
            return
        assert keeper.stats.lost == 0 and not lost, f"{len(lost)} of 10 leases lost to the cut"
        assert direct.lease(1) == [], "a kept message was handed to a rival"
        assert proxied.complete_many(leases) == [None] * 10
    assert direct.lease(1, wait=1) == [], "a completed message came back"


@pytest.mark.parametrize("cut", [1.4, 1.6], ids=["cut-1.4s", "cut-1.6s"])
def test_no_lease_is_lost_to_a_cut_over_the_keepers_renewal_point(
    fault_target: FaultTarget, record_property: RecordProperty, cut: float
) -> None:
    """6 s leases, connections dropped from 3 s: the first renewal (3.6-4.2 s) falls in the cut.

    The network is back 1.6 s (1.4 s for the 1.6 s cut) before the leases
    expire: the renewal, failing in the cut and retried within the leases'
    time, must get through then (issue 33: PostgreSQL's calls waited for the
    connection pool's reconnect schedule, 1 s then 2 s, and lost all 20; that
    schedule's second try would come at 6 s, the leases' end). The cut began
    at 3.5 s until Pub/Sub lost all 20 in a run of twelve test workers beside
    a busy process: 0.9 s after a 1.6 s cut was too little for a starved
    client's gRPC reconnect and retried renewal.
    """
    proxied, direct = fault_target.queues(lease=6)
    direct.send_many([b"%d" % i for i in range(20)])
    leases = _lease_all(proxied, 20, duration=6)
    expiry = time.monotonic() + min(lz.time_left for lz in leases)
    reported: dict[str, float] = {}

    def on_lost(lease: leasekit.Lease, error: LeaseLost) -> None:
        reported.setdefault(lease.message.id, time.monotonic())

    with LeaseKeeper(on_lost=on_lost) as keeper:
        keeper.add_many(leases)
        _wait_until(lambda: time.monotonic() >= expiry - 3.0, 6, "3 s of the leases to pass")
        fault_target.proxy.drop()  # every connection reset; new ones too
        cut_at = time.monotonic()
        _wait_until(lambda: time.monotonic() >= cut_at + cut, 3, f"the cut to last {cut:g} s")
        fault_target.proxy.pass_()
        record_property("cut_s", round(time.monotonic() - cut_at, 2))
        record_property("back_before_expiry_s", round(expiry - time.monotonic(), 2))
        # Past the first expiry, and the renewal after it.
        _wait_until(lambda: time.monotonic() > expiry + 1.0, 8, "the first expiry")
        lost = [lz for lz in leases if lz.state is not LeaseState.HELD]
        record_property("lost_of_20", len(lost))
        if fault_target.name == "azure-service-bus":
            # Service Bus drops the locks of a reset connection (see the 0.5 s cut
            # above): every lease is lost at the reset (the driver's connection watch
            # reports them, core marks them, before their deadline, and the keeper's
            # on_lost hears of each then), none is settled by the first holder, and
            # each message comes back once, to the rival.
            assert len(lost) == 20, f"{len(lost)} of 20 lost"
            assert all(lz.state is LeaseState.LOST for lz in lost)
            assert keeper.stats.lost == 20 and set(reported) == {lz.message.id for lz in leases}
            assert max(reported.values()) < expiry, "a reset's loss was reported only at expiry"
            assert all(isinstance(r, LeaseLost) for r in proxied.complete_many(leases))
            back = _lease_all(direct, 20, duration=None)
            assert {b.message.id for b in back} == {lz.message.id for lz in leases}
            assert direct.complete_many(back) == [None] * 20
            assert direct.lease(1, wait=1) == [], "a message came back twice"
            return
        assert keeper.stats.lost == 0 and not lost, f"{len(lost)} of 20 leases lost to the cut"
        assert not reported
        assert direct.lease(1) == [], "a kept message was handed to a rival"
        assert proxied.complete_many(leases) == [None] * 20
    assert direct.lease(1, wait=1) == [], "a completed message came back"


def _get_status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_readiness_sees_a_partition_and_its_end(
    fault_target: FaultTarget, record_property: RecordProperty
) -> None:
    """/readyz turns 503 within the documented time of a partition, and 200 after it."""
    proxied, _direct = fault_target.queues(lease=10)
    consumer = leasekit.Consumer(proxied, lambda m: None, lease_duration=10, handle_signals=False)
    worker = threading.Thread(target=consumer.run)
    with leasekit.HealthServer(consumer) as server:
        worker.start()
        try:
            ready = f"{server.url}/readyz"
            _wait_until(lambda: _get_status(ready) == 200, 15, "the consumer to be ready")
            fault_target.proxy.blackhole()
            began = time.monotonic()
            # Documented (docs/health.md): a receive that waits past its 1 s long
            # poll by slow_receive (5 s), or fails; on Service Bus a probe after
            # 2 s of silence that gets no answer in 2 s.
            _wait_until(lambda: _get_status(ready) == 503, 6 + 2, "/readyz to turn 503")
            record_property("not_ready_after_s", round(time.monotonic() - began, 2))
            fault_target.proxy.pass_()
            back = time.monotonic()
            _wait_until(lambda: _get_status(ready) == 200, 15, "/readyz to turn 200 again")
            record_property("ready_again_after_s", round(time.monotonic() - back, 2))
        finally:
            fault_target.proxy.pass_()
            consumer.stop()
            worker.join(30)
    assert not worker.is_alive()
