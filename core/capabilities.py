"""What a backend guarantees, as data that core checks before any backend call."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["COUNT_FIELDS", "Capabilities"]

#: The message counts a :class:`~leasekit.spi.QueueStats` can hold (its field names).
COUNT_FIELDS = ("visible", "leased", "delayed", "dead_lettered", "total")
#: The counts whose sum is ``total`` (core adds it up when the driver counts all three).
_TOTAL_PARTS = frozenset({"visible", "leased", "delayed"})


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """The limits and guarantees of one backend (or one queue of it).

    Core validates every call against these before it reaches the driver, and
    the conformance suite checks that they are true: a check a backend cannot
    pass is skipped with the reason taken from here.

    Durations are in seconds.
    """

    #: Shortest lease (visibility timeout) the backend accepts.
    min_lease: float = 1.0
    #: Longest lease one receive or renew can set.
    max_lease: float = 43200.0
    #: Durations are rounded *up* to a multiple of this (1.0 for whole seconds).
    lease_resolution: float = 1.0
    #: The receive uses the queue's visibility and a per-lease duration needs an
    #: extra visibility change right after receive (MNS).
    lease_set_after_receive: bool = False
    #: The lock duration is fixed by the queue (Service Bus): renew extends by
    #: exactly this, and a different physical duration is refused. ``None`` if free.
    fixed_lease: float | None = None
    #: Cap on total invisibility since receive (SQS: 12 h). ``None`` if none.
    max_total_lease: float | None = None
    #: Renewing returns a new receipt and invalidates the old one.
    renew_rotates_receipt: bool = False
    #: A stale receipt (message re-leased or completed) is refused by the backend.
    detects_stale_receipts: bool = True
    #: A receipt whose lease expired but whose message nobody re-leased still works.
    expired_receipt_usable: bool = False
    #: Most messages one receive call returns.
    max_receive_batch: int = 1
    #: Most receipts one delete call settles (1 = no batch form).
    max_delete_batch: int = 1
    #: Most receipts one visibility change renews (1 = no batch form).
    max_renew_batch: int = 1
    #: Most messages one send call takes (1 = no batch form).
    max_send_batch: int = 1
    #: Most bytes of bodies and property names and values one send call takes
    #: together (MNS: 64 KiB of text, i.e. 49,152 body bytes); ``None``: only the
    #: per-message limit. Core splits ``send_many`` batches to stay within it.
    max_send_batch_bytes: int | None = None
    #: Largest body in bytes, as the caller gives it (after any encoding overhead).
    max_message_size: int = 65536
    #: Longest a single receive may wait for messages; 0 if the backend cannot long-poll.
    max_wait: float = 0.0
    #: A receive's wait is a multiple of this (SQS, MNS: whole seconds); core asks
    #: for the whole part of what is left and polls for the rest. 0: any wait.
    wait_resolution: float = 0.0
    #: Longest delay on abandon; 0 if abandon cannot be delayed.
    max_abandon_delay: float = 0.0
    #: Shortest time an abandoned message stays hidden: ``abandon(delay)`` makes it
    #: visible again after ``max(delay, min_abandon_delay)``. MNS: 1 s (it refuses a
    #: visibility of 0). 0 where an abandoned message is visible again at once.
    min_abandon_delay: float = 0.0
    #: Longest delay before a sent message becomes visible; 0 if unsupported.
    max_send_delay: float = 0.0
    #: Longest time-to-live on send; ``None`` if TTL is not supported.
    max_ttl: float | None = None
    #: A message's time-to-live ends it even while it is leased (renewal cannot
    #: keep it alive). Service Bus: ``False`` (a locked message outlives its TTL
    #: until the lock ends).
    ttl_ends_lease: bool = True
    #: Messages carry string properties.
    supports_properties: bool = True
    #: ``stats()`` reports ``oldest_age`` (the age of the oldest message in the queue).
    reports_oldest_age: bool = False
    #: Property text (and a dead-letter reason) may hold NUL (U+0000). PostgreSQL's
    #: text cannot; where this is False core refuses a NUL before any call.
    properties_hold_nul: bool = True
    #: The backend dead-letters natively (else core moves to ``<queue>-poison``).
    native_dead_letter: bool = False
    #: ``delivery_count`` is exact (1 on first delivery, +1 per redelivery).
    delivery_count: bool = True
    #: ``stats()`` works: the backend reports some message counts (which ones: ``counts``).
    queue_stats: bool = False
    #: The counts the driver's ``stats()`` reports, as :data:`COUNT_FIELDS` names
    #: (``"visible"``, ``"leased"``, ``"delayed"``, ``"dead_lettered"``, ``"total"``);
    #: it leaves the others ``None``. Core derives more (see :attr:`counted`), and the
    #: conformance suite checks each counted one as messages are sent, leased,
    #: completed, delayed and dead-lettered.
    counts: frozenset[str] = frozenset()
    #: Dead-lettered messages can be read back (``Queue.peek_dead_letters``).
    inspect_dead_letters: bool = False
    #: The backend keeps a checkpoint with the message (``Driver.checkpoint``):
    #: ``Lease.checkpoint`` needs no store (see :mod:`leasekit.checkpoints`).
    native_checkpoint: bool = False
    #: Messages may be sent in ordered groups (``send(..., group=...)``): while a
    #: message of a group is leased no other of that group is handed out, a group's
    #: messages come in the order they were sent, and a head whose lease ended
    #: comes back first (see ``docs/ordering.md``). ``False``: ``group`` is refused.
    ordered: bool = False
    #: The backend keeps a state per ordered group that the holder of a lease of
    #: that group may read and replace (``Lease.group_state()`` /
    #: ``Lease.set_group_state()``; Service Bus session state).
    group_state: bool = False
    #: The backend drops a second message with the same deduplication id within
    #: its window, and takes the caller's id (``send(..., dedup_key=...)``; SQS FIFO).
    deduplicates: bool = False

    def __post_init__(self) -> None:
        if not (0 <= self.min_lease <= self.max_lease):
            raise ValueError("Capabilities: need 0 <= min_lease <= max_lease")
        if self.lease_resolution <= 0 or not math.isfinite(self.lease_resolution):
            raise ValueError("Capabilities: lease_resolution must be positive")
        if self.min_abandon_delay < 0 or (0 < self.max_abandon_delay < self.min_abandon_delay):
            raise ValueError("Capabilities: need 0 <= min_abandon_delay <= max_abandon_delay")
        for name in ("max_receive_batch", "max_delete_batch", "max_renew_batch", "max_send_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"Capabilities: {name} must be at least 1")
        if self.max_send_batch_bytes is not None and self.max_send_batch_bytes < 1:
            raise ValueError("Capabilities: max_send_batch_bytes must be at least 1 or None")
        if isinstance(self.counts, str) or not all(isinstance(c, str) for c in self.counts):
            raise ValueError(f"Capabilities: counts must be a set of names, got {self.counts!r}")
        # A frozen dataclass: store any set of names as the frozenset it is declared as.
        object.__setattr__(self, "counts", frozenset(self.counts))
        unknown = sorted(self.counts.difference(COUNT_FIELDS))
        if unknown:
            raise ValueError(
                f"Capabilities: unknown count(s) {', '.join(unknown)}; "
                f"counts are {', '.join(COUNT_FIELDS)}"
            )
        if self.counts and not self.queue_stats:
            raise ValueError("Capabilities: counts need queue_stats=True")

    @property
    def counted(self) -> frozenset[str]:
        """The counts :meth:`leasekit.Queue.stats` fills in; the others stay ``None``.

        The driver's :attr:`counts`, plus what core derives from them: ``total``
        (visible + leased + delayed) when the driver counts all three, and, where
        core dead-letters to ``<queue>-poison`` (``native_dead_letter=False``),
        ``dead_lettered`` (that queue's total) when ``total`` is known.
        """
        counted = set(self.counts)
        if counted >= _TOTAL_PARTS:
            counted.add("total")
        if not self.native_dead_letter and "total" in counted:
            counted.add("dead_lettered")
        return frozenset(counted)

    def clamp_lease(self, seconds: float) -> float:
        """``seconds`` moved into the backend's lease range (``min_lease`` to ``max_lease``).

        For a wanted duration that is a preference, not the caller's argument
        (a default, a policy's guess): an argument out of range is refused
        instead (``InvalidLeaseDuration``).
        """
        return min(max(seconds, self.min_lease), self.max_lease)

    def replace(self, **changes: Any) -> Capabilities:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The capabilities as a plain dict (for JSON and the CLI); sets become sorted lists."""
        return {
            key: sorted(value) if isinstance(value, frozenset) else value
            for key, value in dataclasses.asdict(self).items()
        }
