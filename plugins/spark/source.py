"""The streaming source: leases on the driver, rows in the partitions, complete on commit.

Where each part runs (PySpark's Python Data Source API, observed on Spark 4.3):

* ``__init__`` runs in two or three processes: it only parses options (no I/O).
* ``initialOffset``, ``latestOffset``, ``partitions``, ``commit`` and ``stop`` run
  in **one long-lived driver-side Python process** per query. That process
  opens the queue, leases, and holds every uncommitted lease in a
  :class:`~leasekit.LeaseKeeper` (the "planner state", dropped on pickling).
* ``read`` runs in executor Python workers. It never touches the queue: the
  leased messages travel inside the pickled :class:`LeasedPartition` objects.

Offsets are ``{"run": str, "seq": int, "messages": int}``: ``seq`` counts the
batches this query has planned (over all its runs), ``messages`` the messages
leased so far, and ``run`` names the planner process that leased them (a
random token made on its first call). The rows of batch ``seq`` exist only in
the memory of run ``run``.

The guarantee (at least once):

1. ``latestOffset(start)`` leases up to ``maxMessagesPerBatch`` messages, puts
   them in the keeper and returns ``seq + 1``. Asked again with the same start
   before planning, it returns the same end (nothing more is leased).
2. ``partitions(start, end)`` ships the batch's messages to the executors,
   then (``prefetch``, default on) leases the next batch in a background
   thread while this one runs; those leases are held by the keeper too and
   become the next batch.
3. Spark calls ``commit(end of batch N)`` when it plans batch N+1, after batch
   N's output was committed by the sink. Only then are batch N's messages
   completed (``Queue.complete_many``, in the backend's delete batches, on the
   background thread, before its next prefetch; ``stop()`` waits for it). When the
   queue goes idle, the source returns **one empty heartbeat offset** so that
   Spark plans one more (empty) batch and commits the last real one.
4. A query that fails or is stopped before that commit never completes the
   batch's messages. On a graceful stop (SIGTERM to the planner process, or
   ``stop()``) the source abandons its uncommitted and prefetched leases (``releaseOnStop``,
   default on), so the messages are visible again at once; if the process dies
   harder (SIGKILL, lost machine), the keeper dies with it and the leases lapse
   after at most ``leaseDuration`` seconds. Either way the messages come back
   with ``delivery_count + 1`` and a later batch delivers them.
5. On restart Spark re-plans the uncommitted batch from the checkpoint with the
   same offsets in a new planner process that holds no leases for it. That
   batch is **replayed empty**: the source never fabricates rows it does not
   hold. Its messages are delivered by later batches once they come back (4.).
   ``commit`` of an end offset the process does not hold is a no-op.

So: every message is delivered in at least one batch whose sink output Spark
committed before the message was completed; no message is completed before
that. A message may be delivered more than once — in a batch that failed, in
a batch that succeeded but whose source commit never came (a stop between the
sink's commit and the next planning), or when a lease was lost (renewals kept
failing) before the commit. Make the sink idempotent on ``id``, which is stable
across redeliveries (e.g. ``dropDuplicates(["id"])``, a MERGE on ``id``).
Batch ``N`` of a restarted query is not the same rows as batch ``N`` of the
failed run: do not key idempotency on Spark's batch id alone.

``Trigger.AvailableNow`` (PySpark's ``SupportsTriggerAvailableNow``): Spark calls
``prepareForTriggerAvailableNow`` in the planner process when the run starts.
It takes a **bound**: the wall-clock time, and the queue's visible count from
``Queue.stats()`` (``total`` where the backend counts only that; no count where
it counts neither). From then on ``latestOffset`` (and the prefetch) receive at
most that many messages in the whole run, and a received message sent after the
bound (``enqueued_at`` later) is abandoned at once, so it is visible again for
the next run. When the count is spent, or a receive brings nothing inside the
bound, the bound is *done*: the source returns the heartbeat that commits the
last batch, then ``start``, and Spark stops the query (and calls ``stop()``,
which releases anything still held). On ``sqlite`` and ``memory`` (delivery
order: visibility time, then send order) with no other consumer, the run takes
exactly the messages visible when it started; elsewhere the bound is
approximate (see ``docs/spark.md``). A restarted run takes a new bound.
"""

