"""A Prometheus ``/metrics`` endpoint for leasekit's metrics, through OpenTelemetry's exporter.

``start_prometheus_server()`` makes a :class:`~opentelemetry.sdk.metrics.MeterProvider`
whose reader is the OpenTelemetry Prometheus exporter (``PrometheusMetricReader``)
and serves it over HTTP with ``prometheus_client``; pass its ``meter_provider``
to :func:`leasekit.plugins.otel.instrument` (or set it globally). The exporter
turns names into Prometheus's: ``leasekit.leases.held`` -> ``leasekit_leases_held``,
counters get ``_total``, a histogram in seconds gets ``_seconds`` (see
``docs/observability.md``).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from leasekit.errors import InvalidArgument

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "PrometheusEndpoint", "start_prometheus_server"]

#: The OpenTelemetry defaults (``OTEL_EXPORTER_PROMETHEUS_HOST`` / ``_PORT`` override them).
DEFAULT_HOST = "localhost"
DEFAULT_PORT = 9464


@dataclass
class PrometheusEndpoint:
    """A running ``/metrics`` endpoint and the meter provider it exports.

    ``port`` is the bound port (useful with ``port=0``). :meth:`shutdown` stops
    the server and the provider; the endpoint is also a context manager.
    """

    meter_provider: Any
    host: str
    port: int
    _server: Any = field(repr=False)
    _thread: threading.Thread = field(repr=False)
    _reader: Any = field(repr=False)

    @property
    def url(self) -> str:
        """Where Prometheus scrapes: ``http://host:port/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def shutdown(self) -> None:
        """Stop serving and shut the meter provider down (its collector leaves the registry)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        self.meter_provider.shutdown()

    def __enter__(self) -> PrometheusEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def start_prometheus_server(
    port: int | None = None, host: str | None = None, *, resource: Any = None
) -> PrometheusEndpoint:
    """Serve leasekit's metrics for Prometheus on ``http://host:port/metrics``.

    Parameters
    ----------
        port: the TCP port (default ``OTEL_EXPORTER_PROMETHEUS_PORT`` or 9464; 0: any free one).
        host: the address to bind (default ``OTEL_EXPORTER_PROMETHEUS_HOST`` or
            ``localhost``; ``0.0.0.0`` to be scraped from other hosts, as in a pod).
        resource: the OpenTelemetry ``Resource`` of the provider (default: from
            the environment, e.g. ``OTEL_SERVICE_NAME``).

    Returns
    -------
        The endpoint; use ``endpoint.meter_provider`` with :func:`instrument`.

    Raises
    ------
        InvalidArgument: a port outside 0..65535.
        OSError: the port cannot be bound.
    """
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    if port is None:
        port = int(os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", DEFAULT_PORT))
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidArgument(f"port must be an int in 0..65535, got {port!r}")
    host = host or os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", DEFAULT_HOST)
    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=resource or Resource.create())
    try:
        server, thread = _serve(port, host)
    except BaseException:
        provider.shutdown()
        raise
    return PrometheusEndpoint(
        meter_provider=provider,
        host=host,
        port=server.server_port,
        _server=server,
        _thread=thread,
        _reader=reader,
    )


def _serve(port: int, host: str) -> tuple[Any, threading.Thread]:
    """prometheus_client's ``start_http_server``, with its connections bounded.

    Its threading server reads without a timeout and starts a thread per
    connection, so clients that send half a request pin a thread each; here
    at most ``MAX_CONNECTIONS`` are served at once and a stalled client is
    dropped after ``REQUEST_TIMEOUT`` (:mod:`leasekit.serving`).
    """
    import socket
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import REGISTRY, make_wsgi_app

    from leasekit.serving import REQUEST_TIMEOUT, BoundedThreadingMixIn, RequestHeadMixIn

    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(BoundedThreadingMixIn, WSGIServer):
        address_family = family

    class Handler(RequestHeadMixIn, WSGIRequestHandler):
        timeout = REQUEST_TIMEOUT

        def log_message(self, format: str, *args: Any) -> None:
            """Log nothing (as prometheus_client's own handler)."""

    server = make_server(
        str(sockaddr[0]), port, make_wsgi_app(REGISTRY), Server, handler_class=Handler
    )
    thread = threading.Thread(target=server.serve_forever, name="leasekit-prometheus", daemon=True)
    thread.start()
    return server, thread
