"""SQS FIFO queues (``*.fifo``) on moto's server: groups, deduplication, renewal, the worker.

moto models FIFO group blocking (a group with a message in flight hands out no
other), several messages of one group per receive, and deduplication ids; the
ordered conformance section runs against it unchanged.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

import leasekit
import leasekit.aio
from leasekit import InvalidArgument, UnsupportedOperation
from leasekit.conformance import CountingDriver, OrderedSuite, UrlHarness
from leasekit.queue import Queue

pytest.importorskip("boto3")

#: Slack on expiry deadlines (SQS works in whole seconds).
MARGIN = 5.0


class FifoHarness(UrlHarness):
    """Fresh ``*.fifo`` queues on moto."""

    def queue_name(self) -> str:
        return super().queue_name() + ".fifo"

    def make_missing_queue(self) -> Queue:
        queue = self.open_queue(super().queue_name() + "-missing.fifo", create=False)
        with self._lock:
            self._open.append(queue)
        return queue


class TestSqsFifoOrdered(OrderedSuite):
    conformance_backend = "SqsFifo"

    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, moto_server: Any) -> Iterator[FifoHarness]:
        harness = FifoHarness("aws-sqs", **moto_server.options)
        yield harness
        harness.close()


@pytest.fixture
def fifo(moto_server: Any) -> Iterator[Queue]:
    name = f"fifo-{secrets.token_hex(4)}.fifo"
    queue = leasekit.open("aws-sqs", queue=name, create=True, **moto_server.options)
    try:
        yield queue
    finally:
        queue.delete_queue()
        queue.close()


def test_fifo_queue_declares_groups_and_deduplication(fifo: Queue, moto_server: Any) -> None:
    caps = fifo.capabilities
    assert caps.ordered and caps.deduplicates
    assert caps.max_send_delay == 0
    attributes = fifo.driver.client.get_queue_attributes(  # type: ignore[attr-defined]
        QueueUrl=fifo.driver._url(),  # type: ignore[attr-defined]
        AttributeNames=["FifoQueue"],
    )["Attributes"]
    assert attributes["FifoQueue"] == "true"
    with leasekit.open("aws-sqs", queue="standard", **moto_server.options) as standard:
        assert not standard.capabilities.ordered and not standard.capabilities.deduplicates


def test_send_without_a_group_or_with_a_delay_is_refused_before_any_call(fifo: Queue) -> None:
    counting = CountingDriver.install(fifo.driver)
    try:
        with pytest.raises(InvalidArgument, match="group"):
            fifo.send(b"x")
        with pytest.raises(InvalidArgument, match="group"):
            fifo.send_many([b"x", b"y"])
        with pytest.raises(InvalidArgument):
            fifo.send(b"x", group="A", delay=1)
    finally:
        counting.uninstall()
    assert counting.calls == []


def _drain(queue: Queue) -> list[bytes]:
    bodies: list[bytes] = []
    while leases := queue.lease(10, duration=30, wait=1):
        bodies += [lease.message.body for lease in leases]
        queue.complete_many(leases)
    return bodies


def test_same_dedup_key_is_stored_once(fifo: Queue) -> None:
    fifo.send(b"first", group="A", dedup_key="order-17-paid")
    fifo.send(b"second", group="A", dedup_key="order-17-paid")
    fifo.send(b"third", group="A", dedup_key="order-17-shipped")
    assert _drain(fifo) == [b"first", b"third"]


def test_without_a_key_leasekit_makes_one_per_message(fifo: Queue) -> None:
    fifo.send(b"same", group="A")
    fifo.send(b"same", group="A")
    fifo.send_many([b"same", b"same"], group="A")
    assert _drain(fifo) == [b"same"] * 4


def test_content_based_queue_deduplicates_by_body(fifo: Queue) -> None:
    driver: Any = fifo.driver
    driver.client.set_queue_attributes(
        QueueUrl=driver._url(), Attributes={"ContentBasedDeduplication": "true"}
    )
    fifo.send(b"same", group="A")
    fifo.send(b"same", group="A")
    fifo.send(b"other", group="A")
    assert _drain(fifo) == [b"same", b"other"]


def test_keeper_renews_every_in_flight_message_of_the_group(fifo: Queue) -> None:
    fifo.send_many([b"a1", b"a2", b"a3"], group="A")
    leases = fifo.lease(10, duration=2, wait=MARGIN)
    assert [lease.message.body for lease in leases] == [b"a1", b"a2", b"a3"]  # one receive
    keeper = leasekit.LeaseKeeper()
    keeper.start()
    try:
        keeper.add_many(leases)
        # Well past the 2 s leases: none of the group came back, none re-ordered.
        assert fifo.lease(10, duration=30, wait=2 + MARGIN) == []
        assert all(not lease.lost.is_set() for lease in leases)
    finally:
        keeper.discard_many(leases)
        keeper.stop()
    fifo.complete_many(leases)
    assert _drain(fifo) == []


@pytest.mark.parametrize("face", ["threads", "tasks"])
def test_consumer_keeps_the_order_when_a_head_fails_and_followers_were_leased_with_it(
    fifo: Queue, face: str, moto_server: Any
) -> None:
    fifo.send_many([b"a0", b"a1", b"a2", b"a3"], group="A")
    fifo.send_many([b"b0", b"b1"], group="B")
    calls: list[bytes] = []

    def handler(message: leasekit.Message) -> None:
        calls.append(message.body)
        if message.body == b"a0":
            raise RuntimeError("a0 always fails")

    options: dict[str, Any] = {
        "concurrency": 4,
        "max_deliveries": 2,
        "backoff_base": 0.0,
        "lease_duration": 30,
        "handle_signals": False,
    }
    if face == "threads":
        stats = leasekit.Consumer(fifo, handler, **options).run(until_idle=True)
    else:

        async def call(message: leasekit.Message) -> None:
            handler(message)

        async def main() -> leasekit.ConsumerStats:
            # A handle of its own (closing it ends its threads; the fixture's stays open).
            own = leasekit.open("aws-sqs", queue=fifo.name, **moto_server.options)
            async with leasekit.aio.AsyncQueue(own) as aqueue:
                return await leasekit.aio.AsyncConsumer(aqueue, call, **options).run(
                    until_idle=True
                )

        stats = asyncio.run(main())
    group_a = [body for body in calls if body.startswith(b"a")]
    # a0 fails twice and is dead-lettered; a1..a3, leased with it and given back
    # each time, are not poison for it: they run after it, in order.
    assert group_a == [b"a0", b"a0", b"a1", b"a2", b"a3"]
    assert [body for body in calls if body.startswith(b"b")] == [b"b0", b"b1"]
    assert stats.dead_lettered == 1
    assert stats.returned_in_order >= 3
    assert stats.completed == 5


def test_unordered_standard_queue_refuses_a_group_and_a_dedup_key(moto_server: Any) -> None:
    with leasekit.open("aws-sqs", queue=f"std-{secrets.token_hex(3)}", **moto_server.options) as q:
        with pytest.raises(UnsupportedOperation):
            q.send(b"x", group="A")
        with pytest.raises(UnsupportedOperation):
            q.send(b"x", dedup_key="k")


def test_fifo_names_are_checked_before_any_call() -> None:
    with pytest.raises(leasekit.InvalidURL):
        leasekit.open("aws-sqs://us-east-1/" + "x" * 76 + ".fifo")
    started = time.monotonic()
    queue = leasekit.open("aws-sqs://us-east-1/orders.fifo")
    assert queue.capabilities.ordered
    assert time.monotonic() - started < 5
    queue.close()
