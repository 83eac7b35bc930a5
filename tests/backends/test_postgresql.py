"""The PostgreSQL backend, against a real server the tests start (``postgres_server``).

The conformance suite covers the portable semantics (also through
``leasekit.aio``); the tests here cover what is PostgreSQL's own: URLs and
libpq parameters, the schema and its migrations, the lease-batch renewal (one
row per batch, exact fencing when a batch is split or given back), error
classification, and deadlines applied to the server and the socket.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import leasekit
from leasekit.conformance import AsyncUrlHarness, ConformanceSuite, UrlHarness
from leasekit.emulators.postgres import LocalPostgres
from leasekit.queue import Queue

# --------------------------------------------------------------- conformance


class TestPostgresqlConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, postgres_server: LocalPostgres) -> Iterator[UrlHarness]:
        harness = UrlHarness(postgres_server.url())
        yield harness
        harness.close()


class TestPostgresqlConformanceThroughAsyncio(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, postgres_server: LocalPostgres) -> Iterator[AsyncUrlHarness]:
        harness = AsyncUrlHarness(postgres_server.url())
        yield harness
        harness.close()


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def queue(postgres_server: LocalPostgres) -> Iterator[Queue]:
    q = leasekit.open(postgres_server.url(), queue=f"t-{uuid.uuid4().hex[:12]}", create=True)
    try:
        yield q
    finally:
        q.delete()
        q.close()
