"""What ``leasekit watch`` shows: a queue's counts and rates, and a consumer's metrics.

Rates come from successive samples: a count's change per second between two
:meth:`Queue.stats` calls (net: what came in minus what went out; counts are
approximate on cloud services), and a counter's increase per second between
two scrapes of a consumer's Prometheus endpoint (``--metrics``, as served by
``leasekit.plugins.otel`` through the OpenTelemetry Prometheus exporter).

Metric names are leasekit's OpenTelemetry names (``leasekit.leases.held``...).
The exporter writes them with underscores, ``_total`` on counters and the unit
on histograms (``leasekit_lease_renewal_lateness_seconds``); both spellings are
read. The text format is parsed by ``prometheus_client`` where it is installed
(the ``otel`` extra), by a small parser here otherwise.

:class:`WatchView` keeps the last two samples and renders a frame (a rich
renderable) that fits 80 columns; the command refreshes it with ``rich.live``.
Tests render it to a string with ``Console(record=True, width=80)``.
"""

from __future__ import annotations

import http.client
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from . import errors
from .capabilities import COUNT_FIELDS
from .queue import Queue
from .redaction import redact, redact_url
from .spi import QueueStats

__all__ = [
    "Metrics",
    "MetricsSample",
    "QueueSample",
    "WatchView",
    "fetch_metrics",
    "parse_metrics",
    "sample_queue",
]

#: The metrics the view shows (OpenTelemetry names) and the label of each.
LEASES_HELD = "leasekit.leases.held"
RENEWALS = "leasekit.lease.renewals"
LATENESS = "leasekit.lease.renewal.lateness"
LOST = "leasekit.leases.lost"
DEAD_LETTERED = "leasekit.messages.dead_lettered"
DUPLICATES = "leasekit.messages.duplicates_suppressed"
CONSUMED = "messaging.client.consumed.messages"
#: Counters whose rate is shown, in order, with their labels (LEASES_HELD is a gauge).
_COUNTERS = {
    RENEWALS: "renewals",
    LOST: "leases lost",
    DEAD_LETTERED: "dead-lettered",
    DUPLICATES: "duplicates suppressed",
    CONSUMED: "messages consumed",
}
#: Seconds one scrape of the metrics endpoint may take.
SCRAPE_TIMEOUT = 5.0

_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:.]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


# ------------------------------------------------------------------ metrics


@dataclass
class Histogram:
    """One histogram, summed over its series: cumulative bucket counts by upper bound."""

    buckets: dict[float, float] = field(default_factory=dict)
    count: float = 0.0
    sum: float = 0.0

    def since(self, before: Histogram | None) -> Histogram:
        """What was observed after ``before`` (all of it without one, or after a restart)."""
        if before is None or self.count < before.count:
            return self
        return Histogram(
            {le: n - before.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.count - before.count,
            self.sum - before.sum,
        )

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile, interpolated in its bucket as Prometheus does; None if empty."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in sorted(self.buckets.items()):
            if cumulative >= rank:
                if math.isinf(le):
                    return lower  # in the open-ended bucket: its lower bound is all we know
                inside = cumulative - below
                share = (rank - below) / inside if inside > 0 else 1.0
                return lower + (le - lower) * share
            lower, below = le, cumulative
        return lower


@dataclass
class Metrics:
    """A scrape, read for the view: values by OpenTelemetry name, summed over series."""

    values: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)


def parse_metrics(text: str) -> Metrics:
    """Read the Prometheus text format; keep the metrics the view shows."""
    wanted = {name.replace(".", "_"): name for name in (LEASES_HELD, *_COUNTERS)}
    histograms = {LATENESS.replace(".", "_"): LATENESS}
    metrics = Metrics()
    for name, labels, value in _samples(text):
        name = name.replace(".", "_")
        if name.endswith("_created") or math.isnan(value):
            continue
        part = next((p for p in ("_bucket", "_count", "_sum") if name.endswith(p)), None)
        if part is not None and _base(name[: -len(part)]) in histograms:
            histogram = metrics.histograms.setdefault(
                histograms[_base(name[: -len(part)])], Histogram()
            )
            if part == "_bucket":
                le = float(labels.get("le", "+Inf"))
                histogram.buckets[le] = histogram.buckets.get(le, 0.0) + value
            elif part == "_count":
                histogram.count += value
            else:
                histogram.sum += value
            continue
        key = wanted.get(_base(name))
        if key is not None:
            metrics.values[key] = metrics.values.get(key, 0.0) + value
    return metrics


