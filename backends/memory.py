"""The in-memory backend: leasekit's reference semantics, for tests and prototypes.

URLs:
    ``memory://orders`` — queue ``orders`` in the process-wide default broker.
    Keyword form: ``leasekit.open("memory", queue="orders", broker=..., clock=...)``.
    Give a :class:`MemoryBroker` (or a ``clock``, e.g. :class:`leasekit.ManualClock`)
    to isolate tests or to control time: with a manual clock, lease expiry happens
    when the test advances the clock, with no sleeping.

Delivery semantics:
    At least once. A leased message is invisible until its lease ends, then comes
    back with a new receipt and ``delivery_count + 1``. Each delivery has its own
    receipt; a stale one is refused (``LeaseLost``). A receipt whose lease expired
    but whose message nobody re-leased still works. Renew keeps the receipt unless
    ``rotate_receipts=True`` (which imitates Azure Storage Queue's pop receipts).
    Checkpoints are native: kept with the message (up to ``max_message_size``
    bytes), handed to every later holder, dropped with the message.
    Delivery order: by visibility time, then send order.
    Ordered groups (``send(..., group=...)``, ``capabilities.ordered``): a group's
    messages wait behind its oldest one (the head), which is handed out when it
    is visible; while it is leased (or abandoned with a delay) the group waits,
    and it is handed out again, before the rest, until it is completed or
    dead-lettered. One message per group per receive.

Limits:
    Leases 0.01 s – 7 days at millisecond resolution; 256 messages per receive,
    delete, renew and send call; bodies up to ``max_message_size`` (256 KiB by
    default); long polls wake on arrival. ``Queue.stats()`` counts are exact:
    visible, leased, delayed (sent with a delay, or abandoned with one),
    dead-lettered, and their total.

Raw types:
    ``lease.raw`` is ``None``; errors are :class:`leasekit.spi.DriverError`.

Errors:
    Unknown queue → ``QueueNotFound``; stale, expired-and-redelivered, completed
    or TTL-expired receipt → ``LeaseLost``.
"""

from __future__ import annotations

import heapq
import itertools
import secrets
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from leasekit import dead_letter_format as marks
from leasekit.capabilities import Capabilities
from leasekit.clock import Clock, SystemClock, to_datetime
from leasekit.errors import InvalidURL
from leasekit.hookspecs import hookimpl
from leasekit.options import as_bool, as_int, as_object
from leasekit.registry import BackendSpec
from leasekit.spi import (
    CheckpointEntry,
    DeadLetter,
    Driver,
    DriverError,
    ErrorCode,
    OutgoingMessage,
    QueueStats,
    RawMessage,
    Visibility,
)

__all__ = ["MemoryBroker", "MemoryDeadLetters", "MemoryDriver"]

