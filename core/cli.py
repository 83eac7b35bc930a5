"""The ``leasekit`` command line: backends, send, lease, stats, consume, watch, conformance.

Backend options (credentials, endpoints) are given with ``--option KEY=VALUE``
(repeatable), never in the URL. ``python -m leasekit`` is the same program.

Errors and exit codes (one rule, documented in docs/cli.md): every error is one
line on stderr, ``error: ...`` ending in a newline, with credentials redacted,
and the exit status says whose the fault is:

* **2** usage: a missing or malformed argument or option, a bad URL or option
  value, a backend that is not installed (:class:`~leasekit.InvalidArgument`,
  :class:`~leasekit.errors.BackendNotFound`,
  :class:`~leasekit.errors.BackendNotInstalled`, a misused lease);
* **1** the backend: the queue is missing, the service refused or failed
  (every other :class:`~leasekit.LeaseError`), or a command's own verdict
  (``watch --once`` whose sample failed, ``demo`` that lost a message);
* **0** success (``demo`` also uses 3: its time limit came first).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import importlib.metadata
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import errors
from .capabilities import COUNT_FIELDS, Capabilities
from .cli_base import EXIT_USAGE, MAX_LISTED
from .cli_base import Command as _Command
from .cli_base import Group as _Group
from .cli_base import cut as _cut
from .cli_base import error as _error
from .cli_base import parse_options as _parse_options
from .cli_base import run as _run
from .cli_base import show_body as _show_body
from .consumer import Consumer, ConsumerStats
from .health import HealthServer
from .registry import default_registry
from .registry import open as open_queue

__all__ = ["app", "main"]

T = TypeVar("T")


app = typer.Typer(
    cls=_Group,
    name="leasekit",
    help="Safe, portable leased queue messages.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

OptionList = Annotated[
    list[str] | None,
    typer.Option("--option", "-o", metavar="KEY=VALUE", help="Backend option (repeatable)."),
]


@app.command(cls=_Command)
def backends(
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            metavar="URL",
            help="Open this queue (no call is made) and show its own capabilities.",
        ),
    ] = None,
    option: OptionList = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the backends and what each guarantees (documented limits; --url: one queue's own)."""
    if url is not None:
        _run(lambda: _queue_capabilities(url, _parse_options(option), as_json))
        return
    registry = default_registry()
    rows: list[dict[str, Any]] = []
    for name, spec in registry.specs().items():
        row: dict[str, Any] = {"name": name, "driver": spec.driver, "description": spec.description}
        try:
            cls = registry.driver_class(name)
        except errors.LeaseError as exc:
            row["installed"] = False
            row["hint"] = str(exc)
        else:
            missing = _missing_packages(spec.extra)
            row["installed"] = not missing
            if missing:
                row["hint"] = f"needs {', '.join(missing)}: {spec.install_hint}"
            caps = getattr(cls, "capabilities", None)
            row["capabilities"] = caps.as_dict() if isinstance(caps, Capabilities) else None
        rows.append(row)
    _mark_aliases(rows)
    if as_json:
        console.print_json(json.dumps(rows))
        return
    _print_backends([row for row in rows if "alias_of" not in row])


def _mark_aliases(rows: list[dict[str, Any]]) -> None:
    """Mark a row that only names another backend's driver again (``postgres``).

    Such a row (same driver, a description starting "alias of") gets
    ``alias_of``; the backend it names lists it in ``aliases``. The table
    shows the alias in that backend's description instead of a row of its own.
    """
    primary = {
        row["driver"]: row
        for row in reversed(rows)
        if not str(row["description"]).startswith("alias of")
    }
    for row in rows:
        named = primary.get(row["driver"])
        if (
            named is not None
            and named is not row
            and str(row["description"]).startswith("alias of")
        ):
            row["alias_of"] = named["name"]
            named.setdefault("aliases", []).append(row["name"])


