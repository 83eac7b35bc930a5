"""The conformance suite against the built-in backends: memory (plain and rotating), SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from leasekit.conformance import AsyncUrlHarness, ConformanceSuite, UrlHarness


class TestMemoryConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls) -> Iterator[UrlHarness]:
        harness = UrlHarness("memory")
        yield harness
        harness.close()


class TestMemoryRotatingReceiptsConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls) -> Iterator[UrlHarness]:
        harness = UrlHarness("memory", rotate_receipts=True)
        yield harness
        harness.close()


class TestSqliteConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UrlHarness]:
        path: Path = tmp_path_factory.mktemp("sqlite") / "conformance.db"
        harness = UrlHarness(f"sqlite:///{path}")
        yield harness
        harness.close()


# ---------------------------------------------- the same suite through leasekit.aio


class TestMemoryConformanceThroughAsyncio(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls) -> Iterator[AsyncUrlHarness]:
        harness = AsyncUrlHarness("memory")
        yield harness
        harness.close()


class TestSqliteConformanceThroughAsyncio(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsyncUrlHarness]:
        path: Path = tmp_path_factory.mktemp("sqlite-aio") / "conformance.db"
        harness = AsyncUrlHarness(f"sqlite:///{path}")
        yield harness
        harness.close()
