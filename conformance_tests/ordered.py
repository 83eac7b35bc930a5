"""The *ordered* section of the conformance suite: message groups (``docs/ordering.md``).

It runs where ``capabilities.ordered`` is true and is skipped, with that reason,
elsewhere; the checks that a backend *without* groups refuses them before any
call run there instead. :class:`~leasekit.conformance.ConformanceSuite` includes
it; a queue that only takes grouped messages (SQS FIFO: every message needs a
group) runs it alone::

    class TestMyFifo(OrderedSuite):
        @pytest.fixture(scope="class")
        @classmethod
        def harness(cls): ...

The rules, the same on every backend:

1. while any message of a group is leased, no other message of that group is
   handed out;
2. a group's messages are handed out in the order they were sent;
3. a head whose lease ended (abandoned, expired) comes back first, its delivery
   count raised; a completed or dead-lettered head lets the next one go;
4. other groups are not held up.

One receive may hand out several messages of one group, in order (SQS FIFO
does); rule 1 is about the receives after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest

from leasekit import InvalidArgument, Lease, UnsupportedOperation
from leasekit.queue import Queue

from .fixtures import QueueFixtures
from .harness import CountingDriver

__all__ = ["OrderedSuite"]

F = TypeVar("F", bound=Callable[..., Any])

#: Slack on every expiry deadline (the suite's own ``MARGIN``).
MARGIN = 5.0


def _ordered(fn: F) -> F:
    """Mark a test as the matrix's "ordered groups" row (as ``conformance_property`` does)."""
    fn.conformance_property = "ordered groups"  # type: ignore[attr-defined]
    return fn


def _require_ordered(queue: Queue) -> None:
    if not queue.capabilities.ordered:
        pytest.skip("backend has no ordered groups on this queue (capabilities.ordered=False)")


def _bodies(leases: Sequence[Lease]) -> list[bytes]:
    return [lease.message.body for lease in leases]


def _lease_some(queue: Queue, max_messages: int, duration: float, wait: float) -> list[Lease]:
    """Lease up to ``max_messages``, waiting up to ``wait`` s for the first (a poll)."""
    return queue.lease(max_messages, duration=duration, wait=wait)


def _drain_in_order(queue: Queue, count: int, duration: float) -> list[bytes]:
    """Lease and complete until ``count`` messages came, each receive's leases in their order."""
    seen: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(seen) < count and time.monotonic() < deadline:
        leases = queue.lease(10, duration=duration, wait=1)
        seen += _bodies(leases)
        if leases:
            queue.complete_many(leases)
    return seen