from __future__ import annotations

import logging
import math
import secrets
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from leasekit import errors
from leasekit.clock import to_datetime
from leasekit.errors import InvalidArgument
from leasekit.keeper import LeaseKeeper
from leasekit.lease import Lease
from leasekit.message import LeaseState
from leasekit.queue import MAX_LEASE_BATCH, Queue

from ._options import QueueOptions, bool_option, float_option, int_option

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = [
    "DEFAULT_MAX_MESSAGES",
    "DEFAULT_PARTITIONS",
    "SCHEMA",
    "AvailableNowBound",
    "LeasedPartition",
    "LeasekitStreamReader",
    "source_schema",
]

_log = logging.getLogger("leasekit.spark")

#: The source's schema (``body`` is the raw bytes; cast it to string yourself).
SCHEMA = (
    "id STRING, body BINARY, delivery_count INT, enqueued_at TIMESTAMP, "
    "properties MAP<STRING, STRING>"
)


def source_schema() -> StructType:
    """:data:`SCHEMA` as a ``StructType`` (built without a SparkContext)."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructType(
        [
            StructField("id", StringType()),
            StructField("body", BinaryType()),
            StructField("delivery_count", IntegerType()),
            StructField("enqueued_at", TimestampType()),
            StructField("properties", MapType(StringType(), StringType())),
        ]
    )


#: Messages one micro-batch leases at most (option ``maxMessagesPerBatch``).
#: Per-batch cost is mostly fixed (planning, task launch, commit), so bigger
#: batches give more throughput; all of a batch's leases stay held (and
#: renewed) in the driver-side process until the batch commits.
DEFAULT_MAX_MESSAGES = 1000
#: Spark partitions (tasks) per micro-batch (option ``numPartitions``); never
#: more than the batch has messages.
DEFAULT_PARTITIONS = 2
#: Seconds a graceful stop spends abandoning uncommitted leases before it lets
#: the rest lapse (the process is being terminated: stay short).
RELEASE_BUDGET = 5.0
#: Threads abandoning leases on stop: a remote backend's round trip, not CPU,
#: bounds how many leases the budget releases.
RELEASE_THREADS = 8


def _offset(run: str, seq: int, messages: int) -> dict[str, Any]:
    return {"run": run, "seq": seq, "messages": messages}


def _seq(offset: Mapping[str, Any]) -> int:
    return int(offset.get("seq", 0))


@dataclass(repr=False)
class LeasedPartition(InputPartition):
    """One Spark task's share of a micro-batch: the leased messages, column by column.

    Pickled by the driver-side process and read on an executor; it holds plain
    data only (no lease, no queue, no client).
    """

    batch: int
    index: int
    ids: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    delivery_counts: list[int] = field(default_factory=list)
    #: Microseconds since the epoch (UTC), what Spark's TIMESTAMP holds.
    enqueued_at: list[int] = field(default_factory=list)
    properties: list[list[tuple[str, str]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"LeasedPartition(batch={self.batch}, index={self.index}, messages={len(self)})"

    def append(self, lease: Lease) -> None:
        """Add one leased message's row."""
        message = lease.message
        stamp = message.enqueued_at
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        self.ids.append(message.id)
        self.bodies.append(message.body)
        self.delivery_counts.append(message.delivery_count)
        self.enqueued_at.append(int(stamp.timestamp() * 1_000_000))
        self.properties.append(list(message.properties.items()))

    def to_arrow(self, schema: pa.Schema) -> pa.RecordBatch:
        """The rows as one Arrow record batch of ``schema`` (the source's, as Spark sees it)."""
        import pyarrow as pa

        columns = (self.ids, self.bodies, self.delivery_counts, self.enqueued_at, self.properties)
        arrays = [pa.array(values, type=schema.field(i).type) for i, values in enumerate(columns)]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _utc(stamp: datetime) -> datetime:
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


