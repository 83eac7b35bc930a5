"""What this process's leases look like, for the operator's dashboard: ids and timings only.

A :class:`LeaseReporter` is a plugin (``leasekit_lease_*`` hooks) that keeps,
for every lease held in this process, its message id, queue, delivery count,
when it was leased, its renewals and how late the last one was, and when it
last checkpointed; and, for the last :data:`MAX_TIMELINES` messages whose
lease was lost here or that came back redelivered, a timeline (leased →
renewed … → lost, with the reason → redelivered → settled).

It never keeps a receipt (a credential for the message) nor a body.
:meth:`LeaseReporter.snapshot` is plain JSON-ready data, served by
:class:`~leasekit.HealthServer` at ``GET /leases`` when given ``leases=``
(opt-in)::

    reporter = LeaseReporter().install()          # into the default registry
    with HealthServer(consumer, port=8081, leases=reporter.snapshot):
        consumer.run()

The ``leasekit dashboard --consumer http://host:8081`` page reads it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .hookspecs import hookimpl
from .redaction import redact

if TYPE_CHECKING:
    from .errors import LeaseLost
    from .lease import Lease
    from .registry import BackendRegistry

__all__ = ["MAX_HELD", "MAX_TIMELINES", "LeaseReporter", "event_order"]

#: Most held leases reported (a process holding more reports this many, and says so).
MAX_HELD = 10_000
#: Timelines kept (lost or redelivered messages), newest first; older ones are dropped.
MAX_TIMELINES = 200
#: Events kept per timeline; renewals in between are counted, not listed.
MAX_EVENTS = 20
#: Longest lost-reason kept (characters).
MAX_REASON = 300


@dataclass(slots=True)
class _Held:
    queue: str
    message_id: str
    delivery_count: int
    leased_at: float
    renewals: int = 0
    last_renewal_at: float | None = None
    last_lateness: float | None = None
    checkpoint_at: float | None = None


@dataclass(slots=True)
class _Timeline:
    queue: str
    message_id: str
    events: list[dict[str, Any]] = field(default_factory=list)

    def add(self, event: dict[str, Any]) -> None:
        if len(self.events) < MAX_EVENTS:
            self.events.append(event)
        else:
            self.events[-1] = event


class LeaseReporter:
    """Records the leases of this process for ``GET /leases`` (see the module docstring).

    Parameters:
        consumer: a label for this process in the dashboard (default ``host:pid``).
        clock: wall-clock seconds (``time.time``), for tests.

    Thread-safe; each hook is a dictionary update under a lock.
    """

    def __init__(self, *, consumer: str | None = None, clock: Any = time.time) -> None:
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._label = consumer or f"{self._host}:{self._pid}"
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[Lease, _Held] = {}
        self._dropped = 0
        self._timelines: OrderedDict[tuple[str, str], _Timeline] = OrderedDict()
        self._registry: BackendRegistry | None = None

    # ------------------------------------------------------------ install

    def install(self, registry: BackendRegistry | None = None) -> LeaseReporter:
        """Register with ``registry`` (the default one): every queue it opens reports here."""
        from .registry import default_registry

        registry = registry or default_registry()
        registry.register_plugin(self, name=f"leasekit-lease-reporter-{id(self)}")
        self._registry = registry
        return self

    def uninstall(self) -> None:
        """Stop receiving lease events."""
        if self._registry is not None:
            self._registry.plugin_manager.unregister(self)
            self._registry = None

    # -------------------------------------------------------------- hooks

    @hookimpl
    def leasekit_lease_acquired(self, lease: Lease) -> None:
        """A message was leased here."""
        now = self._clock()
        message = lease.message
        queue = lease.queue.name
        with self._lock:
            if len(self._held) >= MAX_HELD:
                self._dropped += 1
            else:
                self._held[lease] = _Held(queue, message.id, message.delivery_count, now)
            key = (queue, message.id)
            timeline = self._timelines.get(key)
            if timeline is None and message.delivery_count > 1:
                timeline = self._timeline(key)
            if timeline is not None:
                event = "redelivered" if message.delivery_count > 1 else "leased"
                timeline.add(self._event(event, now, delivery_count=message.delivery_count))

    @hookimpl
    def leasekit_lease_renewed(self, lease: Lease, lateness: float | None) -> None:
        """A lease held here was renewed."""
        now = self._clock()
        with self._lock:
            held = self._held.get(lease)
            if held is not None:
                held.renewals += 1
                held.last_renewal_at = now
                held.last_lateness = lateness

    @hookimpl
    def leasekit_lease_checkpointed(self, lease: Lease, size: int) -> None:
        """A lease held here saved a checkpoint."""
        now = self._clock()
        with self._lock:
            held = self._held.get(lease)
            if held is not None:
                held.checkpoint_at = now
                held.renewals += 1
                held.last_renewal_at = now

    @hookimpl
    def leasekit_lease_lost(self, lease: Lease, error: LeaseLost) -> None:
        """A lease held here was found lost: its timeline starts (or goes on)."""
        now = self._clock()
        reason = redact(str(error))[:MAX_REASON]
        # Lost when its lease ended, if that was before the loss was found (a frozen
        # process finds it late, maybe after the message was redelivered).
        at = min(now, lease.expires_at.timestamp())
        count = lease.message.delivery_count
        with self._lock:
            held = self._held.pop(lease, None)
            key = (lease.queue.name, lease.message.id)
            timeline = self._timelines.get(key)
            if timeline is None:
                timeline = self._timeline(key)
            if held is not None and not any(
                e["event"] == "leased" and e.get("delivery_count") == count for e in timeline.events
            ):
                timeline.add(self._event("leased", held.leased_at, delivery_count=count))
            if held is not None and held.renewals:
                timeline.add(
                    self._event(
                        "renewed",
                        held.last_renewal_at or now,
                        delivery_count=count,
                        renewals=held.renewals,
                        lateness=_ms(held.last_lateness),
                    )
                )
            timeline.add(self._event("lost", at, delivery_count=count, reason=reason))
            # Found late (a redelivery may have been seen first): keep the story's order.
            timeline.events.sort(key=event_order)

    @hookimpl
    def leasekit_lease_completed(self, lease: Lease) -> None:
        """A lease held here was completed."""
        self._settled(lease, "completed")

    @hookimpl
    def leasekit_lease_abandoned(self, lease: Lease, delay: float) -> None:
        """A lease held here was abandoned."""
        self._settled(lease, "abandoned")

    @hookimpl
    def leasekit_lease_dead_lettered(self, lease: Lease, reason: str) -> None:
        """A lease held here was dead-lettered."""
        self._settled(lease, "dead-lettered")

    def _settled(self, lease: Lease, how: str) -> None:
        now = self._clock()
        with self._lock:
            held = self._held.pop(lease, None)
            timeline = self._timelines.get((lease.queue.name, lease.message.id))
            if timeline is not None:
                renewals = 0 if held is None else held.renewals
                timeline.add(
                    self._event(
                        how,
                        now,
                        delivery_count=lease.message.delivery_count,
                        renewals=renewals,
                    )
                )

    def _timeline(self, key: tuple[str, str]) -> _Timeline:
        timeline = self._timelines[key] = _Timeline(*key)
        while len(self._timelines) > MAX_TIMELINES:
            self._timelines.popitem(last=False)
        return timeline

    def _event(self, kind: str, at: float, **details: Any) -> dict[str, Any]:
        return {"event": kind, "at": round(at, 3), "consumer": self._label, **details}

    # ------------------------------------------------------------- report

    def snapshot(self) -> dict[str, Any]:
        """The leases held now and the timelines, as JSON-ready data (ids and timings only)."""
        now = self._clock()
        with self._lock:
            held = list(self._held.items())
            timelines = [
                {"queue": t.queue, "message_id": t.message_id, "events": list(t.events)}
                for t in reversed(self._timelines.values())
            ]
            dropped = self._dropped
        held.sort(key=lambda item: item[1].leased_at)
        leases: list[dict[str, Any]] = []
        for lease, entry in held:
            leases.append(
                {
                    "queue": entry.queue,
                    "message_id": entry.message_id,
                    "delivery_count": entry.delivery_count,
                    "leased_at": round(entry.leased_at, 3),
                    "expires_at": round(lease.expires_at.timestamp(), 3),
                    "time_left": _ms(lease.time_left),
                    "renewals": entry.renewals,
                    "last_renewal_at": None
                    if entry.last_renewal_at is None
                    else round(entry.last_renewal_at, 3),
                    "last_lateness": _ms(entry.last_lateness),
                    "checkpoint_age": None
                    if entry.checkpoint_at is None
                    else _ms(now - entry.checkpoint_at),
                    "state": lease.state.name.lower(),
                }
            )
        return {
            "consumer": {"label": self._label, "host": self._host, "pid": self._pid},
            "at": round(now, 3),
            "leases": leases,
            "leases_not_listed": dropped,
            "timelines": timelines,
        }


#: Where an event goes among events of the same moment and delivery.
_RANK = {"leased": 0, "renewed": 1, "lost": 2, "redelivered": 3}


def event_order(event: dict[str, Any]) -> tuple[int, float, int]:
    """Sort key of a timeline's events: by delivery, then time, then what happened."""
    count = event.get("delivery_count")
    at = event.get("at")
    return (
        count if isinstance(count, int) else 0,
        at if isinstance(at, int | float) else 0.0,
        _RANK.get(str(event.get("event")), 4),
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)