class OrderedSuite(QueueFixtures):
    """Conformance checks for ordered groups; a subclass supplies a ``harness`` fixture."""

    # ------------------------------------------------------------- the rules

    @_ordered
    def test_group_messages_are_handed_out_in_the_order_sent(
        self, queue: Queue, long: float
    ) -> None:
        _require_ordered(queue)
        batch = queue.capabilities.max_send_batch
        count = min(2 * batch + 3, 25)  # more than one send batch where batches are small
        bodies = [f"o-{i:03d}".encode() for i in range(count)]
        queue.send_many(bodies, group="order-17")
        assert _drain_in_order(queue, count, long) == bodies

    @_ordered
    def test_leased_message_holds_back_the_rest_of_its_group(
        self, queue: Queue, long: float
    ) -> None:
        _require_ordered(queue)
        queue.send(b"a1", group="A")
        queue.send(b"a2", group="A")
        [first] = _lease_some(queue, 1, long, MARGIN)
        assert first.message.body == b"a1"
        assert first.message.group == "A"
        assert _lease_some(queue, 10, long, 1) == [], "a2 was handed out while a1 was leased"
        first.complete()
        [second] = _lease_some(queue, 1, long, MARGIN)
        assert second.message.body == b"a2"
        second.complete()

    @_ordered
    def test_renewed_head_holds_its_group_past_the_first_expiry(
        self, queue: Queue, short: float, long: float
    ) -> None:
        _require_ordered(queue)
        if queue.capabilities.fixed_lease is not None:
            pytest.skip("fixed lock duration: renewal steps are the keeper's (see the main suite)")
        queue.send(b"a1", group="A")
        queue.send(b"a2", group="A")
        [head] = _lease_some(queue, 1, short, MARGIN)
        head.renew(long)
        # Past the first lease (and its margin), the group is still held by the renewed head.
        assert _lease_some(queue, 10, long, short + 1) == []
        head.complete()
        assert _bodies(_lease_some(queue, 1, long, MARGIN)) == [b"a2"]

    @_ordered
    def test_other_groups_are_not_held_up(self, queue: Queue, long: float) -> None:
        _require_ordered(queue)
        queue.send(b"a1", group="A")
        queue.send(b"a2", group="A")
        queue.send(b"b1", group="B")
        [first] = _lease_some(queue, 1, long, MARGIN)
        assert first.message.body == b"a1"
        others = _lease_some(queue, 10, long, MARGIN)
        assert _bodies(others) == [b"b1"], "group B waited for group A, or A's a2 overtook a1"
        queue.complete_many([first, *others])

    @_ordered
    def test_abandoned_head_comes_back_first_with_its_count_raised(
        self, queue: Queue, long: float
    ) -> None:
        _require_ordered(queue)
        queue.send(b"a1", group="A")
        queue.send(b"a2", group="A")
        [head] = _lease_some(queue, 1, long, MARGIN)
        head.abandon()
        again = _lease_some(queue, 10, long, MARGIN)
        assert _bodies(again)[:1] == [b"a1"], f"a1 must come back first, got {_bodies(again)}"
        assert again[0].message.id == head.message.id
        if queue.capabilities.delivery_count:
            assert again[0].message.delivery_count == head.message.delivery_count + 1
        assert _drain_in_order_after(queue, again, long) == [b"a1", b"a2"]

    @_ordered
    def test_expired_head_comes_back_first_with_its_count_raised(
        self, queue: Queue, short: float, long: float
    ) -> None:
        _require_ordered(queue)
        queue.send(b"a1", group="A")
        queue.send(b"a2", group="A")
        [head] = _lease_some(queue, 1, short, MARGIN)
        again = _lease_some(queue, 1, long, short + MARGIN)
        assert _bodies(again) == [b"a1"], f"a1 must come back first, got {_bodies(again)}"
        if queue.capabilities.delivery_count:
            assert again[0].message.delivery_count == head.message.delivery_count + 1
        assert _drain_in_order_after(queue, again, long) == [b"a1", b"a2"]

    @_ordered
    def test_dead_lettered_head_lets_the_rest_of_its_group_go_on_in_order(
        self, queue: Queue, long: float
    ) -> None:
        _require_ordered(queue)
        queue.send_many([b"a1", b"a2", b"a3"], group="A")
        [head] = _lease_some(queue, 1, long, MARGIN)
        assert head.message.body == b"a1"
        head.dead_letter("poison for the ordered suite")
        assert _drain_in_order(queue, 2, long) == [b"a2", b"a3"]

    @_ordered
    def test_group_round_trips_on_the_message(self, queue: Queue, long: float) -> None:
        _require_ordered(queue)
        name = "Order-17/line:3#x~"
        queue.send(b"g", group=name)
        [lease] = _lease_some(queue, 1, long, MARGIN)
        assert lease.message.group == name
        lease.complete()

    # ------------------------------------------------------------ bad input

    @_ordered
    def test_bad_group_is_refused_before_any_call(self, queue: Queue) -> None:
        _require_ordered(queue)
        counting = CountingDriver.install(queue.driver)
        try:
            for bad in ("", "x" * 129, "has space", "é", 17):
                with pytest.raises(InvalidArgument):
                    queue.send(b"x", group=bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument):
                queue.send(b"x", group="A", delay=1)
            with pytest.raises(InvalidArgument):
                queue.send_many([b"x"], group="has space")
        finally:
            counting.uninstall()
        assert counting.calls == []

    @_ordered
    def test_group_on_an_unordered_queue_is_refused_before_any_call(self, queue: Queue) -> None:
        if queue.capabilities.ordered:
            pytest.skip("backend has ordered groups (capabilities.ordered=True)")
        counting = CountingDriver.install(queue.driver)
        try:
            with pytest.raises(UnsupportedOperation):
                queue.send(b"x", group="A")
            with pytest.raises(UnsupportedOperation):
                queue.send_many([b"x"], group="A")
        finally:
            counting.uninstall()
        assert counting.calls == []

    @_ordered
    def test_dedup_key_where_nothing_deduplicates_is_refused_before_any_call(
        self, queue: Queue
    ) -> None:
        if queue.capabilities.deduplicates:
            pytest.skip("backend deduplicates (capabilities.deduplicates=True)")
        counting = CountingDriver.install(queue.driver)
        try:
            with pytest.raises(UnsupportedOperation):
                queue.send(b"x", dedup_key="k-1")
        finally:
            counting.uninstall()
        assert counting.calls == []


def _drain_in_order_after(queue: Queue, leases: list[Lease], duration: float) -> list[bytes]:
    """Complete ``leases`` (already received) and drain the rest; every body in order."""
    seen = _bodies(leases)
    queue.complete_many(leases)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        more = queue.lease(10, duration=duration, wait=1)
        if not more:
            break
        seen += _bodies(more)
        queue.complete_many(more)
    return seen