WEEK = 7 * 24 * 3600.0
#: Per-call batch limit: large enough that batching pays, small enough that one
#: call never holds the broker lock for long.
BATCH = 256
#: How often a waiting receive re-checks the clock when nothing notified it
#: (expiry of someone else's lease does not notify).
WAIT_TICK = 0.02


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``memory``."""
    return [
        BackendSpec(
            name="memory",
            driver="leasekit.backends.memory:MemoryDriver",
            description="in-process queues for tests and prototypes (injectable clock)",
        )
    ]


@dataclass
class _Record:
    id: str
    body: bytes
    properties: dict[str, str]
    enqueued_at: float
    visible_at: float
    expires_at: float | None
    seq: int
    delivery_count: int = 0
    receipt: str | None = None
    checkpoint: bytes | None = None
    version: int = 0
    #: Key of this record's live heap entry (may be earlier than visible_at: lazy).
    heap_at: float = 0.0
    #: The ordered group (``None``: unordered). A grouped record is never on the
    #: queue's heap: its group is, keyed by its head.
    group: str | None = None


@dataclass
class _Dead:
    """A dead letter, and its lease while a re-drive moves it (``receipt`` ``None``: free)."""

    letter: DeadLetter
    visible_at: float = 0.0
    receipt: str | None = None


@dataclass
class _MemoryQueue:
    records: dict[str, _Record] = field(default_factory=dict)
    heap: list[tuple[float, int, str, int]] = field(default_factory=list)
    dead: list[_Dead] = field(default_factory=list)
    #: Ordered groups: each group's records in send order (the head first).
    groups: dict[str, deque[_Record]] = field(default_factory=dict)
    #: Groups by their head's visibility time, then its seq (lazy, like ``heap``).
    group_heap: list[tuple[float, int, str, int]] = field(default_factory=list)
    #: Per group: (version, key) of its live ``group_heap`` entry.
    group_entry: dict[str, tuple[int, float]] = field(default_factory=dict)

    def file_group(self, group: str) -> None:
        """File ``group`` in the group heap at its head's visibility time (superseding)."""
        records = self.groups.get(group)
        if not records:
            self.groups.pop(group, None)
            self.group_entry.pop(group, None)
            return
        head = records[0]
        version = self.group_entry.get(group, (0, 0.0))[0] + 1
        self.group_entry[group] = (version, head.visible_at)
        heapq.heappush(self.group_heap, (head.visible_at, head.seq, group, version))

    def add(self, rec: _Record) -> None:
        """A sent record: on the heap, or at the end of its group."""
        self.records[rec.id] = rec
        if rec.group is None:
            self.push(rec)
            return
        records = self.groups.setdefault(rec.group, deque())
        records.append(rec)
        if len(records) == 1:
            self.file_group(rec.group)

    def remove(self, rec: _Record) -> None:
        """Drop ``rec`` (completed, dead-lettered, expired); its group's next one becomes head."""
        self.records.pop(rec.id, None)
        if rec.group is None:
            return
        records = self.groups.get(rec.group)
        if not records:
            return
        if records[0] is rec:
            records.popleft()
            self.file_group(rec.group)
        else:
            records.remove(rec)

    def push(self, rec: _Record) -> None:
        """File ``rec`` in the heap at its ``visible_at`` (superseding its older entry)."""
        rec.version += 1
        rec.heap_at = rec.visible_at
        heapq.heappush(self.heap, (rec.visible_at, rec.seq, rec.id, rec.version))
        if len(self.heap) > 4 * len(self.records) + 1024:
            # Superseded entries pile up under heavy abandon traffic; rebuild.
            free = [r for r in self.records.values() if r.group is None]
            for r in free:
                r.version += 1
                r.heap_at = r.visible_at
            self.heap = [(r.visible_at, r.seq, r.id, r.version) for r in free]
            heapq.heapify(self.heap)

    def move(self, rec: _Record, visible_at: float) -> None:
        """Change when ``rec`` becomes visible.

        Later than its heap entry: just record it (a renewal costs no heap
        operation; the entry is re-filed when it reaches the top). Earlier: re-file now.
        """
        rec.visible_at = visible_at
        if rec.group is not None:
            # Only a head is ever leased; earlier than its group's entry: re-file now.
            entry = self.group_entry.get(rec.group)
            if entry is not None and visible_at < entry[1]:
                self.file_group(rec.group)
            return
        if visible_at < rec.heap_at:
            self.push(rec)


class MemoryBroker:
    """A set of named in-memory queues sharing one clock; thread-safe.

    Parameters
    ----------
        clock: the time source for every lease, delay and TTL (wall clock by default).
    """

    _default: MemoryBroker | None = None
    _by_clock: weakref.WeakKeyDictionary[Clock, MemoryBroker] = weakref.WeakKeyDictionary()
    _class_lock = threading.Lock()

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self.queues: dict[str, _MemoryQueue] = {}
        self.cond = threading.Condition(threading.Lock())
        self._seq = itertools.count()

    def __repr__(self) -> str:
        return f"<MemoryBroker queues={sorted(self.queues)} clock={self.clock!r}>"

    @classmethod
    def default(cls) -> MemoryBroker:
        """The process-wide broker behind ``memory://`` URLs."""
        with cls._class_lock:
            if cls._default is None:
                cls._default = MemoryBroker()
            return cls._default

    @classmethod
    def for_clock(cls, clock: Clock) -> MemoryBroker:
        """The broker that uses ``clock`` (one per clock object)."""
        with cls._class_lock:
            broker = cls._by_clock.get(clock)
            if broker is None:
                broker = cls._by_clock[clock] = MemoryBroker(clock)
            return broker

    def next_seq(self) -> int:
        """A new sequence number (send order)."""
        return next(self._seq)


