"""The example pipeline: queue → Spark stream → an aggregate in Parquet, at least once.

Sensor readings (JSON bodies) go into an embedded SQLite queue. A streaming
query reads them with the ``leasekit`` source, drops redelivered duplicates by
message id, sums them per sensor and writes the whole aggregate to Parquet on
every micro-batch. To show the guarantee, the first run's ``foreachBatch``
fails at one batch; the query restarts from its checkpoint and the final
aggregate still counts every reading exactly once:

* the failed batch's messages were never completed (the source completes a
  batch only after Spark committed its output), so they come back and a later
  batch delivers them (``delivery_count`` 2);
* a message delivered twice (a stop between Spark's commit and the source's)
  is dropped by ``dropDuplicates(["id"])``, whose state is in the checkpoint.

This is what ``leasekit spark-demo`` runs.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import leasekit

__all__ = ["PipelineResult", "run_pipeline"]

#: How long the pipeline waits for every reading to be aggregated.
DEADLINE = 300.0


class InjectedFailure(RuntimeError):
    """Raised by the demo's ``foreachBatch`` to show recovery."""


@dataclass
class PipelineResult:
    """What the pipeline did and whether the aggregate is exact."""

    messages: int
    #: sensor → (readings, sum of values) from the Parquet aggregate.
    totals: dict[str, tuple[int, float]]
    #: sensor → (readings, sum of values) computed from what was sent.
    expected: dict[str, tuple[int, float]]
    #: Readings delivered more than once (after the injected failure).
    redelivered: int
    failed_batch: int | None
    restarts: int
    seconds: float
    parquet: str
    queue_left: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every reading counted exactly once, and nothing left in the queue."""
        same = self.totals.keys() == self.expected.keys() and all(
            self.totals[k][0] == self.expected[k][0]
            and abs(self.totals[k][1] - self.expected[k][1]) < 1e-6
            for k in self.expected
        )
        return same and self.queue_left == 0


def run_pipeline(
    *,
    spark: Any = None,
    messages: int = 2000,
    sensors: int = 5,
    batch: int = 500,
    fail_batch: int | None = 1,
    lease: float = 30.0,
    directory: str | Path | None = None,
) -> PipelineResult:
    """Run the example pipeline end to end and return its result.

    Parameters
    ----------
        spark: a SparkSession; a fast ``local[2]`` one if ``None``.
        messages: readings to send.
        sensors: distinct sensors (the aggregate's rows).
        batch: messages per micro-batch (``maxMessagesPerBatch``).
        fail_batch: the micro-batch whose ``foreachBatch`` fails in the first
            run (``None``: no failure).
        lease: the source's ``leaseDuration`` in seconds.
        directory: where the queue file, checkpoint and Parquet go (a
            temporary directory, removed afterwards, if ``None``).
    """
    from pyspark.sql import functions as F

    if spark is None:
        from .session import local_session

        spark = local_session(app_name="leasekit-spark-demo")
    else:
        from . import register

        register(spark)
    temporary = directory is None
    root = Path(tempfile.mkdtemp(prefix="leasekit-spark-demo-") if temporary else directory)  # type: ignore[arg-type]
    root.mkdir(parents=True, exist_ok=True)
    for stale in ("checkpoint", "aggregate.parquet"):  # a rerun starts afresh
        shutil.rmtree(root / stale, ignore_errors=True)
    for stale in ("readings.db", "readings.db-wal", "readings.db-shm"):
        (root / stale).unlink(missing_ok=True)
    url = f"sqlite:///{root / 'readings.db'}?queue=readings"
    parquet = str(root / "aggregate.parquet")
    checkpoint = str(root / "checkpoint")
    started = time.monotonic()
    try:
        with leasekit.open(url, create=True) as queue:
            expected = _send(queue, messages, sensors)
            schema = "sensor STRING, value DOUBLE"
            restarts = 0

            def write(df: Any, batch_id: int, *, fail: bool) -> None:
                if fail and batch_id == fail_batch:
                    raise InjectedFailure(f"injected failure in micro-batch {batch_id}")
                df.write.mode("overwrite").parquet(parquet)

            def start(fail: bool) -> Any:
                readings = (
                    spark.readStream.format("leasekit")
                    .option("url", url)
                    .option("maxMessagesPerBatch", str(batch))
                    .option("leaseDuration", str(lease))
                    .load()
                    .select(
                        "id",
                        "delivery_count",
                        F.from_json(F.col("body").cast("string"), schema).alias("r"),
                    )
                    .dropDuplicates(["id"])
                )
                aggregate = readings.groupBy(F.col("r.sensor").alias("sensor")).agg(
                    F.count("*").alias("readings"),
                    F.sum("r.value").alias("total"),
                    F.sum(F.when(F.col("delivery_count") > 1, 1).otherwise(0)).alias("redelivered"),
                )
                return (
                    aggregate.writeStream.outputMode("complete")
                    .foreachBatch(lambda df, batch_id: write(df, batch_id, fail=fail))
                    .option("checkpointLocation", checkpoint)
                    .start()
                )

            query = start(fail_batch is not None)
            deadline = time.monotonic() + DEADLINE
            if fail_batch is not None:
                try:
                    query.awaitTermination(DEADLINE)
                except Exception as exc:  # the injected failure, as a StreamingQueryException
                    if "injected failure" not in str(exc):
                        raise
                else:  # pragma: no cover - the queue ran dry before the failing batch
                    query.stop()
                restarts += 1
                query = start(False)
            try:
                while True:
                    query.processAllAvailable()
                    if _unfinished(queue.stats()) == 0:
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError("the pipeline did not drain the queue in time")
                    query.awaitTermination(0.2)
            finally:
                query.stop()
            left = _unfinished(queue.stats())
        rows = spark.read.parquet(parquet).collect()
        totals = {r.sensor: (int(r.readings), float(r.total)) for r in rows}
        return PipelineResult(
            messages=messages,
            totals=totals,
            expected=expected,
            redelivered=sum(int(r.redelivered) for r in rows),
            failed_batch=fail_batch,
            restarts=restarts,
            seconds=time.monotonic() - started,
            parquet=parquet,
            queue_left=left,
        )
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)


def _send(queue: leasekit.Queue, messages: int, sensors: int) -> dict[str, tuple[int, float]]:
    expected: dict[str, tuple[int, float]] = {}
    bodies = []
    for i in range(messages):
        sensor, value = f"sensor-{i % sensors}", (i % 97) / 4
        bodies.append(json.dumps({"sensor": sensor, "value": value}).encode())
        count, total = expected.get(sensor, (0, 0.0))
        expected[sensor] = (count + 1, total + value)
    queue.send_many(bodies)
    return expected


def _unfinished(stats: leasekit.QueueStats) -> int:
    """Messages visible or leased; all messages where the backend only counts them all."""
    if stats.visible is not None and stats.leased is not None:
        return stats.visible + stats.leased
    if stats.total is not None:
        return stats.total
    raise leasekit.UnsupportedOperation("the backend cannot count the messages left")
