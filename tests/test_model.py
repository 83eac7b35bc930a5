"""Model-based test: random lease histories against a small reference model.

A hypothesis state machine sends, leases, renews, completes, abandons and
dead-letters messages and moves a :class:`leasekit.ManualClock`, on the
``memory`` and ``sqlite`` backends, and checks every result against a model of
what DESIGN.md promises: which messages are visible, which lease holds each
message and until when, delivery counts, stale leases raising ``LeaseLost``,
settled leases raising ``LeaseStateError``, completed messages never coming
back, bodies and properties round-tripping. No sleeping: time moves only when
the machine advances the clock.
"""

from __future__ import annotations

import enum
import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

import leasekit
from leasekit import Lease, LeaseLost, LeaseStateError, ManualClock, Queue
from leasekit.clock import to_datetime

#: Durations and clock steps are binary fractions, so expiry boundaries
#: (``visible_at == now``) are hit exactly and compared without rounding.
DURATIONS = st.sampled_from([0.25, 0.5, 1.0, 2.0, 5.0])
STEPS = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 31.0])
DELAYS = st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0])
TTLS = st.none() | st.sampled_from([1.0, 2.5, 6.0])
BODIES = st.binary(max_size=48)
PROPERTIES = st.dictionaries(st.text(min_size=1, max_size=4), st.text(max_size=4), max_size=2)
#: The queue's default physical lease (``leasekit.open`` without lease_duration).
DEFAULT_DURATION = 30.0

SETTINGS = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class State(enum.Enum):
    """What the model expects of a lease handle."""

    HELD = "held"
    COMPLETED = "completed"
    ABANDONED = "abandoned"
    DEAD_LETTERED = "dead_lettered"
    LOST = "lost"


@dataclass
class ModelMessage:
    """One message as the model sees it."""

    id: str
    body: bytes
    properties: dict[str, str]
    seq: int
    visible_at: float
    enqueued_at: float
    expires_at: float | None = None
    delivery_count: int = 0
    #: The model lease whose receipt is current (the newest delivery), if any.
    holder: ModelLease | None = None
    gone: bool = False
    receipts: list[str] = field(default_factory=list)


@dataclass(eq=False)
class ModelLease:
    """One lease handle and what the model expects of it."""

    lease: Lease
    message: ModelMessage
    duration: float
    state: State = State.HELD


def has_leases(machine: LeaseModel) -> bool:
    return bool(machine.handles)