def _print_backends(rows: list[dict[str, Any]]) -> None:
    """The backends table, readable at 80 columns, then each one's description."""
    table = Table(title="leasekit backends", title_justify="left")
    table.add_column("backend", no_wrap=True)
    table.add_column("lease", no_wrap=True)
    table.add_column("batch", justify="right")
    table.add_column("max body", justify="right", no_wrap=True)
    table.add_column("stale receipt")
    fixed = False
    for row in rows:
        name = Text(row["name"], style="" if row["installed"] else "dim")
        caps = row.get("capabilities")
        if not caps:
            table.add_row(name, "?", "?", "?", "?")
            continue
        if caps["fixed_lease"] is not None:
            fixed = True
            lease = f"fixed {_human_seconds(caps['fixed_lease'])} ¹"
        else:
            lease = f"{_human_seconds(caps['min_lease'])}–{_human_seconds(caps['max_lease'])}"
        table.add_row(
            name,
            lease,
            str(caps["max_receive_batch"]),
            _human_bytes(caps["max_message_size"]),
            "refused" if caps["detects_stale_receipts"] else "not detected ²",
        )
    console.print(table)
    about = Table.grid(padding=(0, 2))
    about.add_column(no_wrap=True)
    about.add_column()
    for row in rows:
        also = f" (also {', '.join(row['aliases'])}://)" if row.get("aliases") else ""
        about.add_row(row["name"], Text((row["description"] or "") + also))
    console.print(about)
    notes = [
        "lease: shortest–longest lease per call (the keeper renews longer ones); batch: "
        "most messages per receive. Cloud services: documented limits with default "
        "options; one queue's own: leasekit backends --url URL.",
    ]
    if fixed:
        notes.append("¹ the queue's lock duration (option lock_duration), renewed in steps.")
    if any((row.get("capabilities") or {}).get("detects_stale_receipts") is False for row in rows):
        notes.append(
            "² the service accepts a stale receipt: leasekit's own clock reports the lease lost."
        )
    for row in rows:
        if not row["installed"]:
            notes.append(f"{row['name']} is not installed: {row.get('hint', '')}")
    for note in notes:
        console.print(Text(note, style="dim"))


def _queue_capabilities(url: str, options: dict[str, Any], as_json: bool) -> None:
    """Print one queue's capabilities (opening it makes no backend call)."""
    with open_queue(url, **options) as queue:
        caps = queue.capabilities.as_dict()
        name = queue.name
    if as_json:
        console.print_json(json.dumps(caps))
        return
    table = Table(title=f"capabilities of queue {name}", title_justify="left")
    table.add_column("capability", no_wrap=True)
    table.add_column("value (s, bytes)")
    for key, value in caps.items():
        shown = ", ".join(value) if isinstance(value, list) else str(value)
        table.add_row(key, Text(shown or "-"))
    console.print(table)


def _missing_packages(extra: str | None) -> list[str]:
    """The distributions a backend's pip extra needs that are not installed ([] if unknown)."""
    if extra is None:
        return []
    try:
        requirements = importlib.metadata.requires("leasekit") or []
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return []
    missing = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        if f'extra == "{extra}"' not in marker.replace("'", '"'):
            continue
        match = re.match(r"[A-Za-z0-9._-]+", spec.strip())
        if match is None:
            continue
        try:
            importlib.metadata.version(match.group())
        except importlib.metadata.PackageNotFoundError:
            missing.append(match.group())
    return missing


