"""OpenTelemetry traces and metrics for leasekit (``pip install 'leasekit[otel]'``).

Two ways to turn it on::

    # 1. Configure the OpenTelemetry SDK before the first leasekit.open(): the
    #    plugin (entry point ``leasekit.plugins``: ``otel``) then instruments by itself.
    trace.set_tracer_provider(TracerProvider(...))
    queue = leasekit.open("sqlite:///jobs.db?queue=jobs")

    # 2. Or one call, with providers of your own (or the global ones):
    leasekit.plugins.otel.instrument(tracer_provider=tp, meter_provider=mp)

Spans follow the OpenTelemetry messaging conventions: PRODUCER ``send {queue}``,
CLIENT ``receive {queue}`` (a link per message), CONSUMER ``process {queue}``
around each Consumer handler call (child of the producer's span, across
processes: the trace context travels in the message's properties), CLIENT
``complete`` / ``abandon`` / ``dead_letter`` / ``renew {queue}``. Metrics: see
:mod:`leasekit.plugins.otel.conventions`; a Prometheus endpoint:
:func:`start_prometheus_server`. The whole story: ``docs/observability.md``.

Installed without OpenTelemetry, or with it but not configured, the entry point
registers no hook: core then skips every event this plugin would read. Set
``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=leasekit`` to keep it off even when the
SDK is configured. Importing this module imports no OpenTelemetry package.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from leasekit.registry import BackendRegistry, default_registry

from .conventions import MESSAGING_SYSTEMS, messaging_system

if TYPE_CHECKING:
    from .instrumentation import OtelInstrumentation
    from .prometheus import PrometheusEndpoint

__all__ = [
    "MESSAGING_SYSTEMS",
    "PLUGIN_NAME",
    "instrument",
    "messaging_system",
    "start_prometheus_server",
    "uninstrument",
]

#: The plugin's name in a registry's plugin manager (the entry point's name too).
PLUGIN_NAME = "otel"
#: The name ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` knows this instrumentation by.
INSTRUMENTATION_NAME = "leasekit"


class _Off:
    """What the entry point registers when OpenTelemetry is absent or not configured: no hooks."""

    def __repr__(self) -> str:
        return "<leasekit otel plugin: off (OpenTelemetry not configured)>"


def instrument(
    tracer_provider: Any = None,
    meter_provider: Any = None,
    *,
    registry: BackendRegistry | None = None,
    tracing: bool = True,
    metrics: bool = True,
    propagate: bool = True,
    parent_from_message: bool = True,
    renewal_spans: bool = True,
) -> OtelInstrumentation:
    """Turn leasekit's spans and metrics on; replaces an earlier one (or the automatic one).

    Parameters
    ----------
        tracer_provider: where spans go; the global provider if ``None``.
        meter_provider: where metrics go; the global provider if ``None``.
        registry: whose queues to instrument (default: the process-wide one that
            :func:`leasekit.open` uses); queues already open are covered too.
        tracing: make spans (``False``: metrics only, and no trace context on messages).
        metrics: record metrics (``False``: spans only).
        propagate: add the trace context (W3C ``traceparent``) to sent messages'
            properties, where the backend carries properties and it fits.
        parent_from_message: a process span continues the producer's trace
            (``False``: it only links to it, under the ambient context).
        renewal_spans: a span per renewal call (the renewal metrics are kept either way).

    Returns
    -------
        The registered plugin (pass it to nothing; :func:`uninstrument` removes it).
    """
    from .instrumentation import OtelInstrumentation

    plugin = OtelInstrumentation(
        tracer_provider,
        meter_provider,
        tracing=tracing,
        metrics_enabled=metrics,
        propagate=propagate,
        parent_from_message=parent_from_message,
        renewal_spans=renewal_spans,
    )
    target = registry or default_registry()
    uninstrument(target)
    target.register_plugin(plugin, name=PLUGIN_NAME)
    return plugin


def uninstrument(registry: BackendRegistry | None = None) -> None:
    """Stop making leasekit telemetry (unregister the plugin from ``registry``)."""
    manager = (registry or default_registry()).plugin_manager
    if manager.get_plugin(PLUGIN_NAME) is not None:
        manager.unregister(name=PLUGIN_NAME)


def start_prometheus_server(
    port: int | None = None, host: str | None = None, *, resource: Any = None
) -> PrometheusEndpoint:
    """Serve metrics for Prometheus (see :mod:`leasekit.plugins.otel.prometheus`)."""
    from .prometheus import start_prometheus_server as start

    return start(port, host, resource=resource)


def _disabled_by_environment() -> bool:
    names = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    return INSTRUMENTATION_NAME in {name.strip() for name in names.split(",")}


def _automatic() -> object:
    """The entry point's plugin: instrumentation if OpenTelemetry is configured now, else no hooks.

    "Configured" means a real tracer or meter provider is set globally (the SDK,
    or a vendor's). An application that has not imported OpenTelemetry has
    configured nothing, so nothing is imported to find out.
    """
    if _disabled_by_environment():
        return _Off()
    if "opentelemetry.trace" not in sys.modules and "opentelemetry.metrics" not in sys.modules:
        return _Off()
    try:
        from .instrumentation import OtelInstrumentation, global_providers_configured
    except ImportError:  # the API without leasekit[otel]'s other parts
        return _Off()
    tracing, metering = global_providers_configured()
    if not (tracing or metering):
        return _Off()
    return OtelInstrumentation(tracing=tracing, metrics_enabled=metering)


def __getattr__(name: str) -> object:
    # ``autoinstrument`` is decided when the entry point is loaded (the first
    # leasekit.open() of a registry), not when this module is imported.
    if name == "autoinstrument":
        return _automatic()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
