"""What sits on top of a queue, on ``gcp-pubsub://`` (the emulator): Consumer, AsyncConsumer,
the keeper, redrive, the otel plugin and the CLI."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.pubsub_v1")

from _fixtures._otel import send_and_process_spans
from typer.testing import CliRunner

import leasekit
import leasekit.aio
from leasekit.aio import AsyncConsumer
from leasekit.cli import app
from leasekit.redrive import redrive

runner = CliRunner()


@pytest.fixture
def url(pubsub_server: Any) -> Iterator[str]:
    name = f"int-{secrets.token_hex(4)}"
    url = (
        f"gcp-pubsub://{pubsub_server.project}/{name}?endpoint={pubsub_server.address}"
        "&dead_letter_topic=int-dead-letters"
    )
    yield url
    with leasekit.open(url) as queue:
        queue.delete_queue()


def test_a_consumer_handles_every_message_once(url: str) -> None:
    handled: Counter[bytes] = Counter()
    lock = threading.Lock()

    def handler(message: leasekit.Message) -> None:
        with lock:
            handled[message.body] += 1

    with leasekit.open(url, create=True) as queue:
        queue.send_many([b"%d" % i for i in range(200)])
        stats = leasekit.Consumer(queue, handler, concurrency=8, handle_signals=False).run(
            until_idle=True
        )
        assert queue.lease(1, duration=10) == []
    assert stats.completed == 200 and set(handled.values()) == {1} and len(handled) == 200


def test_an_async_consumer_handles_every_message_once(url: str) -> None:
    handled: Counter[bytes] = Counter()

    async def handler(message: leasekit.Message) -> None:
        await asyncio.sleep(0.01)
        handled[message.body] += 1

    async def main() -> leasekit.ConsumerStats:
        async with leasekit.aio.open(url, create=True) as queue:
            await queue.send_many([b"%d" % i for i in range(100)])
            consumer = AsyncConsumer(queue, handler, concurrency=20, handle_signals=False)
            return await consumer.run(until_idle=True)

    stats = asyncio.run(main())
    assert stats.completed == 100 and set(handled.values()) == {1}


def test_the_keeper_holds_leases_past_their_first_deadline_in_batched_renewals(url: str) -> None:
    with leasekit.open(url, create=True) as queue:
        queue.send_many([b"%d" % i for i in range(50)])
        leases = []
        while len(leases) < 50:
            leases += queue.lease(50 - len(leases), duration=2, wait=5)
        driver = queue.driver
        calls: list[int] = []
        original = driver.change_visibility

        def counted(receipts: Any, seconds: float) -> Any:
            calls.append(len(receipts))
            return original(receipts, seconds)

        driver.change_visibility = counted  # type: ignore[method-assign]
        with leasekit.LeaseKeeper() as keeper:
            keeper.add_many(leases)
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                assert queue.lease(1, duration=10) == [], "a kept message was handed out"
            assert keeper.stats.lost == 0
        assert max(calls) > 1, f"renewals were not batched: {calls}"
        assert queue.complete_many(leases) == [None] * 50


def test_dead_letters_go_to_the_dead_letter_topic_and_redrive_back(url: str) -> None:
    with leasekit.open(url, create=True) as queue:
        marker = secrets.token_hex(4).encode()
        queue.send(marker, properties={"k": "v"})
        (lease,) = queue.lease(1, duration=10, wait=5)
        lease.dead_letter("poison")
        assert queue.lease(1, duration=10) == []
        moved = redrive(queue, where=lambda letter: letter.body == marker)
        assert moved == 1
        (back,) = queue.lease(1, duration=10, wait=5)
        assert back.message.body == marker and back.message.properties["k"] == "v"
        back.complete()


def test_otel_spans_name_gcp_pubsub_and_carry_the_trace_through_attributes(url: str) -> None:
    send, process = send_and_process_spans(url)
    assert send.attributes is not None and send.attributes["messaging.system"] == "gcp_pubsub"
    assert process.context.trace_id == send.context.trace_id


def test_cli_sends_and_shows_capabilities_on_a_gcp_pubsub_url(url: str) -> None:
    result = runner.invoke(app, ["send", url, "hello", "--create"])
    assert result.exit_code == 0, result.output
    with leasekit.open(url) as queue:
        (lease,) = queue.lease(1, duration=10, wait=5)
        assert lease.message.body == b"hello"
        lease.complete()
    shown = runner.invoke(app, ["backends", "--url", url, "--json"])
    assert shown.exit_code == 0, shown.output
    assert '"detects_stale_receipts": true' in shown.output
