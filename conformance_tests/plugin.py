"""The pytest plugin (entry point ``pytest11``): options, the URL harness, and the report.

Options:
    ``--leasekit-backend URL``: the backend the packaged suite runs against.
    ``--leasekit-option KEY=VALUE``: a backend option (repeatable; credentials
    belong here or in the environment, not in the URL).
    ``--leasekit-async``: drive the backend through ``leasekit.aio`` instead.
    ``--leasekit-report-json PATH`` / ``--leasekit-report-md PATH``: write the
    compatibility matrix (property x result, with skip reasons).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .async_harness import AsyncUrlHarness
from .harness import Harness, UrlHarness
from .report import MatrixReport


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the suite's command-line options."""
    group = parser.getgroup("leasekit", "leasekit conformance suite")
    group.addoption(
        "--leasekit-backend",
        metavar="URL",
        default=None,
        help="backend URL or name for the packaged conformance suite",
    )
    group.addoption(
        "--leasekit-option",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="backend option passed to leasekit.open (repeatable)",
    )
    group.addoption(
        "--leasekit-async",
        action="store_true",
        default=False,
        help="run the suite through the asyncio API (leasekit.aio)",
    )
    group.addoption("--leasekit-report-json", metavar="PATH", default=None)
    group.addoption("--leasekit-report-md", metavar="PATH", default=None)


def pytest_configure(config: pytest.Config) -> None:
    """Start collecting the matrix when a report was asked for."""
    json_path = config.getoption("--leasekit-report-json")
    md_path = config.getoption("--leasekit-report-md")
    if json_path or md_path:
        backend = config.getoption("--leasekit-backend") or "harness"
        report = MatrixReport(backend=backend, json_path=json_path, md_path=md_path)
        config.pluginmanager.register(report, "leasekit-matrix-report")


def _options(config: pytest.Config) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in config.getoption("--leasekit-option"):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise pytest.UsageError(f"--leasekit-option takes KEY=VALUE, got {item!r}")
        options[key] = value
    return options


@pytest.fixture(scope="session")
def leasekit_harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """A :class:`UrlHarness` for ``--leasekit-backend`` (an async one with ``--leasekit-async``)."""
    target = request.config.getoption("--leasekit-backend")
    if not target:
        pytest.skip("no --leasekit-backend given: nothing to run the conformance suite against")
    options = _options(request.config)
    harness: Harness = (
        AsyncUrlHarness(target, **options)
        if request.config.getoption("--leasekit-async")
        else UrlHarness(target, **options)
    )
    yield harness
    harness.close()


__all__ = ["leasekit_harness", "pytest_addoption", "pytest_configure"]