def _base(name: str) -> str:
    """A sample's name without what the exporter appends: ``_total``, then the unit."""
    for suffix in ("_total", "_seconds"):
        name = name.removesuffix(suffix)
    return name


def _samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """Every sample as (name, labels, value): prometheus_client's parser if installed."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        yield from _parse_text(text)
        return
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                yield sample.name, dict(sample.labels), float(sample.value)
    except ValueError as exc:
        raise errors.InvalidArgument(f"not the Prometheus text format: {exc}") from exc


def _parse_text(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """The Prometheus text format, enough for the view: ``name{labels} value [timestamp]``."""
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise errors.InvalidArgument(f"not the Prometheus text format (line {number})")
        labels = dict(_LABEL.findall(match.group("labels") or ""))
        try:
            value = float(match.group("value"))
        except ValueError:
            raise errors.InvalidArgument(
                f"not the Prometheus text format (line {number}: a bad value)"
            ) from None
        yield match.group("name"), labels, value


# ------------------------------------------------------------------ samples


@dataclass(frozen=True)
class QueueSample:
    """A queue's counts at one moment (monotonic seconds), or why they could not be read."""

    at: float
    stats: QueueStats | None = None
    error: str | None = None


@dataclass(frozen=True)
class MetricsSample:
    """A consumer's metrics at one moment, or why they could not be read."""

    at: float
    metrics: Metrics | None = None
    error: str | None = None


def sample_queue(queue: Queue) -> QueueSample:
    """Read the queue's counts now; a failure becomes the sample's error (shown, not raised)."""
    now = time.monotonic()
    try:
        return QueueSample(now, queue.stats())
    except errors.LeaseError as exc:
        return QueueSample(now, error=f"{type(exc).__name__}: {redact(str(exc))}")


