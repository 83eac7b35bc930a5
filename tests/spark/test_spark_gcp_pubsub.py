"""Spark on ``gcp-pubsub://`` (the emulator): the sink, the streaming source and task consumers.

What is Pub/Sub's own here: every executor's Python worker opens its own gRPC
channel to the emulator, and Pub/Sub has no counts, so the tests check that
nothing is left by leasing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import leasekit
from leasekit.plugins.spark import run_consumers

pytestmark = pytest.mark.spark

DEADLINE = 60.0


@pytest.fixture
def pubsub_url(pubsub_server: Any) -> Iterator[str]:
    name = f"spark-{uuid.uuid4().hex[:8]}"
    url = f"gcp-pubsub://{pubsub_server.project}/{name}?endpoint={pubsub_server.address}"
    with leasekit.open(url, create=True):
        pass
    yield url
    with leasekit.open(url) as queue:
        queue.delete_queue()


def _left(url: str) -> int:
    with leasekit.open(url) as queue:
        leases = queue.lease(100, duration=10, wait=1)
        for lease in leases:
            lease.abandon()
        return len(leases)


def test_sink_then_stream_through_pubsub(spark: Any, pubsub_url: str, tmp_path: Path) -> None:
    spark.range(40).selectExpr("concat('row-', id) AS body").write.format("leasekit").option(
        "url", pubsub_url
    ).mode("append").save()
    seen: list[bytes] = []
    query = (
        spark.readStream.format("leasekit")
        .option("url", pubsub_url)
        .option("maxMessagesPerBatch", "15")
        .option("leaseDuration", "20")
        .load()
        .writeStream.foreachBatch(lambda df, _: seen.extend(r.body for r in df.collect()))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    end = time.monotonic() + DEADLINE
    try:
        while len(seen) < 40:
            query.processAllAvailable()
            assert time.monotonic() < end, "the stream did not deliver everything in time"
            query.awaitTermination(0.2)  # a poll interval that also surfaces a failure
    finally:
        query.stop()
    assert sorted(seen) == sorted(b"row-%d" % i for i in range(40))
    assert _left(pubsub_url) == 0


def test_run_consumers_compete_as_spark_tasks_on_pubsub(spark: Any, pubsub_url: str) -> None:
    with leasekit.open(pubsub_url) as queue:
        queue.send_many([f"w{i}".encode() for i in range(200)])
    stats = run_consumers(spark, pubsub_url, lambda message: None, tasks=2, concurrency=4)
    assert [s.task for s in stats] == [0, 1]
    assert sum(s.completed for s in stats) == 200
    assert _left(pubsub_url) == 0
