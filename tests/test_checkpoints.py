"""Checkpoints in core: the store path and its fences, the native path's bookkeeping, events.

The memory backend keeps checkpoints natively; the store path is exercised on
the same backend with ``native_checkpoint`` turned off on its driver (a real
driver, one capability flag changed), so core's renewal-then-save order and the
generation fence can be watched without a network. The cloud backends run the
conformance suite's checkpoint section in ``tests/backends/``.
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import leasekit
from leasekit import errors
from leasekit.backends.memory import MemoryBroker, MemoryDriver
from leasekit.conformance import CountingDriver

_names = itertools.count()


class RecordingStore(leasekit.MemoryCheckpointStore):
    """A memory store that remembers the order of the calls it got."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.fail: str | None = None  # the method that raises

    def load(self, message_id: str) -> bytes | None:
        self.calls.append("load")
        if self.fail == "load":
            raise OSError("store down")
        return super().load(message_id)

    def save(self, message_id: str, data: bytes, generation: int) -> bool:
        self.calls.append("save")
        if self.fail == "save":
            raise OSError("store down")
        return super().save(message_id, data, generation)

    def discard(self, message_id: str) -> None:
        self.calls.append("discard")
        super().discard(message_id)


def _stored(
    store: Any, clock: leasekit.ManualClock | None = None
) -> tuple[leasekit.Queue, leasekit.Queue]:
    """A memory queue whose driver keeps no checkpoints (so they go to ``store``), and a twin."""
    broker = MemoryBroker(clock=clock or leasekit.ManualClock())
    name = f"cp-{next(_names)}"
    queues = []
    for _ in range(2):
        driver = MemoryDriver(queue=name, broker=broker)
        driver.capabilities = driver.capabilities.replace(native_checkpoint=False)
        queues.append(leasekit.Queue(driver, checkpoint_store=store))
    queues[0].create()
    return queues[0], queues[1]


def test_the_store_is_written_only_after_the_renewal_confirmed_the_receipt() -> None:
    store = RecordingStore()
    queue, _ = _stored(store)
    queue.send(b"x")
    [lease] = queue.lease(1, duration=30)
    counter = CountingDriver.install(queue.driver)
    try:
        lease.checkpoint(b"half")
    finally:
        counter.uninstall()
    assert counter.calls == ["change_visibility"]  # the one extra call: a renewal
    assert store.calls == ["load", "save"]  # load at receive, save after the renewal
    assert store.load(lease.message.id) == b"half"


def test_a_stale_holder_writes_nothing_to_the_store() -> None:
    store = RecordingStore()
    clock = leasekit.ManualClock()
    queue, other = _stored(store, clock)
    queue.send(b"x")
    [stale] = queue.lease(1, duration=30)
    clock.advance(31)
    [current] = other.lease(1, duration=30)
    current.checkpoint(b"new")
    store.calls.clear()
    with pytest.raises(errors.LeaseLost):
        stale.checkpoint(b"old")
    assert store.calls == []  # the renewal failed first: no save was tried
    assert store.load(current.message.id) == b"new"


def test_a_holder_that_stalled_past_a_later_holders_save_is_fenced_by_the_generation() -> None:
    store = RecordingStore()
    queue, _ = _stored(store)
    queue.send(b"x")
    [lease] = queue.lease(1, duration=30)
    # A later delivery (generation 2) saved while this holder's renewal was in flight.
    store.save(lease.message.id, b"later", lease.message.delivery_count + 1)
    with pytest.raises(errors.LeaseLost, match="later delivery"):
        lease.checkpoint(b"stale")
    assert lease.state is leasekit.LeaseState.LOST
    assert store.load(lease.message.id) == b"later"


def test_a_store_that_fails_on_save_is_a_backend_error_and_the_lease_stays_held() -> None:
    store = RecordingStore()
    queue, _ = _stored(store)
    queue.send(b"x")
    [lease] = queue.lease(1, duration=30)
    store.fail = "save"
    with pytest.raises(errors.BackendError, match="checkpoint store failed") as raised:
        lease.checkpoint(b"half")
    assert isinstance(raised.value.__cause__, OSError)
    assert lease.state is leasekit.LeaseState.HELD
    lease.complete()


def test_a_store_that_fails_on_load_hands_the_message_out_to_start_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RecordingStore()
    queue, _ = _stored(store)
    queue.send(b"x")
    [lease] = queue.lease(1, duration=30)
    lease.checkpoint(b"half")
    lease.abandon()
    store.fail = "load"
    with caplog.at_level(logging.WARNING, logger="leasekit"):
        [again] = queue.lease(1, duration=30)
    assert again.message.checkpoint is None
    assert "starts over" in caplog.text


def test_completion_discards_only_a_checkpoint_that_exists() -> None:
    store = RecordingStore()
    queue, _ = _stored(store)
    queue.send_many([b"a", b"b"])
    first, second = queue.lease(2, duration=30)
    first.checkpoint(b"half")
    store.calls.clear()
    assert queue.complete_many([first, second]) == [None, None]
    assert store.calls == ["discard"]  # the message without a checkpoint cost no call
    assert len(store) == 0


def test_abandon_keeps_the_checkpoint_for_the_next_holder() -> None:
    store = RecordingStore()
    queue, _ = _stored(store)
    queue.send(b"x", properties={"k": "v"})
    [lease] = queue.lease(1, duration=30)
    lease.checkpoint(b"half")
    lease.abandon()
    [again] = queue.lease(1, duration=30)
    assert (again.message.checkpoint, again.message.body) == (b"half", b"x")
    assert dict(again.message.properties) == {"k": "v"}
    again.dead_letter("done with it")
    assert len(store) == 0  # dead-lettering discards it too


