"""The packaged suite, run by ``pytest --pyargs leasekit.conformance --leasekit-backend URL``."""

from __future__ import annotations

import pytest

from leasekit.conformance import ConformanceSuite, UrlHarness


class TestConformance(ConformanceSuite):
    """The whole suite against ``--leasekit-backend``."""

    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, leasekit_harness: UrlHarness) -> UrlHarness:
        """The URL harness from the command line."""
        return leasekit_harness