def _not_found(queue: str) -> DriverError:
    return DriverError(
        ErrorCode.QUEUE_NOT_FOUND, f"queue {queue!r} does not exist", backend_code="QueueNotFound"
    )


def _lost(what: str) -> DriverError:
    return DriverError(ErrorCode.LEASE_LOST, what, backend_code="LeaseLost")


def _too_large(size: int, limit: int) -> DriverError:
    return DriverError(
        ErrorCode.TOO_LARGE,
        f"a checkpoint of {size} bytes is over this queue's {limit}-byte limit",
        backend_code="CheckpointTooLarge",
    )


#: The defaults (shown by ``leasekit backends``); options can change some per queue.
CAPABILITIES = Capabilities(
    min_lease=0.01,
    max_lease=WEEK,
    lease_resolution=0.001,
    renew_rotates_receipt=False,
    detects_stale_receipts=True,
    expired_receipt_usable=True,
    max_receive_batch=BATCH,
    max_delete_batch=BATCH,
    max_renew_batch=BATCH,
    max_send_batch=BATCH,
    max_message_size=256 * 1024,
    max_wait=1.0,
    max_abandon_delay=WEEK,
    max_send_delay=WEEK,
    max_ttl=365 * 24 * 3600.0,
    supports_properties=True,
    reports_oldest_age=True,
    native_dead_letter=True,
    delivery_count=True,
    queue_stats=True,
    counts=frozenset({"visible", "leased", "delayed", "dead_lettered"}),
    inspect_dead_letters=True,
    native_checkpoint=True,
    ordered=True,
)