class LeaseModel(RuleBasedStateMachine):
    """The state machine; subclasses open the queue for one backend."""

    leases = Bundle("leases")
    #: Whether the backend gives a new receipt on renew.
    rotates = False

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.queue = self.open_queue(self.clock)
        self.messages: dict[str, ModelMessage] = {}
        self.handles: dict[int, ModelLease] = {}
        self.dead: list[tuple[str, str]] = []
        self.seq = itertools.count()

    def open_queue(self, clock: ManualClock) -> Queue:
        raise NotImplementedError

    def teardown(self) -> None:
        try:
            self.drain_and_check()
        finally:
            self.queue.close()

    # ------------------------------------------------------------ model views

    def now(self) -> float:
        return self.clock.time()

    def expired(self, message: ModelMessage) -> bool:
        """Whether the message's time-to-live has passed (it then counts as gone)."""
        return message.expires_at is not None and message.expires_at <= self.now()

    def alive(self) -> list[ModelMessage]:
        return [m for m in self.messages.values() if not m.gone and not self.expired(m)]

    def visible(self) -> list[ModelMessage]:
        now = self.now()
        ready = [m for m in self.alive() if m.visible_at <= now]
        return sorted(ready, key=lambda m: (m.visible_at, m.seq))

    def current_holders(self) -> list[ModelLease]:
        """Leases still held that hold their message's newest receipt."""
        return [
            h
            for h in self.handles.values()
            if h.state is State.HELD
            and not h.message.gone
            and not self.expired(h.message)
            and h.message.holder is h
        ]

    def model_of(self, lease: Lease) -> ModelLease:
        return self.handles[id(lease)]

    def expected_failure(self, handle: ModelLease) -> type[Exception] | None:
        """The error an action on ``handle`` must raise now, or None if it must work."""
        if handle.state in (State.COMPLETED, State.ABANDONED, State.DEAD_LETTERED):
            return LeaseStateError
        if handle.state is State.LOST:
            return LeaseLost
        if handle.message.gone or handle.message.holder is not handle:
            return LeaseLost
        if self.expired(handle.message):
            event("lease on a message past its time-to-live refused")
            return LeaseLost
        return None

    def check_refused(self, handle: ModelLease, error: type[Exception], action: Any) -> None:
        """Run ``action``; it must raise ``error`` and change nothing but the handle's state."""
        before = self.queue.stats()
        with pytest.raises(error):
            action()
        if error is LeaseLost:
            event("stale lease refused" if handle.state is State.HELD else "lost lease reused")
            handle.state = State.LOST
            assert handle.lease.state is leasekit.LeaseState.LOST
        else:
            event("settled lease refused")
        assert self.queue.stats() == before

    # ------------------------------------------------------------------ rules

    @initialize()
    def check_capabilities(self) -> None:
        caps = self.queue.capabilities
        assert caps.expired_receipt_usable
        assert caps.detects_stale_receipts
        assert caps.renew_rotates_receipt is self.rotates

    @rule(body=BODIES, delay=DELAYS, ttl=TTLS, properties=PROPERTIES)
    def send(
        self, body: bytes, delay: float, ttl: float | None, properties: dict[str, str]
    ) -> None:
        if ttl is not None and delay >= ttl:
            # It would expire before it became visible: refused, and nothing is sent.
            before = self.queue.stats()
            with pytest.raises(leasekit.InvalidArgument, match="shorter than ttl"):
                self.queue.send(body, delay=delay, ttl=ttl, properties=properties)
            assert self.queue.stats() == before
            event("send with delay >= ttl refused")
            return
        message_id = self.queue.send(body, delay=delay, ttl=ttl, properties=properties)
        assert message_id not in self.messages
        now = self.now()
        self.messages[message_id] = ModelMessage(
            id=message_id,
            body=body,
            properties=properties,
            seq=next(self.seq),
            visible_at=now + delay,
            enqueued_at=now,
            expires_at=None if ttl is None else now + ttl,
        )

    @rule(bodies=st.lists(BODIES, min_size=1, max_size=4))
    def send_many(self, bodies: list[bytes]) -> None:
        ids = self.queue.send_many(bodies)
        assert len(ids) == len(bodies)
        assert len(set(ids)) == len(ids)
        now = self.now()
        for message_id, body in zip(ids, bodies, strict=True):
            assert message_id not in self.messages
            self.messages[message_id] = ModelMessage(
                id=message_id,
                body=body,
                properties={},
                seq=next(self.seq),
                visible_at=now,
                enqueued_at=now,
            )

    @rule(target=leases, count=st.integers(1, 4), duration=st.none() | DURATIONS)
    def lease(self, count: int, duration: float | None) -> Any:
        expected = self.visible()[:count]
        got = self.queue.lease(count, duration=duration)
        seconds = DEFAULT_DURATION if duration is None else duration
        now = self.now()
        # Which messages, in which order: by visibility time, then send order.
        assert [lz.message.id for lz in got] == [m.id for m in expected]
        by_id = {lz.message.id: lz for lz in got}
        handles = []
        for model in expected:
            lease = by_id[model.id]
            if model.holder is not None and model.holder.state is State.HELD:
                event("message re-leased while an older lease was unsettled")
            model.delivery_count += 1
            model.visible_at = now + seconds
            message = lease.message
            assert message.body == model.body
            assert dict(message.properties) == model.properties
            assert message.delivery_count == model.delivery_count
            assert message.enqueued_at == to_datetime(model.enqueued_at)
            assert lease.expires_at == to_datetime(now + seconds)
            assert lease.duration == seconds
            assert lease.state is leasekit.LeaseState.HELD
            assert lease.receipt not in model.receipts, "a delivery reused an old receipt"
            model.receipts.append(lease.receipt)
            handle = ModelLease(lease, model, seconds)
            model.holder = handle
            self.handles[id(lease)] = handle
            handles.append(lease)
        if model_redelivered := [m for m in expected if m.delivery_count > 1]:
            event(f"redelivery (count {max(m.delivery_count for m in model_redelivered)})")
        return multiple(*handles)

    @precondition(lambda self: self.current_holders())
    @rule(target=leases, count=st.integers(1, 4), duration=st.none() | DURATIONS)
    def expire_and_lease(self, count: int, duration: float | None) -> Any:
        """Let a held lease expire, then lease again: the old lease goes stale (or stays usable)."""
        now = self.now()
        ends = [h.message.visible_at for h in self.current_holders()]
        self.clock.advance(max(0.0, min(ends) - now))
        return self.lease(count, duration)

    @precondition(lambda self: any(h.message.expires_at for h in self.current_holders()))
    @rule(data=st.data())
    def outlive_ttl(self, data: st.DataObject) -> None:
        """Hold a message past its time-to-live, then use the lease: the TTL wins."""
        handle = data.draw(
            st.sampled_from([h for h in self.current_holders() if h.message.expires_at]),
            label="handle",
        )
        assert handle.message.expires_at is not None
        self.clock.advance(handle.message.expires_at - self.now())
        action = data.draw(st.sampled_from(["renew", "complete", "abandon", "dead_letter"]))
        if action == "renew":
            self.renew(handle.lease, None)
        elif action == "complete":
            self.complete(handle.lease)
        elif action == "abandon":
            self.abandon(handle.lease, 0.0)
        else:
            self.dead_letter(handle.lease, "poison")

    @precondition(has_leases)
    @rule(lease=leases, duration=st.none() | DURATIONS)
    def renew(self, lease: Lease, duration: float | None) -> None:
        handle = self.model_of(lease)
        error = self.expected_failure(handle)
        if error is not None:
            self.check_refused(handle, error, lambda: lease.renew(duration))
            return
        expired = handle.message.visible_at <= self.now()
        lease.renew(duration)
        seconds = handle.duration if duration is None else duration
        handle.duration = seconds
        handle.message.visible_at = self.now() + seconds
        assert lease.expires_at == to_datetime(handle.message.visible_at)
        assert lease.duration == seconds
        if self.rotates:  # a new receipt; the lease tracks it, the old one is stale
            assert lease.receipt not in handle.message.receipts
            handle.message.receipts.append(lease.receipt)
        else:
            assert lease.receipt == handle.message.receipts[-1]
        if expired:
            event("expired, not re-leased lease renewed")

    @precondition(has_leases)
    @rule(lease=leases)
    def complete(self, lease: Lease) -> None:
        handle = self.model_of(lease)
        error = self.expected_failure(handle)
        if error is not None:
            self.check_refused(handle, error, lease.complete)
            return
        if handle.message.visible_at <= self.now():
            event("expired, not re-leased lease completed")
        lease.complete()
        handle.state = State.COMPLETED
        handle.message.gone = True
        assert lease.state is leasekit.LeaseState.COMPLETED

    @precondition(has_leases)
    @rule(lease=leases, delay=DELAYS)
    def abandon(self, lease: Lease, delay: float) -> None:
        handle = self.model_of(lease)
        error = self.expected_failure(handle)
        if error is not None:
            self.check_refused(handle, error, lambda: lease.abandon(delay))
            return
        if handle.message.visible_at <= self.now():
            event("expired, not re-leased lease abandoned")
        lease.abandon(delay)
        handle.state = State.ABANDONED
        handle.message.visible_at = self.now() + delay
        assert lease.state is leasekit.LeaseState.ABANDONED

    @precondition(has_leases)
    @rule(lease=leases, reason=st.sampled_from(["poison", "bad input ü"]))
    def dead_letter(self, lease: Lease, reason: str) -> None:
        handle = self.model_of(lease)
        error = self.expected_failure(handle)
        if error is not None:
            self.check_refused(handle, error, lambda: lease.dead_letter(reason))
            return
        lease.dead_letter(reason)
        handle.state = State.DEAD_LETTERED
        handle.message.gone = True
        self.dead.append((handle.message.id, reason))
        assert lease.state is leasekit.LeaseState.DEAD_LETTERED

    @precondition(has_leases)
    @rule(leases=st.lists(leases, min_size=1, max_size=4, unique_by=id))
    def complete_many(self, leases: list[Lease]) -> None:
        """``Queue.complete_many`` gives one result per lease."""
        handles = [self.model_of(lz) for lz in leases]
        expected = [self.expected_failure(h) for h in handles]
        results = self.queue.complete_many(leases)
        for handle, error, result in zip(handles, expected, results, strict=True):
            if error is None:
                assert result is None, f"{handle.message.id}: {result!r}"
                handle.state = State.COMPLETED
                handle.message.gone = True
            else:
                assert isinstance(result, error), f"{handle.message.id}: {result!r}"
                if handle.state is State.HELD:
                    handle.state = State.LOST
                    assert handle.lease.state is leasekit.LeaseState.LOST

    @rule(seconds=STEPS)
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: bool(self.alive()))
    @rule()
    def advance_to_next_expiry(self) -> None:
        """Jump exactly to the next moment a message becomes visible (the boundary case)."""
        now = self.now()
        later = [m.visible_at for m in self.alive() if m.visible_at > now]
        later += [m.expires_at for m in self.alive() if m.expires_at is not None]
        if later:
            self.clock.advance(min(later) - now)
            assert self.clock.time() == min(later)
            event("clock moved exactly to a visibility or time-to-live boundary")

    # ------------------------------------------------------------- invariants

    @invariant()
    def counts_match(self) -> None:
        stats = self.queue.stats()
        now = self.now()
        alive = self.alive()
        assert stats.visible == sum(1 for m in alive if m.visible_at <= now)
        assert (stats.visible or 0) + (stats.leased or 0) + (stats.delayed or 0) == len(alive)
        assert stats.dead_lettered == len(self.dead)

    # --------------------------------------------------------------- teardown

    def drain_and_check(self) -> None:
        """Move far ahead; every live message comes back exactly once, no completed one does."""
        dead = self.queue.peek_dead_letters(1000)
        assert [(d.id, d.reason) for d in dead] == self.dead
        for letter in dead:
            model = self.messages[letter.id]
            assert letter.body == model.body
            assert letter.delivery_count == model.delivery_count
        self.clock.advance(10_000)  # past every lease, delay and time-to-live here
        alive = {m.id for m in self.alive()}
        seen: list[str] = []
        while batch := self.queue.lease(100, duration=60):
            for lease in batch:
                model = self.messages[lease.message.id]
                assert not model.gone, f"settled message {model.id} came back"
                assert lease.message.body == model.body
                assert lease.message.delivery_count == model.delivery_count + 1
                seen.append(lease.message.id)
        assert sorted(seen) == sorted(alive)


