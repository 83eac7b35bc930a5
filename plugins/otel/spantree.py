"""Spans as a text tree, and a demo that prints one (``python -m leasekit.plugins.otel.spantree``).

:func:`render` draws finished spans (the SDK's ``ReadableSpan``, e.g. from its
``InMemorySpanExporter``) one trace after another, each child under its parent
in start order, with its kind, duration, a few telling attributes and its links
(by the linked span's name where it is among the spans). The demo sends three
orders on a SQLite queue inside a ``checkout`` span, then a ``Consumer`` handles
them: one handler fails once (abandoned, redelivered), one outlives its lease
(the keeper renews it); ``docs/observability.md`` shows its output.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "render"]

#: Attributes shown on a span's line (the rest are in the exporter's output).
_SHOWN = (
    ("messaging.message.id", "id", 8),
    ("messaging.batch.message_count", "batch", 0),
    ("leasekit.message.delivery_count", "delivery", 0),
    ("leasekit.lease.duration", "lease", 0),
    ("error.type", "error", 0),
)


def _label(span: Any) -> str:
    attributes = span.attributes or {}
    parts = []
    for key, short, cut in _SHOWN:
        if key in attributes:
            value = str(attributes[key])
            parts.append(f"{short}={value[:cut] if cut else value}")
    seconds = (span.end_time - span.start_time) / 1e9
    kind = span.kind.name
    return f"{span.name} [{kind}] {seconds * 1000:.1f} ms" + (
        f"  {' '.join(parts)}" if parts else ""
    )


def render(spans: Iterable[Any]) -> str:
    """The spans as text: one tree per trace (by first start), children in start order."""
    spans = sorted(spans, key=lambda s: s.start_time)
    by_id = {s.context.span_id: s for s in spans}
    children: dict[int, list[Any]] = {}
    roots = []
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        if parent is not None and parent in by_id:
            children.setdefault(parent, []).append(span)
        else:
            roots.append(span)
    lines: list[str] = []

    def walk(span: Any, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        line = prefix + branch + _label(span)
        if span.parent is not None and span.parent.span_id not in by_id:
            line += "  (parent in another process or not shown)"
        lines.append(line)
        inner = prefix + ("" if top else ("   " if last else "│  "))
        for link in span.links:
            target = by_id.get(link.context.span_id)
            name = target.name if target is not None else f"{link.context.span_id:016x}"
            lines.append(f"{inner}   ↪ link: {name}")
        kids = children.get(span.context.span_id, [])
        for index, child in enumerate(kids):
            walk(child, inner, index == len(kids) - 1, False)

    for root in roots:
        lines.append(f"trace {root.context.trace_id:032x}"[:14] + "…")
        walk(root, "  ", True, True)
    return "\n".join(lines)


def _demo(folder: str, lease: float) -> str:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import leasekit
    from leasekit.plugins import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = leasekit.BackendRegistry()
    otel.instrument(tracer_provider=provider, registry=registry)
    tracer = provider.get_tracer("demo")
    queue = registry.open(f"sqlite:///{folder}/shop.db?queue=orders", create=True)
    with tracer.start_as_current_span("checkout"):
        queue.send(b"order-1")
        queue.send_many([b"order-2", b"order-3"])
    failed: set[bytes] = set()

    def handle(message: leasekit.Message) -> None:
        with tracer.start_as_current_span("charge card"):
            if message.body == b"order-2" and message.body not in failed:
                failed.add(message.body)
                raise RuntimeError("card declined, try again")
            if message.body == b"order-3":
                time.sleep(lease * 0.9)  # outlives most of its lease: the keeper renews

    consumer = leasekit.Consumer(
        queue,
        handle,
        lease_duration=lease,
        backoff_base=0.01,
        backoff_max=0.01,
        handle_signals=False,
    )
    consumer.run(until_idle=True)
    queue.close()
    otel.uninstrument(registry)
    spans = [s for s in exporter.get_finished_spans() if not _empty_receive(s)]
    return render(spans)


def _empty_receive(span: Any) -> bool:
    attributes = span.attributes or {}
    return bool(
        attributes.get("messaging.operation.type") == "receive"
        and attributes.get("messaging.batch.message_count") == 0
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run the demo and print its span tree (empty polls left out)."""
    parser = argparse.ArgumentParser(description="Print the span tree of a small leasekit run.")
    parser.add_argument("--folder", help="where the SQLite file goes (default: a temporary one)")
    parser.add_argument("--lease", type=float, default=1.0, help="the physical lease (s)")
    args = parser.parse_args(argv)
    if args.folder:
        Path(args.folder).mkdir(parents=True, exist_ok=True)
        print(_demo(args.folder, args.lease))
        return
    with tempfile.TemporaryDirectory() as folder:
        print(_demo(folder, args.lease))


if __name__ == "__main__":
    main()