def _human_seconds(seconds: float) -> str:
    """``0.01`` -> ``10 ms``, ``43200`` -> ``12 h``, ``604800`` -> ``7 d``."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds * 1000:.3g} ms"


def _human_bytes(size: int) -> str:
    """``49152`` -> ``48 KiB``, ``1048576`` -> ``1 MiB``."""
    for unit, step in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= step:
            return f"{size / step:.4g} {unit}"
    return f"{size} B"


@app.command(cls=_Command)
def send(
    url: Annotated[
        str, typer.Argument(metavar="URL", help="Queue URL, e.g. sqlite:///jobs.db?queue=jobs")
    ],
    body: Annotated[
        str | None, typer.Argument(metavar="BODY", help="Message body (UTF-8); '-' reads stdin.")
    ] = None,
    prop: Annotated[
        list[str] | None,
        typer.Option("--property", "-p", metavar="KEY=VALUE", help="A message property."),
    ] = None,
    delay: Annotated[
        float, typer.Option(metavar="SECONDS", help="Seconds before it is visible.")
    ] = 0,
    ttl: Annotated[
        float | None, typer.Option(metavar="SECONDS", help="Time-to-live in seconds.")
    ] = None,
    count: Annotated[
        int, typer.Option(metavar="N", min=1, help="Send the body this many times.")
    ] = 1,
    create: Annotated[bool, typer.Option(help="Create the queue if missing.")] = False,
    option: OptionList = None,
) -> None:
    """Send a message."""

    def go() -> None:
        data = sys.stdin.buffer.read() if body in (None, "-") else (body or "").encode()
        properties: dict[str, str] = _parse_options(prop, "--property")
        with open_queue(url, create=create, **_parse_options(option)) as queue:
            if count == 1:  # the error a single send meets is the one to report
                ids = [queue.send(data, delay=delay, ttl=ttl, properties=properties)]
            else:
                ids = _send_many(queue, [data] * count, delay, ttl, properties)
        for message_id in ids:
            console.print(message_id, highlight=False)

    _run(go)


def _send_many(
    queue: Any, bodies: list[bytes], delay: float, ttl: float | None, properties: dict[str, str]
) -> list[str]:
    """``send_many``; when nothing was sent, the error the sends met (not ``SendIncomplete``).

    When some were sent, their ids are printed before the ``SendIncomplete`` error.
    """
    try:
        ids: list[str] = queue.send_many(bodies, delay=delay, ttl=ttl, properties=properties)
    except errors.SendIncomplete as exc:
        if not exc.sent:
            first = next(iter(exc.failed.values()))
            raise first from first.__cause__
        for message_id in exc.sent.values():
            console.print(message_id, highlight=False)
        raise
    return ids


@app.command(cls=_Command)
def lease(
    url: Annotated[str, typer.Argument(metavar="URL", help="Queue URL.")],
    max_messages: Annotated[
        int, typer.Option("--max", metavar="N", help="Most messages to lease.")
    ] = 1,
    duration: Annotated[
        float | None, typer.Option(metavar="SECONDS", help="Lease duration in seconds.")
    ] = None,
    wait: Annotated[
        float, typer.Option(metavar="SECONDS", help="Seconds to wait for a message.")
    ] = 0,
    settle: Annotated[
        str, typer.Option(metavar="ACTION", help="After printing: complete, abandon or keep.")
    ] = "abandon",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
    option: OptionList = None,
) -> None:
    """Lease messages, print them, then complete or abandon them."""
    if settle not in ("complete", "abandon", "keep"):
        _error("--settle must be complete, abandon or keep")
        raise typer.Exit(EXIT_USAGE)

    def go() -> None:
        with open_queue(url, **_parse_options(option)) as queue:
            leases = queue.lease(max_messages, duration=duration, wait=wait)
            if not leases:
                err_console.print("no message")
            table = Table(title=f"{len(leases)} leased from {queue.name}", title_justify="left")
            table.add_column("id", no_wrap=True)
            table.add_column("#", justify="right")  # delivery count
            table.add_column("age", justify="right", no_wrap=True)
            table.add_column("expires", justify="right", no_wrap=True)
            table.add_column("body (properties)", overflow="fold")
            for item in leases:
                m = item.message
                if as_json:
                    print(
                        json.dumps(
                            {
                                "id": m.id,
                                "delivery_count": m.delivery_count,
                                "enqueued_at": m.enqueued_at.isoformat(),
                                "expires_at": item.expires_at.isoformat(),
                                "properties": dict(m.properties),
                                "body_base64": base64.b64encode(m.body).decode(),
                            }
                        )
                    )
                else:
                    body = Text(_show_body(m.body))
                    if m.properties:
                        shown = " ".join(f"{k}={v}" for k, v in m.properties.items())
                        body.append(f"\n({shown})", style="dim")
                    age = (datetime.now(UTC) - m.enqueued_at).total_seconds()
                    table.add_row(
                        m.id,
                        str(m.delivery_count),
                        _human_seconds(max(age, 0.001)),
                        f"in {_human_seconds(max(item.time_left, 0.001))}",
                        body,
                    )
                if settle == "complete":
                    item.complete()
                elif settle == "abandon":
                    item.abandon()
            if leases and not as_json:
                console.print(table)

    _run(go)


@app.command(cls=_Command)
def stats(
    url: Annotated[str, typer.Argument(metavar="URL", help="Queue URL.")],
    option: OptionList = None,
) -> None:
    """Print visible / leased / delayed / dead-lettered / total counts, where known."""

    def go() -> None:
        with open_queue(url, **_parse_options(option)) as queue:
            counts = queue.stats()
        table = Table(title=f"queue {queue.name}")
        table.add_column("state")
        table.add_column("messages", justify="right")
        for state in COUNT_FIELDS:
            value = getattr(counts, state)
            table.add_row(state.replace("_", "-"), "unknown" if value is None else str(value))
        console.print(table)

    _run(go)


@app.command("dead-letters", cls=_Command)
def dead_letters_command(
    url: Annotated[str, typer.Argument(metavar="URL", help="Queue URL.")],
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", min=1, help="Most dead letters to show.")
    ] = 20,
    option: OptionList = None,
) -> None:
    """List dead letters: age, reason, delivery count and the start of the body."""

    def go() -> None:
        with open_queue(url, **_parse_options(option)) as queue:
            letters = queue.peek_dead_letters(limit)
            name = queue.name
        if not letters:
            err_console.print(f"no dead letters in {name}", highlight=False)
            return
        table = Table(title=f"{len(letters)} dead letter(s) of {name}", title_justify="left")
        # Cut the text to fit here: rich shrinks no_wrap columns to nothing otherwise.
        reason_width = 24
        body_width = max(console.width - reason_width - 24, 10)
        table.add_column("age", justify="right", no_wrap=True, min_width=6)
        table.add_column("#", justify="right", no_wrap=True, min_width=2)  # delivery count
        table.add_column("reason", no_wrap=True)
        table.add_column("body", no_wrap=True)
        now = datetime.now(UTC)
        for letter in letters:
            age = (
                _human_seconds(max((now - letter.enqueued_at).total_seconds(), 0.001))
                if letter.enqueued_at is not None
                else "?"
            )
            count = "?" if letter.delivery_count is None else str(letter.delivery_count)
            body = _cut(_show_body(letter.body, limit=200).replace("\n", " "), body_width)
            reason = _cut((letter.reason or "-").replace("\n", " "), reason_width)
            table.add_row(age, count, Text(reason), Text(body))
        console.print(table)

    _run(go)


@app.command(cls=_Command)
def redrive(
    url: Annotated[str, typer.Argument(metavar="URL", help="Queue URL.")],
    limit: Annotated[
        int | None,
        typer.Option("--limit", metavar="N", min=1, help="Most dead letters to move."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would move; move nothing.")
    ] = False,
    option: OptionList = None,
) -> None:
    """Move dead letters back to their queue (none lost if interrupted)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from .redrive import redrive as move

    def go() -> None:
        with open_queue(url, **_parse_options(option)) as queue:
            name = queue.name
            waiting = len(queue.peek_dead_letters(limit or MAX_LISTED))
            if dry_run:
                console.print(
                    f"would move {waiting:,} dead letter(s) back to {name} (dry run)",
                    highlight=False,
                )
                return
            start = time.monotonic()
            columns = (TextColumn("moving"), BarColumn(), MofNCompleteColumn())
            with Progress(*columns, console=err_console, transient=True) as bar:
                task = bar.add_task("redrive", total=waiting or None)
                moved = move(queue, limit, progress=lambda _letter: bar.advance(task))
            left = len(queue.peek_dead_letters(1))
        elapsed = time.monotonic() - start
        console.print(
            f"moved {moved:,} dead letter(s) back to {name} in {elapsed:.1f} s"
            + ("; more are left" if left else ""),
            highlight=False,
        )

    _run(go)


