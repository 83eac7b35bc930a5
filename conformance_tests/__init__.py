"""leasekit's conformance suite, shipped in the wheel as a pytest plugin.

Run it against any installed backend::

    pytest --pyargs leasekit.conformance --leasekit-backend "sqlite:///c.db"

or build it into a backend's own tests::

    from leasekit.conformance import ConformanceSuite, UrlHarness

    class TestMine(ConformanceSuite):
        @pytest.fixture(scope="class")
        @classmethod
        def harness(cls):
            harness = UrlHarness("mine", endpoint=...)
            yield harness
            harness.close()
"""

from __future__ import annotations

from .harness import CountingDriver, Harness, UrlHarness
from .suite import ConformanceSuite, conformance_property

__all__ = ["ConformanceSuite", "CountingDriver", "Harness", "UrlHarness", "conformance_property"]
