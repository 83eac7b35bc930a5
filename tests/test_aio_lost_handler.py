"""AsyncConsumer stops a handler whose lease is found lost: its task is cancelled, once counted.

Async only: a thread cannot be cancelled from outside, so the threaded Consumer
has no equivalent (its handler watches ``lease.lost`` / ``lease.check()``, see
``tests/test_worker_parity.py``'s pass_lease rows). The lease ends by the
memory backend's manual clock, and another consumer takes the message; the
keeper finds the lease lost on its next renewal. Timing is measured from the
moment the lease was marked lost to the handler's cancellation.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import leasekit
import leasekit.aio
from leasekit.aio import AsyncConsumer, AsyncLease
from leasekit.backends.memory import MemoryBroker

_names = itertools.count()


class Plugin:
    """Records the after_process outcomes and when leases were found lost."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []
        self.lost_at: list[float] = []

    @leasekit.hookimpl
    def leasekit_after_process(self, lease: leasekit.Lease, error: Any, outcome: str) -> None:
        self.outcomes.append(outcome)

    @leasekit.hookimpl
    def leasekit_lease_lost(self, lease: leasekit.Lease, error: Any) -> None:
        self.lost_at.append(time.monotonic())


def _queues(plugin: Plugin) -> tuple[leasekit.Queue, leasekit.Queue, leasekit.ManualClock]:
    clock = leasekit.ManualClock()
    broker = MemoryBroker(clock=clock)
    registry = leasekit.BackendRegistry()
    registry.register_plugin(plugin)
    name = f"lost-{next(_names)}"
    queue = registry.open("memory", queue=name, broker=broker, create=True)
    other = leasekit.open("memory", queue=name, broker=broker)
    return queue, other, clock


def test_a_handler_whose_lease_is_taken_over_is_cancelled_within_a_second() -> None:
    plugin = Plugin()
    queue, other, clock = _queues(plugin)
    queue.send(b"long work")
    started = asyncio.Event()
    cancelled_at: list[float] = []
    taken: list[leasekit.Lease] = []

    async def handler(message: leasekit.Message) -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # work that would never end
        except asyncio.CancelledError:
            cancelled_at.append(time.monotonic())
            raise

    async def main() -> leasekit.ConsumerStats:
        async with leasekit.aio.AsyncQueue(queue) as aqueue:
            consumer = AsyncConsumer(aqueue, handler, lease_duration=1.0, handle_signals=False)
            run = asyncio.ensure_future(consumer.run())
            await asyncio.wait_for(started.wait(), 10)
            clock.advance(5)  # the backend's lease ended ...
            taken.extend(other.lease(1, duration=60))  # ... and someone else has the message
            deadline = time.monotonic() + 10
            while not cancelled_at and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            consumer.stop()
            return await run

    stats = asyncio.run(main())
    assert len(taken) == 1 and cancelled_at and plugin.lost_at
    assert cancelled_at[0] - plugin.lost_at[0] < 1.0
    assert stats.cancelled_on_loss == 1
    assert (stats.lost, stats.failed, stats.abandoned, stats.completed) == (0, 0, 0, 0)
    assert stats.abandoned_at_shutdown == 0 and stats.in_flight == 0
    assert plugin.outcomes == ["cancelled_on_loss"]
    taken[0].complete()  # the new holder's lease was left alone


def test_after_max_lifetime_the_handler_is_cancelled_at_the_lease_deadline() -> None:
    plugin = Plugin()
    queue, _, _ = _queues(plugin)
    queue.send(b"hung")
    deadlines: list[float] = []
    cancelled_at: list[float] = []

    async def handler(lease: AsyncLease) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled_at.append(time.monotonic())
            deadlines.append(lease.deadline)
            raise

    async def main() -> leasekit.ConsumerStats:
        async with leasekit.aio.AsyncQueue(queue) as aqueue:
            consumer = AsyncConsumer(
                aqueue,
                handler,
                lease_duration=0.5,
                max_lifetime=0.3,
                pass_lease=True,
                handle_signals=False,
            )
            run = asyncio.ensure_future(consumer.run())
            deadline = time.monotonic() + 10
            while not cancelled_at and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            consumer.stop()
            return await run

    stats = asyncio.run(main())
    assert cancelled_at, "the handler was not cancelled"
    assert 0 <= cancelled_at[0] - deadlines[0] < 1.0
    assert stats.cancelled_on_loss == 1 and stats.lost == 0 and stats.failed == 0
    assert plugin.outcomes == ["cancelled_on_loss"]


def test_a_handler_that_swallows_the_cancel_counts_as_cancelled_and_is_not_completed() -> None:
    plugin = Plugin()
    queue, other, clock = _queues(plugin)
    queue.send(b"stubborn")
    started = asyncio.Event()

    async def handler(message: leasekit.Message) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return  # swallowed: its work is not done all the same

    async def main() -> leasekit.ConsumerStats:
        async with leasekit.aio.AsyncQueue(queue) as aqueue:
            consumer = AsyncConsumer(aqueue, handler, lease_duration=1.0, handle_signals=False)
            run = asyncio.ensure_future(consumer.run())
            await asyncio.wait_for(started.wait(), 10)
            clock.advance(5)
            [lease] = other.lease(1, duration=60)
            deadline = time.monotonic() + 10
            while not plugin.outcomes and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            consumer.stop()
            stats = await run
            lease.complete()  # still the new holder's
            return stats

    stats = asyncio.run(main())
    assert stats.cancelled_on_loss == 1
    assert (stats.completed, stats.stale_on_complete, stats.lost) == (0, 0, 0)


def test_shutdown_cancels_a_handler_as_a_shutdown_not_as_a_loss() -> None:
    plugin = Plugin()
    queue, other, _ = _queues(plugin)
    queue.send(b"slow")
    started = asyncio.Event()

    async def handler(message: leasekit.Message) -> None:
        started.set()
        await asyncio.Event().wait()

    async def main() -> leasekit.ConsumerStats:
        async with leasekit.aio.AsyncQueue(queue) as aqueue:
            consumer = AsyncConsumer(
                aqueue, handler, lease_duration=30, shutdown_grace=0.1, handle_signals=False
            )
            run = asyncio.ensure_future(consumer.run())
            await asyncio.wait_for(started.wait(), 10)
            consumer.stop()
            return await run

    stats = asyncio.run(main())
    assert stats.cancelled_on_loss == 0
    assert stats.abandoned_at_shutdown == 1
    [again] = other.lease(1, duration=30)  # given back, not leaked
    again.complete()