@app.command(cls=_Command)
def consume(
    url: Annotated[str, typer.Argument(metavar="URL", help="Queue URL.")],
    handler: Annotated[
        str,
        typer.Option(
            "--handler",
            metavar="MODULE:FUNC",
            help="Called with each message (sync or async): returning completes it, "
            "raising abandons it.",
        ),
    ],
    concurrency: Annotated[
        int, typer.Option(metavar="N", help="Handlers at once (tasks if async).")
    ] = 1,
    lease_duration: Annotated[
        float | None, typer.Option(metavar="SECONDS", help="Physical lease, kept renewed.")
    ] = None,
    max_deliveries: Annotated[
        int | None, typer.Option(metavar="N", help="Dead-letter one delivered more than N times.")
    ] = None,
    until_idle: Annotated[
        bool, typer.Option("--until-idle", help="Stop once the queue is drained.")
    ] = False,
    health_port: Annotated[
        int | None,
        typer.Option(metavar="PORT", help="Serve /livez and /readyz (0: any free port)."),
    ] = None,
    health_host: Annotated[
        str, typer.Option(metavar="HOST", help="Health address (0.0.0.0: reachable outside).")
    ] = "127.0.0.1",
    create: Annotated[bool, typer.Option("--create", help="Create the queue if missing.")] = False,
    report_leases: Annotated[
        bool,
        typer.Option(
            "--report-leases",
            help="Also serve GET /leases on the health port for 'leasekit dashboard' "
            "(ids and timings only).",
        ),
    ] = False,
    option: OptionList = None,
) -> None:
    """Run a worker on a queue: lease, keep alive, handle, settle.

    MODULE is imported from the current directory or the installed packages.
    Ctrl-C or SIGTERM stops it gracefully: handlers finish, unstarted messages
    go back to the queue.
    """

    def go() -> ConsumerStats:
        if report_leases and health_port is None:
            raise errors.InvalidArgument("--report-leases needs --health-port")
        function = _load_handler(handler)
        options = _parse_options(option)
        settings: dict[str, Any] = {
            "concurrency": concurrency,
            "lease_duration": lease_duration,
            "max_deliveries": max_deliveries,
        }
        call = getattr(function, "__call__", None)  # noqa: B004 - an object with an async __call__
        if inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call):
            return asyncio.run(_consume_async(url, function, options, settings))
        with open_queue(url, create=create, **options) as queue:
            consumer = Consumer(queue, function, **settings)
            with _health_endpoint(
                consumer, health_host, health_port, queue.name, handler, report_leases
            ):
                return consumer.run(until_idle=until_idle)

    async def _consume_async(
        url: str, function: Any, options: dict[str, Any], settings: dict[str, Any]
    ) -> ConsumerStats:
        from . import aio

        async with aio.open(url, create=create, **options) as queue:
            consumer = aio.AsyncConsumer(queue, function, **settings)
            with _health_endpoint(
                consumer, health_host, health_port, queue.name, handler, report_leases
            ):
                return await consumer.run(until_idle=until_idle)

    stats = _run(go)
    table = Table(title="consumer stopped", title_justify="left")
    table.add_column("messages")
    table.add_column("", justify="right")
    for key, value in stats.as_dict().items():
        if isinstance(value, int) and (value or key in ("received", "completed")):
            table.add_row(key.replace("_", " "), f"{value:,}")
    console.print(table)