class MemoryDriver(Driver):
    """Driver for one in-memory queue.

    Parameters
    ----------
        queue: the queue name.
        broker: the broker holding the queue (the default broker if ``None``).
        clock: a clock; selects the broker for that clock if ``broker`` is not given.
        rotate_receipts: give a new receipt on every renew (imitates Azure pop receipts).
        max_message_size: the largest body in bytes.
    """

    scheme = "memory"
    capabilities = CAPABILITIES

    def __init__(
        self,
        queue: str,
        broker: MemoryBroker | None = None,
        clock: Clock | None = None,
        rotate_receipts: bool | str = False,
        max_message_size: int | str = 256 * 1024,
    ) -> None:
        if not isinstance(queue, str) or not queue:
            raise InvalidURL("memory: a queue name is required (memory://NAME)")
        if broker is not None:
            as_object(broker, "broker", kind=MemoryBroker, what="a MemoryBroker")
        if clock is not None:
            as_object(clock, "clock", methods=("time",), what="a clock (with a time() method)")
        if broker is not None and clock is not None and broker.clock is not clock:
            raise InvalidURL("memory: give either broker or clock, not both")
        self._rotate = as_bool(rotate_receipts, "rotate_receipts")
        size = as_int(max_message_size, "max_message_size", minimum=1)
        if broker is None and clock is not None:
            try:
                broker = MemoryBroker.for_clock(clock)
            except TypeError:  # the per-clock brokers are kept by weak reference
                raise InvalidURL(
                    "memory: option clock must be an object that can be weakly referenced"
                ) from None
        self.queue = queue
        self.broker = broker or MemoryBroker.default()
        self._clock = self.broker.clock
        self.capabilities = CAPABILITIES.replace(
            renew_rotates_receipt=self._rotate, max_message_size=size
        )

    def __repr__(self) -> str:
        return f"<MemoryDriver {self.queue!r}>"

    # --------------------------------------------------------------- messages

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Add messages, under one lock."""
        broker = self.broker
        with broker.cond:
            q = self._q()
            now = self._clock.time()
            ids: list[str | BaseException] = []
            for message in messages:
                message_id = secrets.token_hex(12)
                rec = _Record(
                    id=message_id,
                    body=message.body,
                    properties=dict(message.properties),
                    enqueued_at=now,
                    visible_at=now + message.delay,
                    expires_at=now + message.ttl if message.ttl is not None else None,
                    seq=broker.next_seq(),
                    group=message.group,
                )
                q.add(rec)
                ids.append(message_id)
            broker.cond.notify_all()
            return ids

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """Lease up to ``max_messages``; wait up to ``wait`` seconds for the first."""
        broker = self.broker
        with broker.cond:
            remaining = wait
            while True:
                out = self._receive_now(max_messages, visibility)
                if out or remaining <= 0:
                    return out
                tick = min(remaining, WAIT_TICK)
                broker.cond.wait(tick)
                remaining -= tick

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """Hide each message for ``seconds`` from now (0: visible at once), under one lock."""
        results: list[Visibility | BaseException] = []
        with self.broker.cond:
            q = self._q()
            now = self._clock.time()
            until = to_datetime(now + seconds)
            for receipt in receipts:
                try:
                    rec = self._held(q, receipt, now)
                except DriverError as exc:
                    results.append(exc)
                    continue
                q.move(rec, now + seconds)
                if self._rotate:
                    rec.receipt = f"{rec.id}:{secrets.token_hex(8)}"
                assert rec.receipt is not None
                results.append(Visibility(rec.receipt, until))
            if seconds <= 0:
                self.broker.cond.notify_all()
        return results

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """Delete the leased messages, under one lock."""
        results: list[BaseException | None] = []
        with self.broker.cond:
            q = self._q()
            now = self._clock.time()
            for receipt in receipts:
                try:
                    rec = self._held(q, receipt, now)
                except DriverError as exc:
                    results.append(exc)
                    continue
                q.remove(rec)
                if rec.group is not None:
                    self.broker.cond.notify_all()  # its group's next message is free now
                results.append(None)
        return results

    # ------------------------------------------------------------------ admin

    def create_queue(self) -> None:
        """Create the queue if missing."""
        with self.broker.cond:
            self.broker.queues.setdefault(self.queue, _MemoryQueue())

    def delete_queue(self) -> None:
        """Drop the queue and its messages."""
        with self.broker.cond:
            self.broker.queues.pop(self.queue, None)
            self.broker.cond.notify_all()

    # ---------------------------------------------------------------- helpers

    def _q(self) -> _MemoryQueue:
        q = self.broker.queues.get(self.queue)
        if q is None:
            raise _not_found(self.queue)
        return q

    def _held(self, q: _MemoryQueue, receipt: str, now: float) -> _Record:
        message_id = receipt.partition(":")[0]
        rec = q.records.get(message_id)
        if rec is None:
            raise _lost(f"message {message_id!r} is gone (completed or expired)")
        if rec.expires_at is not None and rec.expires_at <= now:
            q.remove(rec)
            raise _lost(f"message {message_id!r} expired (time-to-live)")
        if rec.receipt != receipt:
            raise _lost(f"receipt for {message_id!r} is stale: the message was leased again")
        return rec

    def _receive_now(self, max_messages: int, visibility: float) -> list[RawMessage]:
        q = self._q()
        now = self._clock.time()
        out: list[RawMessage] = []
        heap, groups = q.heap, q.group_heap
        while len(out) < max_messages:
            # The earlier of the next free message and the next group's head.
            free = bool(heap) and heap[0][0] <= now
            grouped = bool(groups) and groups[0][0] <= now
            if grouped and (not free or groups[0][:2] < heap[0][:2]):
                rec = self._next_head(q, now)
            elif free:
                rec = self._next_free(q, now)
            else:
                break
            if rec is None:
                continue
            rec.delivery_count += 1
            rec.receipt = f"{rec.id}:{secrets.token_hex(8)}"
            rec.visible_at = now + visibility
            if rec.group is None:
                q.push(rec)
            else:
                q.file_group(rec.group)  # held: the group waits until the head's lease ends
            out.append(
                RawMessage(
                    id=rec.id,
                    body=rec.body,
                    receipt=rec.receipt,
                    delivery_count=rec.delivery_count,
                    enqueued_at=to_datetime(rec.enqueued_at),
                    visible_until=to_datetime(rec.visible_at),
                    properties=dict(rec.properties),
                    checkpoint=rec.checkpoint,
                    group=rec.group,
                )
            )
        return out

    @staticmethod
    def _next_free(q: _MemoryQueue, now: float) -> _Record | None:
        """Pop the heap's top: the unordered record to hand out, or ``None`` (look again)."""
        _, _, message_id, version = heapq.heappop(q.heap)
        rec = q.records.get(message_id)
        if rec is None or rec.version != version:
            return None
        if rec.expires_at is not None and rec.expires_at <= now:
            del q.records[message_id]
            return None
        if rec.visible_at > rec.heap_at:
            # Renewed since it was filed: re-file it at its real time, even if
            # that has passed too, so delivery order stays visibility time, then seq.
            q.push(rec)
            return None
        return rec

    @staticmethod
    def _next_head(q: _MemoryQueue, now: float) -> _Record | None:
        """Pop the group heap's top: the group's head to hand out, or ``None`` (look again)."""
        _, _, group, version = heapq.heappop(q.group_heap)
        entry = q.group_entry.get(group)
        records = q.groups.get(group)
        if entry is None or entry[0] != version or not records:
            return None
        head = records[0]
        if head.expires_at is not None and head.expires_at <= now:
            q.remove(head)  # the next one is head now (re-filed)
            return None
        if head.visible_at > now:  # renewed since filed: the group still waits
            q.file_group(group)
            return None
        return head

    def checkpoint(
        self, entries: Sequence[CheckpointEntry], seconds: float
    ) -> list[Visibility | BaseException]:
        """Keep each checkpoint with its message and hide it for ``seconds``, under one lock."""
        results: list[Visibility | BaseException] = []
        limit = self.capabilities.max_message_size
        with self.broker.cond:
            q = self._q()
            now = self._clock.time()
            until = to_datetime(now + seconds)
            for entry in entries:
                if len(entry.data) > limit:
                    results.append(_too_large(len(entry.data), limit))
                    continue
                try:
                    rec = self._held(q, entry.receipt, now)
                except DriverError as exc:
                    results.append(exc)
                    continue
                rec.checkpoint = bytes(entry.data)
                q.move(rec, now + seconds)
                if self._rotate:
                    rec.receipt = f"{rec.id}:{secrets.token_hex(8)}"
                assert rec.receipt is not None
                results.append(Visibility(rec.receipt, until))
        return results

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        """Release the messages, visible again after ``delay``; their receipts stop working.

        Clearing the receipt is what makes ``stats()`` count a message abandoned with
        a delay as delayed, not leased.
        """
        results: list[BaseException | None] = []
        with self.broker.cond:
            q = self._q()
            now = self._clock.time()
            for receipt in receipts:
                try:
                    rec = self._held(q, receipt, now)
                except DriverError as exc:
                    results.append(exc)
                    continue
                q.move(rec, now + delay)
                rec.receipt = None
                results.append(None)
            if delay <= 0:
                self.broker.cond.notify_all()
        return results

    def dead_letter(self, receipt: str, reason: str, message: RawMessage) -> None:
        """Move the leased message to this queue's dead-letter list."""
        with self.broker.cond:
            q = self._q()
            now = self._clock.time()
            rec = self._held(q, receipt, now)
            q.remove(rec)
            letter = DeadLetter(
                id=rec.id,
                body=rec.body,
                reason=reason,
                delivery_count=rec.delivery_count,
                properties=dict(rec.properties),
                enqueued_at=to_datetime(now),
                group=rec.group,
            )
            q.dead.append(_Dead(letter))
            if rec.group is not None:
                self.broker.cond.notify_all()

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        """The oldest ``limit`` dead letters."""
        with self.broker.cond:
            return [dead.letter for dead in self._q().dead[:limit]]

    def dead_letters_after(self, after: str, limit: int) -> list[DeadLetter]:
        """The ``limit`` dead letters after the one with id ``after``."""
        with self.broker.cond:
            dead = self._q().dead
            for index, entry in enumerate(dead):
                if entry.letter.id == after:
                    return [d.letter for d in dead[index + 1 : index + 1 + limit]]
        raise KeyError(after)

    def dead_letter_store(self) -> MemoryDeadLetters:
        """The dead letters of this queue, leased and deleted like messages (for re-driving)."""
        return MemoryDeadLetters(self.queue, self.broker)

    def stats(self) -> QueueStats:
        """Counts by state."""
        with self.broker.cond:
            q = self._q()
            now = self._clock.time()
            visible = leased = delayed = 0
            oldest: float | None = None
            for rec in q.records.values():
                if rec.expires_at is not None and rec.expires_at <= now:
                    continue
                if oldest is None or rec.enqueued_at < oldest:
                    oldest = rec.enqueued_at
                if rec.visible_at <= now:
                    visible += 1
                elif rec.delivery_count and rec.receipt is not None:
                    leased += 1
                else:
                    delayed += 1
            return QueueStats(
                visible=visible,
                leased=leased,
                delayed=delayed,
                dead_lettered=len(q.dead),
                oldest_age=None if oldest is None else max(0.0, now - oldest),
            )

    def sibling(self, queue: str) -> MemoryDriver:
        """The same broker's queue ``queue``."""
        return MemoryDriver(queue=queue, broker=self.broker, rotate_receipts=self._rotate)


