"""``leasekit watch``: a queue's counts and rates, a consumer's metrics, rendered to a string.

Frames are rendered with ``Console(record=True, width=80)``; the consumer's
metrics come from a small HTTP server in the test serving a Prometheus
exposition shaped like the OpenTelemetry exporter's, whose counters grow
between scrapes.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import leasekit
from leasekit.cli import app
from leasekit.spi import QueueStats
from leasekit.watch import (
    CONSUMED,
    LATENESS,
    LEASES_HELD,
    RENEWALS,
    Histogram,
    MetricsSample,
    QueueSample,
    WatchView,
    fetch_metrics,
    parse_metrics,
)

runner = CliRunner()

#: What the OpenTelemetry Prometheus exporter writes: underscores, ``_total`` on
#: counters, the unit on histograms, a series per queue, target_info.
OTEL_EXPOSITION = """\
# HELP target_info Target metadata
# TYPE target_info gauge
target_info{service_name="worker",telemetry_sdk_language="python"} 1.0
# HELP leasekit_leases_held Leases the keeper holds
# TYPE leasekit_leases_held gauge
leasekit_leases_held{messaging_destination_name="jobs"} 30.0
leasekit_leases_held{messaging_destination_name="mail"} 10.0
# HELP leasekit_lease_renewals_total Lease renewals
# TYPE leasekit_lease_renewals_total counter
leasekit_lease_renewals_total{messaging_destination_name="jobs"} {renewals}
# HELP leasekit_lease_renewal_lateness_seconds Renewal lateness
# TYPE leasekit_lease_renewal_lateness_seconds histogram
leasekit_lease_renewal_lateness_seconds_bucket{le="0.005"} {fast}
leasekit_lease_renewal_lateness_seconds_bucket{le="0.01"} {renewals}
leasekit_lease_renewal_lateness_seconds_bucket{le="+Inf"} {renewals}
leasekit_lease_renewal_lateness_seconds_count {renewals}
leasekit_lease_renewal_lateness_seconds_sum 0.5
# TYPE leasekit_leases_lost_total counter
leasekit_leases_lost_total 2.0
# TYPE messaging_client_consumed_messages_total counter
messaging_client_consumed_messages_total{messaging_system="sqlite"} {consumed}
"""

#: The same metrics as an exporter that keeps the names as they are (no suffixes).
PLAIN_EXPOSITION = """\
leasekit_leases_held 40
leasekit_lease_renewals 1000
leasekit_lease_renewal_lateness_bucket{le="0.005"} 900
leasekit_lease_renewal_lateness_bucket{le="0.01"} 1000
leasekit_lease_renewal_lateness_bucket{le="+Inf"} 1000
leasekit_lease_renewal_lateness_count 1000
leasekit_lease_renewal_lateness_sum 0.5
leasekit_leases_lost 2
messaging_client_consumed_messages 5000
"""


def _exposition(scrape: int) -> str:
    """The OpenTelemetry-style exposition at the ``scrape``-th scrape.

    Each scrape shows 100 more renewals, half of them late by up to 5 ms and
    half by 5-10 ms, and 50 more messages consumed.
    """
    renewals = 1000 + 100 * scrape
    values = {"renewals": renewals, "fast": 900 + 50 * scrape, "consumed": 5000 + 50 * scrape}
    text = OTEL_EXPOSITION
    for key, value in values.items():
        text = text.replace("{" + key + "}", f"{value}.0")
    return text


@pytest.fixture(params=["prometheus_client", "own parser"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with prometheus_client's parser (if installed) and with the fallback."""
    if request.param == "prometheus_client":
        pytest.importorskip("prometheus_client.parser")
    else:
        monkeypatch.setitem(sys.modules, "prometheus_client.parser", None)
    return str(request.param)