@contextlib.contextmanager
def _health_endpoint(
    consumer: Any,
    host: str,
    port: int | None,
    queue: str,
    handler: str,
    report_leases: bool = False,
) -> Iterator[None]:
    """Serve ``consumer``'s health while the block runs (if a port is given); say so on stderr.

    With ``report_leases``, ``/leases`` too (a :class:`~leasekit.lease_report.LeaseReporter`).
    """
    err_console.print(f"consuming {queue!r} with {handler}", highlight=False)
    if port is None:
        yield
        return
    reporter = None
    if report_leases:
        from .lease_report import LeaseReporter

        reporter = LeaseReporter().install()
    try:
        leases = None if reporter is None else reporter.snapshot
        with HealthServer(consumer, host=host, port=port, leases=leases) as server:
            err_console.print(
                f"health: {server.url}/livez and {server.url}/readyz"
                + (f"; leases: {server.url}/leases" if reporter else ""),
                highlight=False,
                soft_wrap=True,
            )
            yield
    finally:
        if reporter is not None:
            reporter.uninstall()


def _load_handler(spec: str) -> Callable[..., Any]:
    """Import ``module:attribute[.attribute]``; the current directory comes first, as for python -m.

    Raises:
        InvalidArgument: a malformed spec, a module that fails to import, a missing
            or non-callable attribute.
    """
    module_name, sep, path = spec.partition(":")
    if not sep or not module_name or not path:
        raise errors.InvalidArgument(f"--handler takes MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise errors.InvalidArgument(f"--handler: cannot import {module_name!r}: {exc!r}") from exc
    for part in path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise errors.InvalidArgument(
                f"--handler: {module_name!r} has no attribute {path!r}"
            ) from None
    if not callable(target):
        raise errors.InvalidArgument(f"--handler: {spec} is not callable")
    return cast(Callable[..., Any], target)


@app.command(cls=_Command)
def watch(
    url: Annotated[str, typer.Argument(metavar="URL", help="Queue URL.")],
    metrics: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="A consumer's Prometheus endpoint, e.g. http://host:9464/metrics.",
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option(metavar="SECONDS", help="Seconds between samples.")
    ] = 2.0,
    once: Annotated[
        bool,
        typer.Option("--once", help="Print one frame (two samples for the rates) and exit."),
    ] = False,
    option: OptionList = None,
) -> None:
    """Watch a queue's counts and rates live, and a consumer's leases with --metrics."""
    from rich.live import Live

    from .watch import WatchView, check_metrics_url, fetch_metrics, sample_queue

    if not (isinstance(interval, float | int) and 0.1 <= interval <= 3600):
        _error("--interval must be 0.1 to 3600 seconds")
        raise typer.Exit(EXIT_USAGE)

    def go() -> None:
        if metrics is not None:
            check_metrics_url(metrics)
        with open_queue(url, **_parse_options(option)) as queue:
            view = WatchView(
                f"{queue.name} ({queue.driver.scheme})",
                queue.capabilities.counted if queue.capabilities.queue_stats else frozenset(),
                metrics_url=metrics,
                interval=interval,
            )

            def sample() -> None:
                view.add(sample_queue(queue), fetch_metrics(metrics) if metrics else None)

            sample()
            if once:
                time.sleep(interval)
                sample()
                console.print(view.render())
                if view.queue[-1].error is not None:
                    raise typer.Exit(1)
                return
            try:
                with Live(view.render(), console=console, auto_refresh=False) as live:
                    while True:
                        time.sleep(interval)
                        sample()
                        live.update(view.render(), refresh=True)
            except KeyboardInterrupt:
                return

    _run(go)


