"""The sink (batch and streaming), competing consumers as Spark tasks, and the demo pipeline."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import leasekit
from leasekit.plugins.spark import run_consumers, run_pipeline

pytestmark = pytest.mark.spark


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path}/q.db?queue=out"
    with leasekit.open(url, create=True):
        pass
    yield url


def _drain(queue: leasekit.Queue) -> list[leasekit.Message]:
    messages = []
    while leases := queue.lease(100):
        for lease in leases:
            messages.append(lease.message)
            lease.complete()
    return messages


def test_write_sends_body_and_properties(spark: Any, sqlite_url: str) -> None:
    df = spark.createDataFrame(
        [(b"\x00\x01", {"kind": "a"}), (b"two", None), (b"", {"kind": "b", "n": "3"})],
        "body BINARY, properties MAP<STRING, STRING>",
    )
    df.write.format("leasekit").option("url", sqlite_url).mode("append").save()
    with leasekit.open(sqlite_url) as queue:
        got = {m.body: dict(m.properties) for m in _drain(queue)}
    assert got == {b"\x00\x01": {"kind": "a"}, b"two": {}, b"": {"kind": "b", "n": "3"}}


def test_write_string_body_to_sqs_and_creates_the_queue(spark: Any, moto_server: Any) -> None:
    name = f"spark-{uuid.uuid4().hex[:10]}"
    writer = spark.range(25).selectExpr("concat('row-', id) AS body").write.format("leasekit")
    writer = writer.option("url", f"aws-sqs://{moto_server.region}/{name}").option("create", "true")
    for key, value in moto_server.options.items():
        if key != "region":
            writer = writer.option(f"backend.{key}", value)
    writer.mode("append").save()
    queue = leasekit.open("aws-sqs", queue=name, **moto_server.options)
    try:
        bodies = sorted(m.body for m in _drain(queue))
    finally:
        queue.delete_queue()
        queue.close()
    assert bodies == sorted(f"row-{i}".encode() for i in range(25))


def test_write_refuses_overwrite_and_a_missing_body(spark: Any, sqlite_url: str) -> None:
    df = spark.createDataFrame([("x",)], "text STRING")
    with pytest.raises(Exception, match="column 'body'"):
        df.write.format("leasekit").option("url", sqlite_url).mode("append").save()
    ok = spark.createDataFrame([("x",)], "body STRING")
    with pytest.raises(Exception, match="cannot be overwritten"):
        ok.write.format("leasekit").option("url", sqlite_url).mode("overwrite").save()


def test_stream_queue_to_queue(spark: Any, tmp_path: Path) -> None:
    source = f"sqlite:///{tmp_path}/in.db?queue=in"
    sink = f"sqlite:///{tmp_path}/out.db?queue=out"
    with leasekit.open(source, create=True) as inbox, leasekit.open(sink, create=True) as outbox:
        inbox.send_many([f"n{i}".encode() for i in range(30)])
        query = (
            spark.readStream.format("leasekit")
            .option("url", source)
            .option("maxMessagesPerBatch", "20")
            .load()
            .selectExpr("upper(cast(body AS STRING)) AS body", "map('from', id) AS properties")
            .writeStream.format("leasekit")
            .option("url", sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .start()
        )
        try:
            deadline = time.monotonic() + 60
            while inbox.stats().visible or inbox.stats().leased:
                query.processAllAvailable()
                assert time.monotonic() < deadline
                query.awaitTermination(0.1)
        finally:
            query.stop()
        out = _drain(outbox)
    assert sorted(m.body for m in out) == sorted(f"N{i}".encode() for i in range(30))
    assert all(m.properties.get("from") for m in out)


def test_run_consumers_competes_and_reports_per_task(spark: Any, sqlite_url: str) -> None:
    with leasekit.open(sqlite_url) as queue:
        queue.send_many([f"w{i}".encode() for i in range(200)] + [b"poison"])

        def handler(message: leasekit.Message) -> None:
            if message.body == b"poison":
                raise ValueError("cannot handle this one")

        stats = run_consumers(
            spark,
            sqlite_url,
            handler,
            tasks=2,
            concurrency=4,
            max_deliveries=1,
            backoff_base=0,
        )
        assert [s.task for s in stats] == [0, 1]
        assert sum(s.completed for s in stats) == 200
        assert sum(s.dead_lettered for s in stats) == 1
        assert sum(s.failed for s in stats) == 1
        assert queue.stats().visible == 0 and queue.stats().leased == 0
        assert queue.stats().dead_lettered == 1


def test_run_consumers_checks_arguments(spark: Any, sqlite_url: str) -> None:
    with pytest.raises(leasekit.InvalidArgument, match="tasks"):
        run_consumers(spark, sqlite_url, print, tasks=0)
    with pytest.raises(leasekit.InvalidArgument, match="never return"):
        run_consumers(spark, sqlite_url, print, until_idle=False)
    with pytest.raises(leasekit.InvalidArgument, match="keeper"):
        run_consumers(spark, sqlite_url, print, keeper=None)


def test_run_consumers_stops_at_max_seconds(spark: Any, sqlite_url: str) -> None:
    stats = run_consumers(spark, sqlite_url, print, tasks=1, until_idle=False, max_seconds=0.5)
    assert stats[0].received == 0 and stats[0].seconds < 30


def test_demo_pipeline_counts_every_reading_once_despite_a_failure(
    spark: Any, tmp_path: Path
) -> None:
    result = run_pipeline(
        spark=spark, messages=100, sensors=3, batch=100, fail_batch=0, directory=tmp_path
    )
    assert result.ok, result
    assert result.restarts == 1 and result.redelivered == 100
    assert (tmp_path / "aggregate.parquet").exists()
