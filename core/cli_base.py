"""The command line's plumbing: one-line errors, exit codes, help without typer's placeholders.

Shared by the commands in :mod:`leasekit.cli`: how an error is printed (one
line on stderr, credentials redacted) and which exit status it gets, how
``KEY=VALUE`` options are parsed without echoing a mistyped secret, and the
typer classes that render arguments and flags plainly.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

try:  # newer typer carries its own copy of click, and raises that copy's exceptions
    from typer._click.core import Context, Parameter
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # pragma: no cover - older typer runs on click itself
    from click import ClickException, Context, Parameter, UsageError  # type: ignore

from . import errors
from .redaction import redact

__all__ = [
    "EXIT_BACKEND",
    "EXIT_USAGE",
    "MAX_LISTED",
    "Command",
    "Group",
    "cut",
    "error",
    "exit_code",
    "parse_options",
    "run",
    "show_body",
]

T = TypeVar("T")

#: Exit status for usage errors and bad input (click's own for usage errors).
EXIT_USAGE = 2
#: Most dead letters ``redrive`` counts ahead for its progress bar.
MAX_LISTED = 100_000
#: Exit status for a backend error (a missing queue, a refusal, an outage).
EXIT_BACKEND = 1


def error(text: str) -> None:
    """Print ``error: text`` as one line on stderr (credentials redacted, no wrapping)."""
    line = " ".join(redact(text).split())  # one line, whatever the text held
    typer.echo(f"error: {line}", err=True)


class _Argument(TyperArgument):
    """A positional argument shown as click shows it: ``URL``, ``[BODY]`` (not ``{URL}``)."""

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


class _Option(TyperOption):
    """An option whose help shows no ``<bool>`` after a flag."""

    def display_type_rich(self, ctx: Context) -> str | None:
        if self.is_flag or self.count:
            return None
        return super().display_type_rich(ctx)


def _plain(params: list[Parameter]) -> list[Parameter]:
    """``params`` with typer's help decorations removed (see :class:`_Argument`, :class:`_Option`).

    typer builds its own parameter objects; giving them these subclasses (which
    add no state) changes only how help and usage show them.
    """
    for param in params:
        if type(param) is TyperArgument:
            param.__class__ = _Argument
        elif type(param) is TyperOption:
            param.__class__ = _Option
    return params


class Command(TyperCommand):
    """A command with plain help (see :func:`_plain`)."""

    def get_params(self, ctx: Context) -> list[Parameter]:
        return _plain(super().get_params(ctx))


class Group(TyperGroup):
    """The ``leasekit`` group: plain help, and every usage error as one line (exit 2)."""

    def get_params(self, ctx: Context) -> list[Parameter]:
        return _plain(super().get_params(ctx))

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # typer has shown the help
                sys.exit(exc.exit_code)
            where = ""
            if isinstance(exc, UsageError) and exc.ctx is not None:
                where = f" (see '{exc.ctx.command_path} --help')"
            error(exc.format_message() + where)
            sys.exit(exc.exit_code)
        except typer.Abort:
            error("aborted")
            sys.exit(EXIT_BACKEND)
        # Without standalone mode click returns an Exit's code, and a command's value.
        sys.exit(result if isinstance(result, int) else 0)


def parse_options(items: list[str] | None, flag: str = "--option") -> dict[str, Any]:
    """``KEY=VALUE`` items as a dict.

    A malformed item is never echoed: it may be a credential with its ``=``
    mistyped, and the error would put it into a log. Only its position is named.

    Raises:
        InvalidArgument: an item without ``=`` or with an empty key.
    """
    options: dict[str, Any] = {}
    for position, item in enumerate(items or [], start=1):
        key, sep, value = item.partition("=")
        if not sep or not key:
            what = "has no '='" if not sep else "has no KEY before '='"
            raise errors.InvalidArgument(
                f"{flag} takes KEY=VALUE; {flag} number {position} {what} "
                "(its text is not shown: it may hold a secret)"
            )
        options[key] = value
    return options


def run(fn: Callable[[], T]) -> T:
    """Run a command body; print a leasekit error as one line and exit non-zero."""
    try:
        return fn()
    except errors.LeaseError as exc:
        error(f"{type(exc).__name__}: {exc}")
        raise typer.Exit(exit_code(exc)) from None
    except errors.LeaseStateError as exc:
        error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None


def exit_code(exc: errors.LeaseError) -> int:
    """The CLI's exit status for ``exc``: 2 for bad input and setup, 1 for the backend's errors."""
    usage = errors.InvalidArgument | errors.BackendNotFound | errors.BackendNotInstalled
    return EXIT_USAGE if isinstance(exc, usage) else EXIT_BACKEND


def cut(text: str, width: int) -> str:
    """``text`` at most ``width`` characters, an ellipsis marking a cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def show_body(body: bytes, limit: int = 200) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return (
            "base64:" + base64.b64encode(body[:limit]).decode() + ("…" if len(body) > limit else "")
        )
    return text[:limit] + ("…" if len(text) > limit else "")
