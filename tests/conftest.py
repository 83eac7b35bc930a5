"""Project-wide test configuration.

Server fixtures (Azurite, moto, the MNS and Service Bus emulators) live one per
module in ``tests/_fixtures/`` and are loaded here as pytest plugins, so every
test folder can ask for them. Each is session-scoped and lazy: a server starts
only when a test that needs it runs, on a free loopback port, and stops at the
end of the session.
"""

import gc
import os
from pathlib import Path

import pytest

from leasekit.emulators._process import PORTS_ENV

#: Ports for test servers: below the kernel's ephemeral ports (32768 up here), a
#: range of its own for each parallel worker.
TEST_PORTS = (20000, 32000)
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and PORTS_ENV not in os.environ:
    _count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    _span = (TEST_PORTS[1] - TEST_PORTS[0]) // _count
    _first = TEST_PORTS[0] + int(_worker[2:]) * _span
    os.environ[PORTS_ENV] = f"{_first}-{_first + _span - 1}"

#: gRPC (grpcio 1.81 and later, grpc/grpc#43055) restarts its poller thread in a
#: forked child, which aborts (code -6) on the epoll descriptor that
#: ``subprocess``'s ``close_fds`` closes before ``exec``. leasekit's own launcher
#: does not fork (``launch_argv``), but code it runs beside Pub/Sub's live channels
#: does: PySpark starts its JVM with a ``preexec_fn``, a PostgreSQL test forks.
#: gRPC's documented switch turns its fork handlers off (read when grpc loads).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

pytest_plugins = [
    *sorted(
        f"_fixtures.{path.stem}" for path in (Path(__file__).parent / "_fixtures").glob("[!_]*.py")
    ),
    "_order",  # the order a parallel run takes the tests in (see tests/_order.py)
]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collection made to the collector's permanent generation (in each worker).

    After collection a worker tracks about 296,000 objects (modules, test items,
    Hypothesis strategies), and every full collection walked them all: 150-650 ms
    with the GIL held, longer for a worker starved of CPU beside eleven others. Tests
    that keep sub-second leases lost them in those pauses. Frozen, they are never
    walked again (a full collection then took under 1 ms); objects made by tests
    are collected as usual.
    """
    gc.collect()
    gc.freeze()
