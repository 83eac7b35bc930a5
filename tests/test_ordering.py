"""Ordered groups through the worker: Consumer (threads) and AsyncConsumer (tasks).

On memory and SQLite: a group's messages reach the handler one at a time and in
the order sent, different groups run in parallel, a failed message holds its
group until it is handled, a poison one is dead-lettered without breaking the
order of the rest (docs/ordering.md, "Consuming").
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import leasekit
import leasekit.aio
from leasekit.aio import AsyncConsumer
from leasekit.backends.memory import MemoryBroker

#: How long a handler waits for another group before the test calls it held up.
HELD_UP = 30.0


@pytest.fixture(params=["memory", "sqlite"])
def queue(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[leasekit.Queue]:
    """A fresh ordered queue; the tasks face closes it when done, so teardown reopens."""
    name = f"ordered-{request.node.name[-40:]}".replace("[", "-").replace("]", "")
    broker = MemoryBroker()

    def opened(create: bool = False) -> leasekit.Queue:
        if request.param == "memory":
            return leasekit.open("memory", queue=name, broker=broker, create=create)
        return leasekit.open(f"sqlite:///{tmp_path / 'o.db'}", queue=name, create=create)

    first = opened(create=True)
    first.reopen = opened  # type: ignore[attr-defined]
    try:
        yield first
    finally:
        first.close()
        with opened() as last:
            last.delete_queue()


def _run(queue: leasekit.Queue, face: str, handler: Any, **options: Any) -> leasekit.ConsumerStats:
    """Run ``handler(message)`` (a plain function) on ``queue`` until idle, on ``face``."""
    options = {"handle_signals": False, "lease_duration": 30, **options}
    if face == "threads":
        return leasekit.Consumer(queue, handler, **options).run(until_idle=True)

    async def call(message: leasekit.Message) -> None:
        await asyncio.to_thread(handler, message)

    async def main() -> leasekit.ConsumerStats:
        async with leasekit.aio.AsyncQueue(queue) as aqueue:
            return await AsyncConsumer(aqueue, call, **options).run(until_idle=True)

    return asyncio.run(main())


class _Tracker:
    """Records each group's handler calls and fails if two of one group overlap."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: set[str] = set()
        self.calls: dict[str, list[bytes]] = defaultdict(list)
        self.overlaps: list[str] = []

    def enter(self, message: leasekit.Message) -> None:
        group = message.group
        assert group is not None
        with self.lock:
            if group in self.active:
                self.overlaps.append(group)
            self.active.add(group)
            self.calls[group].append(message.body)

    def leave(self, message: leasekit.Message) -> None:
        with self.lock:
            self.active.discard(message.group or "")


def _send_interleaved(queue: leasekit.Queue, groups: int, per: int) -> dict[str, list[bytes]]:
    sent: dict[str, list[bytes]] = defaultdict(list)
    for i in range(per):
        for g in range(groups):
            body = b"g%d-%03d" % (g, i)
            queue.send(body, group=f"g{g}")
            sent[f"g{g}"].append(body)
    return sent


@pytest.mark.parametrize("face", ["threads", "tasks"])
def test_each_group_reaches_the_handler_one_at_a_time_in_order(
    queue: leasekit.Queue, face: str
) -> None:
    sent = _send_interleaved(queue, groups=6, per=15)
    tracker = _Tracker()

    def handler(message: leasekit.Message) -> None:
        tracker.enter(message)
        tracker.leave(message)

    stats = _run(queue, face, handler, concurrency=4)
    assert tracker.overlaps == []
    assert dict(tracker.calls) == dict(sent)
    assert stats.completed == 90


@pytest.mark.parametrize("face", ["threads", "tasks"])
def test_a_group_busy_in_its_handler_holds_up_no_other_group(
    queue: leasekit.Queue, face: str
) -> None:
    queue.send_many([b"a0", b"a1"], group="A")
    queue.send_many([b"b0", b"b1", b"b2"], group="B")
    b_done = threading.Event()
    order: list[bytes] = []
    held_up: list[bytes] = []

    def handler(message: leasekit.Message) -> None:
        order.append(message.body)
        if message.body == b"a0" and not b_done.wait(HELD_UP):
            held_up.append(message.body)  # group B never ran while a0 was in hand
        if message.body == b"b2":
            b_done.set()

    _run(queue, face, handler, concurrency=2)
    assert held_up == []
    assert [body for body in order if body.startswith(b"a")] == [b"a0", b"a1"]
    assert order.index(b"b2") < order.index(b"a1")


@pytest.mark.parametrize("face", ["threads", "tasks"])
def test_a_failed_message_holds_its_group_until_it_is_handled(
    queue: leasekit.Queue, face: str
) -> None:
    sent = _send_interleaved(queue, groups=3, per=8)
    tracker = _Tracker()
    failed: set[bytes] = set()

    def handler(message: leasekit.Message) -> None:
        tracker.enter(message)
        try:
            if message.body.endswith((b"-002", b"-005")) and message.body not in failed:
                failed.add(message.body)
                raise RuntimeError("fails on its first delivery")
        finally:
            tracker.leave(message)

    stats = _run(queue, face, handler, concurrency=3, backoff_base=0.0)
    assert tracker.overlaps == []
    for group, bodies in sent.items():
        # Each failed message is retried before anything after it in its group.
        expected = [b for body in bodies for b in ([body, body] if body in failed else [body])]
        assert tracker.calls[group] == expected
    assert stats.failed == stats.abandoned == 6
    assert stats.completed == 24


@pytest.mark.parametrize("face", ["threads", "tasks"])
def test_a_poison_message_is_dead_lettered_and_the_rest_keep_their_order(
    queue: leasekit.Queue, face: str
) -> None:
    queue.send_many([b"p0", b"p1", b"p2", b"p3"], group="P")
    calls: list[bytes] = []

    def handler(message: leasekit.Message) -> None:
        calls.append(message.body)
        if message.body == b"p1":
            raise RuntimeError("always fails")

    stats = _run(queue, face, handler, concurrency=2, backoff_base=0.0, max_deliveries=3)
    assert calls == [b"p0", b"p1", b"p1", b"p1", b"p2", b"p3"]
    assert stats.dead_lettered == 1
    with queue.reopen() as again:  # type: ignore[attr-defined]
        assert [letter.body for letter in again.peek_dead_letters()] == [b"p1"]
    assert stats.completed == 3
