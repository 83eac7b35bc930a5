"""The conformance suite's *checkpoint* section: progress that travels with the lease.

It runs on every backend whose capabilities declare ``native_checkpoint``, and on
the others when the harness opens its queues with a ``checkpoint_store``
(``UrlHarness(url, checkpoint_store=leasekit.SqliteCheckpointStore(path))``);
otherwise each test is skipped with that reason. It is part of
:class:`~leasekit.conformance.ConformanceSuite`, and can run alone::

    class TestMineWithAStore(CheckpointSuite):
        @pytest.fixture(scope="class")
        @classmethod
        def harness(cls, tmp_path_factory):
            store = leasekit.SqliteCheckpointStore(str(tmp_path_factory.mktemp("cp") / "cp.db"))
            harness = UrlHarness("mine", endpoint=..., checkpoint_store=store)
            yield harness
            harness.close()
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from leasekit import InvalidArgument, LeaseLost, LeaseState
from leasekit.queue import Queue

from .harness import CountingDriver, Harness

__all__ = ["CheckpointSuite"]

F = TypeVar("F", bound=Callable[..., Any])

#: Slack for an expiry to show (the emulators round lease ends to whole seconds).
MARGIN = 5.0


def _require_checkpoints(queue: Queue) -> None:
    """Skip, with the reason, unless leases of ``queue`` can checkpoint."""
    if not queue.can_checkpoint:
        pytest.skip(
            "backend keeps no checkpoints (native_checkpoint=False) and the harness "
            "gave no checkpoint_store"
        )


def _checkpoint_property(fn: F) -> F:
    """Mark a test as the compatibility matrix's ``checkpoint`` row."""
    fn.conformance_property = "checkpoint"  # type: ignore[attr-defined]
    return fn


class CheckpointSuite:
    """Mixin of the checkpoint tests; a subclass supplies a ``harness`` fixture."""

    @pytest.fixture
    def cq(self, harness: Harness) -> Iterator[Queue]:
        """A fresh queue whose leases can checkpoint (else the test is skipped)."""
        queue = harness.make_queue()
        try:
            _require_checkpoints(queue)
            yield queue
        finally:
            harness.cleanup(queue)

    @pytest.fixture
    def cp_long(self, harness: Harness, cq: Queue) -> float:
        """A lease long enough to outlast any step of a test."""
        return harness.long_lease(cq)

    @_checkpoint_property
    def test_checkpoint_reaches_the_next_holder_and_leaves_the_message_unchanged(
        self, cq: Queue, cp_long: float
    ) -> None:
        properties = {"k": "v"} if cq.capabilities.supports_properties else None
        body = b"\x00work\xff"
        message_id = cq.send(body, properties=properties)
        first = cq.lease(1, duration=cp_long, wait=10)[0]
        assert first.message.checkpoint is None
        first.checkpoint(b"step-1")
        first.checkpoint(b"step-2\x00\xff")  # the last one saved is the one that travels
        first.abandon(max(0.0, cq.capabilities.min_abandon_delay))
        again = cq.lease(1, duration=cp_long, wait=10 + MARGIN)[0]
        assert again.message.id == message_id
        assert again.message.checkpoint == b"step-2\x00\xff"
        assert again.message.body == body
        assert dict(again.message.properties) == (properties or {})
        again.complete()

    @_checkpoint_property
    def test_checkpoint_keeps_the_lease_held_and_the_message_hidden(
        self, cq: Queue, cp_long: float
    ) -> None:
        cq.send(b"x")
        lease = cq.lease(1, duration=cp_long, wait=10)[0]
        lease.checkpoint(b"half")
        assert lease.state is LeaseState.HELD
        assert cq.lease(1, duration=cp_long, wait=0) == []
        lease.renew()  # the receipt a checkpoint leaves (rotated where renewals rotate) works
        lease.complete()
        assert cq.lease(1, duration=cp_long, wait=1) == []

    @_checkpoint_property
    def test_completing_discards_the_checkpoint(self, cq: Queue, cp_long: float) -> None:
        cq.send(b"x")
        lease = cq.lease(1, duration=cp_long, wait=10)[0]
        lease.checkpoint(b"progress")
        message_id = lease.message.id
        lease.complete()
        store = cq.checkpoint_store
        if store is not None:
            assert store.load(message_id) is None
        assert cq.lease(1, duration=cp_long, wait=1) == []

    @_checkpoint_property
    def test_dead_lettering_discards_the_checkpoint_and_keeps_the_message(
        self, cq: Queue, cp_long: float
    ) -> None:
        cq.send(b"poison")
        lease = cq.lease(1, duration=cp_long, wait=10)[0]
        lease.checkpoint(b"progress")
        message_id = lease.message.id
        lease.dead_letter("bad")
        store = cq.checkpoint_store
        if store is not None:
            assert store.load(message_id) is None
        if cq.capabilities.inspect_dead_letters:
            [letter] = cq.peek_dead_letters(10)
            assert letter.body == b"poison"

    @_checkpoint_property
    def test_stale_holder_checkpoint_raises_lease_lost_and_the_new_holder_checkpoint_stands(
        self, harness: Harness, cq: Queue, cp_long: float
    ) -> None:
        short = harness.short_lease(cq)
        cq.send(b"x")
        stale = cq.lease(1, duration=short, wait=10)[0]
        stale.checkpoint(b"old-holder")
        current = cq.lease(1, duration=cp_long, wait=short * 2 + MARGIN)[0]
        assert current.message.checkpoint == b"old-holder"
        current.checkpoint(b"new-holder")
        with pytest.raises(LeaseLost):
            stale.checkpoint(b"stale-write")
        assert stale.state is LeaseState.LOST
        assert current.state is LeaseState.HELD
        current.abandon(max(0.0, cq.capabilities.min_abandon_delay))
        third = cq.lease(1, duration=cp_long, wait=10 + MARGIN)[0]
        assert third.message.checkpoint == b"new-holder"
        third.complete()

    @_checkpoint_property
    def test_a_checkpoint_that_is_not_bytes_is_refused_before_any_call(
        self, cq: Queue, cp_long: float
    ) -> None:
        cq.send(b"x")
        lease = cq.lease(1, duration=cp_long, wait=10)[0]
        counter = CountingDriver.install(cq.driver)
        try:
            with pytest.raises(InvalidArgument):
                lease.checkpoint("text")  # type: ignore[arg-type]
        finally:
            counter.uninstall()
        assert counter.calls == []
        assert lease.state is LeaseState.HELD
        lease.complete()
