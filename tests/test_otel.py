"""leasekit.plugins.otel: spans, links and trace context across processes, metrics, Prometheus.

Spans and metrics are read back from the OpenTelemetry SDK's in-memory span
exporter and metric reader. The cross-process test sends in this process and
consumes in a child process that configures the SDK itself (the entry point
then instruments on its own) and prints its spans as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import leasekit
import leasekit.aio
from leasekit.events import Events
from leasekit.plugins import otel
from leasekit.spi import OutgoingMessage

ROOT = Path(__file__).resolve().parent.parent


def _span_dict(span: ReadableSpan) -> dict[str, Any]:
    """What the assertions read of a span (the child process prints the same shape)."""
    assert span.context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace": f"{span.context.trace_id:032x}",
        "id": f"{span.context.span_id:016x}",
        "parent": f"{span.parent.span_id:016x}" if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "status": span.status.status_code.name,
    }


class Telemetry:
    """An SDK tracer and meter provider with in-memory exporters, instrumenting one registry."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.registry = leasekit.BackendRegistry()
        self.plugin = otel.instrument(
            self.tracer_provider, self.meter_provider, registry=self.registry
        )
        self.tracer = self.tracer_provider.get_tracer("test")

    def spans(self, prefix: str = "") -> list[dict[str, Any]]:
        return [
            _span_dict(s) for s in self.exporter.get_finished_spans() if s.name.startswith(prefix)
        ]

    def metrics(self) -> dict[str, list[Any]]:
        """Metric name -> its data points."""
        found: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def total(self, name: str, **attributes: Any) -> float:
        """Sum (or histogram count) of ``name`` over points with ``attributes`` among theirs."""
        total = 0.0
        for point in self.metrics().get(name, []):
            if all(point.attributes.get(k) == v for k, v in attributes.items()):
                total += point.count if hasattr(point, "count") else point.value
        return total

    def close(self) -> None:
        otel.uninstrument(self.registry)
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry()
    try:
        yield t
    finally:
        t.close()


def _memory(t: Telemetry, name: str = "") -> leasekit.Queue:
    return t.registry.open("memory", queue=name or f"otel-{uuid.uuid4().hex[:8]}", create=True)


def _consume(queue: leasekit.Queue, handler: Any = None, **options: Any) -> leasekit.ConsumerStats:
    consumer = leasekit.Consumer(
        queue, handler or (lambda m: None), handle_signals=False, **options
    )
    return consumer.run(until_idle=True)


# ----------------------------------------------------------- core's send hook


class _Adds:
    """A plugin that adds properties to every message sent (as a tracer adds traceparent)."""

    def __init__(self, extra: dict[str, Any]) -> None:
        self.extra = extra
        self.seen: list[tuple[str, Any]] = []

    @leasekit.hookimpl
    def leasekit_before_send(self, messages: list[OutgoingMessage], properties: dict) -> None:
        properties.update(self.extra)

    @leasekit.hookimpl
    def leasekit_after_send(self, messages: list[OutgoingMessage], results: list, error: Any):
        self.seen.append(([dict(m.properties) for m in messages], (list(results), error)))


def test_before_send_properties_are_added_without_touching_the_callers_mapping() -> None:
    registry = leasekit.BackendRegistry()
    plugin = _Adds({"traceparent": "from-plugin", "added": "yes", "": "no name", "bad": 3})
    registry.register_plugin(plugin)
    queue = registry.open("memory", queue=f"props-{uuid.uuid4().hex[:6]}", create=True)
    mine = {"traceparent": "mine", "k": "v"}
    queue.send(b"a", properties=mine)
    queue.send_many([b"b", b"c"])
    assert mine == {"traceparent": "mine", "k": "v"}  # the caller's dict is never changed
    got = {lease.message.body: lease.message.properties for lease in queue.lease(3)}
    assert got[b"a"] == {"traceparent": "mine", "k": "v", "added": "yes"}  # the caller's win
    assert got[b"b"] == got[b"c"] == {"traceparent": "from-plugin", "added": "yes"}
    # after_send sees each message as sent, and each one's id
    (sent, (results, error)), _ = plugin.seen
    assert sent == [{"traceparent": "mine", "k": "v", "added": "yes"}] and error is None
    assert isinstance(results[0], str)


