"""What the per-message cost work (issue 25) must not give up.

Leases of one receive share one lock; ``lease.lost`` and callbacks are made
when first asked for and still work; per-lease events reach an observer that
listens and are not built for one that does not (``listens_when``); a message
without properties shares one read-only empty mapping; ``lease.raw_message``
is rebuilt with the current receipt; the SQLite driver's one-statement settle
keeps every receipt fenced, also for two receipts of one message in one call.
"""

from __future__ import annotations

import json
import logging
import threading
from itertools import count
from pathlib import Path
from typing import Any

import pytest

import leasekit
from leasekit.backends.memory import MemoryBroker
from leasekit.message import NO_PROPERTIES

_names = count()


def _sqlite(tmp_path: Path, clock: leasekit.ManualClock | None = None) -> leasekit.Queue:
    return leasekit.open(
        "sqlite",
        path=str(tmp_path / "cost.db"),
        queue=f"cost-{next(_names)}",
        create=True,
        clock=clock or leasekit.ManualClock(1_700_000_000.0),
    )


def test_leases_of_one_receive_share_one_lock_and_make_no_event_until_asked(
    tmp_path: Path,
) -> None:
    with _sqlite(tmp_path) as queue:
        queue.send_many([b"a", b"b", b"c"])
        leases = queue.lease(3, duration=30)
        batches = {id(lease._record._batch) for lease in leases}
        assert len(batches) == 1, "one LeaseBatch per receive"
        record = leases[0]._record
        assert record._lost_event is None and record._on_lost is None
        assert record._batch.idle is None, "no condition until an operation has to wait"
        queue.send(b"d")
        [second] = queue.lease(1, duration=30)
        assert second._record._batch is not record._batch, "another receive, another batch"


def test_lost_event_made_on_first_use_is_set_when_the_lease_is_lost(tmp_path: Path) -> None:
    with _sqlite(tmp_path) as queue:
        queue.send(b"x")
        [lease] = queue.lease(1, duration=30)
        event = lease.lost
        assert not event.is_set()
        woke = threading.Event()
        waiter = threading.Thread(target=lambda: event.wait(5) and woke.set())
        waiter.start()
        lease._record.lose(lease, leasekit.LeaseLost("taken"))
        waiter.join(5)
        assert woke.is_set() and lease.lost.is_set()
        assert lease.lost is event, "the same event, made once"


def test_lost_event_first_asked_for_after_the_loss_is_already_set(tmp_path: Path) -> None:
    with _sqlite(tmp_path) as queue:
        queue.send(b"x")
        [lease] = queue.lease(1, duration=30)
        lease._record.lose(lease, leasekit.LeaseLost("taken"))
        assert lease.lost.is_set()


def test_an_operation_waits_for_another_on_a_lease_of_the_same_batch(tmp_path: Path) -> None:
    """The shared condition is made by the first waiter and wakes it when the other ends."""
    with _sqlite(tmp_path) as queue:
        queue.send_many([b"a", b"b"])
        first, other = queue.lease(2, duration=30)
        record = first._record
        assert record.take("renew", "renew", first.message.id) == first.receipt
        results: list[Any] = []
        waiter = threading.Thread(target=lambda: results.append(first.complete()))
        waiter.start()
        pause = threading.Event()
        for _ in range(500):  # poll (with a deadline) until the waiter sleeps on the condition
            if record._batch.idle is not None:
                break
            pause.wait(0.01)
        assert record._batch.idle is not None
        other.complete()  # a lease of the same batch is not held up
        assert waiter.is_alive()
        record.release()
        waiter.join(5)
        assert results == [None] and first.state is leasekit.LeaseState.COMPLETED


class _Observer:
    def __init__(self) -> None:
        self.listening = False
        self.acquired: list[str] = []
        self.completed: list[str] = []

    @leasekit.hookimpl
    def leasekit_lease_completed(self, lease: leasekit.Lease) -> None:
        self.completed.append(lease.message.id)


def test_per_lease_events_reach_a_listening_observer_only_while_it_listens() -> None:
    observer = _Observer()

    @leasekit.hookimpl
    @leasekit.listens_when(lambda: observer.listening)
    def leasekit_lease_acquired(lease: leasekit.Lease) -> None:
        observer.acquired.append(lease.message.id)

    plugin = type(
        "Plugin",
        (),
        {
            "leasekit_lease_acquired": staticmethod(leasekit_lease_acquired),
            "leasekit_lease_completed": observer.leasekit_lease_completed,
        },
    )
    registry = leasekit.BackendRegistry()
    registry.register_plugin(plugin)
    queue = registry.open(
        "memory", queue="events", broker=MemoryBroker(clock=leasekit.ManualClock()), create=True
    )
    queue.send_many([b"1", b"2", b"3", b"4"])
    quiet = queue.lease(2, duration=30)
    assert observer.acquired == [], "not built for an observer that does not listen"
    assert not queue.events.observed("leasekit_lease_acquired")
    observer.listening = True
    heard = queue.lease(2, duration=30)
    assert observer.acquired == [lease.message.id for lease in heard]
    queue.complete_many(quiet + heard)
    assert observer.completed == [lease.message.id for lease in quiet + heard]