@dataclass
class AvailableNowBound:
    """What a ``Trigger.AvailableNow`` run may still take: the snapshot made when it began.

    ``since`` is when the run began (the planner machine's wall clock): a
    message sent later is beyond the bound. ``remaining`` is how many more
    messages the run may receive (``None``: the backend counts nothing to bound
    it by); every received message spends one, inside the bound or not.
    ``done`` once the count is spent or a receive brought nothing inside.
    """

    since: datetime
    remaining: int | None
    done: bool = False
    #: Messages received beyond the bound and abandoned (given back at once).
    released: int = 0

    def allow(self, ask: int) -> int:
        """How many of ``ask`` messages the next receive may take (0: none, the run is over)."""
        if self.done:
            return 0
        if self.remaining is None:
            return ask
        return min(ask, self.remaining)

    def split(self, got: Sequence[Lease]) -> tuple[list[Lease], list[Lease]]:
        """Spend the count on ``got``; return the leases inside the bound and those beyond it."""
        inside = [lz for lz in got if _utc(lz.message.enqueued_at) <= self.since]
        beyond = [lz for lz in got if _utc(lz.message.enqueued_at) > self.since]
        if self.remaining is not None:
            self.remaining = max(0, self.remaining - len(got))
        if not inside or self.remaining == 0:
            self.done = True
        return inside, beyond


@dataclass(eq=False)
class _Batch:
    seq: int
    start: int
    leases: list[Lease]
    planned: bool = False


class _Planner:
    """The driver-side state: the queue, the keeper and the uncommitted batches."""

    def __init__(self, reader: LeasekitStreamReader) -> None:
        self.run = secrets.token_hex(6)
        self.queue: Queue = reader.queue_options.open(lease_duration=reader.lease_duration)
        self.duration = self.queue.default_lease_duration
        self.keeper = LeaseKeeper(max_lifetime=reader.max_lease_lifetime)
        self.batches: dict[int, _Batch] = {}
        # Reentrant: the SIGTERM handler runs stop() on the main thread, maybe inside a call.
        self.lock = threading.RLock()
        self.leased = 0
        self.completed = 0
        self.commit_failures = 0
        self.stopped = False
        #: Leased ahead (prefetched) for the next batch, not in any batch yet.
        self.ready: list[Lease] = []
        #: Set by ``prepareForTriggerAvailableNow``: what this run may still take.
        self.bound: AvailableNowBound | None = None
        self.prefetch: Future[None] | None = None
        #: One thread for the queue work that overlaps the running batch: completing
        #: committed batches, then leasing the next one. One thread keeps them in order.
        self.background = ThreadPoolExecutor(1, thread_name_prefix="leasekit-spark")


class LeasekitStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The ``DataSourceStreamReader`` behind ``spark.readStream.format("leasekit")``.

    It supports ``trigger(availableNow=True)``: see :meth:`prepareForTriggerAvailableNow`.

    Options (strings, names case-insensitive):

    ``url``
        the queue URL (required), e.g. ``sqlite:///jobs.db?queue=jobs``.
    ``backend.<name>``
        a keyword option for :func:`leasekit.open` (credentials, endpoints).
    ``leaseDuration``
        the physical lease in seconds (the queue's default if absent); the keeper
        renews it until the batch commits, so this is how long a crashed query's
        messages stay invisible.
    ``maxMessagesPerBatch``
        messages per micro-batch, at most (default 1000).
    ``numPartitions``
        Spark tasks per micro-batch (default 2).
    ``wait``
        seconds ``latestOffset`` long-polls an idle queue (default 0: Spark's
        own trigger polls; raise it on backends that charge per request).
    ``maxLeaseLifetime``
        stop renewing a batch's leases after this many seconds (default: until
        the batch commits); a stuck query then lets its messages go.
    ``prefetch``
        lease the next batch in the background while the current one runs
        (default true): the planner's queue work overlaps the batch. The
        prefetched messages are held (renewed) like a batch's.
    ``releaseOnStop``
        abandon uncommitted leases on a graceful stop (default true).
    ``create``
        create the queue if it is missing (default false).
    """

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        if schema is not None and schema.simpleString() != source_schema().simpleString():
            raise InvalidArgument(
                f"the leasekit source's schema is fixed ({SCHEMA}); got {schema.simpleString()} "
                "(drop .schema(...) and select or cast columns after load())"
            )
        self.schema = schema
        self.queue_options = QueueOptions(options)
        self.lease_duration = float_option(options, "leaseDuration", None, minimum=0)
        self.max_messages = int_option(options, "maxMessagesPerBatch", DEFAULT_MAX_MESSAGES)
        self.num_partitions = int_option(options, "numPartitions", DEFAULT_PARTITIONS)
        self.wait = float_option(options, "wait", 0.0) or 0.0
        self.max_lease_lifetime = float_option(options, "maxLeaseLifetime", None, minimum=0)
        self.prefetch = bool_option(options, "prefetch", True)
        self.release_on_stop = bool_option(options, "releaseOnStop", True)
        self._planner: _Planner | None = None
        self._arrow_schema: pa.Schema | None = None

    # ------------------------------------------------------------- pickling

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_planner"] = None  # queue, keeper, leases, locks: driver-side only
        state["_arrow_schema"] = None
        return state

    # ------------------------------------------------------- driver side

    def _state(self) -> _Planner:
        if self._planner is None:
            self._planner = _Planner(self)
            _install_sigterm(self)
            _log.info(
                "leasekit source %s on %r: %d messages per batch, %g s leases",
                self._planner.run,
                self._planner.queue,
                self.max_messages,
                self._planner.duration,
            )
        return self._planner

    def prepareForTriggerAvailableNow(self) -> None:
        """Bound this run to the messages visible now (``Trigger.AvailableNow``).

        Records the time and the queue's visible count (``Queue.stats()``;
        ``total`` where only that is counted, nothing where neither is). Later
        ``latestOffset`` calls receive at most that many messages, abandon at
        once any received message sent after now, and return ``start`` (after
        one heartbeat that commits the last batch) once the bound is spent, so
        Spark ends the run. Errors from ``stats()`` propagate: the run fails
        before it leased anything.
        """
        planner = self._state()
        since = to_datetime(time.time())
        remaining: int | None = None
        caps = planner.queue.capabilities
        if caps.queue_stats and {"visible", "total"} & caps.counted:
            stats = planner.queue.stats()
            remaining = stats.visible if stats.visible is not None else stats.total
        with planner.lock:
            planner.bound = AvailableNowBound(since, remaining)
        _log.info(
            "leasekit source %s: Trigger.AvailableNow run bound to %s messages sent up to %s",
            planner.run,
            "all visible" if remaining is None else remaining,
            since.isoformat(),
        )

    def initialOffset(self) -> dict[str, Any]:
        """The empty start of a new query (no I/O)."""
        return _offset("", 0, 0)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxMessagesPerBatch)``."""
        return ReadMaxRows(self.max_messages)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Lease the next batch (or return a heartbeat / ``start``); see the module doc."""
        planner = self._state()
        start_seq = _seq(start)
        with planner.lock:
            for batch in planner.batches.values():
                if batch.start == start_seq and not batch.planned:
                    # Asked again before planning: the same batch, nothing more leased.
                    return _offset(
                        planner.run, batch.seq, int(start.get("messages", 0)) + len(batch.leases)
                    )
            waiting = any(b.seq <= start_seq for b in planner.batches.values())
        want = self._limit(limit)
        leases = self._take_ready(planner, want)
        if len(leases) < want:
            leases += self._lease(
                planner, want - len(leases), wait=0.0 if waiting or leases else self.wait
            )
        messages = int(start.get("messages", 0))
        with planner.lock:
            if leases:
                seq = start_seq + 1
                planner.batches[seq] = _Batch(seq, start_seq, leases)
                planner.leased += len(leases)
                return _offset(planner.run, seq, messages + len(leases))
            if waiting:
                # Idle, but a planned batch awaits its commit, which Spark sends only
                # when it plans the next batch: give it one (empty) to plan.
                return _offset(planner.run, start_seq + 1, messages)
        return start

    def _limit(self, limit: ReadLimit) -> int:
        if isinstance(limit, ReadMaxRows) and limit.max_rows > 0:
            return int(limit.max_rows)
        # ReadAllAvailable (or another limit): a queue has no "all" — leasing it
        # whole would hold every message in this process — so lease one batch.
        return self.max_messages

    def _take_ready(self, planner: _Planner, want: int) -> list[Lease]:
        """The prefetched leases (waiting for the prefetch to finish), at most ``want``."""
        future, planner.prefetch = planner.prefetch, None
        if future is not None:
            future.result()  # it logs its own errors; raises only if cancelled
        with planner.lock:
            live = [lz for lz in planner.ready if lz.state is LeaseState.HELD]
            taken, planner.ready = live[:want], live[want:]
        return taken

    def _prefetch(self, planner: _Planner) -> None:
        """Lease the next batch in the background while the current one runs."""
        if not self.prefetch or planner.stopped:
            return
        with planner.lock:
            want = self.max_messages - len(planner.ready)
        if want <= 0:
            return

        def work() -> None:
            try:
                leases = self._lease(planner, want, wait=0.0)
            except Exception as exc:  # the synchronous lease in latestOffset retries
                _log.warning("prefetching the next batch failed: %s", exc)
                return
            with planner.lock:
                planner.ready.extend(leases)

        try:
            planner.prefetch = planner.background.submit(work)
        except RuntimeError:  # shutting down
            planner.prefetch = None

    def _lease(self, planner: _Planner, want: int, *, wait: float) -> list[Lease]:
        leases: list[Lease] = []
        bound = planner.bound
        while len(leases) < want and not planner.stopped:
            ask = min(MAX_LEASE_BATCH, want - len(leases))
            if bound is not None:
                ask = bound.allow(ask)
                if ask == 0:
                    break
            got = planner.queue.lease(ask, duration=planner.duration, wait=0 if leases else wait)
            received = len(got)
            if bound is not None:
                got, beyond = bound.split(got)
                if beyond:
                    self._give_back(planner, bound, beyond)
            if got:
                planner.keeper.add_many(got)  # one receive: renewed together, in one call
            leases.extend(got)
            if received < ask:
                break
        return leases

    def _give_back(self, planner: _Planner, bound: AvailableNowBound, beyond: list[Lease]) -> None:
        """Abandon messages received past the AvailableNow bound: visible again at once."""
        try:
            results = planner.queue.abandon_many(beyond)
        except (errors.LeaseError, errors.LeaseStateError) as exc:
            _log.warning(
                "could not give back %d messages sent after the run began (%s); "
                "they come back when their leases lapse",
                len(beyond),
                exc,
            )
            return
        bound.released += sum(1 for r in results if r is None)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The batch's messages split into ``numPartitions`` picklable partitions.

        A batch this process did not lease (re-planned after a restart) gives
        no partitions: its messages come back to the queue when their old
        leases are released or lapse, and a later batch delivers them.
        """
        seq = _seq(end)
        if seq == _seq(start) or int(end.get("messages", 0)) == int(start.get("messages", 0)):
            return []  # no batch, or a heartbeat (it carries no messages)
        planner = self._state()
        with planner.lock:
            batch = planner.batches.get(seq) if end.get("run") == planner.run else None
            if batch is None:
                _log.warning(
                    "batch %s (run %r) was leased by an earlier planner process that is gone; "
                    "replaying it empty: its messages return to the queue when their leases "
                    "are released or lapse, and a later batch delivers them",
                    seq,
                    end.get("run"),
                )
                return []
            first_time = not batch.planned
            batch.planned = True
            leases = [lz for lz in batch.leases if lz.state is LeaseState.HELD]
        if first_time:
            self._prefetch(planner)
        count = min(self.num_partitions, len(leases))
        if count == 0:
            return []
        size = math.ceil(len(leases) / count)
        parts: list[LeasedPartition] = []
        for index in range(count):
            part = LeasedPartition(seq, index)
            for lease in leases[index * size : (index + 1) * size]:
                part.append(lease)
            if len(part):
                parts.append(part)
        return parts

    def commit(self, end: dict[str, Any]) -> None:
        """Complete the messages of every batch up to ``end`` (Spark committed their output)."""
        planner = self._state()
        seq = _seq(end)
        with planner.lock:
            done = [b for b in planner.batches.values() if b.seq <= seq]
            for batch in done:
                del planner.batches[batch.seq]
        leases = [lz for batch in done for lz in batch.leases]
        if not leases:
            return
        planner.keeper.discard_many(leases)  # one lock round for the batch
        try:
            # Completing overlaps the next batch; the worker runs jobs in order, so
            # this finishes before the prefetch queued after it.
            planner.background.submit(self._settle, planner, leases, seq)
        except RuntimeError:  # shutting down: complete here
            self._settle(planner, leases, seq)

    def _settle(self, planner: _Planner, leases: list[Lease], seq: int) -> None:
        try:
            results = planner.queue.complete_many(leases)
        except (errors.LeaseError, errors.LeaseStateError) as exc:
            planner.commit_failures += len(leases)
            _log.error(
                "could not complete the %d messages of batches up to %s (%s); "
                "they will be delivered again",
                len(leases),
                seq,
                exc,
            )
            return
        failed = [r for r in results if r is not None]
        planner.completed += len(leases) - len(failed)
        if failed:
            planner.commit_failures += len(failed)
            _log.warning(
                "%d of %d messages of batches up to %s were not completed (first: %s); "
                "they may be delivered again",
                len(failed),
                len(leases),
                seq,
                failed[0],
            )

    def stop(self) -> None:
        """Release what this process holds: abandon uncommitted leases, stop the keeper."""
        planner = self._planner
        if planner is None or planner.stopped:
            return
        planner.stopped = True
        # Let queued completions of committed batches finish (else they would be
        # delivered again); a running prefetch stops after its current call.
        planner.background.shutdown(wait=True)
        with planner.lock:
            leases = [lz for b in planner.batches.values() for lz in b.leases]
            leases += planner.ready
            planner.batches.clear()
            planner.ready = []
        try:
            planner.keeper.stop()
            if self.release_on_stop:
                _release(leases, time.monotonic() + RELEASE_BUDGET)
        finally:
            planner.queue.close()

    # ----------------------------------------------------- executor side

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield the partition's rows as one Arrow batch (no queue access here)."""
        if not isinstance(partition, LeasedPartition) or not len(partition):
            return
        if self._arrow_schema is None:
            from pyspark.sql.pandas.types import to_arrow_schema

            self._arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        yield partition.to_arrow(self._arrow_schema)


