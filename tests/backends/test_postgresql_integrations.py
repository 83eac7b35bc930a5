"""What sits on top of a queue, on ``postgresql://``: AsyncConsumer, the otel plugin, the CLI.

The Consumer rides out faults on PostgreSQL in ``test_postgresql_faults.py`` and
competes across processes in ``test_postgresql_processes.py``; Spark's source,
sink and task consumers are in ``tests/spark/test_spark_network_backends.py``.
"""

from __future__ import annotations

import asyncio
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
from leasekit.emulators.postgres import LocalPostgres

runner = CliRunner()


@pytest.fixture
def url(postgres_server: LocalPostgres) -> Iterator[str]:
    url = f"{postgres_server.url()}?queue=int-{uuid.uuid4().hex[:8]}"
    yield url
    with leasekit.open(url) as queue:
        queue.delete_queue()


def test_an_async_consumer_handles_every_message_once(url: str) -> None:
    handled: Counter[bytes] = Counter()

    async def handler(message: leasekit.Message) -> None:
        await asyncio.sleep(0.01)
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


def test_otel_spans_name_postgresql_and_carry_the_trace_through_the_table(url: str) -> None:
    send, process = send_and_process_spans(url)
    assert send.attributes is not None and process.attributes is not None
    assert send.attributes["messaging.system"] == "postgresql"
    assert process.attributes["messaging.system"] == "postgresql"
    # The trace context went through the messages table (a property) and came back.
    assert process.context.trace_id == send.context.trace_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id


def test_cli_send_stats_and_watch_once_on_a_postgresql_url(url: str) -> None:
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
    watch = runner.invoke(app, ["watch", url, "--once", "--interval", "0.2"], env={"COLUMNS": "80"})
    assert watch.exit_code == 0, watch.output
    rows = {line.split()[0]: line.split()[1:] for line in watch.output.splitlines() if line.split()}
    assert rows["visible"][0] == "2"
    assert rows["leased"][0] == "1"
    assert rows["total"][0] == "3"
