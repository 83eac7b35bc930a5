"""What sits on top of a queue, on ``redis://`` (Debian's redis-server): smoke tests.

Consumer (threads) and AsyncConsumer, the keeper past a lease's length, dead
letters read back and re-driven, the CLI, and the otel plugin's spans. The
portable semantics are the conformance suite's (``test_redis.py``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from _fixtures._otel import send_and_process_spans
from typer.testing import CliRunner

import leasekit
import leasekit.aio
from leasekit.aio import AsyncConsumer
from leasekit.cli import app
from leasekit.emulators.redis import LocalRedis

runner = CliRunner()


@pytest.fixture
def url(redis_server: LocalRedis) -> Iterator[str]:
    url = f"{redis_server.url()}?queue=int-{uuid.uuid4().hex[:8]}"
    yield url
    with leasekit.open(url) as queue:
        queue.delete_queue()


def test_a_consumer_on_threads_handles_every_message_once(url: str) -> None:
    handled: Counter[bytes] = Counter()
    lock = threading.Lock()

    def handler(message: leasekit.Message) -> None:
        with lock:
            handled[message.body] += 1

    with leasekit.open(url, create=True) as queue:
        queue.send_many([b"%d" % i for i in range(200)])
        consumer = leasekit.Consumer(queue, handler, concurrency=8, handle_signals=False)
        stats = consumer.run(until_idle=True)
        assert queue.stats().total == 0
    assert stats.completed == 200 and set(handled.values()) == {1} and len(handled) == 200


def test_an_async_consumer_handles_every_message_once(url: str) -> None:
    handled: Counter[bytes] = Counter()

    async def handler(message: leasekit.Message) -> None:
        await asyncio.sleep(0.005)
        handled[message.body] += 1

    async def main() -> leasekit.ConsumerStats:
        async with leasekit.aio.open(url, create=True) as queue:
            await queue.send_many([b"%d" % i for i in range(100)])
            consumer = AsyncConsumer(queue, handler, concurrency=20, handle_signals=False)
            stats = await consumer.run(until_idle=True)
            assert (await queue.stats()).total == 0
            return stats

    stats = asyncio.run(main())
    assert stats.completed == 100 and set(handled.values()) == {1}


def test_the_keeper_holds_a_lease_past_its_length_and_nobody_else_gets_it(url: str) -> None:
    with leasekit.open(url, create=True) as queue, leasekit.LeaseKeeper() as keeper:
        queue.send(b"long job")
        [lease] = queue.lease(1, duration=1)
        keeper.add(lease)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert queue.lease(1, duration=1, wait=0.3) == []
        lease.complete()  # (the keeper lets go of a settled lease)
        assert queue.stats().total == 0


def test_dead_letters_are_read_back_and_redriven(url: str) -> None:
    with leasekit.open(url, create=True) as queue:
        queue.send(b"poison", properties={"k": "v"})
        [lease] = queue.lease(1, duration=30)
        lease.dead_letter("handler kept failing")
        [letter] = queue.peek_dead_letters()
        assert letter.body == b"poison" and letter.reason == "handler kept failing"
        assert letter.delivery_count == 1 and letter.id == lease.message.id
        assert letter.properties == {"k": "v"}
        assert queue.stats().dead_lettered == 1
        assert queue.redrive() == 1
        assert queue.stats().dead_lettered == 0
        [back] = queue.lease(1, duration=30)
        assert back.message.body == b"poison" and back.message.properties["k"] == "v"
        back.complete()


def test_cli_send_and_stats_on_a_redis_url(url: str) -> None:
    result = runner.invoke(app, ["send", url, "hello", "--create"])
    assert result.exit_code == 0, result.output
    with leasekit.open(url) as queue:
        queue.send_many([b"a", b"b"])
        queue.lease(1, duration=60)
    stats = runner.invoke(app, ["stats", url])
    assert stats.exit_code == 0, stats.output
    counts = {
        cells[0]: cells[1]
        for line in stats.output.splitlines()
        if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 2
    }
    assert counts["visible"] == "2" and counts["leased"] == "1" and counts["total"] == "3"


def test_otel_spans_name_redis_and_carry_the_trace_through_the_stream(url: str) -> None:
    send, process = send_and_process_spans(url)
    assert send.attributes is not None and process.attributes is not None
    assert send.attributes["messaging.system"] == "redis"
    assert process.context.trace_id == send.context.trace_id


def test_a_consumer_on_redis_reports_ready_health_while_it_runs(url: str) -> None:
    with leasekit.open(url, create=True) as queue:
        queue.send(b"x")
        consumer = leasekit.Consumer(queue, lambda m: None, handle_signals=False)
        thread = threading.Thread(target=consumer.run)
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while not consumer.health().ready:
                assert time.monotonic() < deadline, consumer.health().ready_problems
                time.sleep(0.05)  # polling the consumer's state, with a deadline
            assert consumer.health().live
        finally:
            consumer.stop()
            thread.join(10)
        assert not thread.is_alive()
