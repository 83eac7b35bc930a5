"""A failed test whose server died says so: the server's exit code and last output.

A session's server (an emulator, Redis, PostgreSQL) that dies takes every later
test of its worker with it, each failing on a refused connection that does not
say why. This hook adds, to the report of a failed test, the exit code and the
end of the output of every server process among its fixtures that has exited.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from leasekit.emulators._process import ServerProcess

#: The last characters of a dead server's output put in the report.
OUTPUT_TAIL = 4000


def _server_processes(value: Any) -> list[ServerProcess]:
    """``value`` itself if it is a ServerProcess, else its ``process`` attribute if that is one."""
    if isinstance(value, ServerProcess):
        return [value]
    process = getattr(value, "process", None)
    return [process] if isinstance(process, ServerProcess) else []


def dead_servers(funcargs: dict[str, Any]) -> list[tuple[str, ServerProcess]]:
    """The fixtures among ``funcargs`` whose server process has exited."""
    dead = []
    for name, value in funcargs.items():
        for process in _server_processes(value):
            if process.exit_code() is not None:
                dead.append((name, process))
    return dead


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for name, process in dead_servers(getattr(item, "funcargs", {})):
        report.sections.append(
            (
                f"server {name} exited with code {process.exit_code()}",
                process.output()[-OUTPUT_TAIL:] or "(no output kept)",
            )
        )
