"""Spark on ``redis://``: the sink, the streaming source and task consumers on one server.

What is Redis's own here: every executor process reaches the same server, and
each Python worker opens its own connections (a driver's pools are never shared
across a fork).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import leasekit
from leasekit.emulators.redis import LocalRedis
from leasekit.plugins.spark import run_consumers

pytestmark = pytest.mark.spark

DEADLINE = 60.0


@pytest.fixture
def redis_url(redis_server: LocalRedis) -> Iterator[str]:
    url = f"{redis_server.url()}?queue=spark-{uuid.uuid4().hex[:8]}"
    with leasekit.open(url, create=True):
        pass
    yield url
    with leasekit.open(url) as queue:
        queue.delete_queue()


def test_sink_then_stream_through_redis(spark: Any, redis_url: str, tmp_path: Path) -> None:
    spark.range(40).selectExpr("concat('row-', id) AS body").write.format("leasekit").option(
        "url", redis_url
    ).mode("append").save()
    seen: list[bytes] = []
    query = (
        spark.readStream.format("leasekit")
        .option("url", redis_url)
        .option("maxMessagesPerBatch", "15")
        .option("leaseDuration", "20")
        .load()
        .writeStream.foreachBatch(lambda df, _: seen.extend(r.body for r in df.collect()))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    with leasekit.open(redis_url) as queue:
        end = time.monotonic() + DEADLINE
        try:
            while True:
                query.processAllAvailable()
                stats = queue.stats()
                if len(seen) >= 40 and stats.visible == 0 and stats.leased == 0:
                    break
                assert time.monotonic() < end, "the stream did not deliver everything in time"
                query.awaitTermination(0.2)  # a poll interval that also surfaces a failure
        finally:
            query.stop()
        assert sorted(seen) == sorted(b"row-%d" % i for i in range(40))


def test_run_consumers_compete_as_spark_tasks_on_redis(spark: Any, redis_url: str) -> None:
    with leasekit.open(redis_url) as queue:
        queue.send_many([f"w{i}".encode() for i in range(200)])
        stats = run_consumers(spark, redis_url, lambda message: None, tasks=2, concurrency=4)
        assert [s.task for s in stats] == [0, 1]
        assert sum(s.completed for s in stats) == 200
        counts = queue.stats()
        assert counts.visible == 0 and counts.leased == 0
