"""Competing leasekit Consumers as Spark tasks, for work that outgrows one machine.

:func:`run_consumers` starts ``tasks`` Spark tasks; each opens the queue on its
executor and runs a :class:`leasekit.Consumer` with its own
:class:`~leasekit.LeaseKeeper`. The queue hands each message to one of them at
a time (the lease), so they compete like any other consumers; nothing is
coordinated through Spark but the start and the per-task stats.

Executor Python workers are reused across tasks, so each task stops and joins
everything it started (keeper threads, the deadline timer, the handler pool)
and closes the queue in ``finally``. If Spark kills a task (job cancelled,
executor lost), its leases lapse and the messages come back: at least once,
like every leasekit consumer.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import leasekit
from leasekit.errors import InvalidArgument

__all__ = ["TaskStats", "run_consumers"]


@dataclass(frozen=True)
class TaskStats:
    """What one consumer task did."""

    task: int
    host: str
    pid: int
    seconds: float
    received: int
    completed: int
    failed: int
    dead_lettered: int
    lost: int
    #: Every counter of the task's :class:`leasekit.ConsumerStats`.
    consumer: dict[str, Any] = field(default_factory=dict, repr=False)


def run_consumers(
    spark: Any,
    url: str,
    handler: Callable[[Any], object],
    *,
    tasks: int = 2,
    options: Mapping[str, Any] | None = None,
    until_idle: bool = True,
    max_seconds: float | None = None,
    **consumer_options: Any,
) -> list[TaskStats]:
    """Run ``tasks`` competing Consumers of ``url`` as Spark tasks; block until all return.

    Parameters
    ----------
        spark: a SparkSession (classic, not Spark Connect: it uses the RDD API).
        url: the queue URL; every executor must reach the queue (a ``sqlite://``
            file only works when all executors share that file system).
        handler: called with each message on the executors (``pass_lease=True``
            in ``consumer_options`` passes the lease); it is pickled with
            cloudpickle, so it may be a closure, and must be idempotent: delivery
            is at least once.
        tasks: consumer tasks (Spark runs as many at once as it has free cores).
        options: keyword options for :func:`leasekit.open` (credentials, endpoints).
        until_idle: a task returns once the queue has nothing for it.
        max_seconds: a task stops after this long (graceful: in-flight handlers
            finish within ``shutdown_grace``); ``None`` runs until idle or forever.
        consumer_options: passed to :class:`leasekit.Consumer` (``concurrency``,
            ``lease_duration``, ``max_deliveries``, ``idempotency``, ...).

    Returns
    -------
        One :class:`TaskStats` per task, in task order.
    """
    if not isinstance(tasks, int) or isinstance(tasks, bool) or tasks < 1:
        raise InvalidArgument(f"tasks must be an int >= 1, got {tasks!r}")
    if not until_idle and max_seconds is None:
        raise InvalidArgument("give until_idle=True or max_seconds, or the tasks never return")
    if max_seconds is not None and max_seconds <= 0:
        raise InvalidArgument(f"max_seconds must be > 0, got {max_seconds!r}")
    for reserved in ("keeper", "handle_signals"):
        if reserved in consumer_options:
            raise InvalidArgument(f"{reserved} is set by run_consumers for each task")
    with leasekit.open(url, **dict(options or {})):
        pass  # a bad URL or option fails here, before any task starts
    task = partial(
        _consume,
        url=url,
        options=dict(options or {}),
        handler=handler,
        until_idle=until_idle,
        max_seconds=max_seconds,
        consumer_options=consumer_options,
    )
    rdd = spark.sparkContext.parallelize(range(tasks), tasks)
    results: list[TaskStats] = rdd.mapPartitionsWithIndex(task).collect()
    return sorted(results, key=lambda stats: stats.task)


def _consume(
    index: int,
    _items: Iterator[int],
    *,
    url: str,
    options: dict[str, Any],
    handler: Callable[[Any], object],
    until_idle: bool,
    max_seconds: float | None,
    consumer_options: dict[str, Any],
) -> Iterator[TaskStats]:
    """One Spark task: a Consumer with its own keeper, all of it stopped in ``finally``."""
    started = time.monotonic()
    queue = leasekit.open(url, **options)
    keeper = leasekit.LeaseKeeper()
    timer: threading.Timer | None = None
    try:
        consumer = leasekit.Consumer(
            queue, handler, keeper=keeper, handle_signals=False, **consumer_options
        )
        if max_seconds is not None:
            timer = threading.Timer(max_seconds, consumer.stop)
            timer.daemon = True
            timer.start()
        stats = consumer.run(until_idle=until_idle)
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
        keeper.stop()
        queue.close()
    yield TaskStats(
        task=index,
        host=socket.gethostname(),
        pid=os.getpid(),
        seconds=time.monotonic() - started,
        received=stats.received,
        completed=stats.completed,
        failed=stats.failed,
        dead_lettered=stats.dead_lettered,
        lost=stats.lost,
        consumer=stats.as_dict(),
    )