@pytest.fixture
def metrics_server() -> Iterator[str]:
    """A consumer's metrics endpoint: each scrape shows 100 more renewals than the last."""
    scrapes = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = _exposition(scrapes["n"]).encode()
            scrapes["n"] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def _text(view: WatchView) -> str:
    console = Console(record=True, width=80, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(view.render(clock="12:00:00"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    return text


def _row(text: str, label: str) -> list[str]:
    """The cells of the row starting with ``label`` (split on runs of 2+ spaces)."""
    [line] = [line for line in text.splitlines() if line.strip().startswith(label)]
    return re.split(r"\s{2,}", line.strip())


# ------------------------------------------------------------------ parsing


@pytest.mark.usefixtures("parser")
@pytest.mark.parametrize("text", [_exposition(0), PLAIN_EXPOSITION], ids=["otel", "plain"])
def test_metrics_are_read_under_either_naming(text: str) -> None:
    metrics = parse_metrics(text)
    assert metrics.values[LEASES_HELD] == 40  # summed over the queues' series
    assert metrics.values[RENEWALS] == 1000
    assert metrics.values[CONSUMED] == 5000
    lateness = metrics.histograms[LATENESS]
    assert lateness.count == 1000 and lateness.sum == 0.5
    assert lateness.buckets == {0.005: 900, 0.01: 1000, float("inf"): 1000}


def test_the_fallback_parser_refuses_what_is_not_the_text_format(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client.parser", None)
    with pytest.raises(leasekit.InvalidArgument, match="line 1"):
        parse_metrics("<html>not metrics</html>")


def test_histogram_quantiles_interpolate_within_a_bucket() -> None:
    histogram = Histogram({0.01: 50, 0.02: 100, float("inf"): 100}, count=100, sum=1.2)
    assert histogram.quantile(0.5) == pytest.approx(0.01)
    assert histogram.quantile(0.75) == pytest.approx(0.015)
    assert Histogram().quantile(0.5) is None
    later = Histogram({0.01: 50, 0.02: 200, float("inf"): 200}, count=200, sum=3.0)
    assert later.since(histogram).quantile(0.5) == pytest.approx(0.015)  # the last 100 only


# -------------------------------------------------------------------- frames


def test_a_frame_shows_counts_their_rates_and_what_is_unknown() -> None:
    view = WatchView("jobs (aws-sqs)", frozenset({"visible", "leased", "delayed", "total"}))
    view.add(QueueSample(100.0, QueueStats(visible=1000, leased=40, delayed=0, total=1040)))
    first = _text(view)
    assert _row(first, "visible") == ["visible", "1,000"]  # no rate from one sample
    view.add(QueueSample(102.0, QueueStats(visible=1100, leased=30, delayed=0, total=1130)))
    text = _text(view)
    assert _row(text, "visible") == ["visible", "1,100", "+50.0"]
    assert _row(text, "leased") == ["leased", "30", "-5.0"]
    assert _row(text, "delayed") == ["delayed", "0", "0"]
    assert _row(text, "dead-lettered") == ["dead-lettered", "unknown"]
    assert "queue jobs (aws-sqs)" in text and "in minus out" in text


def test_a_frame_shows_a_consumers_leases_renewals_and_lateness() -> None:
    view = WatchView("jobs (sqlite)", frozenset(), metrics_url="http://h:9464/metrics")
    view.add(QueueSample(0.0, QueueStats()), MetricsSample(0.0, parse_metrics(_exposition(0))))
    view.add(QueueSample(2.0, QueueStats()), MetricsSample(2.0, parse_metrics(_exposition(1))))
    text = _text(view)
    assert _row(text, "leases held") == ["leases held", "40"]
    assert _row(text, "renewals") == ["renewals", "1,100", "50.0"]
    assert _row(text, "messages consumed") == ["messages consumed", "5,050", "25.0"]
    assert _row(text, "leases lost") == ["leases lost", "2", "0.0"]
    # Of the last 100 renewals, half were late by up to 5 ms, half by 5-10 ms.
    assert _row(text, "renewal lateness p50") == ["renewal lateness p50", "5 ms"]
    assert _row(text, "renewal lateness p99") == ["renewal lateness p99", "9.9 ms"]
    assert _row(text, "duplicates suppressed") == ["duplicates suppressed", "not exposed"]


def test_a_frame_says_why_a_sample_is_missing() -> None:
    view = WatchView("jobs (sqlite)", frozenset(), metrics_url="http://h:1/metrics")
    view.add(
        QueueSample(0.0, error="BackendUnavailable: no route"),
        MetricsSample(0.0, error="Connection refused"),
    )
    text = _text(view)
    assert "queue: BackendUnavailable: no route" in text
    assert "consumer http://h:1/metrics: Connection refused" in text


# ----------------------------------------------------------------- end to end


@pytest.mark.usefixtures("parser")
def test_fetch_metrics_scrapes_the_endpoint(metrics_server: str) -> None:
    sample = fetch_metrics(metrics_server)
    assert sample.metrics is not None and sample.metrics.values[RENEWALS] == 1000
    missing = fetch_metrics(metrics_server.replace("/metrics", "/nothing"))
    assert missing.metrics is None and "404" in (missing.error or "")


def test_watch_once_prints_a_frame_of_a_real_queue_and_a_consumers_metrics(
    tmp_path: Path, metrics_server: str
) -> None:
    url = f"sqlite:///{tmp_path}/watch.db?queue=jobs"
    with leasekit.open(url, create=True) as queue:
        queue.send_many([b"x"] * 5)
        queue.lease(2, duration=60)
    args = ["watch", url, "--metrics", metrics_server, "--once", "--interval", "0.2"]
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert _row(result.output, "visible")[:2] == ["visible", "3"]
    assert _row(result.output, "leased")[:2] == ["leased", "2"]
    assert _row(result.output, "total")[:2] == ["total", "5"]
    renewals = _row(result.output, "renewals")
    assert renewals[1] == "1,100" and float(renewals[2]) > 0
    assert _row(result.output, "leases held")[1] == "40"


def test_watch_once_of_an_unreachable_queue_says_why_and_exits_1(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/none.db?queue=missing"
    result = runner.invoke(app, ["watch", url, "--once", "--interval", "0.1"])
    assert result.exit_code == 1 and "QueueNotFound" in result.output
    bad = runner.invoke(app, ["watch", url, "--interval", "0"])
    assert bad.exit_code == 2


def test_watch_reads_the_otel_plugins_real_prometheus_endpoint() -> None:
    """Not a sample: the otel plugin's metrics, served by the OpenTelemetry exporter."""
    otel = pytest.importorskip("leasekit.plugins.otel")
    endpoint = otel.start_prometheus_server(port=0, host="127.0.0.1")
    registry = leasekit.BackendRegistry()
    name = f"watch-{uuid.uuid4().hex[:6]}"
    try:
        otel.instrument(meter_provider=endpoint.meter_provider, registry=registry)
        queue = registry.open("memory", queue=name, create=True)
        queue.send_many([b"a", b"b", b"c"])
        # 2 s, renewed at half-time, completed while kept (see test_otel's scrape test).
        [lease] = queue.lease(1, duration=2.0)
        [held] = queue.lease(1, duration=30)
        with leasekit.LeaseKeeper(renew_at=0.5) as keeper:
            keeper.add(lease)
            deadline = time.monotonic() + 10
            while keeper.stats.renewed < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            lease.complete()
        scraped = fetch_metrics(endpoint.url).metrics
        args = ["watch", f"memory://{name}", "--metrics", endpoint.url, "--once"]
        result = runner.invoke(app, [*args, "--interval", "0.1"], env={"COLUMNS": "80"})
    finally:
        otel.uninstrument(registry)
        endpoint.shutdown()
    assert result.exit_code == 0, result.output
    assert _row(result.output, "visible")[:2] == ["visible", "1"]
    assert _row(result.output, "leases held") == ["leases held", "1"]  # `held`
    assert int(_row(result.output, "renewals")[1]) >= 1
    assert _row(result.output, "messages consumed")[:2] == ["messages consumed", "2"]
    assert scraped is not None and scraped.histograms[LATENESS].count >= 1
    # The frame's lateness covers the renewals between its two scrapes: none here.
    assert _row(result.output, "renewal lateness p99") == ["renewal lateness p99", "no renewals"]
    held.complete()
