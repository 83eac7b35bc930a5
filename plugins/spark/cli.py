"""``leasekit spark-demo``: the example pipeline from the command line."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["register", "spark_demo"]


def register(app: typer.Typer) -> None:
    """Add ``leasekit spark-demo`` to the command line (entry point ``leasekit.commands``)."""
    from leasekit.cli_base import Command

    @app.command("spark-demo", cls=Command)
    def spark_demo_command(
        messages: Annotated[int, typer.Option(metavar="N", help="Sensor readings to send.")] = 2000,
        batch: Annotated[int, typer.Option(metavar="N", help="Messages per micro-batch.")] = 500,
        fail_batch: Annotated[
            int, typer.Option(metavar="N", help="Micro-batch that fails once (-1: none).")
        ] = 1,
        directory: Annotated[
            str | None,
            typer.Option(
                "--dir", metavar="DIR", help="Keep the queue, checkpoint and Parquet here."
            ),
        ] = None,
    ) -> None:
        r"""Queue → Spark stream → Parquet, with a failure: nothing lost (needs \[spark])."""
        ok = spark_demo(
            messages=messages,
            batch=batch,
            fail_batch=None if fail_batch < 0 else fail_batch,
            directory=directory,
        )
        if not ok:
            raise typer.Exit(1)


def spark_demo(
    *,
    messages: int = 2000,
    sensors: int = 5,
    batch: int = 500,
    fail_batch: int | None = 1,
    directory: str | None = None,
    console: Console | None = None,
) -> bool:
    """Run :func:`~leasekit.plugins.spark.run_pipeline` and print what happened; True if exact."""
    console = console or Console()
    try:
        from .pipeline import run_pipeline
    except ImportError as exc:  # pyspark or pyarrow missing
        console.print(
            f"[bold red]error:[/] the Spark demo needs pyspark and pyarrow ({exc}); "
            "pip install 'leasekit[spark]'"
        )
        return False
    failure = f"micro-batch {fail_batch} fails once" if fail_batch is not None else "no failure"
    console.print(
        f"[bold]leasekit spark-demo[/]: {messages} sensor readings in an embedded SQLite queue → "
        f"Spark stream ({batch} per micro-batch, {failure}) → per-sensor aggregate in Parquet"
    )
    from .session import local_session

    spark = local_session(app_name="leasekit-spark-demo")
    # The injected failure is a real query failure, which Spark logs with long JVM
    # traces; this command reports the outcome itself.
    spark.sparkContext.setLogLevel("OFF")
    result = run_pipeline(
        spark=spark,
        messages=messages,
        sensors=sensors,
        batch=batch,
        fail_batch=fail_batch,
        directory=directory,
    )
    table = Table(title=f"aggregate ({result.parquet})")
    for column in ("sensor", "readings", "expected", "sum", "expected sum"):
        table.add_column(column, justify="left" if column == "sensor" else "right")
    for sensor in sorted(result.expected):
        count, total = result.totals.get(sensor, (0, 0.0))
        want_count, want_total = result.expected[sensor]
        table.add_row(sensor, str(count), str(want_count), f"{total:.2f}", f"{want_total:.2f}")
    console.print(table)
    console.print(
        f"{result.restarts} restart(s) from the checkpoint, {result.redelivered} readings "
        f"redelivered after the failure, {result.queue_left} left in the queue, "
        f"{result.seconds:.1f} s"
    )
    if result.ok:
        console.print(
            "[bold green]OK[/]: every reading counted exactly once. The source is at least "
            "once — a batch's messages are completed only after Spark committed its output, "
            "so the failed batch's messages came back — and dropDuplicates(['id']) made the "
            "aggregate exact."
        )
        return True
    console.print("[bold red]FAILED[/]: the aggregate does not match what was sent")
    return False
