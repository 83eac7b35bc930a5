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

``AsyncUrlHarness`` runs the same suite through ``leasekit.aio`` (and
``--leasekit-async`` does on the command line): the same matrix, either way.
"""

from __future__ import annotations

from .async_harness import AsyncUrlHarness
from .checkpoint_suite import CheckpointSuite
from .harness import CountingDriver, Harness, UrlHarness
from .ordered import OrderedSuite
from .suite import ConformanceSuite, conformance_property

__all__ = [
    "AsyncUrlHarness",
    "CheckpointSuite",
    "ConformanceSuite",
    "CountingDriver",
    "Harness",
    "OrderedSuite",
    "UrlHarness",
    "conformance_property",
]