@app.command(cls=_Command)
def conformance(
    url: Annotated[str, typer.Argument(metavar="URL", help="Backend URL or name to test.")],
    option: OptionList = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", metavar="PATH", help="Write the matrix as JSON.")
    ] = None,
    markdown: Annotated[
        Path | None,
        typer.Option("--markdown", metavar="PATH", help="Write the matrix as Markdown."),
    ] = None,
    select: Annotated[
        str | None, typer.Option("-k", metavar="EXPR", help="Only tests matching (pytest -k).")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show pytest output.")] = False,
    use_async: Annotated[
        bool, typer.Option("--async", help="Drive the backend through leasekit.aio.")
    ] = False,
) -> None:
    """Run the conformance suite against a backend and print its compatibility matrix."""
    with tempfile.TemporaryDirectory(prefix="leasekit-conformance-") as tmp:
        report = Path(tmp) / "matrix.json"
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "--pyargs",
            "leasekit.conformance",
            "--leasekit-backend",
            url,
            "--leasekit-report-json",
            str(report),
            "-p",
            "no:cacheprovider",
            "-q" if verbose else "-qq",
        ]
        for item in option or []:
            argv += ["--leasekit-option", item]
        if select:
            argv += ["-k", select]
        if use_async:
            argv.append("--leasekit-async")
        result = subprocess.run(argv, cwd=tmp, capture_output=not verbose, text=True, check=False)
        if not report.exists():
            output = (result.stderr or "").strip() or (result.stdout or "").strip()
            last = output.splitlines()[-1] if output else "no output"
            _error(f"the conformance suite did not run ({last}); --verbose shows pytest's output")
            raise typer.Exit(EXIT_USAGE)
        data = json.loads(report.read_text())
        _print_matrix(data)
        if json_out:
            json_out.write_text(json.dumps(data, indent=2) + "\n")
        if markdown:
            markdown.write_text(_matrix_markdown(data))
    raise typer.Exit(0 if result.returncode in (0, 5) else 1)


