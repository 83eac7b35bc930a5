"""Spark on the network backends: the sink, the streaming source and task consumers.

One module for every backend whose queue lives on a server (PostgreSQL, Redis,
Pub/Sub's emulator): what is theirs here is that every executor's Python worker
reaches the same server and opens its own connections or gRPC channel (a
driver's pool is never shared across a fork), where a ``sqlite://`` file only
works on one machine. Whether anything is left is asked the same way
everywhere, by leasing (Pub/Sub has no counts).
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


def _url_for(backend: str, request: pytest.FixtureRequest) -> str:
    name = f"spark-{uuid.uuid4().hex[:8]}"
    if backend == "postgresql":
        return f"{request.getfixturevalue('postgres_server').url()}?queue={name}"
    if backend == "redis":
        return f"{request.getfixturevalue('redis_server').url()}?queue={name}"
    server = request.getfixturevalue("pubsub_server")
    return f"gcp-pubsub://{server.project}/{name}?endpoint={server.address}"


@pytest.fixture(params=["postgresql", "redis", "gcp-pubsub"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    made = _url_for(request.param, request)
    with leasekit.open(made, create=True):
        pass
    yield made
    with leasekit.open(made) as queue:
        queue.delete_queue()


def _left(url: str) -> int:
    """How many messages a lease still finds (each given back at once)."""
    with leasekit.open(url) as queue:
        leases = queue.lease(100, duration=10, wait=1)
        for lease in leases:
            lease.abandon()
        return len(leases)


def test_sink_then_stream_through_the_server(spark: Any, url: str, tmp_path: Path) -> None:
    spark.range(40).selectExpr("concat('row-', id) AS body").write.format("leasekit").option(
        "url", url
    ).mode("append").save()
    seen: list[bytes] = []
    query = (
        spark.readStream.format("leasekit")
        .option("url", url)
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
    assert _left(url) == 0


def test_run_consumers_compete_as_spark_tasks(spark: Any, url: str) -> None:
    with leasekit.open(url) as queue:
        queue.send_many([f"w{i}".encode() for i in range(200)])
    stats = run_consumers(spark, url, lambda message: None, tasks=2, concurrency=4)
    assert [s.task for s in stats] == [0, 1]
    assert sum(s.completed for s in stats) == 200
    assert _left(url) == 0
