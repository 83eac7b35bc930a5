"""The hook implementations that turn leasekit's events into OpenTelemetry spans and metrics.

One :class:`OtelInstrumentation` is one plugin (register it with
:func:`leasekit.plugins.otel.instrument`). How the events map to telemetry:

- ``before_send`` / ``after_send``: a PRODUCER ``send {queue}`` span, made
  current for the call; its context is injected (W3C ``traceparent``, and
  ``tracestate`` / ``baggage`` when present) into the properties core adds to
  every message of the call, so the message carries its creation context.
- ``before_receive`` / ``after_receive``: a CLIENT ``receive {queue}`` span with
  ``messaging.batch.message_count`` and a link to each message's creation context.
- ``before_process`` / ``after_process`` (the Consumer, when a worker takes the
  message): a CONSUMER ``process {queue}`` span around the handler, current while
  it runs, whose parent is the message's creation context (the producer's
  trace continues across processes) and which links to it too.
- ``before_settle`` / ``after_settle``: CLIENT ``complete`` / ``abandon`` /
  ``dead_letter {queue}`` spans; ``before_renew`` / ``after_renew``: CLIENT
  ``renew {queue}`` spans with the new expiry.
- Metrics: the conventions' ``messaging.client.operation.duration``,
  ``messaging.process.duration``, ``messaging.client.sent.messages`` and
  ``messaging.client.consumed.messages``, and leasekit's ``leasekit.*`` ones
  (see :mod:`leasekit.plugins.otel.conventions`).

Every hook is called on the thread doing the work; the client spans of one
call live in a per-thread stack between its ``before_`` and ``after_`` event.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

import leasekit
from leasekit.errors import LeaseLost
from leasekit.hookspecs import hookimpl
from leasekit.lease import Lease
from leasekit.queue import Queue
from leasekit.spi import OutgoingMessage

from . import conventions as c

__all__ = ["OtelInstrumentation", "global_providers_configured"]

#: Operation name -> ``messaging.operation.type`` (``None``: no conventional type).
_OPERATIONS: dict[str, str | None] = {
    "send": "send",
    "receive": "receive",
    "process": "process",
    "complete": "settle",
    "abandon": "settle",
    "dead_letter": "settle",
    "renew": None,
}
_SCOPE = "leasekit"


def global_providers_configured() -> tuple[bool, bool]:
    """Whether a real tracer provider / meter provider is set globally (not the API's defaults)."""
    tracing = not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )
    provider = metrics.get_meter_provider()
    default_meters: tuple[type, ...] = (metrics.NoOpMeterProvider,)
    try:
        from opentelemetry.metrics._internal import _ProxyMeterProvider

        default_meters += (_ProxyMeterProvider,)
    except ImportError:  # pragma: no cover - an API that moved it
        pass
    return tracing, not isinstance(provider, default_meters)


class _QueueNames:
    """Span names and attribute dicts of one queue, made once (hot paths only read them)."""

    __slots__ = ("base", "key", "metric", "names", "servicebus", "span")

    def __init__(self, queue: Queue) -> None:
        system = c.messaging_system(queue.driver.scheme)
        self.servicebus = system == "servicebus"
        base = {c.MESSAGING_SYSTEM: system, c.DESTINATION: queue.name}
        self.base: dict[str, Any] = base
        self.key = (system, queue.name)
        self.names = {op: f"{op} {queue.name}" for op in _OPERATIONS}
        self.metric: dict[str, dict[str, Any]] = {}
        self.span: dict[str, dict[str, Any]] = {}
        for op, kind in _OPERATIONS.items():
            attrs = {**base, c.OPERATION_NAME: op}
            if kind is not None:
                attrs[c.OPERATION_TYPE] = kind
            self.metric[op] = attrs
            span_attrs = dict(attrs)
            if self.servicebus and kind == "settle":
                span_attrs[c.SERVICEBUS_DISPOSITION] = op
            self.span[op] = span_attrs


