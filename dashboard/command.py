"""The ``leasekit dashboard`` command, added to the CLI by the ``leasekit.commands`` entry point.

Core imports no dashboard (tools/check_layers.py): the command line finds this
module's :func:`add_commands` by its entry point. Importing it imports nothing
heavy; the web stack (starlette, jinja2, uvicorn) is imported when the command
runs, and a missing extra is a one-line error naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from leasekit.cli_base import EXIT_USAGE, Command, error, parse_options, run

__all__ = ["add_commands"]


def add_commands(app: typer.Typer) -> None:
    """Define ``dashboard`` on the ``leasekit`` typer app."""

    @app.command(cls=Command)
    def dashboard(
        urls: Annotated[list[str], typer.Argument(metavar="URL", help="Queue URLs to show.")],
        host: Annotated[
            str,
            typer.Option(metavar="HOST", help="Address to bind (another than loopback: token)."),
        ] = "127.0.0.1",
        port: Annotated[int, typer.Option(metavar="PORT", min=0, max=65535)] = 8050,
        read_only: Annotated[
            bool, typer.Option("--read-only", help="Refuse every change (redrive, send, peek).")
        ] = False,
        consumer: Annotated[
            list[str] | None,
            typer.Option(
                "--consumer",
                metavar="URL",
                help="A consumer's health server serving /leases (repeatable).",
            ),
        ] = None,
        conformance_report: Annotated[
            list[Path] | None,
            typer.Option(
                "--conformance",
                metavar="PATH",
                help="A report of 'leasekit conformance URL --json PATH' (repeatable).",
            ),
        ] = None,
        allow_host: Annotated[
            list[str] | None,
            typer.Option("--allow-host", metavar="NAME", help="Another Host header to answer."),
        ] = None,
        no_token: Annotated[
            bool, typer.Option("--no-token", help="No login token (loopback only).")
        ] = False,
        option: Annotated[
            list[str] | None,
            typer.Option(
                "--option", "-o", metavar="KEY=VALUE", help="Backend option (repeatable)."
            ),
        ] = None,
    ) -> None:
        """Serve the operator's web dashboard on 127.0.0.1 (needs the dashboard extra)."""
        try:
            from leasekit.dashboard.cli import serve
        except ImportError as exc:
            error(f"the dashboard needs its extra: pip install 'leasekit[dashboard]' ({exc.name})")
            raise typer.Exit(EXIT_USAGE) from None
        run(
            lambda: serve(
                urls,
                host=host,
                port=port,
                read_only=read_only,
                consumers=consumer or [],
                conformance=conformance_report or [],
                allowed_hosts=allow_host or [],
                no_token=no_token,
                options=parse_options(option),
            )
        )
