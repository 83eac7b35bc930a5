"""Queue counts: the ``counts`` capability; what core derives (total, poison-queue letters)."""

from __future__ import annotations

import dataclasses
import json

import pytest

import leasekit
from leasekit import errors
from leasekit.backends.memory import MemoryBroker, MemoryDriver
from leasekit.capabilities import COUNT_FIELDS, Capabilities
from leasekit.queue import Queue
from leasekit.spi import QueueStats


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker(clock=leasekit.ManualClock())


def _driver(broker: MemoryBroker, name: str, **changes: object) -> MemoryDriver:
    driver = MemoryDriver(queue=name, broker=broker)
    driver.capabilities = driver.capabilities.replace(**changes)
    return driver


class _OnlyCounts(MemoryDriver):
    """A memory driver whose ``stats()`` tells only the counts it declares (like a cloud)."""

    def stats(self) -> QueueStats:
        full = super().stats()
        total = (full.visible or 0) + (full.leased or 0) + (full.delayed or 0)
        full = dataclasses.replace(full, total=total)
        return QueueStats(**{name: getattr(full, name) for name in self.capabilities.counts})


# ---------------------------------------------------------------- the capability


def test_count_fields_are_the_queue_stats_fields() -> None:
    # Every count, then the one figure that is not a count (the oldest message's age).
    assert tuple(f.name for f in dataclasses.fields(QueueStats)) == (*COUNT_FIELDS, "oldest_age")


@pytest.mark.parametrize(
    ("counts", "queue_stats", "match"),
    [
        (frozenset({"visible", "waiting"}), True, "unknown count"),
        ("visible", True, "set of names"),
        (frozenset({"visible"}), False, "queue_stats=True"),
    ],
    ids=["unknown-name", "a-string", "without-queue-stats"],
)
def test_bad_counts_are_refused(counts: object, queue_stats: bool, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Capabilities(counts=counts, queue_stats=queue_stats)  # type: ignore[arg-type]


def test_counts_are_kept_as_a_frozenset_and_shown_as_a_sorted_list() -> None:
    caps = Capabilities(queue_stats=True, counts={"total", "delayed"})  # type: ignore[arg-type]
    assert caps.counts == frozenset({"total", "delayed"})
    assert isinstance(caps.counts, frozenset)
    shown = caps.as_dict()
    assert shown["counts"] == ["delayed", "total"]
    json.dumps(shown)  # what `leasekit backends --json` prints


@pytest.mark.parametrize(
    ("counts", "native", "counted"),
    [
        ({"visible", "leased", "delayed"}, True, {"visible", "leased", "delayed", "total"}),
        (
            {"visible", "leased", "delayed"},
            False,
            {"visible", "leased", "delayed", "total", "dead_lettered"},
        ),
        ({"total"}, False, {"total", "dead_lettered"}),
        ({"delayed", "dead_lettered", "total"}, True, {"delayed", "dead_lettered", "total"}),
        ({"visible", "leased"}, False, {"visible", "leased"}),
        (set(), False, set()),
    ],
    ids=["mns-like-native", "mns", "storage-queue", "service-bus", "no-total", "none"],
)
def test_counted_adds_what_core_derives(counts: set[str], native: bool, counted: set[str]) -> None:
    caps = Capabilities(
        queue_stats=True,
        counts=frozenset(counts),
        native_dead_letter=native,
    )
    assert caps.counted == counted


# ---------------------------------------------------------------- Queue.stats


def test_stats_add_up_the_total_of_the_three_states(broker: MemoryBroker) -> None:
    queue = leasekit.open("memory", queue="sum", broker=broker, create=True)
    queue.send(b"visible")
    queue.send(b"later", delay=60)
    queue.send(b"leased")
    queue.lease(1, duration=30)
    stats = queue.stats()
    assert stats == QueueStats(visible=1, leased=1, delayed=1, dead_lettered=0, total=3)
    assert stats.oldest_age is not None  # not compared: a reading of time, not a count


def test_only_the_declared_counts_are_filled(broker: MemoryBroker) -> None:
    driver = _OnlyCounts(queue="partial", broker=broker)
    driver.capabilities = driver.capabilities.replace(counts=frozenset({"visible", "leased"}))
    queue = Queue(driver)
    queue.create()
    queue.send(b"x")
    assert queue.stats() == QueueStats(visible=1, leased=0)


def test_without_a_native_store_dead_letters_are_the_poison_queues_total(
    broker: MemoryBroker,
) -> None:
    driver = _OnlyCounts(queue="orders", broker=broker)
    driver.capabilities = driver.capabilities.replace(
        native_dead_letter=False, counts=frozenset({"total"})
    )
    queue = Queue(driver)
    queue.create()
    assert "orders-poison" not in broker.queues
    # No poison queue yet (core makes it on the first dead letter): none dead-lettered.
    assert queue.stats() == QueueStats(total=0, dead_lettered=0)
    assert "orders-poison" not in broker.queues, "stats() must not create the poison queue"

    queue.send_many([b"bad", b"worse", b"fine"])
    for lease in queue.lease(2, duration=30):
        lease.dead_letter("unparseable")
    assert queue.stats() == QueueStats(total=1, dead_lettered=2)

    # Someone re-processing a letter holds a lease on it: it is still dead-lettered.
    poison = leasekit.open("memory", queue="orders-poison", broker=broker)
    [held] = poison.lease(1, duration=30)
    assert queue.stats().dead_lettered == 2
    held.complete()
    assert queue.stats().dead_lettered == 1


def test_a_fresh_queue_object_counts_an_existing_poison_queue(broker: MemoryBroker) -> None:
    states = frozenset({"visible", "leased", "delayed"})
    first = Queue(_driver(broker, "jobs", native_dead_letter=False, counts=states))
    first.create()
    first.send(b"bad")
    first.lease(1, duration=30)[0].dead_letter("no")
    first.close()
    second = Queue(_driver(broker, "jobs", native_dead_letter=False, counts=states))
    assert second.stats() == QueueStats(visible=0, leased=0, delayed=0, dead_lettered=1, total=0)


def test_stats_of_a_missing_queue_raise_queue_not_found(broker: MemoryBroker) -> None:
    queue = Queue(_driver(broker, "ghost", native_dead_letter=False))
    with pytest.raises(errors.QueueNotFound):
        queue.stats()


def test_a_backend_without_stats_says_so(broker: MemoryBroker) -> None:
    queue = Queue(_driver(broker, "mute", queue_stats=False, counts=frozenset()))
    queue.create()
    with pytest.raises(errors.UnsupportedOperation, match="cannot report queue stats"):
        queue.stats()
