"""The conformance suite: one test (or small group) per semantic rule of DESIGN.md.

Tests drive the backend *through* :class:`leasekit.Queue`, as an app would. A
check the backend's :class:`~leasekit.Capabilities` exclude is skipped with the
reason; nothing is passed silently. A vendor runs it by subclassing
:class:`ConformanceSuite` and providing a ``harness`` fixture::

    class TestMyBackend(ConformanceSuite):
        @pytest.fixture(scope="class")
        @classmethod
        def harness(cls):
            harness = UrlHarness("mybackend", endpoint=...)
            yield harness
            harness.close()

or from the command line: ``pytest --pyargs leasekit.conformance --leasekit-backend URL``.

Waiting is always a poll with a deadline (``queue.lease(wait=...)``), never a
bare sleep; expiry tests use the harness's shortest lease.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest

from leasekit import (
    InvalidArgument,
    InvalidLeaseDuration,
    Lease,
    LeaseLost,
    LeaseStateError,
    MessageTooLarge,
    QueueNotFound,
    UnsupportedOperation,
)
from leasekit.capabilities import COUNT_FIELDS
from leasekit.queue import Queue

from .checkpoint_suite import CheckpointSuite
from .harness import CountingDriver, Harness
from .ordered import OrderedSuite

__all__ = ["ConformanceSuite", "conformance_property"]

F = TypeVar("F", bound=Callable[..., Any])

#: Slack added to every expiry deadline: emulators and services round lease
#: ends to whole seconds and poll their clocks.
MARGIN = 5.0
#: Longest wait for an approximate count to show a change (SQS documents up to a
#: minute after traffic stops); local backends and the emulators are exact at once.
COUNT_WAIT = 60.0
#: Pause between two reads of the counts while waiting for one.
COUNT_POLL = 0.2


def conformance_property(name: str) -> Callable[[F], F]:
    """Mark a test with the semantic property it checks (a row of the compatibility matrix)."""

    def mark(fn: F) -> F:
        fn.conformance_property = name  # type: ignore[attr-defined]
        return fn

    return mark


def _twin(lease: Lease, receipt: str | None = None) -> Lease:
    """A second Lease object on the same receipt: lets a test reuse a receipt after settling.

    A lease of another face of the API (the async harness's) makes its own twin.
    """
    twin = getattr(lease, "twin", None)
    if twin is not None:
        made: Lease = twin(receipt)
        return made
    return Lease(
        lease.queue,
        lease.message,
        receipt or lease.receipt,
        lease.expires_at,
        lease.duration,
        lease.raw_message,
    )


def _lease_one(queue: Queue, duration: float, wait: float) -> Lease:
    leases = queue.lease(1, duration=duration, wait=wait)
    assert leases, f"expected a message on {queue.name!r} within {wait:g} s, got none"
    return leases[0]


def _lease_exactly(queue: Queue, count: int, duration: float) -> list[Lease]:
    """Lease ``count`` messages (several receives if need be), polling with a deadline."""
    leases: list[Lease] = []
    deadline = time.monotonic() + 30
    while len(leases) < count and time.monotonic() < deadline:
        leases.extend(queue.lease(count - len(leases), duration=duration, wait=1))
    assert len(leases) == count, f"leased {len(leases)} of {count} messages within 30 s"
    return leases


def _require_count(queue: Queue, name: str) -> None:
    """Skip, with the capability as the reason, unless ``stats()`` counts ``name``."""
    caps = queue.capabilities
    if not caps.queue_stats:
        pytest.skip("backend cannot report counts (queue_stats=False)")
    if name not in caps.counted:
        pytest.skip(
            f"backend does not count {name.replace('_', '-')} messages "
            f"(capabilities.counted: {', '.join(sorted(caps.counted)) or 'none'})"
        )


def _await_count(
    queue: Queue, name: str, expected: int, step: str, hold: Sequence[Lease] = ()
) -> None:
    """Poll ``stats()`` until count ``name`` is ``expected``; fail after :data:`COUNT_WAIT`.

    Cloud counts are approximate and lag (SQS: up to a minute), so the check is a
    poll with a deadline. The leases in ``hold`` are renewed when half their time
    is gone, so a slow count cannot turn a leased message visible again.
    """
    deadline = time.monotonic() + COUNT_WAIT
    while True:
        value = getattr(queue.stats(), name)
        if value == expected:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"{name} count is {value}, expected {expected} {step} "
                f"(polled stats() for {COUNT_WAIT:g} s)"
            )
        now = time.time()
        for lease in hold:
            if lease.expires_at.timestamp() - now < lease.duration / 2:
                lease.renew()
        time.sleep(COUNT_POLL)  # an approximate count has no event to wait on


def _wait_redelivery(queue: Queue, duration: float, lease_duration: float) -> Lease:
    """Lease again after ``duration`` expires: poll with a deadline, not a sleep."""
    return _lease_one(queue, lease_duration, wait=duration + MARGIN)


class ConformanceSuite(CheckpointSuite, OrderedSuite):
    """Mixin of conformance tests; a subclass supplies a ``harness`` fixture.

    The checkpoint section (:class:`~leasekit.conformance.CheckpointSuite`) and the
    *ordered* section (:class:`~leasekit.conformance.OrderedSuite`) come with it.
    """

    # ----------------------------------------------------------- invisibility

    @conformance_property("invisibility")
    def test_leased_message_is_invisible_to_other_consumers(
        self, queue: Queue, long: float
    ) -> None:
        queue.send(b"only-one")
        first = _lease_one(queue, long, wait=MARGIN)
        assert queue.lease(1, duration=long, wait=1) == []
        first.complete()

    @conformance_property("invisibility")
    def test_concurrent_consumers_never_hold_the_same_message(
        self, queue: Queue, long: float
    ) -> None:
        total = 12
        sent = set(queue.send_many([f"m{i}".encode() for i in range(total)]))
        held: list[Lease] = []
        lock = threading.Lock()
        done = threading.Event()
        deadline = time.monotonic() + 60

        def consume() -> None:
            while not done.is_set() and time.monotonic() < deadline:
                for lease in queue.lease(3, duration=long, wait=1):
                    with lock:
                        held.append(lease)
                        if len(held) >= total:
                            done.set()

        threads = [threading.Thread(target=consume) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ids = [lease.message.id for lease in held]
        assert len(ids) == len(set(ids)), "a message was held by two consumers at once"
        assert set(ids) == sent
        for lease in held:
            lease.complete()

    # ----------------------------------------------------------------- expiry

    @conformance_property("expiry and redelivery")
    def test_unrenewed_lease_expires_and_message_comes_back(
        self, queue: Queue, short: float, long: float
    ) -> None:
        message_id = queue.send(b"\x00comes back\xff")
        first = _lease_one(queue, short, wait=MARGIN)
        again = _wait_redelivery(queue, short, long)
        assert again.message.id == message_id == first.message.id
        assert again.message.body == b"\x00comes back\xff"
        if queue.capabilities.detects_stale_receipts:
            assert again.receipt != first.receipt
        if queue.capabilities.delivery_count:
            assert again.message.delivery_count == first.message.delivery_count + 1
        again.complete()

    @conformance_property("delivery count")
    def test_delivery_count_is_one_then_grows_by_one(self, queue: Queue, long: float) -> None:
        if not queue.capabilities.delivery_count:
            pytest.skip("backend declares delivery_count=False (no exact delivery count)")
        queue.send(b"count")
        first = _lease_one(queue, long, wait=MARGIN)
        assert first.message.delivery_count == 1
        first.abandon()
        second = _lease_one(queue, long, wait=MARGIN)
        assert second.message.delivery_count == 2
        second.complete()

    @conformance_property("expired receipt")
    def test_expired_receipt_nobody_released_still_settles(
        self, queue: Queue, short: float
    ) -> None:
        if not queue.capabilities.expired_receipt_usable:
            pytest.skip(
                "backend declares expired_receipt_usable=False: an expired receipt is not "
                "guaranteed to work even if nobody re-leased the message"
            )
        queue.send(b"late")
        lease = _lease_one(queue, short, wait=MARGIN)
        deadline = time.monotonic() + short + MARGIN
        while time.monotonic() < deadline and time.time() < lease.expires_at.timestamp() + 0.05:
            time.sleep(0.01)  # waiting for a clock to pass a point; nothing to poll
        lease.complete()
        assert queue.lease(1, duration=short, wait=short + 1) == []

    # --------------------------------------------------------- stale receipts

    @pytest.mark.parametrize("action", ["complete", "renew", "abandon"])
    @conformance_property("stale receipt after redelivery")
    def test_stale_receipt_after_redelivery_raises_lease_lost_and_changes_nothing(
        self, queue: Queue, short: float, long: float, action: str
    ) -> None:
        if not queue.capabilities.detects_stale_receipts:
            pytest.skip(
                "backend declares detects_stale_receipts=False: it does not guarantee that "
                "a stale receipt is refused"
            )
        queue.send(b"stale")
        old = _lease_one(queue, short, wait=MARGIN)
        new = _wait_redelivery(queue, short, long)
        with pytest.raises(LeaseLost):
            if action == "complete":
                old.complete()
            elif action == "renew":
                old.renew()
            else:
                old.abandon()
        assert old.lost.is_set()
        # The new holder's lease is intact: still invisible, and it settles.
        assert queue.lease(1, duration=long, wait=1) == []
        new.renew()
        new.complete()

    @pytest.mark.parametrize("action", ["complete", "renew", "abandon"])
    @conformance_property("stale receipt after complete")
    def test_receipt_of_completed_message_raises_lease_lost(
        self, queue: Queue, long: float, action: str
    ) -> None:
        if not queue.capabilities.detects_stale_receipts:
            pytest.skip(
                "backend declares detects_stale_receipts=False: settling a deleted message's "
                "receipt may succeed silently"
            )
        queue.send(b"done")
        lease = _lease_one(queue, long, wait=MARGIN)
        twin = _twin(lease)
        lease.complete()
        with pytest.raises(LeaseLost):
            getattr(twin, action)()

    @conformance_property("receipt rotation")
    def test_renew_rotates_the_receipt_exactly_as_declared(self, queue: Queue, long: float) -> None:
        queue.send(b"rotate")
        lease = _lease_one(queue, long, wait=MARGIN)
        before = lease.receipt
        lease.renew()
        if queue.capabilities.renew_rotates_receipt:
            assert lease.receipt != before
            if queue.capabilities.detects_stale_receipts:
                with pytest.raises(LeaseLost):
                    _twin(lease, before).complete()
        else:
            assert lease.receipt == before
        lease.complete()

    # ------------------------------------------------------------------ renew

    @conformance_property("renew")
    def test_renew_keeps_message_invisible_past_the_first_expiry(
        self, queue: Queue, short: float, long: float
    ) -> None:
        queue.send(b"renewed")
        lease = _lease_one(queue, short, wait=MARGIN)
        first_expiry = lease.expires_at
        fixed = queue.capabilities.fixed_lease is not None
        if fixed:
            # A fixed lock renews by its own length from now: renew half-way
            # through, or the new expiry is barely past the first.
            halfway = first_expiry.timestamp() - short / 2
            while time.time() < halfway:
                time.sleep(0.02)  # waiting for a clock to pass a point; nothing to poll
        lease.renew(None if fixed else short * 4)
        assert lease.expires_at > first_expiry
        # Past the first expiry the message must still be hidden.
        past = short / 4 if fixed else min(short, 1.0)
        deadline = first_expiry.timestamp() + past
        while time.time() < deadline:
            assert queue.lease(1, duration=long, wait=0.2) == [], "renewed lease lapsed"
        lease.complete()

    @conformance_property("time-to-live wins over renew")
    def test_message_time_to_live_wins_over_renew(self, queue: Queue, long: float) -> None:
        caps = queue.capabilities
        if caps.max_ttl is None:
            pytest.skip("backend has no per-message time-to-live (max_ttl=None)")
        if not caps.ttl_ends_lease:
            pytest.skip(
                "backend declares ttl_ends_lease=False: a leased message outlives its "
                "time-to-live until the lease ends"
            )
        ttl = 2.0
        queue.send(b"short-lived", ttl=ttl)
        lease = _lease_one(queue, long, wait=MARGIN)
        deadline = time.monotonic() + ttl + MARGIN
        with pytest.raises(LeaseLost):
            while time.monotonic() < deadline:
                lease.renew()
                time.sleep(0.2)  # pacing renewals while the TTL runs out
        assert queue.lease(1, duration=long, wait=1) == []

    # ---------------------------------------------------------------- abandon

    @conformance_property("abandon")
    def test_abandon_makes_message_visible_at_once(self, queue: Queue, long: float) -> None:
        """Visible again at once, or after the declared ``min_abandon_delay`` and not before."""
        minimum = queue.capabilities.min_abandon_delay
        queue.send(b"again")
        lease = _lease_one(queue, long, wait=MARGIN)
        lease.abandon()
        if minimum > 0:
            assert queue.lease(1, duration=long, wait=0) == [], (
                f"an abandoned message came back before min_abandon_delay ({minimum:g} s)"
            )
        again = _lease_one(queue, long, wait=minimum + MARGIN)
        assert again.message.id == lease.message.id
        again.complete()

    @conformance_property("abandon")
    def test_abandon_with_delay_hides_message_until_the_delay_passes(
        self, queue: Queue, long: float
    ) -> None:
        caps = queue.capabilities
        if caps.max_abandon_delay <= 0:
            pytest.skip("backend cannot delay an abandoned message (max_abandon_delay=0)")
        delay = min(max(1.0, caps.min_lease), caps.max_abandon_delay)
        queue.send(b"later")
        lease = _lease_one(queue, long, wait=MARGIN)
        start = time.monotonic()
        lease.abandon(delay=delay)
        early = queue.lease(1, duration=long, wait=max(0.0, delay * 0.5 - 0.1))
        if early:
            assert time.monotonic() - start >= delay * 0.5, "abandoned message came back early"
        again = early[0] if early else _lease_one(queue, long, wait=delay + MARGIN)
        assert time.monotonic() - start >= delay - 0.5
        again.complete()

    @conformance_property("abandon")
    def test_leaving_lease_one_block_without_settling_abandons(
        self, queue: Queue, long: float
    ) -> None:
        queue.send(b"ctx")
        with queue.lease_one(duration=long, wait=MARGIN) as lease:
            first_id = lease.message.id
        assert lease.state.value == "abandoned"
        again = _lease_one(queue, long, wait=MARGIN)
        assert again.message.id == first_id
        again.complete()

    # --------------------------------------------------------------- complete

    @conformance_property("complete")
    def test_completed_message_is_never_delivered_again(self, queue: Queue, short: float) -> None:
        queue.send(b"once")
        lease = _lease_one(queue, short, wait=MARGIN)
        lease.complete()
        assert queue.lease(1, duration=short, wait=short + 2) == []

    @conformance_property("settled lease refuses reuse")
    def test_settled_lease_refuses_further_use(self, queue: Queue, long: float) -> None:
        queue.send(b"x")
        lease = _lease_one(queue, long, wait=MARGIN)
        lease.complete()
        for action in (lease.complete, lease.renew, lease.abandon):
            with pytest.raises(LeaseStateError):
                action()
        with pytest.raises(LeaseStateError):
            lease.dead_letter("twice")

    # ------------------------------------------------------------------ bodies

    @pytest.mark.parametrize(
        "kind", ["binary", "empty", "non-utf8", "maximum size"], ids=lambda k: k.replace(" ", "-")
    )
    @conformance_property("body fidelity")
    def test_body_round_trips_byte_for_byte(self, queue: Queue, long: float, kind: str) -> None:
        body = {
            "binary": bytes(range(256)),
            "empty": b"",
            "non-utf8": b"\xff\xfe\xc3\x28\xa0\xa1\x80",
            "maximum size": os.urandom(queue.capabilities.max_message_size),
        }[kind]
        queue.send(body)
        lease = _lease_one(queue, long, wait=MARGIN)
        assert lease.message.body == body
        lease.complete()

    @conformance_property("body fidelity")
    def test_body_over_the_maximum_is_refused_before_any_call(self, queue: Queue) -> None:
        counting = self._count_calls(queue)
        with pytest.raises(MessageTooLarge):
            queue.send(b"x" * (queue.capabilities.max_message_size + 1))
        with pytest.raises(InvalidArgument):
            queue.send("text, not bytes")  # type: ignore[arg-type]
        assert counting.calls == []

    @conformance_property("properties")
    def test_properties_round_trip_or_are_refused(self, queue: Queue, long: float) -> None:
        properties = {"kind": "order", "unicode": "ünï"}
        if not queue.capabilities.supports_properties:
            counting = self._count_calls(queue)
            with pytest.raises(UnsupportedOperation):
                queue.send(b"p", properties=properties)
            assert counting.calls == []
            return
        queue.send(b"p", properties=properties)
        lease = _lease_one(queue, long, wait=MARGIN)
        assert dict(lease.message.properties) == properties
        lease.complete()

    @conformance_property("properties")
    def test_a_nul_in_a_property_round_trips_or_is_refused_before_any_call(
        self, queue: Queue, long: float
    ) -> None:
        caps = queue.capabilities
        if not caps.supports_properties:
            pytest.skip("the backend carries no properties (capabilities.supports_properties)")
        properties = {"kind": "a\x00b"}  # a value: names have their own rules (MNS: plain text)
        if caps.properties_hold_nul:
            queue.send(b"p", properties=properties)
            lease = _lease_one(queue, long, wait=MARGIN)
            assert dict(lease.message.properties) == properties
            lease.complete()
            return
        counting = self._count_calls(queue)
        for one in ({"kind": "a\x00b"}, {"k\x00": "v"}):
            with pytest.raises(InvalidArgument, match="NUL"):
                queue.send(b"p", properties=one)
            with pytest.raises(InvalidArgument, match="NUL"):
                queue.send_many([b"p"], properties=one)
        assert counting.calls == []

    # ------------------------------------------------------------- durations

    @conformance_property("bad input refused before any call")
    def test_out_of_range_durations_are_refused_before_any_call(
        self, queue: Queue, long: float
    ) -> None:
        caps = queue.capabilities
        queue.send(b"d")
        lease = _lease_one(queue, long, wait=MARGIN)
        counting = self._count_calls(queue)
        bad: list[Any] = [caps.max_lease + 1, -1, float("nan"), float("inf"), "30", True]
        if caps.min_lease > 0:
            bad.append(caps.min_lease / 2)
        if caps.fixed_lease is not None:
            bad.append(caps.fixed_lease * 2)
        for duration in bad:
            with pytest.raises(InvalidLeaseDuration):
                queue.lease(1, duration=duration)
            with pytest.raises(InvalidLeaseDuration):
                lease.renew(duration)
        for max_messages in (0, -1, 1001, 2.5):
            with pytest.raises(InvalidArgument):
                queue.lease(max_messages)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            queue.lease(1, wait=-1)
        assert counting.calls == [], f"bad input reached the backend: {counting.calls}"
        self._restore(queue, counting)
        lease.complete()

    @conformance_property("declared capabilities are true")
    def test_declared_maximum_lease_is_accepted(self, queue: Queue) -> None:
        caps = queue.capabilities
        queue.send(b"max")
        lease = _lease_one(queue, caps.max_lease, wait=MARGIN)
        assert lease.expires_at.timestamp() > time.time() + caps.max_lease * 0.9
        if caps.fixed_lease is not None:
            lease.renew()
        else:
            # A renew may not take the total past max_total_lease (SQS: 12 h from receive).
            renewal = caps.max_lease
            if caps.max_total_lease is not None:
                renewal = min(renewal, caps.max_total_lease - caps.lease_resolution - 5)
            lease.renew(max(renewal, caps.min_lease))
            if caps.max_total_lease is not None:
                with pytest.raises(InvalidLeaseDuration):
                    lease.renew(caps.max_lease)
        lease.abandon()

    @conformance_property("declared capabilities are true")
    def test_declared_minimum_lease_is_accepted(self, queue: Queue) -> None:
        caps = queue.capabilities
        queue.send(b"min")
        lease = _lease_one(queue, caps.min_lease, wait=MARGIN)
        lease.abandon()

    @conformance_property("batch receive limits")
    def test_batch_receive_respects_the_limits(self, queue: Queue, long: float) -> None:
        batch = queue.capabilities.max_receive_batch
        total = min(batch + 2, 40)
        queue.send_many([b"b%d" % i for i in range(total)])
        got: list[Lease] = []
        deadline = time.monotonic() + 30
        while len(got) < total and time.monotonic() < deadline:
            leases = queue.lease(min(batch, total), duration=long, wait=1)
            assert len(leases) <= min(batch, total)
            got.extend(leases)
        assert len({lease.message.id for lease in got}) == total
        for lease in got:
            lease.complete()

    @conformance_property("batch receive limits")
    def test_lease_of_more_than_one_receive_batch_is_split_by_core(
        self, queue: Queue, long: float
    ) -> None:
        batch = queue.capabilities.max_receive_batch
        if batch >= 40:
            pytest.skip(f"receive batch of {batch} is too large to overflow cheaply")
        total = batch + 3
        queue.send_many([b"s%d" % i for i in range(total)])
        got: list[Lease] = []
        deadline = time.monotonic() + 30
        while len(got) < total and time.monotonic() < deadline:
            got.extend(queue.lease(total, duration=long, wait=1))
        assert len({lease.message.id for lease in got}) == total
        for lease in got:
            lease.complete()

    # ----------------------------------------------------------- send options

    @conformance_property("send delay")
    def test_delayed_message_is_invisible_until_the_delay_passes(
        self, queue: Queue, long: float
    ) -> None:
        caps = queue.capabilities
        if caps.max_send_delay <= 0:
            pytest.skip("backend cannot delay a sent message (max_send_delay=0)")
        delay = min(2.0, caps.max_send_delay)
        start = time.monotonic()
        queue.send(b"delayed", delay=delay)
        lease = _lease_one(queue, long, wait=delay + MARGIN)
        assert time.monotonic() - start >= delay - 0.5
        lease.complete()

    # ------------------------------------------------------------ dead-letter

    @conformance_property("dead-letter")
    def test_dead_lettered_message_is_not_redelivered_and_keeps_its_reason(
        self, queue: Queue, short: float
    ) -> None:
        message_id = queue.send(b"poison")
        lease = _lease_one(queue, short, wait=MARGIN)
        lease.dead_letter("handler gave up")
        assert queue.lease(1, duration=short, wait=short + 2) == []
        if not queue.capabilities.inspect_dead_letters:
            pytest.skip("backend cannot read dead letters back (inspect_dead_letters=False)")
        letters = queue.peek_dead_letters(10)
        assert len(letters) == 1
        assert letters[0].body == b"poison"
        assert letters[0].reason == "handler gave up"
        assert (
            letters[0].id == message_id
            or letters[0].properties.get("leasekit-original-id") == message_id
        )

    # ----------------------------------------------------------------- counts

    @conformance_property("declared capabilities are true")
    def test_stats_fill_exactly_the_declared_counts(self, queue: Queue) -> None:
        caps = queue.capabilities
        if not caps.queue_stats:
            with pytest.raises(UnsupportedOperation):
                queue.stats()
            return
        stats = queue.stats()
        filled = {name for name in COUNT_FIELDS if getattr(stats, name) is not None}
        assert filled == set(caps.counted), (
            f"stats() filled {sorted(filled)}, capabilities.counted says {sorted(caps.counted)}"
        )
        for name in filled:
            assert getattr(stats, name) == 0, f"a new queue counts {name}={getattr(stats, name)}"

    @conformance_property("count: visible")
    def test_visible_count_follows_send_and_lease(self, queue: Queue, long: float) -> None:
        _require_count(queue, "visible")
        queue.send_many([b"v1", b"v2", b"v3"])
        _await_count(queue, "visible", 3, "after sending 3")
        leases = _lease_exactly(queue, 2, long)
        _await_count(queue, "visible", 1, "after leasing 2 of 3", hold=leases)
        queue.complete_many(leases)
        _await_count(queue, "visible", 1, "after completing the 2 leased")

    @conformance_property("count: leased")
    def test_leased_count_follows_lease_and_complete(self, queue: Queue, long: float) -> None:
        _require_count(queue, "leased")
        queue.send_many([b"l1", b"l2", b"l3"])
        _await_count(queue, "leased", 0, "after sending 3, none leased")
        leases = _lease_exactly(queue, 2, long)
        _await_count(queue, "leased", 2, "after leasing 2 of 3", hold=leases)
        queue.complete_many(leases)
        _await_count(queue, "leased", 0, "after completing the 2 leased")

    @conformance_property("count: delayed")
    def test_delayed_count_counts_a_delayed_send(self, queue: Queue) -> None:
        _require_count(queue, "delayed")
        caps = queue.capabilities
        if caps.max_send_delay <= 0:
            pytest.skip("backend cannot delay a sent message (max_send_delay=0)")
        queue.send(b"now")
        # Long enough to stay delayed however long the count takes to show it.
        queue.send(b"later", delay=min(caps.max_send_delay, COUNT_WAIT + 4 * MARGIN))
        _await_count(queue, "delayed", 1, "after one delayed and one plain send")

    @conformance_property("count: dead-lettered")
    def test_dead_lettered_count_counts_a_dead_letter(self, queue: Queue, long: float) -> None:
        _require_count(queue, "dead_lettered")
        _await_count(queue, "dead_lettered", 0, "before any dead letter")
        queue.send_many([b"poison", b"fine"])
        [lease] = _lease_exactly(queue, 1, long)
        lease.dead_letter("counted")
        _await_count(queue, "dead_lettered", 1, "after dead-lettering 1")

    @conformance_property("count: total")
    def test_total_count_follows_send_lease_and_complete(self, queue: Queue, long: float) -> None:
        _require_count(queue, "total")
        queue.send_many([b"t1", b"t2", b"t3"])
        _await_count(queue, "total", 3, "after sending 3")
        leases = _lease_exactly(queue, 2, long)
        _await_count(queue, "total", 3, "after leasing 2 of 3 (leased ones count)", hold=leases)
        queue.complete_many(leases)
        _await_count(queue, "total", 1, "after completing the 2 leased")
        caps = queue.capabilities
        if caps.max_send_delay > 0:
            queue.send(b"later", delay=min(caps.max_send_delay, COUNT_WAIT + 4 * MARGIN))
            _await_count(queue, "total", 2, "after a delayed send (delayed ones count)")

    # ------------------------------------------------------------ not found

    @conformance_property("QueueNotFound is not LeaseLost")
    def test_missing_queue_opens_but_fails_on_send_and_lease(self, harness: Harness) -> None:
        missing = harness.make_missing_queue()
        with pytest.raises(QueueNotFound):
            missing.send(b"nowhere")
        with pytest.raises(QueueNotFound):
            missing.lease(1, wait=0)

    @conformance_property("QueueNotFound is not LeaseLost")
    def test_receipt_on_a_deleted_queue_raises_queue_not_found(
        self, harness: Harness, long: float
    ) -> None:
        queue = harness.make_queue()
        try:
            queue.send(b"orphan")
            lease = _lease_one(queue, long, wait=MARGIN)
            queue.delete_queue()
            with pytest.raises(QueueNotFound):
                lease.complete()
            assert not lease.lost.is_set()
        finally:
            harness.cleanup(queue)

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def _count_calls(queue: Queue) -> CountingDriver:
        return CountingDriver.install(queue.driver)

    @staticmethod
    def _restore(queue: Queue, counting: CountingDriver) -> None:
        counting.uninstall()