class OtelInstrumentation:
    """leasekit's OpenTelemetry plugin: spans and metrics from core's hooks.

    Parameters
    ----------
        tracer_provider: where spans go; the global one if ``None``.
        meter_provider: where metrics go; the global one if ``None``.
        tracing: make spans (``False``: metrics only, no trace context either).
        metrics_enabled: record metrics (``False``: spans only).
        propagate: add the trace context to sent messages' properties (on
            Azure Storage Queue a message with properties is stored as leasekit's
            JSON envelope instead of plain base64).
        parent_from_message: a process span's parent is the message's creation
            context (one trace from producer to consumer); ``False``: the ambient
            context, with only a link to the creation context (the conventions'
            default where processing runs inside another span).
        renewal_spans: a span per renewal call (a keeper holding many leases
            makes many); the renewal metrics are recorded either way.
    """

    def __init__(
        self,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        *,
        tracing: bool = True,
        metrics_enabled: bool = True,
        propagate: bool = True,
        parent_from_message: bool = True,
        renewal_spans: bool = True,
    ) -> None:
        version = leasekit.__version__
        self._tracing = tracing
        self._metrics = metrics_enabled
        self._propagate = propagate and tracing
        self._parent_from_message = parent_from_message
        self._renewal_spans = renewal_spans and tracing
        self._tracer = trace.get_tracer(_SCOPE, version, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, version, meter_provider=meter_provider)
        self._operation_duration = meter.create_histogram(
            c.OPERATION_DURATION,
            unit="s",
            description="Duration of a send, receive, settle or renew call.",
            explicit_bucket_boundaries_advisory=c.DURATION_BUCKETS,
        )
        self._process_duration = meter.create_histogram(
            c.PROCESS_DURATION,
            unit="s",
            description="Duration of handling one message (the Consumer's handler call).",
            explicit_bucket_boundaries_advisory=c.DURATION_BUCKETS,
        )
        self._sent = meter.create_counter(
            c.SENT_MESSAGES, unit="{message}", description="Messages the producer tried to send."
        )
        self._consumed = meter.create_counter(
            c.CONSUMED_MESSAGES, unit="{message}", description="Messages received (leased)."
        )
        # Held leases change on every receive and settle: counted here in plain ints
        # and observed at collection (one SDK call per collection, not per change).
        self._held_counts: dict[tuple[str, str], int] = {}
        self._held_attrs: dict[tuple[str, str], dict[str, Any]] = {}
        self._held_lock = threading.Lock()
        meter.create_observable_up_down_counter(
            c.LEASES_HELD,
            callbacks=[self._observe_held],
            unit="{lease}",
            description="Leases this process holds now.",
        )
        self._renewals = meter.create_counter(
            c.RENEWALS, unit="{renewal}", description="Leases renewed."
        )
        self._lateness = meter.create_histogram(
            c.RENEWAL_LATENESS,
            unit="s",
            description="How late a keeper's renewal started after its planned point.",
            explicit_bucket_boundaries_advisory=c.LATENESS_BUCKETS,
        )
        self._lost = meter.create_counter(
            c.LEASES_LOST, unit="{lease}", description="Leases found lost (stale or expired)."
        )
        self._dead_lettered = meter.create_counter(
            c.DEAD_LETTERED, unit="{message}", description="Messages dead-lettered."
        )
        self._duplicates = meter.create_counter(
            c.DUPLICATES_SUPPRESSED,
            unit="{message}",
            description="Messages the idempotency store recognised; completed unhandled.",
        )
        self._queues: weakref.WeakKeyDictionary[Queue, _QueueNames] = weakref.WeakKeyDictionary()
        self._local = threading.local()
        #: Per lease taken by a worker: its process span, context token and start.
        self._processing: dict[int, tuple[Span | None, Any, float]] = {}
        #: Each live lease's creation context, parsed once (receive, process, renew links).
        self._created: weakref.WeakKeyDictionary[Lease, Context] = weakref.WeakKeyDictionary()
        self._textmap: object = None
        self._fields: frozenset[str] = frozenset()

    def __repr__(self) -> str:
        parts = [p for p, on in (("traces", self._tracing), ("metrics", self._metrics)) if on]
        return f"<leasekit OtelInstrumentation {'+'.join(parts) or 'off'}>"

    # ---------------------------------------------------------------- helpers

    def _names(self, queue: Queue) -> _QueueNames:
        names = self._queues.get(queue)
        if names is None:
            names = self._queues[queue] = _QueueNames(queue)
        return names

    def _stack(self) -> list[tuple[str, int, Span | None, Any, float]]:
        local = self._local
        try:
            stack: list[tuple[str, int, Span | None, Any, float]] = local.stack
        except AttributeError:
            stack = local.stack = []
        return stack

    def _begin(
        self,
        op: str,
        queue: Queue,
        kind: SpanKind,
        attributes: dict[str, Any],
        span: bool = True,
        links: list[Link] | None = None,
    ) -> Span | None:
        """Start (and make current) the client span of one call; remember when it began."""
        started = time.perf_counter()
        if span and self._tracing:
            names = self._names(queue)
            current = self._tracer.start_span(
                names.names[op], kind=kind, attributes=attributes, links=links
            )
            token = otel_context.attach(trace.set_span_in_context(current))
        else:
            current, token = None, None
        self._stack().append((op, id(queue), current, token, started))
        return current

    def _finish(self, op: str, queue: Queue) -> tuple[Any, float] | None:
        """Pop the call's span (detached, not ended) and its duration; ``None`` if unknown.

        A receive's entry holds its start time (ns) where others hold the span.
        """
        stack = self._stack()
        key = id(queue)
        for index in range(len(stack) - 1, -1, -1):
            entry = stack[index]
            if entry[0] == op and entry[1] == key:
                del stack[index]
                _, _, span, token, started = entry
                if span is None:
                    return token, time.perf_counter() - started  # no span: the start (ns)
                otel_context.detach(token)
                return span, time.perf_counter() - started
        return None  # the plugin was registered during the call

    def _creation_fields(self) -> frozenset[str]:
        """The property names the global propagator reads (cached per propagator)."""
        textmap = propagate.get_global_textmap()
        if textmap is not self._textmap:
            self._fields = frozenset(textmap.fields)
            self._textmap = textmap
        return self._fields

    def _creation_context(self, properties: Any) -> Context | None:
        """The creation context a message carries in its properties, if it carries one."""
        if not properties or self._creation_fields().isdisjoint(properties):
            return None
        extracted = propagate.extract(properties)
        if not trace.get_current_span(extracted).get_span_context().is_valid:
            return None
        return extracted

    def _created_context(self, lease: Lease) -> Context | None:
        """The lease's creation context, parsed once per lease (kept while the lease lives)."""
        created = self._created.get(lease)
        if created is None:
            created = self._creation_context(lease.message.properties)
            if created is not None:
                self._created[lease] = created
        return created

    def _links(self, leases: Sequence[Lease]) -> list[Link]:
        """A link to each lease's creation context (for a batch settle or a renewal)."""
        links = []
        for lease in leases:
            created = self._created_context(lease)
            if created is not None:
                links.append(Link(trace.get_current_span(created).get_span_context()))
        return links

    def _count_held(self, names: _QueueNames, change: int) -> None:
        key = names.key
        with self._held_lock:
            self._held_counts[key] = self._held_counts.get(key, 0) + change
            self._held_attrs.setdefault(key, names.base)

    def _observe_held(self, options: CallbackOptions) -> Iterable[Observation]:
        """The ``leasekit.leases.held`` callback: each queue's count now."""
        with self._held_lock:
            counts = list(self._held_counts.items())
        return [Observation(count, self._held_attrs[key]) for key, count in counts]

    def _record_failure(self, span: Span | None, error: BaseException | None, kind: str) -> None:
        if span is None or not span.is_recording():
            return
        span.set_attribute(c.ERROR_TYPE, kind)
        span.set_status(Status(StatusCode.ERROR, str(error) if error is not None else kind))
        if error is not None:
            span.record_exception(error)

    def _duration(self, op: str, names: _QueueNames, seconds: float, failure: str | None) -> None:
        if not self._metrics:
            return
        attrs = names.metric[op]
        if failure is not None:
            attrs = {**attrs, c.ERROR_TYPE: failure}
        self._operation_duration.record(seconds, attrs)

    # ------------------------------------------------------------------- send

    @hookimpl
    def leasekit_before_send(
        self, queue: Queue, messages: Sequence[OutgoingMessage], properties: dict[str, str]
    ) -> None:
        """Start the send span; give core the trace context to add to the messages."""
        if not self._tracing:
            self._begin("send", queue, SpanKind.PRODUCER, {}, span=False)
            return
        names = self._names(queue)
        attrs = names.span["send"]
        if len(messages) > 1:
            attrs = {**attrs, c.BATCH_COUNT: len(messages)}
        else:
            attrs = {**attrs, c.BODY_SIZE: len(messages[0].body)}
        span = self._begin("send", queue, SpanKind.PRODUCER, attrs)
        if span is None or not span.get_span_context().is_valid:
            return
        if self._propagate and queue.capabilities.supports_properties:
            propagate.inject(properties)  # the send span is current: it is the creation context
        if span.is_recording():  # a caller's own creation context: the send span links to it
            for message in messages:
                own = self._creation_context(message.properties)
                if own is not None:
                    span.add_link(trace.get_current_span(own).get_span_context())

    @hookimpl
    def leasekit_after_send(
        self,
        queue: Queue,
        messages: Sequence[OutgoingMessage],
        results: Sequence[str | BaseException],
        error: BaseException | None,
    ) -> None:
        """End the send span; count the messages sent and failed."""
        finished = self._finish("send", queue)
        names = self._names(queue)
        failures = [r for r in results if isinstance(r, BaseException)]
        failed = error or (failures[0] if failures else None)
        failure = c.error_type(failed) if failed is not None else None
        if finished is not None:
            span, seconds = finished
            if span is not None:
                if len(results) == 1 and isinstance(results[0], str) and span.is_recording():
                    span.set_attribute(c.MESSAGE_ID, results[0])
                if failure is not None:
                    self._record_failure(span, failed, failure)
                span.end()
            self._duration("send", names, seconds, failure)
        if not self._metrics:
            return
        sent = len(results) - len(failures)
        if sent:
            self._sent.add(sent, names.metric["send"])
        if failures:
            self._sent.add(
                len(failures), {**names.metric["send"], c.ERROR_TYPE: c.error_type(failures[0])}
            )

    # ---------------------------------------------------------------- receive

    @hookimpl
    def leasekit_before_receive(self, queue: Queue) -> None:
        """Note when the receive began (its span is made at the end, with its links)."""
        self._stack().append(("receive", id(queue), None, time.time_ns(), time.perf_counter()))

    @hookimpl
    def leasekit_after_receive(
        self, queue: Queue, leases: Sequence[Lease], error: BaseException | None
    ) -> None:
        """Record the receive span (a link per message), back-dated to its start; count leases.

        Made now rather than at ``before_receive`` so its links exist at creation
        (samplers see them) and an empty poll costs one span, no context switch.
        """
        finished = self._finish("receive", queue)
        names = self._names(queue)
        failure = c.error_type(error) if error is not None else None
        if finished is not None:
            start_ns, seconds = finished
            if self._tracing:
                links = []
                created = self._created
                for lease in leases:
                    ctx = self._creation_context(lease.message.properties)
                    if ctx is not None:
                        created[lease] = ctx
                        links.append(Link(trace.get_current_span(ctx).get_span_context()))
                attrs = {**names.span["receive"], c.BATCH_COUNT: len(leases)}
                span = self._tracer.start_span(
                    names.names["receive"],
                    kind=SpanKind.CLIENT,
                    attributes=attrs,
                    links=links,
                    start_time=start_ns,
                )
                if failure is not None:
                    self._record_failure(span, error, failure)
                span.end()
            self._duration("receive", names, seconds, failure)
        if leases and self._metrics:
            self._consumed.add(len(leases), names.metric["receive"])
            self._count_held(names, len(leases))

    # ---------------------------------------------------------------- process

    @hookimpl
    def leasekit_before_handle(self, lease: Lease) -> None:
        """Start the process span, current while the handler runs (the worker took the message)."""
        started = time.perf_counter()
        if not self._tracing:
            self._processing[id(lease)] = (None, None, started)
            return
        names = self._names(lease.queue)
        message = lease.message
        attrs = {
            **names.span["process"],
            c.MESSAGE_ID: message.id,
            c.DELIVERY_COUNT: message.delivery_count,
        }
        if names.servicebus:
            attrs[c.SERVICEBUS_DELIVERY_COUNT] = message.delivery_count
        created = self._created_context(lease)
        links = None
        parent = None
        if created is not None:
            links = [Link(trace.get_current_span(created).get_span_context())]
            if self._parent_from_message:
                ambient = trace.get_current_span().get_span_context()
                if ambient.is_valid:
                    links.append(Link(ambient))
                parent = created
        span = self._tracer.start_span(
            names.names["process"],
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attrs,
            links=links,
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        self._processing[id(lease)] = (span, token, started)

    @hookimpl
    def leasekit_after_handle(self, lease: Lease, error: BaseException | None) -> None:
        """End the process span (the handler returned or raised); its duration is a metric."""
        entry = self._processing.pop(id(lease), None)
        if entry is None:
            return
        span, token, started = entry
        seconds = time.perf_counter() - started
        if token is not None:
            otel_context.detach(token)
        failure = c.error_type(error) if error is not None else None
        if span is not None:
            if failure is not None and span.is_recording():
                self._record_failure(span, error, failure)
            span.end()
        if self._metrics:
            names = self._names(lease.queue)
            attrs = names.metric["process"]
            if failure is not None:
                attrs = {**attrs, c.ERROR_TYPE: failure}
            self._process_duration.record(seconds, attrs)

    @hookimpl
    def leasekit_after_process(
        self, lease: Lease, error: BaseException | None, outcome: str
    ) -> None:
        """Count a message the idempotency store suppressed (its handler never ran)."""
        if outcome == "duplicate" and self._metrics:
            self._duplicates.add(1, self._names(lease.queue).base)

    # ----------------------------------------------------------------- settle

    @hookimpl
    def leasekit_before_settle(self, queue: Queue, leases: Sequence[Lease], action: str) -> None:
        """Start the settle span (``complete`` / ``abandon`` / ``dead_letter``)."""
        if not self._tracing:
            self._begin(action, queue, SpanKind.CLIENT, {}, span=False)
            return
        attrs = self._names(queue).span[action]
        if len(leases) == 1:
            attrs = {**attrs, c.MESSAGE_ID: leases[0].message.id}
        else:
            attrs = {**attrs, c.BATCH_COUNT: len(leases)}
        # Linked to each message's trace: a worker settles handled messages in batches,
        # after their process spans ended, so a settle span has no single parent.
        self._begin(action, queue, SpanKind.CLIENT, attrs, links=self._links(leases))

    @hookimpl
    def leasekit_after_settle(
        self,
        queue: Queue,
        leases: Sequence[Lease],
        action: str,
        results: Sequence[BaseException | None],
        error: BaseException | None,
    ) -> None:
        """End the settle span; leases settled are no longer held."""
        finished = self._finish(action, queue)
        names = self._names(queue)
        settled = 0
        failed = error
        for result in results:
            if result is None:
                settled += 1
            elif failed is None:
                failed = result
        failure = c.error_type(failed) if failed is not None else None
        if finished is not None:
            span, seconds = finished
            if span is not None:
                if failure is not None:
                    self._record_failure(span, failed, failure)
                span.end()
            self._duration(action, names, seconds, failure)
        if settled and self._metrics:
            self._count_held(names, -settled)
            if action == "dead_letter":
                self._dead_lettered.add(settled, names.base)

    # ------------------------------------------------------------------ renew

    @hookimpl
    def leasekit_before_renew(self, queue: Queue, leases: Sequence[Lease]) -> None:
        """Start the renew span."""
        if not self._renewal_spans:
            self._begin("renew", queue, SpanKind.CLIENT, {}, span=False)
            return
        attrs = self._names(queue).span["renew"]
        if len(leases) == 1:
            attrs = {**attrs, c.MESSAGE_ID: leases[0].message.id}
        else:
            attrs = {**attrs, c.BATCH_COUNT: len(leases)}
        # A keeper renews on its own threads: link the messages' traces.
        self._begin("renew", queue, SpanKind.CLIENT, attrs, links=self._links(leases))

    @hookimpl
    def leasekit_after_renew(
        self,
        queue: Queue,
        leases: Sequence[Lease],
        results: Sequence[BaseException | None],
        error: BaseException | None,
    ) -> None:
        """End the renew span with the new expiry; count renewals."""
        finished = self._finish("renew", queue)
        names = self._names(queue)
        renewed = [lease for lease, result in zip(leases, results, strict=False) if result is None]
        failed = error
        if failed is None:
            failed = next((r for r in results if r is not None), None)
        failure = c.error_type(failed) if failed is not None else None
        if finished is not None:
            span, seconds = finished
            if span is not None:
                if renewed and span.is_recording():
                    first = min(renewed, key=lambda lease: lease.expires_at)
                    span.set_attribute(c.EXPIRES_AT, first.expires_at.isoformat())
                    span.set_attribute(c.LEASE_DURATION, first.duration)
                if failure is not None:
                    self._record_failure(span, failed, failure)
                span.end()
            self._duration("renew", names, seconds, failure)
        if renewed and self._metrics:
            self._renewals.add(len(renewed), names.base)

    @hookimpl
    def leasekit_lease_renewed(self, lease: Lease, lateness: float | None) -> None:
        """Record a keeper's renewal lateness."""
        if lateness is not None and self._metrics:
            self._lateness.record(lateness, self._names(lease.queue).base)

    # ------------------------------------------------------------- checkpoint

    @hookimpl
    def leasekit_lease_checkpointed(self, lease: Lease, size: int) -> None:
        """Note a checkpoint on the lease's process span (an event with its size)."""
        entry = self._processing.get(id(lease))
        if entry is not None and entry[0] is not None and entry[0].is_recording():
            entry[0].add_event(
                "leasekit.lease.checkpoint",
                {
                    "leasekit.checkpoint.size": size,
                    "leasekit.lease.expires_at": lease.expires_at.isoformat(),
                },
            )

    # ------------------------------------------------------------------- lost

    @hookimpl
    def leasekit_lease_lost(self, lease: Lease, error: LeaseLost) -> None:
        """Count a lost lease (no longer held); note it on its process span."""
        if self._metrics:
            names = self._names(lease.queue)
            self._lost.add(1, names.base)
            self._count_held(names, -1)
        entry = self._processing.get(id(lease))
        if entry is not None and entry[0] is not None and entry[0].is_recording():
            entry[0].add_event("leasekit.lease.lost", {"exception.message": str(error)})
