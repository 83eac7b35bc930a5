"""The Spark source's planner work per micro-batch, without Spark: lease, plan, commit.

    .venv/bin/python benchmarks/bench_spark_planner.py --batch 10000 --batches 6 --rounds 3

Drives :class:`leasekit.plugins.spark.source.LeasekitStreamReader` the way Spark's
micro-batch loop does — ``latestOffset`` (lease the batch, hand it to the keeper),
``partitions`` (the batch's rows, column by column), ``commit`` (complete it) —
on a fresh ``sqlite://`` queue in ``--dir`` (default ``/dev/shm``), with
``prefetch`` off so each step's work is its own. Reports the median process CPU
time per batch of each step (the completing runs on the planner's background
thread; the commit step waits for it) and their sum: the planner's own cost per
``--batch`` messages, which Spark adds to every micro-batch. Spark itself is
not started (``pyspark`` is imported for its ``ReadMaxRows``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import leasekit


def one_round(directory: str, batch: int, batches: int, round_no: int) -> dict[str, list[float]]:
    """Fill a queue with ``batch * batches`` messages and plan every batch; CPU s per step."""
    from leasekit.plugins.spark.source import LeasekitStreamReader, source_schema

    url = f"sqlite:///{directory}/planner-{round_no}.db?queue=spark"
    with leasekit.open(url, create=True) as queue:
        for _ in range(batches):
            queue.send_many([os.urandom(100) for _ in range(batch)])
    reader = LeasekitStreamReader(
        source_schema(),
        {"url": url, "maxMessagesPerBatch": str(batch), "prefetch": "false", "leaseDuration": "60"},
    )
    steps: dict[str, list[float]] = {"latestOffset": [], "partitions": [], "commit": []}
    start: dict[str, Any] = reader.initialOffset()
    try:
        for _ in range(batches):
            cpu = time.process_time()
            end = reader.latestOffset(start, reader.getDefaultReadLimit())
            steps["latestOffset"].append(time.process_time() - cpu)
            cpu = time.process_time()
            parts = reader.partitions(start, end)
            steps["partitions"].append(time.process_time() - cpu)
            assert sum(len(part) for part in parts) == batch, "a short batch"  # type: ignore[arg-type]
            cpu = time.process_time()
            reader.commit(end)
            planner = reader._state()
            planner.background.submit(lambda: None).result()  # the completion has run
            steps["commit"].append(time.process_time() - cpu)
            start = end
    finally:
        reader.stop()
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="leasekit-planner-", dir=args.dir)
    totals: dict[str, list[float]] = {"latestOffset": [], "partitions": [], "commit": []}
    for round_no in range(args.rounds):
        for step, values in one_round(directory, args.batch, args.batches, round_no).items():
            totals[step].extend(values[1:])  # the first batch warms caches and imports
    print(f"| planner step, per batch of {args.batch:,} | CPU ms (median) |")
    print("| --- | ---: |")
    whole = 0.0
    for step, values in totals.items():
        median = statistics.median(values) * 1e3
        whole += median
        print(f"| {step} | {median:.0f} |")
    print(f"| all three | {whole:.0f} |")
    print(f"planner CPU per batch: {whole:.0f} ms")


if __name__ == "__main__":
    main()