def check_metrics_url(url: str) -> str:
    """``url`` if it can be scraped: ``http(s)://HOST[:PORT]/PATH``, no credentials.

    The error never shows the URL: a mistyped one may hold a password where
    the port should be (``http://user:secret/metrics`` reads as host ``user``,
    port ``secret``).

    Raises:
        InvalidURL: another scheme, no host, a port that is not a number, or
            a user name or password in the URL.
    """
    shown = "(the URL is not shown: it may hold a secret)"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise errors.InvalidURL(
            f"--metrics takes http(s)://HOST[:PORT]/PATH; its host or port is malformed {shown}"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise errors.InvalidURL(f"--metrics takes http(s)://HOST[:PORT]/PATH {shown}")
    if "@" in parts.netloc:
        raise errors.InvalidURL(f"--metrics: credentials in the URL are not supported {shown}")
    if port is not None and not 0 < port < 65536:
        raise errors.InvalidURL(f"--metrics: the port is out of range {shown}")
    return url


def fetch_metrics(url: str, timeout: float = SCRAPE_TIMEOUT) -> MetricsSample:
    """Scrape a Prometheus endpoint now; a failure becomes the sample's error."""
    now = time.monotonic()
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode("utf-8", "replace")
        return MetricsSample(now, parse_metrics(text))
    except urllib.error.HTTPError as exc:
        return MetricsSample(now, error=f"HTTP {exc.code} {exc.reason}")
    except urllib.error.URLError as exc:
        return MetricsSample(now, error=redact(str(exc.reason)))
    except (OSError, ValueError, http.client.HTTPException, errors.LeaseError) as exc:
        # http.client.InvalidURL quotes the URL's parts (a password as a "port"):
        # name the failure's kind, not its text.
        if isinstance(exc, http.client.InvalidURL):
            return MetricsSample(now, error="the metrics URL is malformed")
        return MetricsSample(now, error=redact(str(exc)))


# --------------------------------------------------------------------- view


class WatchView:
    """The frames of ``leasekit watch``: the last two samples, rendered to fit 80 columns.

    Parameters:
        title: what is watched (the queue's name and backend).
        counted: the counts the backend fills in (``capabilities.counted``).
        metrics_url: the consumer's metrics endpoint, if any.
        interval: seconds between samples (shown in the header).
    """

    def __init__(
        self,
        title: str,
        counted: frozenset[str],
        *,
        metrics_url: str | None = None,
        interval: float = 2.0,
    ) -> None:
        self.title = title
        self.counted = counted
        self.metrics_url = metrics_url
        self.interval = interval
        self.queue: list[QueueSample] = []
        self.metrics: list[MetricsSample] = []

    def add(self, queue: QueueSample, metrics: MetricsSample | None = None) -> None:
        """Take a new sample (the view keeps the last two of each)."""
        self.queue = [*self.queue[-1:], queue]
        if metrics is not None:
            self.metrics = [*self.metrics[-1:], metrics]

    def render(self, clock: str | None = None) -> RenderableType:
        """The current frame; ``clock`` is the time shown (now, if ``None``)."""
        shown = clock or datetime.now().strftime("%H:%M:%S")
        header = Text.assemble(
            ("leasekit watch", "bold"), f"  every {self.interval:g} s  {shown}\n"
        )
        parts: list[RenderableType] = [header, self._queue_table()]
        if self.metrics_url is not None:
            parts += [Text(""), self._metrics_table()]
        return Group(*parts)

    # ----------------------------------------------------------------- queue

    def _queue_table(self) -> RenderableType:
        if not self.queue:
            return Text("no sample yet", style="dim")
        now = self.queue[-1]
        if now.stats is None:
            return Text(f"queue: {now.error}", style="red")
        before = self.queue[0] if len(self.queue) == 2 and self.queue[0].stats else None
        table = _table(f"queue {self.title}", "messages", "change/s")
        for name in COUNT_FIELDS:
            value = getattr(now.stats, name)
            label = name.replace("_", "-")
            if name not in self.counted or value is None:
                table.add_row(label, Text("unknown", style="dim"), "")
                continue
            rate = ""
            if before is not None and before.stats is not None:
                previous = getattr(before.stats, name)
                if previous is not None and now.at > before.at:
                    rate = _signed((value - previous) / (now.at - before.at))
            table.add_row(label, f"{value:,}", rate)
        table.caption = "change/s: in minus out; cloud counts are approximate"
        return table

    # --------------------------------------------------------------- metrics

    def _metrics_table(self) -> RenderableType:
        url = redact_url(self.metrics_url or "")
        if not self.metrics:
            return Text(f"consumer {url}: no scrape yet", style="dim")
        now = self.metrics[-1]
        if now.metrics is None:
            return Text(f"consumer {url}: {now.error}", style="red")
        before = self.metrics[0].metrics if len(self.metrics) == 2 else None
        seconds = now.at - self.metrics[0].at if before is not None else 0.0
        table = _table("consumer", "now", "per second")
        values = now.metrics.values
        held = values.get(LEASES_HELD)
        table.add_row("leases held", _count(held), "")
        for name, label in _COUNTERS.items():
            value = values.get(name)
            rate = ""
            if value is not None and before is not None and seconds > 0:
                previous = before.values.get(name)
                if previous is not None and value >= previous:  # else: the consumer restarted
                    rate = f"{(value - previous) / seconds:,.1f}"
            table.add_row(label, _count(value), rate)
            if name == RENEWALS:
                for q, shown in self._lateness(now.metrics, before):
                    table.add_row(f"renewal lateness p{q}", shown, "")
        table.caption = Text(url, style="dim")
        return table

    @staticmethod
    def _lateness(now: Metrics, before: Metrics | None) -> list[tuple[int, Text | str]]:
        """p50 and p99 of renewal lateness since the last scrape (since start on the first)."""
        histogram = now.histograms.get(LATENESS)
        if histogram is None:
            return [(q, Text("not exposed", style="dim")) for q in (50, 99)]
        recent = histogram.since(None if before is None else before.histograms.get(LATENESS))
        shown: list[tuple[int, Text | str]] = []
        for q in (50, 99):
            value = recent.quantile(q / 100)
            shown.append(
                (q, Text("no renewals", style="dim") if value is None else _duration(value))
            )
        return shown


def _table(first: str, *columns: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, min_width=64, caption_justify="left")
    table.add_column(first, no_wrap=True, min_width=28, style="", header_style="bold")
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True, min_width=12)
    return table


def _count(value: float | None) -> Text | str:
    if value is None:
        return Text("not exposed", style="dim")
    return f"{value:,.0f}"


def _signed(rate: float) -> str:
    return "0" if abs(rate) < 0.05 else f"{rate:+,.1f}"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    return f"{seconds:.3g} s"
