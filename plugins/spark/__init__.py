"""leasekit on Spark: a leased streaming source, a sink, and consumers as Spark tasks.

``pip install 'leasekit[spark]'`` (pyspark and pyarrow). Importing this package
is cheap: pyspark is imported only when one of the names below is first used.

* :func:`register` — ``spark.dataSource.register`` the format ``"leasekit"``:
  ``spark.readStream.format("leasekit").option("url", ...)`` (the streaming
  source, at least once), ``df.write.format("leasekit")`` and ``writeStream``
  (the sink).
* :func:`run_consumers` — N competing :class:`leasekit.Consumer` s as Spark tasks.
* :func:`run_pipeline` — the example pipeline behind ``leasekit spark-demo``.
* :func:`local_session` — a ``local[N]`` SparkSession with fast local settings.

See ``docs/spark.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .datasource import LeasekitDataSource
    from .distributed import TaskStats, run_consumers
    from .pipeline import PipelineResult, run_pipeline
    from .session import local_session
    from .source import SCHEMA, LeasedPartition, LeasekitStreamReader, source_schema

__all__ = [
    "SCHEMA",
    "LeasedPartition",
    "LeasekitDataSource",
    "LeasekitStreamReader",
    "PipelineResult",
    "TaskStats",
    "local_session",
    "register",
    "run_consumers",
    "run_pipeline",
    "source_schema",
]

_LAZY = {
    "LeasekitDataSource": "datasource",
    "LeasedPartition": "source",
    "LeasekitStreamReader": "source",
    "PipelineResult": "pipeline",
    "SCHEMA": "source",
    "TaskStats": "distributed",
    "local_session": "session",
    "run_consumers": "distributed",
    "run_pipeline": "pipeline",
    "source_schema": "source",
}


def register(spark: Any) -> None:
    """Register the format ``"leasekit"`` with ``spark`` (a SparkSession); idempotent."""
    from .datasource import LeasekitDataSource

    spark.dataSource.register(LeasekitDataSource)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