def test_without_a_store_checkpoint_is_unsupported_and_names_the_option() -> None:
    queue, _ = _stored(None)
    queue.send(b"x")
    [lease] = queue.lease(1, duration=30)
    assert not queue.can_checkpoint
    with pytest.raises(errors.UnsupportedOperation, match="checkpoint_store"):
        lease.checkpoint(b"half")
    assert lease.state is leasekit.LeaseState.HELD


def test_a_store_given_to_a_native_backend_is_not_used() -> None:
    store = RecordingStore()
    name = f"cp-{next(_names)}"
    with leasekit.open("memory", queue=name, create=True, checkpoint_store=store) as q:
        assert q.capabilities.native_checkpoint and q.checkpoint_store is None and q.can_checkpoint
        q.send(b"x")
        [lease] = q.lease(1, duration=30)
        lease.checkpoint(b"half")
        lease.complete()
    assert store.calls == []


def test_checkpoint_store_must_be_a_store() -> None:
    with pytest.raises(errors.InvalidArgument, match="checkpoint_store"):
        leasekit.open("memory://cp-bad", checkpoint_store=object())


def test_native_checkpoint_over_the_size_limit_is_message_too_large_and_changes_nothing() -> None:
    with leasekit.open(
        "memory", queue=f"cp-{next(_names)}", create=True, max_message_size=16
    ) as queue:
        queue.send(b"x")
        [lease] = queue.lease(1, duration=30)
        with pytest.raises(errors.MessageTooLarge):
            lease.checkpoint(b"y" * 17)
        assert lease.state is leasekit.LeaseState.HELD
        lease.abandon()
        [again] = queue.lease(1, duration=30)
        assert again.message.checkpoint is None
        again.complete()


def test_a_checkpoint_renews_the_lease_for_its_last_duration() -> None:
    clock = leasekit.ManualClock()
    with leasekit.open("memory", queue=f"cp-{next(_names)}", create=True, clock=clock) as queue:
        queue.send(b"x")
        [lease] = queue.lease(1, duration=30)
        clock.advance(20)
        lease.checkpoint(b"half")
        clock.advance(20)  # 40 s after the receive, 20 s after the checkpoint: still hidden
        assert queue.lease(1, duration=30) == []
        lease.complete()


def test_the_checkpoint_event_carries_the_size() -> None:
    seen: list[tuple[str, int]] = []

    class Watch:
        @leasekit.hookimpl
        def leasekit_lease_checkpointed(self, lease: leasekit.Lease, size: int) -> None:
            seen.append((lease.message.id, size))

    registry = leasekit.BackendRegistry()
    registry.register_plugin(Watch())
    with registry.open("memory", queue=f"cp-{next(_names)}", create=True) as queue:
        queue.send(b"x")
        [lease] = queue.lease(1, duration=30)
        lease.checkpoint(b"12345")
        lease.complete()
    assert seen == [(lease.message.id, 5)]


def test_a_sqlite_file_made_before_checkpoints_gets_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE leasekit_queues (name TEXT PRIMARY KEY, created_at REAL NOT NULL);
        CREATE TABLE leasekit_messages (
            seq INTEGER PRIMARY KEY, queue TEXT NOT NULL, id TEXT NOT NULL, body BLOB NOT NULL,
            properties TEXT, enqueued_at REAL NOT NULL, visible_at REAL NOT NULL,
            expires_at REAL, delivery_count INTEGER NOT NULL DEFAULT 0, receipt TEXT);
        INSERT INTO leasekit_queues VALUES ('old', 0);
        INSERT INTO leasekit_messages (queue, id, body, enqueued_at, visible_at)
            VALUES ('old', 'm1', x'01', 0, 0);
        """
    )
    conn.commit()
    conn.close()
    with leasekit.open(f"sqlite:///{path}?queue=old") as queue:
        [lease] = queue.lease(1, duration=30)
        assert lease.message.id == "m1" and lease.message.checkpoint is None
        lease.checkpoint(b"half")
        lease.abandon()
        [again] = queue.lease(1, duration=30)
        assert again.message.checkpoint == b"half"
        again.complete()


def test_checkpoint_on_a_settled_lease_is_a_state_error() -> None:
    with leasekit.open("memory", queue=f"cp-{next(_names)}", create=True) as queue:
        queue.send(b"x")
        [lease] = queue.lease(1, duration=30)
        lease.complete()
        with pytest.raises(errors.LeaseStateError):
            lease.checkpoint(b"late")


def test_otel_records_checkpoints_as_events_on_the_process_span() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from leasekit.plugins import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = leasekit.BackendRegistry()
    otel.instrument(provider, registry=registry)
    try:
        with registry.open("memory", queue=f"cp-{next(_names)}", create=True) as queue:
            queue.send(b"chunked")

            def handler(lease: leasekit.Lease) -> None:
                for step in (b"1", b"22"):
                    lease.checkpoint(step)

            leasekit.Consumer(queue, handler, pass_lease=True, handle_signals=False).run(
                until_idle=True
            )
    finally:
        otel.uninstrument(registry)
        provider.shutdown()
    [process] = [s for s in exporter.get_finished_spans() if s.name.startswith("process")]
    events = [e for e in process.events if e.name == "leasekit.lease.checkpoint"]
    assert [e.attributes["leasekit.checkpoint.size"] for e in events] == [1, 2]
