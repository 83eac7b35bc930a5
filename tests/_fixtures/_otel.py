"""One traced round trip through a backend, for the backends' OpenTelemetry tests.

Not a pytest plugin (its name starts with ``_``): a helper the integration
tests import. It instruments a registry of its own, sends one message under a
"request" span, lets a Consumer process it, and returns the ``send`` and
``process`` spans, for each test to check what its backend carries.
"""

from __future__ import annotations

from typing import Any

import leasekit


def send_and_process_spans(url: str) -> tuple[Any, Any]:
    """The ``send`` and ``process`` spans of one message sent to and consumed from ``url``."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from leasekit.plugins import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = leasekit.BackendRegistry()
    otel.instrument(provider, registry=registry)
    try:
        with registry.open(url, create=True) as queue:
            with provider.get_tracer("test").start_as_current_span("request"):
                queue.send(b"traced")
            stats = leasekit.Consumer(queue, lambda m: None, handle_signals=False).run(
                until_idle=True
            )
            assert stats.completed == 1
    finally:
        otel.uninstrument(registry)
        provider.shutdown()
    spans = {s.name.split()[0]: s for s in exporter.get_finished_spans()}
    return spans["send"], spans["process"]
