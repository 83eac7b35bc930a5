"""The order a parallel run takes the tests in: each worker an equal share, its longest first.

``make test`` runs the suite with pytest-xdist's ``worksteal`` scheduler, which
gives each of the ``W`` workers one contiguous slice of the collected tests
(sizes ``N // W`` as it hands them out) and later lets an idle worker take the
back half of the longest queue. In collection order the slices are far from
equal (``tests/test_faults.py`` alone measures ~12 minutes of waiting on
outages), and a minute-long test collected late becomes the run's tail.

So, in every worker alike (xdist checks that the orders agree), this plugin
reorders the collection: tests are packed into ``W`` slices of the sizes the
scheduler will cut, longest first onto the least loaded slice, by the durations
a previous run measured (``tests/durations.json``; a test not named in it counts
as its module's median, else :data:`DEFAULT`). Within a slice the longest run
first, so what another worker steals at the end is short. Tests that share
something costly made once per process (a Spark JVM, Chromium, a built wheel,
a Redis cluster; see :data:`AFFINITY`), or a module- or class-scoped fixture,
stay together in one slice, in their own order.

Refresh the durations after adding slow tests::

    .venv/bin/python -m pytest -n 12 --dist worksteal --record-durations=tests/durations.json

Without ``PYTEST_XDIST_WORKER_COUNT`` (a plain run, or ``-p no:xdist``) the order
is pytest's own.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
#: Seconds assumed for a test of a module no run has measured.
DEFAULT = 0.5
#: Tests at least this long are recorded by name; the rest by their module's median.
SLOW = 0.25
#: Path prefixes whose tests share a costly per-process resource: each stays in one slice.
AFFINITY = {
    "tests/spark/": "a Spark session (one JVM per process)",
    "tests/dashboard/test_dashboard_browser.py": "Chromium",
    "tests/test_packaging.py": "the built wheel and its venv (module fixture)",
    "tests/backends/test_redis_cluster.py": "two clusters of seven servers",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        default=None,
        help="write every test's setup+call+teardown seconds to PATH (JSON), for tests/_order.py",
    )


def _chunk_sizes(count: int, workers: int) -> list[int]:
    """The slice sizes xdist's worksteal scheduler cuts ``count`` tests into."""
    sizes, left = [], count
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def _unit_key(item: pytest.Item) -> str:
    """Tests with the same key stay together in one slice."""
    nodeid = item.nodeid
    for prefix in AFFINITY:
        if nodeid.startswith(prefix):
            return prefix
    info = getattr(item, "_fixtureinfo", None)
    scopes = set()
    if info is not None:
        for definitions in info.name2fixturedefs.values():
            if definitions:
                scopes.add(definitions[-1].scope)
    module, _, rest = nodeid.partition("::")
    if "class" in scopes and "::" in rest:
        return f"{module}::{rest.split('::')[0]}"
    if "module" in scopes:
        return module
    return nodeid


def _estimates(items: list[pytest.Item], known: dict[str, float]) -> list[float]:
    """Each test's seconds: its own entry, else its module's (a median), else :data:`DEFAULT`."""
    return [
        known.get(item.nodeid, known.get(item.nodeid.partition("::")[0], DEFAULT)) for item in items
    ]


def plan(items: list[pytest.Item], known: dict[str, float], workers: int) -> list[pytest.Item]:
    """``items`` reordered into ``workers`` slices of worksteal's sizes and about equal time."""
    costs = _estimates(items, known)
    units: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        units.setdefault(_unit_key(item), []).append(index)
    ordered = sorted(units.values(), key=lambda unit: -sum(costs[i] for i in unit))
    free = _chunk_sizes(len(items), workers)
    load = [0.0] * workers
    slices: list[list[list[int]]] = [[] for _ in range(workers)]
    for unit in ordered:
        fits = [w for w in range(workers) if free[w] >= len(unit)] or [
            max(range(workers), key=free.__getitem__)
        ]
        chosen = min(fits, key=lambda w: (load[w], w))
        slices[chosen].append(unit)
        free[chosen] -= len(unit)
        load[chosen] += sum(costs[i] for i in unit)
    # A unit too large for any slice's room (never seen) lands where most room
    # is; the scheduler's cut then moves some tests to the next slice: still every test.
    order: list[int] = []
    for units_of_slice in slices:  # units were placed longest first
        for unit in units_of_slice:
            order.extend(unit)
    return [items[i] for i in order]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each worker the controller's ``--dist`` (xdist sets a worker's own to ``no``)."""
    node.workerinput["leasekit_dist"] = node.config.getoption("dist", "no")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    dist = getattr(config, "workerinput", {}).get("leasekit_dist")
    if workers < 2 or dist != "worksteal" or not DURATIONS.exists():
        return
    known = json.loads(DURATIONS.read_text())
    items[:] = plan(items, known, workers)


class _Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self) -> None:
        # Each module's median, and every test of at least SLOW seconds by itself.
        by_module: dict[str, list[float]] = defaultdict(list)
        for nodeid, seconds in self.seconds.items():
            by_module[nodeid.partition("::")[0]].append(seconds)
        data = {module: statistics.median(values) for module, values in by_module.items()}
        data.update({nodeid: s for nodeid, s in self.seconds.items() if s >= SLOW})
        rounded = {key: round(value, 2) for key, value in sorted(data.items())}
        self.path.write_text(json.dumps(rounded, indent=0) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):  # the controller sees every report
        config.pluginmanager.register(_Recorder(Path(path)), "leasekit-record-durations")
