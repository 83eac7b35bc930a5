"""Shared by the backend benchmarks: time leasekit.Consumer draining a queue."""

from __future__ import annotations

import threading
import time
from typing import Any

import leasekit
from leasekit.queue import Queue


def consume_with_consumer(
    queue: Queue, total: int, concurrency: int, timeout: float = 300, **options: Any
) -> float:
    """Seconds until a ``Consumer`` with ``concurrency`` threads has completed ``total`` messages.

    The handler does nothing, so this measures leasekit's own overhead and the
    backend; the clock stops when the last completion is counted (polled every 10 ms).
    ``options`` go to the Consumer (``receivers``, ``prefetch``, ...).
    """
    consumer = leasekit.Consumer(
        queue,
        lambda message: None,
        concurrency=concurrency,
        lease_duration=30,
        handle_signals=False,
        **options,
    )
    runner = threading.Thread(target=consumer.run, name="bench-consumer")
    start = time.perf_counter()
    runner.start()
    deadline = start + timeout
    while consumer.stats.completed < total and time.perf_counter() < deadline:
        time.sleep(0.01)  # sampling the counter; the work happens in the consumer
    finished = time.perf_counter()
    consumer.stop()
    runner.join()
    if consumer.stats.completed < total:
        raise RuntimeError(f"consumer completed {consumer.stats.completed} of {total} in time")
    return finished - start