def _release(leases: Sequence[Lease], deadline: float) -> None:
    """Abandon held leases until ``deadline``; the rest lapse on their own.

    One abandon call per lease (core has no batch abandon), spread over a few
    threads so a remote backend releases more than a handful in the budget.
    """
    held = [lz for lz in leases if lz.state is LeaseState.HELD]
    if not held:
        return

    def release(lease: Lease) -> bool:
        if time.monotonic() >= deadline:
            return False
        try:
            lease.abandon()
        except (errors.LeaseError, errors.LeaseStateError):
            return False
        return True

    with ThreadPoolExecutor(RELEASE_THREADS, thread_name_prefix="leasekit-release") as pool:
        released = sum(pool.map(release, held))
    _log.info("released %d of %d uncommitted leases", released, len(held))


def _install_sigterm(reader: LeasekitStreamReader) -> None:
    """On SIGTERM (Spark stopping the query), leave through ``stop()`` and release leases.

    Spark terminates the driver-side process with SIGTERM when a query stops
    or fails, and its ``finally: reader.stop()`` runs only if the process
    leaves by an exception: turn the signal into one. Only possible in the
    main thread (where Spark's runner calls us); elsewhere leases just lapse.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        # Spark sends SIGTERM more than once; a second one must not interrupt the
        # release (its SystemExit would cut the abandon loop short).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            reader.stop()
        finally:
            raise SystemExit(143)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # pragma: no cover - not the main thread after all
        return
