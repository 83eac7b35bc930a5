"""What leasekit.plugins.otel costs: Consumer throughput with tracing and metrics on vs off.

    .venv/bin/python benchmarks/bench_otel.py --messages 10000 --rounds 5
    .venv/bin/python benchmarks/bench_otel.py --backend sqlite --messages 5000 --rounds 5
    .venv/bin/python benchmarks/bench_otel.py --handler-ms 1 --messages 10000 --rounds 5
    .venv/bin/python benchmarks/bench_otel.py --sdk-costs

A ``Consumer`` (8 threads; a no-op handler, or one that waits ``--handler-ms``)
drains a queue of ``--messages`` in each mode, in alternating turns in one
process (each round runs the modes in a rotated order, so the machine's load
hits them alike):

- ``off``: the plugin not registered (what every install without a configured
  SDK gets: no hook is implemented, core skips the events);
- ``hooks``: a plugin with the hooks the otel plugin implements around a
  handler (``leasekit_before_handle``/``after_handle``, ``after_process``), all
  empty: what emitting the per-message events costs by itself;
- ``metrics``: ``instrument(tracing=False)`` with an SDK ``MeterProvider``
  (metrics recorded, never exported during the turn): no spans, no trace context;
- ``sampled``: as ``noop`` below with the sampler ``ParentBased(TraceIdRatioBased(0.01))``
  (1 % of sends start a recorded trace; the consumer follows the message's flag);
- ``noop``: ``instrument()`` with the SDK's ``TracerProvider`` (every span
  recorded) and a ``BatchSpanProcessor`` over an exporter that drops everything,
  and the SDK ``MeterProvider``;
- ``memory``: the same with the SDK's ``InMemorySpanExporter`` behind a
  ``SimpleSpanProcessor`` (what the tests use: spans kept, exported on end).

Messages are sent with the mode's plugin on, so in the traced modes each one
carries a ``traceparent`` and its process span continues the producer's trace,
as in real use. Reports messages/s per mode (median and range over the rounds)
and the median of the per-round ratios mode/off.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import threading
import time
import timeit
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

import leasekit
from leasekit.plugins import otel
from leasekit.registry import default_registry

MODES = ("off", "hooks", "metrics", "sampled", "noop", "memory")
SEND_BATCH = 500
#: CPU microseconds per message of each drain (process time, all threads).
CPU: list[float] = []


class HandleHooks:
    """Empty per-message hooks, the ones the otel plugin uses: the cost of the events alone."""

    @leasekit.hookimpl
    def leasekit_before_handle(self, lease: leasekit.Lease) -> None:
        pass

    @leasekit.hookimpl
    def leasekit_after_handle(self, lease: leasekit.Lease) -> None:
        pass

    @leasekit.hookimpl
    def leasekit_after_process(self, lease: leasekit.Lease) -> None:
        pass


class DropExporter(SpanExporter):
    """An exporter that does nothing (the cost of the SDK alone)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


@contextmanager
def mode(name: str) -> Iterator[dict[str, Any]]:
    """Instrument the default registry for ``name``; yield what it keeps (spans, metrics)."""
    if name == "off":
        otel.uninstrument()
        yield {}
        return
    if name == "hooks":
        otel.uninstrument()
        registry = default_registry()
        registry.register_plugin(HandleHooks(), name="bench-hooks")
        try:
            yield {}
        finally:
            registry.plugin_manager.unregister(name="bench-hooks")
        return
    sampler = ParentBased(TraceIdRatioBased(0.01)) if name == "sampled" else None
    tracer = TracerProvider(sampler=sampler)
    kept = InMemorySpanExporter()
    if name == "memory":
        tracer.add_span_processor(SimpleSpanProcessor(kept))
    else:
        tracer.add_span_processor(BatchSpanProcessor(DropExporter()))
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader])
    otel.instrument(tracer_provider=tracer, meter_provider=meter, tracing=name != "metrics")
    try:
        yield {"spans": kept, "metrics": reader}
    finally:
        otel.uninstrument()
        tracer.shutdown()
        meter.shutdown()


def handler(ms: float) -> Any:
    """The handler: nothing, or ``ms`` milliseconds of waiting (I/O: the GIL is free)."""
    if ms <= 0:
        return lambda message: None
    seconds = ms / 1000
    return lambda message: time.sleep(seconds)


def drain(queue: leasekit.Queue, total: int, handle: Any, timeout: float = 300) -> float:
    """Seconds until a ``Consumer`` (8 threads) has completed ``total`` messages.

    As ``benchmarks/_consumer.py`` times it (the completion counter polled every
    10 ms), with the handler given.
    """
    consumer = leasekit.Consumer(
        queue, handle, concurrency=8, lease_duration=30, handle_signals=False
    )
    runner = threading.Thread(target=consumer.run, name="bench-consumer")
    start = time.perf_counter()
    cpu = time.process_time()
    runner.start()
    deadline = start + timeout
    while consumer.stats.completed < total and time.perf_counter() < deadline:
        time.sleep(0.01)
    finished = time.perf_counter()
    CPU.append((time.process_time() - cpu) / total * 1e6)
    consumer.stop()
    runner.join()
    if consumer.stats.completed < total:
        raise RuntimeError(f"consumer completed {consumer.stats.completed} of {total} in time")
    return finished - start


