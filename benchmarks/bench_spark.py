"""Messages/s through the leasekit Spark source vs a plain leasekit Consumer, on one SQLite queue.

For each batch size the script fills a fresh ``sqlite://`` queue, runs a
streaming query ``readStream.format("leasekit") → writeStream.format("noop")``
on ``local[2]`` until every message is completed (the last batch is committed
through the source's heartbeat), and reports:

* end to end: messages / (query start → queue empty), startup included;
* steady: rows / summed micro-batch time, from Spark's progress reports.

Then it runs a single-process :class:`leasekit.Consumer` with a no-op handler
on the same queue (refilled) for comparison.

    .venv/bin/python benchmarks/bench_spark.py --messages 60000 --batch-sizes 1000,5000,10000,20000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import leasekit

SEND_CHUNK = 5000


def fill(url: str, messages: int) -> None:
    with leasekit.open(url, create=True) as queue:
        body = b"x" * 100
        for start in range(0, messages, SEND_CHUNK):
            queue.send_many([body] * min(SEND_CHUNK, messages - start))


def drained(queue: leasekit.Queue) -> bool:
    stats = queue.stats()
    return stats.visible == 0 and stats.leased == 0


def run_source(
    spark: Any, root: Path, messages: int, batch: int, partitions: int
) -> dict[str, Any]:
    url = f"sqlite:///{root}/source-{batch}.db?queue=bench"
    fill(url, messages)
    with leasekit.open(url) as queue:
        started = time.perf_counter()
        query = (
            spark.readStream.format("leasekit")
            .option("url", url)
            .option("maxMessagesPerBatch", str(batch))
            .option("numPartitions", str(partitions))
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(root / f"ckpt-{batch}"))
            .start()
        )
        try:
            deadline = time.monotonic() + 600
            while not drained(queue):
                query.processAllAvailable()
                if time.monotonic() > deadline:
                    raise TimeoutError("the source did not drain the queue")
                query.awaitTermination(0.05)
            elapsed = time.perf_counter() - started
            progress = [p for p in query.recentProgress if p["numInputRows"]]
        finally:
            query.stop()
    rows = sum(p["numInputRows"] for p in progress)
    busy = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    return {
        "mode": "spark source",
        "batch": batch,
        "messages": messages,
        "seconds": round(elapsed, 2),
        "end_to_end_per_s": round(messages / elapsed),
        "batches": len(progress),
        "steady_per_s": round(rows / busy) if busy else None,
        "ms_per_batch": round(1000 * busy / len(progress)) if progress else None,
    }


def run_consumer(root: Path, messages: int, concurrency: int, prefetch: int) -> dict[str, Any]:
    url = f"sqlite:///{root}/consumer-{concurrency}.db?queue=bench"
    fill(url, messages)
    with leasekit.open(url) as queue:
        consumer = leasekit.Consumer(
            queue,
            lambda message: None,
            concurrency=concurrency,
            prefetch=prefetch,
            handle_signals=False,
        )
        started = time.perf_counter()
        stats = consumer.run(until_idle=True)
        elapsed = time.perf_counter() - started
    assert stats.completed == messages, stats
    return {
        "mode": f"Consumer concurrency={concurrency} prefetch={prefetch}",
        "messages": messages,
        "seconds": round(elapsed, 2),
        "end_to_end_per_s": round(messages / elapsed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--batch-sizes", default="1000,5000,10000,20000")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--consumer-messages", type=int, default=20_000)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    from leasekit.plugins.spark import local_session

    root = Path(tempfile.mkdtemp(prefix="leasekit-bench-spark-"))
    results: list[dict[str, Any]] = []
    try:
        spark = local_session("local[2]", app_name="leasekit-bench")
        spark.sparkContext.setLogLevel("ERROR")
        # Warm up: JIT, Python workers, the planner path.
        run_source(spark, root, 2000, 1000, args.partitions)
        for size in (int(s) for s in args.batch_sizes.split(",")):
            result = run_source(spark, root, args.messages, size, args.partitions)
            results.append(result)
            print(json.dumps(result), flush=True)
        spark.stop()
        for concurrency, prefetch in ((1, 1), (8, 500)):
            result = run_consumer(root, args.consumer_messages, concurrency, prefetch)
            results.append(result)
            print(json.dumps(result), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"# python {platform.python_version()}, {os.cpu_count()} cpus, "
        f"load {os.getloadavg()[0]:.1f}, {sys.platform}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