def test_the_logging_plugin_logs_leases_at_debug_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _sqlite(tmp_path) as queue:
        queue.send_many([b"a", b"b"])
        with caplog.at_level(logging.INFO, logger="leasekit.events"):
            [lease] = queue.lease(1, duration=30)
            lease.complete()
        assert not [r for r in caplog.records if r.name == "leasekit.events"]
        with caplog.at_level(logging.DEBUG, logger="leasekit.events"):
            [lease] = queue.lease(1, duration=30)
            lease.complete()
        lines = [r.getMessage() for r in caplog.records if r.name == "leasekit.events"]
        assert any(line.startswith(f"leased {lease.message.id}") for line in lines)
        assert f"completed {lease.message.id}" in lines


def test_a_message_without_properties_shares_one_read_only_empty_mapping(
    tmp_path: Path,
) -> None:
    with _sqlite(tmp_path) as queue:
        queue.send_many([b"a", b"b"])
        queue.send(b"c", properties={"k": "v"})
        first, second, third = queue.lease(3, duration=30)
        assert first.message.properties is NO_PROPERTIES is second.message.properties
        assert json.dumps(first.message.properties) == "{}"
        assert dict(first.message.properties) == {}
        with pytest.raises(TypeError):
            first.message.properties["k"] = "v"  # type: ignore[index]
        assert NO_PROPERTIES == {}
        assert third.message.properties == {"k": "v"}


def test_raw_message_is_rebuilt_with_the_current_receipt(tmp_path: Path) -> None:
    with _sqlite(tmp_path) as queue:
        queue.send(b"body", properties={"a": "b"})
        [lease] = queue.lease(1, duration=30)
        raw = lease.raw_message
        assert (raw.id, raw.body, raw.receipt, raw.delivery_count) == (
            lease.message.id,
            b"body",
            lease.receipt,
            1,
        )
        assert raw.properties == {"a": "b"} and raw.visible_until == lease.expires_at
        lease.complete()


@pytest.mark.parametrize("order", ["stale first", "current first"])
def test_sqlite_settles_an_old_and_the_current_receipt_of_one_message_apart(
    tmp_path: Path, order: str
) -> None:
    """A stale and the current receipt of one row in one ``complete_many`` (the model found it)."""
    clock = leasekit.ManualClock(1_700_000_000.0)
    with _sqlite(tmp_path, clock) as queue:
        queue.send(b"x")
        [old] = queue.lease(1, duration=1)
        clock.advance(2)
        [current] = queue.lease(1, duration=30)
        assert current.message.id == old.message.id and current.receipt != old.receipt
        leases = [old, current] if order == "stale first" else [current, old]
        results = dict(zip((id(lz) for lz in leases), queue.complete_many(leases), strict=True))
        assert isinstance(results[id(old)], leasekit.LeaseLost)
        assert results[id(current)] is None
        assert queue.lease(1, duration=30) == [], "completed by the current receipt"


def test_sqlite_batch_renew_and_abandon_are_fenced_per_receipt(tmp_path: Path) -> None:
    clock = leasekit.ManualClock(1_700_000_000.0)
    with _sqlite(tmp_path, clock) as queue:
        queue.send_many([b"a", b"b", b"c"])
        leases = queue.lease(3, duration=30)
        leases[1]._record.receipt = leases[1].receipt + "0"  # a stale receipt of a real row
        renewed = queue.renew_many(leases, 60)
        assert renewed[0] is None and renewed[2] is None
        assert isinstance(renewed[1], leasekit.LeaseLost)
        abandoned = queue.abandon_many([leases[0], leases[2]])
        assert abandoned == [None, None]
        again = queue.lease(3, duration=30)
        assert sorted(lz.message.body for lz in again) == [b"a", b"c"]


def test_a_plugin_registered_after_the_queue_opened_hears_its_events() -> None:
    """Who listens is cached per queue until the plugin manager changes."""
    registry = leasekit.BackendRegistry()
    queue = registry.open(
        "memory", queue="late", broker=MemoryBroker(clock=leasekit.ManualClock()), create=True
    )
    queue.send_many([b"1", b"2"])
    assert not queue.events.observed("leasekit_lease_acquired")
    queue.lease(1, duration=30)
    heard: list[str] = []

    class Late:
        @leasekit.hookimpl
        def leasekit_lease_acquired(self, lease: leasekit.Lease) -> None:
            heard.append(lease.message.id)

    plugin = Late()
    registry.register_plugin(plugin)
    [lease] = queue.lease(1, duration=30)
    assert heard == [lease.message.id]
    registry.plugin_manager.unregister(plugin)
    queue.send(b"3")
    queue.lease(1, duration=30)
    assert heard == [lease.message.id], "an unregistered plugin hears nothing more"