class MemoryModel(LeaseModel):
    def open_queue(self, clock: ManualClock) -> Queue:
        return leasekit.open("memory", queue="model", clock=clock, create=True)


class RotatingMemoryModel(LeaseModel):
    """Memory with ``rotate_receipts=True``: renew rotates the receipt (like Azure's)."""

    rotates = True

    def open_queue(self, clock: ManualClock) -> Queue:
        return leasekit.open(
            "memory", queue="model", clock=clock, create=True, rotate_receipts=True
        )


#: SQLite files go to RAM where there is a tmpfs: the model checks semantics, not disks.
RAM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


class SqliteModel(LeaseModel):
    def open_queue(self, clock: ManualClock) -> Queue:
        self.directory = tempfile.mkdtemp(prefix="leasekit-model-", dir=RAM_DIR)
        path = Path(self.directory) / "model.db"
        return leasekit.open("sqlite", path=str(path), queue="model", clock=clock, create=True)

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


MemoryModel.TestCase.settings = SETTINGS
RotatingMemoryModel.TestCase.settings = settings(SETTINGS, max_examples=100)
SqliteModel.TestCase.settings = SETTINGS
TestMemoryModel = MemoryModel.TestCase
TestRotatingMemoryModel = RotatingMemoryModel.TestCase
TestSqliteModel = SqliteModel.TestCase


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_renewed_message_keeps_delivery_order(backend: str, tmp_path: Path) -> None:
    """Regression (found by the model): a renewal whose end has also passed kept its old place.

    Memory re-files a renewed message lazily; it used to deliver it by its
    pre-renewal visibility time when the renewed time had passed as well.
    """
    clock = ManualClock()
    options: dict[str, Any] = {"path": str(tmp_path / "order.db")} if backend == "sqlite" else {}
    with leasekit.open(backend, queue="order", clock=clock, create=True, **options) as queue:
        first, second = queue.send_many([b"first", b"second"])
        (lease,) = queue.lease(1, duration=30)
        assert lease.message.id == first
        clock.advance(30)
        leases = queue.lease(2, duration=30)  # both, visible again at +60
        assert [lz.message.id for lz in leases] == [second, first]
        clock.advance(30)
        leases[1].renew(30)  # first: visible at +90; second: visible since +60
        clock.advance(30)
        assert [lz.message.id for lz in queue.lease(2, duration=30)] == [second, first]
