"""The keeper and the Consumer on Azure Storage Queue (Azurite): pop receipts rotate on every
renewal, so a handler slower than the physical lease only finishes cleanly if the newest
receipt is tracked."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest
from _fixtures.azurite import Azurite

import leasekit


@pytest.fixture
def queue(azurite: Azurite):  # type: ignore[no-untyped-def]
    q = leasekit.open(
        "azure-storage-queue",
        queue=f"lk-consumer-{uuid.uuid4().hex[:8]}",
        connection_string=azurite.connection_string,
        create=True,
    )
    yield q
    q.delete_queue()
    q.close()


def test_slow_handlers_finish_with_every_message_completed_once(queue: leasekit.Queue) -> None:
    ids = set(queue.send_many([b"slow-%d" % i for i in range(4)]))
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(message: leasekit.Message) -> None:
        time.sleep(2.5)  # the work: longer than two physical leases of 1 s
        with lock:
            seen[message.id] += 1

    stats = leasekit.Consumer(queue, handler, concurrency=4, lease_duration=1).run(until_idle=True)
    assert set(seen) == ids and set(seen.values()) == {1}
    assert stats.completed == 4
    assert stats.stale_on_complete == 0 and stats.lost == 0
    assert queue.lease(1, duration=1, wait=2) == []


def test_keeper_tracks_the_rotating_pop_receipt(queue: leasekit.Queue) -> None:
    queue.send(b"held")
    [lease] = queue.lease(1, duration=1)
    first = lease.receipt
    with leasekit.LeaseKeeper() as keeper, keeper.hold(lease):
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert queue.lease(1, duration=1, wait=0.5) == [], "the kept lease lapsed"
        assert lease.receipt != first
        lease.complete()
    assert keeper.stats.renewed >= 2 and keeper.stats.lost == 0