class MemoryDeadLetters(MemoryDriver):
    """The dead letters of one in-memory queue, as a driver: receive leases, delete removes.

    What :meth:`MemoryDriver.dead_letter_store` returns. Sending is refused.
    """

    def __repr__(self) -> str:
        return f"<MemoryDeadLetters {self.queue!r}>"

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Refused: dead letters come from dead-lettering."""
        return [_unsupported("send to a dead-letter store") for _ in messages]

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """Lease up to ``max_messages`` free dead letters, oldest first (``wait`` is not used)."""
        with self.broker.cond:
            q = self._q()
            now = self._clock.time()
            out: list[RawMessage] = []
            for dead in q.dead:
                if len(out) >= max_messages:
                    break
                if dead.visible_at > now:
                    continue
                letter = dead.letter
                dead.receipt = f"{letter.id}:{secrets.token_hex(8)}"
                dead.visible_at = now + visibility
                out.append(
                    RawMessage(
                        id=letter.id,
                        body=letter.body,
                        receipt=dead.receipt,
                        delivery_count=1,
                        enqueued_at=letter.enqueued_at or to_datetime(now),
                        visible_until=to_datetime(dead.visible_at),
                        properties=marks.marked(
                            letter.properties,
                            id=letter.id,
                            reason=letter.reason,
                            delivery_count=letter.delivery_count,
                        ),
                        group=letter.group,
                    )
                )
            return out

    def _holding(self, q: _MemoryQueue, receipt: str) -> _Dead:
        for dead in q.dead:
            if dead.receipt == receipt:
                return dead
        raise _lost(f"dead-letter receipt {receipt!r} is stale or its dead letter is gone")

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """Hide each leased dead letter for ``seconds`` from now."""
        results: list[Visibility | BaseException] = []
        with self.broker.cond:
            q = self._q()
            now = self._clock.time()
            for receipt in receipts:
                try:
                    dead = self._holding(q, receipt)
                except DriverError as exc:
                    results.append(exc)
                    continue
                dead.visible_at = now + seconds
                if seconds <= 0:
                    dead.receipt = None
                results.append(Visibility(receipt, to_datetime(dead.visible_at)))
        return results

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        """Give the leased dead letters back (their receipts stop working)."""
        return [
            result if isinstance(result, BaseException) else None
            for result in self.change_visibility(receipts, delay)
        ]

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """Remove the leased dead letters."""
        results: list[BaseException | None] = []
        with self.broker.cond:
            q = self._q()
            for receipt in receipts:
                try:
                    dead = self._holding(q, receipt)
                except DriverError as exc:
                    results.append(exc)
                    continue
                q.dead.remove(dead)
                results.append(None)
        return results


def _unsupported(what: str) -> DriverError:
    return DriverError(ErrorCode.UNSUPPORTED, f"memory: cannot {what}")