def test_without_a_send_observer_core_builds_no_event(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = leasekit.BackendRegistry(load_entrypoints=False)
    registry.register(leasekit.BackendSpec("memory", "leasekit.backends.memory:MemoryDriver"))
    queue = registry.open("memory", queue=f"quiet-{uuid.uuid4().hex[:6]}", create=True)

    emit = Events.emit

    def refuse_sends(self: Events, hook: str, **kwargs: Any) -> None:
        if "_send" in hook:
            raise AssertionError("no plugin observes sends: nothing should be built")
        emit(self, hook, **kwargs)

    monkeypatch.setattr(Events, "emit", refuse_sends)
    queue.send(b"x")
    queue.send_many([b"y"])
    assert len(queue.lease(2)) == 2


# ------------------------------------------------------------------ one process


def test_send_receive_process_settle_spans_on_memory(telemetry: Telemetry) -> None:
    queue = _memory(telemetry, "orders")
    with telemetry.tracer.start_as_current_span("request") as request:
        message_id = queue.send(b"one")
        queue.send_many([b"two", b"three"])
    stats = _consume(queue)
    assert stats.completed == 3

    request_id = f"{request.get_span_context().span_id:016x}"
    sends = telemetry.spans("send ")
    assert [s["name"] for s in sends] == ["send orders", "send orders"]
    assert all(s["kind"] == "PRODUCER" and s["parent"] == request_id for s in sends)
    single, batch = sends
    assert single["attributes"] == {
        "messaging.system": "memory",
        "messaging.destination.name": "orders",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.message.body.size": 3,
        "messaging.message.id": message_id,
    }
    assert batch["attributes"]["messaging.batch.message_count"] == 2
    assert "messaging.message.id" not in batch["attributes"]

    receives = [
        s for s in telemetry.spans("receive ") if s["attributes"]["messaging.batch.message_count"]
    ]
    assert len(receives) == 1 and receives[0]["kind"] == "CLIENT"
    assert receives[0]["attributes"]["messaging.batch.message_count"] == 3
    # a link per message to its creation context (the send span that carried it)
    assert sorted(receives[0]["links"]) == sorted([single["id"], batch["id"], batch["id"]])

    processes = telemetry.spans("process ")
    assert len(processes) == 3 and {p["kind"] for p in processes} == {"CONSUMER"}
    by_id = {p["attributes"]["messaging.message.id"]: p for p in processes}
    first = by_id[message_id]
    assert first["parent"] == single["id"] and first["trace"] == single["trace"]
    assert first["links"] == [single["id"]]
    assert first["attributes"]["leasekit.message.delivery_count"] == 1
    assert first["attributes"]["messaging.operation.type"] == "process"

    completes = telemetry.spans("complete ")
    assert len(completes) >= 1
    assert all(c["kind"] == "CLIENT" for c in completes)
    assert all(c["attributes"]["messaging.operation.type"] == "settle" for c in completes)
    # a worker settles handled messages after their process spans, often in one batch:
    # each settle span links to the traces of the messages it settled
    linked = sorted(link for c in completes for link in c["links"])
    assert linked == sorted([single["id"], batch["id"], batch["id"]])


def test_a_failing_handler_gives_an_error_process_span_and_an_abandon_span(
    telemetry: Telemetry,
) -> None:
    queue = _memory(telemetry)
    queue.send(b"boom")

    def handler(message: leasekit.Message) -> None:
        raise ValueError("bad payload")

    consumer = leasekit.Consumer(queue, handler, handle_signals=False, backoff_base=30)
    runner = threading.Thread(target=consumer.run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 10
    while consumer.stats.abandoned < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    consumer.stop()
    runner.join(10)
    [send] = telemetry.spans("send ")
    [process] = telemetry.spans("process ")
    assert process["status"] == "ERROR"
    assert process["attributes"]["error.type"] == "ValueError"
    assert process["parent"] == send["id"]
    [abandon] = telemetry.spans("abandon ")
    # the give-back happens after the handler's span ended: linked to the message's trace
    assert abandon["links"] == [send["id"]]
    assert abandon["attributes"]["messaging.operation.type"] == "settle"
    assert telemetry.total("messaging.process.duration", **{"error.type": "ValueError"}) == 1


def test_a_failed_send_names_its_error_type(telemetry: Telemetry) -> None:
    queue = telemetry.registry.open("memory", queue=f"missing-{uuid.uuid4().hex[:6]}")
    with pytest.raises(leasekit.QueueNotFound):
        queue.send(b"x")
    [send] = telemetry.spans("send ")
    assert send["status"] == "ERROR"
    assert send["attributes"]["error.type"] == "leasekit.errors.QueueNotFound"
    assert (
        telemetry.total(
            "messaging.client.sent.messages", **{"error.type": "leasekit.errors.QueueNotFound"}
        )
        == 1
    )


def test_renew_spans_carry_the_new_expiry_and_keeper_lateness_reaches_the_metric(
    telemetry: Telemetry,
) -> None:
    queue = _memory(telemetry)
    queue.send(b"slow")
    [lease] = queue.lease(1, duration=30)
    lease.renew(0.5)
    [renew] = telemetry.spans("renew ")
    assert renew["kind"] == "CLIENT"
    assert renew["attributes"]["leasekit.lease.expires_at"] == lease.expires_at.isoformat()
    assert renew["attributes"]["leasekit.lease.duration"] == 0.5
    assert renew["attributes"]["messaging.message.id"] == lease.message.id
    assert telemetry.total("leasekit.lease.renewal.lateness") == 0  # not a keeper's renewal

    with leasekit.LeaseKeeper() as keeper:
        keeper.add(lease)
        deadline = time.monotonic() + 10
        while keeper.stats.renewed < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert keeper.stats.renewed >= 2
    assert telemetry.total("leasekit.lease.renewal.lateness") >= 2
    assert telemetry.total("leasekit.lease.renewals") >= 3
    lease.complete()


class _Renewals:
    def __init__(self) -> None:
        self.lateness: list[float | None] = []

    @leasekit.hookimpl
    def leasekit_lease_renewed(self, lateness: float | None) -> None:
        self.lateness.append(lateness)


def test_the_keeper_passes_each_renewals_lateness_with_the_renewed_event() -> None:
    registry = leasekit.BackendRegistry()
    recorder = _Renewals()
    registry.register_plugin(recorder)
    queue = registry.open("memory", queue=f"late-{uuid.uuid4().hex[:6]}", create=True)
    queue.send(b"x")
    [lease] = queue.lease(1, duration=10)
    lease.renew(0.3)
    with leasekit.LeaseKeeper() as keeper:
        keeper.add(lease)
        deadline = time.monotonic() + 10
        while len(recorder.lateness) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert recorder.lateness[0] is None  # lease.renew(): nobody planned it
    assert all(isinstance(x, float) and x >= 0 for x in recorder.lateness[1:])


def test_lease_metrics_held_lost_dead_lettered_duplicates(telemetry: Telemetry) -> None:
    queue = _memory(telemetry)
    system = {"messaging.system": "memory", "messaging.destination.name": queue.name}
    # a lease found lost: leased again by someone else, then completed late
    queue.send(b"lost")
    [stale] = queue.lease(1, duration=0.05)
    time.sleep(0.1)
    [fresh] = queue.lease(1, duration=30)
    with pytest.raises(leasekit.LeaseLost):
        stale.complete()
    fresh.complete()
    assert telemetry.total("leasekit.leases.lost", **system) == 1
    # a duplicate (idempotency store) and a poison message (dead-lettered)
    queue.send(b"poison")
    [poison] = queue.lease(1, duration=0.01)
    time.sleep(0.05)
    assert poison.expire() is not None  # found lost by its holder: delivered again next
    store = leasekit.MemoryIdempotencyStore()
    store.record(queue.send(b"seen"))
    stats = _consume(queue, idempotency=store, max_deliveries=1)
    assert stats.duplicates_skipped == 1 and stats.dead_lettered == 1
    assert poison.message.body == b"poison"
    assert telemetry.total("leasekit.messages.duplicates_suppressed", **system) == 1
    assert telemetry.total("leasekit.messages.dead_lettered", **system) == 1
    assert telemetry.total("leasekit.leases.lost", **system) == 2
    assert telemetry.total("leasekit.leases.held", **system) == 0  # all settled or lost
    assert telemetry.total("messaging.client.sent.messages", **system) == 3
    assert telemetry.total("messaging.client.consumed.messages", **system) == 5
    assert (
        telemetry.total(
            "messaging.client.operation.duration", **{"messaging.operation.name": "dead_letter"}
        )
        == 1
    )
    [dead] = telemetry.spans("dead_letter ")
    assert dead["attributes"]["messaging.operation.type"] == "settle"
    # neither message reached a handler: a process span covers a handler call only
    assert telemetry.spans("process ") == []


# --------------------------------------------------------------------- asyncio


def test_async_consumer_handler_runs_inside_its_process_span(telemetry: Telemetry) -> None:
    async def main() -> list[str]:
        queue = leasekit.aio.AsyncQueue(_memory(telemetry))
        inner: list[str] = []
        with telemetry.tracer.start_as_current_span("request"):
            await queue.send(b"async")

        async def handler(message: leasekit.Message) -> None:
            with telemetry.tracer.start_as_current_span("handler work") as work:
                inner.append(f"{work.get_span_context().span_id:016x}")

        consumer = leasekit.aio.AsyncConsumer(queue, handler, handle_signals=False)
        await consumer.run(until_idle=True)
        await queue.close()
        return inner

    [work_id] = asyncio.run(main())
    [request] = telemetry.spans("request")
    [send] = telemetry.spans("send ")
    [process] = telemetry.spans("process ")
    [work] = telemetry.spans("handler work")
    assert send["parent"] == request["id"]  # the caller's context reached the pool thread
    assert process["parent"] == send["id"] and work["parent"] == process["id"]
    assert work["id"] == work_id
    completes = telemetry.spans("complete ")
    assert completes and all(c["links"] == [send["id"]] for c in completes)


# ------------------------------------------------------------- two processes

CONSUMER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    # Configure the SDK only: the entry point must instrument on its own.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    import leasekit
    url, expected = sys.argv[1], int(sys.argv[2])
    queue = leasekit.open(url)
    stats = leasekit.Consumer(queue, lambda m: None, handle_signals=False).run(until_idle=True)
    assert stats.completed == expected, stats
    spans = []
    for s in exporter.get_finished_spans():
        spans.append({
            "name": s.name, "kind": s.kind.name,
            "trace": f"{s.context.trace_id:032x}", "id": f"{s.context.span_id:016x}",
            "parent": f"{s.parent.span_id:016x}" if s.parent else None,
            "attributes": dict(s.attributes),
            "links": [f"{link.context.span_id:016x}" for link in s.links],
            "status": s.status.status_code.name,
        })
    print(json.dumps(spans))
    """
)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", None)
    return env


def test_a_consumer_in_another_process_continues_the_producers_trace(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/jobs.db?queue=jobs"
    queue = telemetry.registry.open(url, create=True)
    with telemetry.tracer.start_as_current_span("checkout"):
        ids = [queue.send(b"order-1"), *queue.send_many([b"order-2", b"order-3"])]
    queue.close()
    sends = {s["id"]: s for s in telemetry.spans("send ")}
    assert {s["attributes"]["messaging.system"] for s in sends.values()} == {"sqlite"}

    result = subprocess.run(
        [sys.executable, "-c", CONSUMER_SCRIPT, url, "3"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=_child_env(),
    )
    assert result.returncode == 0, result.stderr
    spans = json.loads(result.stdout)
    processes = [s for s in spans if s["name"] == "process jobs"]
    assert len(processes) == 3
    for process in processes:
        assert process["kind"] == "CONSUMER"
        producer = sends[process["parent"]]  # the parent is the send span of this process
        assert process["trace"] == producer["trace"]
        assert process["links"] == [producer["id"]]
        assert process["attributes"]["messaging.system"] == "sqlite"
        assert process["attributes"]["messaging.destination.name"] == "jobs"
    assert sorted(p["attributes"]["messaging.message.id"] for p in processes) == sorted(ids)
    [receive] = [s for s in spans if s["name"] == "receive jobs" and s["links"]]
    assert receive["kind"] == "CLIENT"
    assert receive["attributes"]["messaging.batch.message_count"] == 3
    assert set(receive["links"]) == set(sends)
    completes = [s for s in spans if s["name"] == "complete jobs"]
    # settled after their handlers returned, maybe in one batch: linked to each trace
    assert completes
    assert {link for c in completes for link in c["links"]} == set(sends)


OFF_SCRIPT = textwrap.dedent(
    """
    import sys
    configure = sys.argv[1] == "configured"
    if configure:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        trace.set_tracer_provider(TracerProvider())
    import leasekit
    queue = leasekit.open("memory://off", create=True)
    plugin = leasekit.default_registry().plugin_manager.get_plugin("otel")
    print(repr(plugin))
    print(queue.events.observed("leasekit_before_send"))
    print(any(name.startswith("opentelemetry") for name in sys.modules))
    """
)


@pytest.mark.parametrize(
    ("configured", "disabled", "expect_on", "expect_imported"),
    [
        ("bare", "", False, False),  # no SDK configured: no hook, nothing imported
        ("configured", "", True, True),  # the SDK configured first: instruments by itself
        ("configured", "leasekit", False, True),  # ... unless switched off by name
    ],
)
def test_the_entry_point_instruments_only_a_configured_sdk(
    configured: str, disabled: str, expect_on: bool, expect_imported: bool, tmp_path: Path
) -> None:
    env = _child_env()
    if disabled:
        env["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = f"flask, {disabled}"
    result = subprocess.run(
        [sys.executable, "-c", OFF_SCRIPT, configured],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    plugin, observed, imported = result.stdout.split("\n")[:3]
    assert ("OtelInstrumentation" in plugin) is expect_on, plugin
    assert observed == str(expect_on)
    assert imported == str(expect_imported)


# ------------------------------------------------------------------ a cloud one


def test_sqs_carries_the_trace_context_and_a_full_message_is_sent_without_it(
    telemetry: Telemetry, moto_server: Any
) -> None:
    queue = telemetry.registry.open(
        "aws-sqs", queue=f"otel-{uuid.uuid4().hex[:8]}", create=True, **moto_server.options
    )
    try:
        small = queue.send(b"small")
        # A message exactly at SQS's limit (body at its maximum, a property filling the
        # rest): the trace context would not fit, so it is sent without it.
        body = b"x" * queue.capabilities.max_message_size
        fill = _largest_property_that_fits(queue, body)
        full = queue.send(body, properties={"fill": fill})
        leases = {lease.message.id: lease for lease in queue.lease(2, wait=5)}
        assert "traceparent" in leases[small].message.properties
        assert "traceparent" not in leases[full].message.properties
        assert leases[full].message.properties == {"fill": fill}
        leases[full].complete()
        leases[small].abandon()
        _consume(queue, concurrency=2)
    finally:
        queue.delete_queue()
        queue.close()
    sends = {s["attributes"]["messaging.message.id"]: s for s in telemetry.spans("send ")}
    assert {s["attributes"]["messaging.system"] for s in sends.values()} == {"aws_sqs"}
    [process] = telemetry.spans("process ")
    assert process["attributes"]["messaging.message.id"] == small
    assert process["parent"] == sends[small]["id"] and process["trace"] == sends[small]["trace"]
    assert process["attributes"]["messaging.system"] == "aws_sqs"


def _largest_property_that_fits(queue: leasekit.Queue, body: bytes) -> str:
    """The longest ``fill`` value with which ``body`` still passes the driver's size check."""
    low, high = 0, 64 * 1024
    while low < high:
        middle = (low + high + 1) // 2
        try:
            queue.driver.validate(OutgoingMessage(body=body, properties={"fill": "v" * middle}))
            low = middle
        except Exception:
            high = middle - 1
    return "v" * low


# ------------------------------------------------------------------- Prometheus


def test_prometheus_endpoint_serves_leasekit_metrics_over_http() -> None:
    endpoint = otel.start_prometheus_server(port=0, host="127.0.0.1")
    registry = leasekit.BackendRegistry()
    try:
        otel.instrument(meter_provider=endpoint.meter_provider, registry=registry)
        queue = registry.open("memory", queue=f"prom-{uuid.uuid4().hex[:6]}", create=True)
        queue.send_many([b"a", b"b"])
        # 2 s, renewed at half-time, completed while kept: a 0.3 s lease was lost twice
        # in full runs, 1.4 s and 0.8 s after it ended (a worker process stalled while
        # other workers started a JVM or a browser), and this test is about metrics.
        [lease] = queue.lease(1, duration=2.0)
        [other] = queue.lease(1, duration=30)
        with leasekit.LeaseKeeper(renew_at=0.5) as keeper:
            keeper.add(lease)
            deadline = time.monotonic() + 10
            while keeper.stats.renewed < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            lease.complete()
        with urllib.request.urlopen(endpoint.url, timeout=10) as response:
            assert response.status == 200
            text = response.read().decode()
    finally:
        otel.uninstrument(registry)
        endpoint.shutdown()
    where = f'messaging_destination_name="{queue.name}"'
    assert _scraped(text, "leasekit_leases_held", where) == 1  # `other` is still held
    assert _scraped(text, "leasekit_lease_renewals_total", where) >= 1
    assert _scraped(text, "leasekit_lease_renewal_lateness_seconds_count", where) >= 1
    assert _scraped(text, "messaging_client_sent_messages_total", where) == 2
    assert _scraped(text, "messaging_client_consumed_messages_total", where) == 2
    assert _scraped(text, "messaging_client_operation_duration_seconds_count", where) >= 3
    assert 'messaging_system="memory"' in text
    assert other.state is leasekit.LeaseState.HELD


def _scraped(text: str, name: str, where: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``where``, from a scrape."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and where in line
    ]
    assert values, f"{name} with {where} not in the scrape"
    return sum(values)
