"""``Queue.stats().oldest_age``: how far back a backlog reaches, where the backend tells.

The memory backend on a manual clock gives it exactly; SQLite and PostgreSQL in
the same read as their counts (``min(enqueued_at)`` over the rows the counts
read already). Elsewhere it is ``None`` and ``capabilities.reports_oldest_age``
says so.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import leasekit
from leasekit.emulators.postgres import LocalPostgres


def test_memory_reports_the_oldest_messages_age_on_its_clock() -> None:
    clock = leasekit.ManualClock()
    with leasekit.open("memory", queue="aged", clock=clock, create=True) as queue:
        assert queue.capabilities.reports_oldest_age
        assert queue.stats().oldest_age is None  # empty
        queue.send(b"first")
        clock.advance(30)
        queue.send(b"second")
        clock.advance(12)
        assert queue.stats().oldest_age == 42
        [lease] = queue.lease(1, duration=60)  # leased: still in the queue
        assert queue.stats().oldest_age == 42
        lease.complete()
        assert queue.stats().oldest_age == 12


def _check_real_backend(queue: leasekit.Queue) -> None:
    assert queue.capabilities.reports_oldest_age
    assert queue.stats().oldest_age is None
    queue.send(b"old")
    time.sleep(0.3)  # the age to measure, not a synchronisation
    queue.send(b"new")
    age = queue.stats().oldest_age
    assert age is not None and 0.3 <= age < 30, age
    [lease] = queue.lease(1, duration=30)
    assert lease.message.body == b"old"
    lease.complete()
    younger = queue.stats().oldest_age
    assert younger is not None and younger < age


def test_sqlite_reports_the_oldest_messages_age(tmp_path: Path) -> None:
    with leasekit.open(f"sqlite:///{tmp_path}/aged.db?queue=aged", create=True) as queue:
        _check_real_backend(queue)


def test_postgresql_reports_the_oldest_messages_age(postgres_server: LocalPostgres) -> None:
    url = f"{postgres_server.url()}?queue=aged-{uuid.uuid4().hex[:8]}&schema=aged"
    with leasekit.open(url, create=True) as queue:
        try:
            _check_real_backend(queue)
        finally:
            queue.delete_queue()


def test_a_backend_that_cannot_tell_says_so() -> None:
    caps = leasekit.Capabilities()
    assert caps.reports_oldest_age is False