def test_a_lease_is_freed_without_the_garbage_collector(tmp_path: Path) -> None:
    """A lease's record keeps no reference to it: no cycle, so dropping it frees it."""
    import gc
    import weakref

    with _sqlite(tmp_path) as queue:
        queue.send(b"x")
        [lease] = queue.lease(1, duration=30)
        gone = weakref.ref(lease)
        lease.complete()
        gc.disable()
        try:
            del lease
            assert gone() is None, "the lease outlived its last reference"
        finally:
            gc.enable()


@pytest.mark.parametrize("observed", [False, True], ids=["lean", "observed"])
def test_complete_keeps_the_settle_contract_on_both_paths(
    tmp_path: Path, observed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lease.complete()``: the same outcomes whether or not an observer makes it take the
    general path — completed, settled twice, stale, and out of time before the call."""
    from leasekit.deadline import deadline
    from leasekit.lease_operations import LeaseOperations

    watcher = _Observer()
    registry = leasekit.BackendRegistry()
    if observed:
        registry.register_plugin(watcher)
    else:  # nobody looks on: the lean path, never the general one

        def general(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("lease.complete() took the general path with nobody looking on")

        monkeypatch.setattr(LeaseOperations, "settle", general)
    clock = leasekit.ManualClock(1_700_000_000.0)
    with registry.open(
        "sqlite", path=str(tmp_path / "both.db"), queue="both", create=True, clock=clock
    ) as queue:
        queue.send_many([b"a", b"b", b"c"])
        first, second, third = queue.lease(3, duration=5)
        first.complete()
        assert first.state is leasekit.LeaseState.COMPLETED
        with pytest.raises(leasekit.LeaseStateError):
            first.complete()
        clock.advance(6)  # the second's lease ends; another consumer takes it
        [taken] = queue.lease(1, duration=30)
        assert taken.message.id == second.message.id
        with pytest.raises(leasekit.LeaseLost):
            second.complete()
        assert second.state is leasekit.LeaseState.LOST
        taken.complete()
        with deadline(0.0), pytest.raises(leasekit.BackendUnavailable, match="timeout passed"):
            third.complete()  # nothing asked of the backend: still held
        assert third.state is leasekit.LeaseState.HELD
        third.complete()
    expected = [first.message.id, taken.message.id, third.message.id] if observed else []
    assert watcher.completed == expected


def test_leases_made_from_plain_rows_are_those_made_from_raw_messages() -> None:
    """``ReceivedRows`` takes a path of its own in core: the same objects, field by field."""
    from datetime import UTC, datetime, timedelta

    from leasekit.lease import Lease
    from leasekit.lease_record import LeaseRecord
    from leasekit.spi import ReceivedRows

    now = datetime.now(UTC)
    rows = [
        ("m1", b"one", None, now, 1, "1.11", now + timedelta(seconds=30), None),
        ("m2", b"two", '{"k": "v"}', now, 3, "2.22", now + timedelta(seconds=30), "g"),
        ("m3", b"three", {}, now, 2, "3.33", now + timedelta(seconds=30), None),
    ]
    batch = ReceivedRows(rows, lambda value: dict(json.loads(value)))
    assert len(batch) == 3 and batch[1].properties == {"k": "v"} and batch == batch.messages()
    with leasekit.open("memory://", queue="rows") as queue:
        operations = queue._operations  # type: ignore[attr-defined]
        from_rows = operations.leases_from(batch, 30.0, 100.0)
        from_raw = operations.leases_from(batch.messages(), 30.0, 100.0)
        assert type(from_rows[0]) is Lease and len(from_rows) == len(from_raw) == 3
        for a, b in zip(from_rows, from_raw, strict=True):
            assert a.message == b.message and type(a.message) is type(b.message)
            assert a.message.properties is NO_PROPERTIES or a.message.properties == {"k": "v"}
            assert type(a.message.properties) is type(b.message.properties)
            for name in Lease.__slots__:
                if name not in ("__weakref__", "_record", "received_at"):
                    assert getattr(a, name) == getattr(b, name), name
            assert abs(a.received_at - b.received_at) < 5.0
            for name in LeaseRecord.__slots__:
                left, right = getattr(a._record, name), getattr(b._record, name)
                if name in ("_batch", "_mutex"):  # one per receive: the same kind, shared
                    assert type(left) is type(right), name
                    assert left is getattr(from_rows[0]._record, name), name
                else:
                    assert left == right, name
        assert [lease.receipt for lease in from_rows] == ["1.11", "2.22", "3.33"]
        assert all(lease.state is leasekit.LeaseState.HELD for lease in from_rows)
        assert batch != ["not", "messages"] and batch != ()  # compared as a list is