def open_queue(backend: str, folder: str) -> leasekit.Queue:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    if backend == "memory":
        return leasekit.open(f"memory://{name}", create=True)
    return leasekit.open(f"sqlite:///{folder}/{name}.db?queue={name}", create=True)


def turn(backend: str, name: str, messages: int, folder: str, handler_ms: float) -> float:
    """Fill a fresh queue and time a Consumer draining it in mode ``name``; messages/s."""
    with mode(name) as kept:
        queue = open_queue(backend, folder)
        try:
            body = b"x" * 64
            for start in range(0, messages, SEND_BATCH):
                queue.send_many([body] * min(SEND_BATCH, messages - start))
            gc.collect()
            seconds = drain(queue, messages, handler(handler_ms))
        finally:
            queue.close()
        if name == "memory":
            spans = len(kept["spans"].get_finished_spans())
            if spans < messages:  # the traced mode really traced
                raise RuntimeError(f"only {spans} spans for {messages} messages")
    return messages / seconds


def run(backend: str, messages: int, rounds: int, modes: Sequence[str], handler_ms: float) -> None:
    rates: dict[str, list[float]] = {m: [] for m in modes}
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as folder:
        turn(backend, modes[0], min(messages, 2000), folder, handler_ms)  # warm up
        for index in range(rounds):
            order = list(modes[index % len(modes) :]) + list(modes[: index % len(modes)])
            got: dict[str, float] = {}
            cpu: dict[str, float] = {}
            for name in order:
                got[name] = turn(backend, name, messages, folder, handler_ms)
                cpu[name] = CPU[-1]
            for name in modes:
                rates[name].append(got[name])
                if "off" in got:
                    ratios[name].append(got[name] / got["off"])
            print(
                f"  round {index + 1}: "
                + "  ".join(f"{name}={got[name]:,.0f} ({cpu[name]:.0f} us)" for name in modes)
                + " msg/s (CPU per message)",
                flush=True,
            )
    what = f"a {handler_ms:g} ms handler" if handler_ms > 0 else "no-op handler"
    print(f"{backend}: Consumer, 8 threads, {what}, {messages:,} messages x {rounds} rounds")
    for name in modes:
        values = rates[name]
        line = (
            f"  {name:>6}: median {statistics.median(values):,.0f} msg/s "
            f"(range {min(values):,.0f}-{max(values):,.0f})"
        )
        if name != "off" and ratios[name]:
            r = ratios[name]
            line += (
                f"; vs off: median {statistics.median(r):.3f} "
                f"(range {min(r):.3f}-{max(r):.3f}), {100 * (1 - statistics.median(r)):.1f} % fewer"
            )
        print(line)


def sdk_costs(repeat: int = 20000) -> None:
    """What the SDK's calls cost one at a time, single-threaded (what a message pays)."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(DropExporter()))
    tracer = tracer_provider.get_tracer("bench")
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("bench")
    histogram = meter.create_histogram("h", unit="s")
    counter = meter.create_counter("c")
    process = {
        "messaging.system": "memory",
        "messaging.destination.name": "q",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.message.id": "0123456789abcdef01234567",
        "leasekit.message.delivery_count": 1,
    }
    four = dict(list(process.items())[:4])
    two = dict(list(process.items())[:2])
    span = tracer.start_span("parent")
    carrier: dict[str, str] = {}
    current = trace.set_span_in_context(span)
    propagate.inject(carrier, context=current)

    def attach_detach() -> None:
        context.detach(context.attach(trace.set_span_in_context(span)))

    calls = [
        (
            "start_span + end, 6 attributes",
            lambda: tracer.start_span("p", attributes=process).end(),
        ),
        ("histogram.record, 4 attributes", lambda: histogram.record(0.001, four)),
        ("counter.add, 2 attributes", lambda: counter.add(1, two)),
        ("propagate.extract (traceparent)", lambda: propagate.extract(carrier)),
        ("propagate.inject", lambda: propagate.inject({}, context=current)),
        ("context attach + detach", attach_detach),
    ]
    print(f"OpenTelemetry SDK calls, single-threaded, {repeat:,} each:")
    for label, call in calls:
        seconds = timeit.timeit(call, number=repeat)
        print(f"  {label:34s} {seconds / repeat * 1e6:6.2f} us")
    tracer_provider.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backend", choices=("memory", "sqlite"), default="memory")
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--handler-ms", type=float, default=0, help="each message's handler waits this long"
    )
    parser.add_argument(
        "--sdk-costs", action="store_true", help="only time single SDK calls, then stop"
    )
    args = parser.parse_args()
    if args.sdk_costs:
        sdk_costs()
        return
    started = time.perf_counter()
    run(args.backend, args.messages, args.rounds, args.modes, args.handler_ms)
    print(f"  ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
