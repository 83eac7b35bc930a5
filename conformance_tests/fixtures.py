"""The fixtures every conformance section shares: a fresh queue and the leases its tests use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leasekit.queue import Queue

from .harness import Harness

__all__ = ["QueueFixtures"]


class QueueFixtures:
    """``queue``, ``short`` and ``long`` for a section's tests; a subclass supplies ``harness``."""

    @pytest.fixture
    def queue(self, harness: Harness) -> Iterator[Queue]:
        """A fresh, empty queue, deleted after the test."""
        queue = harness.make_queue()
        try:
            yield queue
        finally:
            harness.cleanup(queue)

    @pytest.fixture
    def short(self, harness: Harness, queue: Queue) -> float:
        """The shortest lease for expiry tests."""
        return harness.short_lease(queue)

    @pytest.fixture
    def long(self, harness: Harness, queue: Queue) -> float:
        """A lease long enough to outlast any single test step."""
        return harness.long_lease(queue)