_STYLE = {"passed": "green", "skipped": "yellow", "failed": "bold red"}


def _print_matrix(data: dict[str, Any]) -> None:
    table = Table(title=f"conformance of {data['backend']}")
    table.add_column("property")
    table.add_column("result")
    table.add_column("reason")
    for prop, row in data["properties"].items():
        result = row["result"]
        table.add_row(prop, f"[{_STYLE.get(result, '')}]{result}[/]", row["reason"])
    console.print(table)
    counts: dict[str, int] = {}
    for test in data["tests"]:
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    console.print(", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))


def _matrix_markdown(data: dict[str, Any]) -> str:
    from leasekit.conformance.report import render_markdown

    return f"## Conformance: `{data['backend']}`\n\n" + render_markdown(data)


@app.command(cls=_Command)
def demo(
    messages: Annotated[int, typer.Option(min=1, help="Messages to enqueue.")] = 3000,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes at once.")] = 3,
    concurrency: Annotated[int, typer.Option(min=1, help="Handler threads per worker.")] = 4,
    lease: Annotated[float, typer.Option(min=0.01, help="Physical lease in seconds.")] = 2.0,
    kill_every: Annotated[
        float, typer.Option(min=0.1, help="Seconds between worker kills or freezes.")
    ] = 1.5,
    time_limit: Annotated[
        float | None,
        typer.Option(
            min=0.1,
            help="Stop after this many seconds and report what is still unprocessed "
            "(default: scaled to --messages).",
            show_default=False,
        ),
    ] = None,
    directory: Annotated[
        str | None, typer.Option("--dir", metavar="DIR", help="Keep the SQLite files here.")
    ] = None,
    chunks: Annotated[
        int,
        typer.Option(
            min=0,
            help="Resumable work instead: each message is this many steps; run the jobs "
            "with and without checkpoints under kills and report the work redone "
            "(--messages defaults to 24 then).",
        ),
    ] = 0,
) -> None:
    """Workers killed mid-message; every message processed, none lost (embedded SQLite).

    Exit status: 0 when every message was processed; 3 when the time limit came
    first and every unprocessed message is still in the queue; 1 when a message
    was lost or dead-lettered.
    """
    if chunks:
        _resumable_demo(messages, chunks, workers, lease, kill_every, time_limit)
        return
    from .demo import default_time_limit, run_demo, summary_rows, verdict

    if time_limit is None:
        time_limit = default_time_limit(messages, workers, concurrency)
    console.print(
        f"[bold]leasekit demo[/]: {messages} messages, {workers} worker processes x "
        f"{concurrency} threads, {lease:g} s leases kept alive by the keeper, "
        f"a worker killed or frozen every {kill_every:g} s, time limit {time_limit:g} s"
    )
    summary = run_demo(
        messages=messages,
        workers=workers,
        concurrency=concurrency,
        lease=lease,
        kill_every=kill_every,
        directory=directory,
        time_limit=time_limit,
    )
    table = Table(title="summary")
    table.add_column("")
    table.add_column("", justify="right")
    for label, value in summary_rows(summary):
        table.add_row(label, value)
    console.print(table)
    outcome, sentence = verdict(summary)
    if outcome == "ok":
        console.print(f"[bold green]OK[/]: {sentence}")
        return
    if outcome == "time limit":
        console.print(f"[bold yellow]TIME LIMIT[/]: {sentence}")
        raise typer.Exit(3)
    err_console.print(f"[bold red]FAILED[/]: {sentence}")
    raise typer.Exit(1)


def _resumable_demo(
    messages: int,
    chunks: int,
    workers: int,
    lease: float,
    kill_every: float,
    time_limit: float | None,
) -> None:
    """``leasekit demo --chunks N``: the work redone after kills, with and without checkpoints."""
    from .demo_resumable import resumable_rows, run_resumable_pair

    messages = 24 if messages == 3000 else messages  # the classic demo's default is too many
    lease = min(lease, 1.0)
    kill_every = min(kill_every, 1.0)
    console.print(
        f"[bold]leasekit demo --chunks {chunks}[/]: {messages} jobs of {chunks} steps, "
        f"{workers} worker processes, {lease:g} s leases, a worker killed every "
        f"{kill_every:g} s; once without checkpoints, once with one per step"
    )
    runs = run_resumable_pair(
        messages=messages,
        chunks=chunks,
        workers=workers,
        lease=lease,
        kill_every=kill_every,
        time_limit=time_limit or 300.0,
    )
    header, *rows = resumable_rows(runs)
    table = Table(title="work redone after kills")
    for column in header:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if not all(run.completed for run in runs):
        err_console.print("[bold yellow]TIME LIMIT[/]: a run stopped before its jobs were done")
        raise typer.Exit(3)


#: The entry-point group through which a plugin adds commands to ``leasekit``: each
#: names a function that takes the typer app and defines its commands on it
#: (importing nothing heavy until one runs). Core imports no plugin itself.
COMMANDS_GROUP = "leasekit.commands"


def _add_plugin_commands(target: typer.Typer) -> None:
    """Add the commands installed plugins register (entry points of :data:`COMMANDS_GROUP`).

    A plugin whose registration fails is left out with a warning on stderr: a
    broken plugin must not take the whole command line down with it.
    """
    for entry in sorted(
        importlib.metadata.entry_points(group=COMMANDS_GROUP), key=lambda e: e.name
    ):
        try:
            entry.load()(target)
        except Exception as exc:
            err_console.print(
                f"[yellow]warning:[/] the {entry.name!r} command could not be added: {exc!r}"
            )


_add_plugin_commands(app)


def main() -> None:
    """Entry point of the ``leasekit`` script."""
    app()


if __name__ == "__main__":
    main()
