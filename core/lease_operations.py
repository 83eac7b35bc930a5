"""Making, renewing and settling leases in backend-sized batches: the engine behind leases.

:class:`LeaseOperations` is the one place that acts on held leases for a
:class:`~leasekit.Queue`: it takes each lease from its
:class:`~leasekit.lease_record.LeaseRecord` (the only writer of a lease's
state), splits the receipts into the batches the backend allows, makes each
backend call under a deadline holding no lock, and reports each outcome back
to the record. The queue checks the arguments first and hands over only
leases of its own.

Deadlines: a renewal never outlives the lease it renews (its call's deadline is
the least time left on the leases of its batch). A settle call runs all its
batches under one deadline (its ``timeout``, or the least time left on its
leases, at least :data:`MIN_SETTLE_TIMEOUT`), as does a renewal given a
``timeout``; a batch reached after that deadline passed gets no call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from . import arguments, errors
from .deadline import deadline, time_left
from .events import Events
from .lease import Lease, _raise_first, leases_from_rows
from .lease_record import RENEW, SETTLE, LeaseBatch, LeaseRecord, settled_together, take_together
from .lost_leases import watch as watch_lost
from .message import NO_PROPERTIES, LeaseState, received_message
from .spi import CheckpointEntry, RawMessage, ReceivedRows, Visibility

if TYPE_CHECKING:
    # Type-only: a lease and an event payload name their queue; nothing here calls it.
    from .call_runner import CallRunner
    from .checkpoints import CheckpointStore
    from .queue import Queue

__all__ = ["MIN_SETTLE_TIMEOUT", "LeaseOperations", "SettleSpec"]

T = TypeVar("T")

_log = logging.getLogger("leasekit")

#: Least time a settle call gets even when the lease's time is (nearly) up: a
#: receipt past its expiry may still be honoured, and settling late harms nobody.
MIN_SETTLE_TIMEOUT = 1.0

#: The events of a renewal made without them (no plugin observes these).
_QUIET = Events()
#: One lease taken for an operation: its position in the caller's list, the
#: lease, and the receipt to use.
_Taken = tuple[int, "Lease", str]
#: What one lease operation returns per lease: ``None`` when done, else the error.
_Results = list[errors.LeaseError | errors.LeaseStateError | None]


#: The event pair around every settle (``Events.bracket("settle", ...)``).
_SETTLE_EVENTS = ("leasekit_before_settle", "leasekit_after_settle")


class SettleSpec(NamedTuple):
    """How one kind of settle is done: which backend call, in what batches, reported how.

    A named tuple (not a dataclass): one is made per ``complete_many`` or
    ``abandon_many`` call, and a Consumer makes one per batch it completes.

    Parameters
    ----------
        action: the word for it in errors and the settle events (``"complete"``, ``"abandon"``).
        state: the state a settled lease is left in.
        batch: most receipts one backend call takes.
        call: the driver call for one batch of receipts; one result per receipt.
        hook: the lease event emitted for each settled lease (``leasekit_lease_completed``).
        hook_kwargs: more arguments for ``hook`` (an abandon's ``delay``).
    """

    action: str
    state: LeaseState
    batch: int
    call: Callable[[list[str]], list[BaseException | None]]
    hook: str
    hook_kwargs: Mapping[str, Any] = MappingProxyType({})


class LeaseOperations:
    """Renew, settle and dead-letter the held leases of one queue, batched where the backend can.

    Parameters
    ----------
        owner: the queue whose leases these are: only named (each lease and event
            payload names its queue), never called back into.
        runner: the queue's :class:`~leasekit.call_runner.CallRunner`, through which
            every driver call goes.
        events: where the queue's work reports.
        checkpoint_store: the queue's checkpoint store, or ``None``.
    """

    __slots__ = ("_events", "_owner", "_runner", "_store")

    def __init__(
        self,
        owner: Queue,
        runner: CallRunner,
        events: Events,
        checkpoint_store: CheckpointStore | None,
    ) -> None:
        self._owner = owner
        self._runner = runner
        self._events = events
        self._store = checkpoint_store

    # --------------------------------------------------------------- receive

    def leases_from(
        self, batch: Sequence[RawMessage], seconds: float, started: float
    ) -> list[Lease]:
        """Leases for a received batch; ``started`` is when the receive call began.

        Where the receive could not set the lease duration (MNS), it is set
        right after; a store's checkpoint is read for each message where the
        backend keeps none.
        """
        queue = self._owner
        set_after = self._runner.capabilities.lease_set_after_receive
        store = self._store
        if type(batch) is ReceivedRows:
            if not set_after and store is None:  # plain rows: no RawMessage at all
                return watch_lost(
                    leases_from_rows(queue, batch, seconds, started + seconds, time.monotonic())
                )
            batch = batch.messages()
        leases = []
        now = time.time()
        # One of each per receive, shared by its leases: the lock and events, the
        # receive time, and (unless set after) the deadline.
        shared = LeaseBatch(self._events)
        new_record, new_lease = LeaseRecord.create, Lease._received
        received = time.monotonic()
        deadline = started + seconds
        for raw in batch:
            properties = raw.properties
            if not properties:
                properties = NO_PROPERTIES  # one shared empty mapping, not one per message
            elif type(properties) is not dict:
                properties = dict(properties)
            message = received_message(
                raw.id,
                raw.body,
                raw.delivery_count,
                raw.enqueued_at,
                properties,  # the driver's dict is the message's own (made for this receive)
                raw.checkpoint if store is None else self._stored_checkpoint(raw.id),
                raw.group,
            )
            if set_after:  # the receive used the queue's visibility, not ours
                physical = min(seconds, max(0.0, raw.visible_until.timestamp() - now))
                deadline = started + physical
            record = new_record(raw.receipt, raw.visible_until, deadline, seconds, shared)
            leases.append(new_lease(queue, message, raw.raw, record, received))
        if set_after:
            leases = self._apply_duration(leases, seconds)
        return watch_lost(leases)  # for a driver that reports lost leases itself

    def _stored_checkpoint(self, message_id: str) -> bytes | None:
        """The store's checkpoint for a received message; ``None`` (logged) if it cannot be read.

        Starting over is always correct, only slower: a store that fails must not
        keep a leased message from its handler.
        """
        store = self._store
        assert store is not None
        try:
            return store.load(message_id)
        except Exception as exc:
            _log.warning(
                "could not read the checkpoint of message %r (%r); it starts over",
                message_id,
                exc,
            )
            return None

    def _apply_duration(self, leases: list[Lease], seconds: float) -> list[Lease]:
        """Set the lease duration right after receive where the receive could not (MNS)."""
        now = time.time()
        resolution = self._runner.capabilities.lease_resolution
        change = [
            lease
            for lease in leases
            if abs(lease.expires_at.timestamp() - now - seconds) > resolution
        ]
        if not change:
            return leases
        results = self.renew(change, [seconds] * len(change), event=False, raise_whole=False)
        dropped: set[int] = set()
        for lease, result in zip(change, results, strict=True):
            if isinstance(result, errors.LeaseLost):
                dropped.add(id(lease))
            elif isinstance(result, errors.BackendUnavailable | errors.BackendError):
                # The message is already leased: hand it out with the visibility the
                # receive gave it rather than drop it (it would stay invisible unused).
                # Renewals still ask for ``seconds``.
                _log.warning(
                    "could not set the lease of message %r to %.0f s (%s); it keeps the "
                    "%.0f s the receive gave it",
                    lease.message.id,
                    seconds,
                    result,
                    lease.expires_at.timestamp() - now,
                )
        return [lease for lease in leases if id(lease) not in dropped]

    # ---------------------------------------------------------------- settle

    def settle(self, leases: Sequence[Lease], spec: SettleSpec, limit: float | None) -> _Results:
        """Settle held leases in backend-sized batches under one deadline; one result each.

        ``limit`` is the caller's timeout for the whole call (see
        :meth:`leasekit.Queue.complete_many`); results as that method gives.
        """
        queue = self._owner
        results: list[Any] = [None] * len(leases)
        done: list[Lease] = []
        with self._events.bracket(
            "settle",
            lambda error: {
                "queue": queue,
                "leases": leases,
                "action": spec.action,
                "results": _reported(leases, results, {id(lease) for lease in done}, error),
            },
            queue=queue,
            leases=leases,
            action=spec.action,
        ):
            try:
                self._settle_batches(leases, spec, limit, results, done)
                if spec.state is LeaseState.COMPLETED:
                    self.discard_checkpoints(done)
            finally:
                if done and self._events.observed(spec.hook):
                    for lease in done:
                        self._events.emit(spec.hook, lease=lease, **spec.hook_kwargs)
        return results

    def _settle_batches(
        self,
        leases: Sequence[Lease],
        spec: SettleSpec,
        limit: float | None,
        results: list[Any],
        done: list[Lease],
    ) -> None:
        """The work of :meth:`settle`: results to ``results``, settled leases to ``done``."""
        if len(leases) == 1:
            self._settle_one(leases[0], spec, limit, results, done)
            return
        action, size = spec.action, spec.batch
        if 1 < len(leases) <= size:
            records = [lease._record for lease in leases]
            receipts = take_together(records, SETTLE)
            if receipts is not None:  # one receive's leases, all free: one call, no lists of them
                self._settle_together(leases, records, receipts, spec, limit, results, done)
                return
        taken, repeats = self._take(leases, SETTLE, action, results)
        if len(taken) <= size:
            chunks = [taken] if taken else []
        else:
            chunks = [taken[start : start + size] for start in range(0, len(taken), size)]
        whole = (
            self.lease_timeout([lease for _, lease, _ in taken], limit, settle=True)
            if taken
            else None
        )
        with deadline(whole):  # one for the whole call: each chunk gets what is left
            for position, chunk in enumerate(chunks):
                if self._out_of_time(action, chunks, position, results):
                    break
                receipts = [receipt for _, _, receipt in chunk]
                outcome = self._batch_call(
                    action, partial(spec.call, receipts), None, chunks, position
                )
                if not any(outcome):  # all settled: record them in one go
                    settled = [lease for _, lease, _ in chunk]
                    lost = settled_together([lease._record for lease in settled], spec.state)
                    if not lost:
                        done.extend(settled)
                        continue
                    for position_in_chunk, (i, lease, _) in enumerate(chunk):
                        if position_in_chunk in lost:
                            results[i] = lease._record.lost_error
                        else:
                            done.append(lease)
                    continue
                for (i, lease, _), result in zip(chunk, outcome, strict=True):
                    if result is None:
                        lost_meanwhile = lease._record.settled(spec.state)
                        if lost_meanwhile is None:
                            done.append(lease)
                        else:
                            results[i] = lost_meanwhile
                        continue
                    failure = self._runner.entry_error(result, action)
                    lease._record.failed(lease, failure)
                    results[i] = failure
        _copy_repeats(results, repeats)

    def _settle_together(
        self,
        leases: Sequence[Lease],
        records: list[LeaseRecord],
        receipts: list[str],
        spec: SettleSpec,
        limit: float | None,
        results: list[Any],
        done: list[Lease],
    ) -> None:
        """:meth:`_settle_batches` for leases taken together that fit one backend call.

        The same deadline, call, outcomes and error handling as the general path
        for its one chunk, without its per-lease tuples and the lists made from
        them (measured on SQLite, batches of 10: a fifth of core's settle work).
        """
        action = spec.action
        with deadline(self.lease_timeout(leases, limit, settle=True)):
            left = time_left()
            if left is not None and left <= 0:  # no call: each given back, still held
                error = self._late(action)
                for i, record in enumerate(records):
                    record.release()
                    results[i] = error
                return
            try:
                outcome = list(self._runner.call(action, partial(spec.call, receipts)))
            except errors.LeaseError as exc:
                for lease in leases:
                    lease._record.failed(lease, exc)
                raise
            except BaseException:
                for record in records:
                    record.release()
                raise
        if not any(outcome):  # all settled: record them in one go
            lost = settled_together(records, spec.state)
            if not lost:
                done.extend(leases)
                return
            for i, lease in enumerate(leases):
                if i in lost:
                    results[i] = lease._record.lost_error
                else:
                    done.append(lease)
            return
        for i, (lease, result) in enumerate(zip(leases, outcome, strict=True)):
            if result is None:
                lost_meanwhile = lease._record.settled(spec.state)
                if lost_meanwhile is None:
                    done.append(lease)
                else:
                    results[i] = lost_meanwhile
                continue
            failure = self._runner.entry_error(result, action)
            lease._record.failed(lease, failure)
            results[i] = failure

    def _settle_one(
        self,
        lease: Lease,
        spec: SettleSpec,
        limit: float | None,
        results: list[Any],
        done: list[Lease],
    ) -> None:
        """:meth:`_settle_batches` for one lease, without its lists."""
        receipt = lease._record.take(SETTLE, spec.action, lease.message.id)
        if not isinstance(receipt, str):
            results[0] = receipt
            return
        error = self._settle_taken(lease, receipt, spec, limit)
        if error is None:
            done.append(lease)
        else:
            results[0] = error

    def complete_one(self, lease: Lease, spec: SettleSpec) -> None:
        """``lease.complete()``: :meth:`settle` of one lease, lean when nothing else looks on.

        Between two network calls every step of the general path costs several
        times what it does in a tight loop (measured on MNS: 19 µs of CPU a message
        against 3 here); this one makes the same call with the same outcome,
        and takes the general path whenever an observer listens to the settle
        or its hook, or a checkpoint store wants its entry discarded.
        """
        if self._store is not None or self._events.observed_any((*_SETTLE_EVENTS, spec.hook)):
            _raise_first(self.settle((lease,), spec, None))
            return
        receipt = lease._record.take(SETTLE, spec.action, lease.message.id)
        if not isinstance(receipt, str):
            raise receipt
        error = self._settle_taken(lease, receipt, spec, None)
        if error is not None:
            raise error

    def _settle_taken(
        self, lease: Lease, receipt: str, spec: SettleSpec, limit: float | None
    ) -> errors.LeaseError | None:
        """Settle one taken lease by one backend call; its error (``None``: settled).

        The outcome is recorded (settled, failed, or given back when the deadline
        passed before the call). Raises the leasekit error of a call that failed
        as a whole (the lease failed with it), or anything else (given back).
        """
        record = lease._record
        with deadline(self.lease_timeout((lease,), limit, settle=True)):
            left = time_left()
            if left is not None and left <= 0:
                record.release()
                return self._late(spec.action)
            try:
                [result] = self._runner.call(spec.action, partial(spec.call, [receipt]))
            except errors.LeaseError as exc:
                record.failed(lease, exc)
                raise
            except BaseException:
                record.release()
                raise
        if result is None:
            return record.settled(spec.state)  # the error if it was reported lost meanwhile
        failure = self._runner.entry_error(result, spec.action)
        record.failed(lease, failure)
        return failure

    def dead_letter(
        self,
        lease: Lease,
        reason: str,
        limit: float | None,
        move: Callable[[Lease, str, str], None],
    ) -> None:
        """Dead-letter ``lease`` by ``move(lease, receipt, reason)``; raise its error.

        The lease is taken for the call and reported settled, or failed (a
        :class:`LeaseLost` marks it lost); the call runs under the lease's
        settle deadline, within ``limit``.
        """
        queue = self._owner
        with self._events.bracket(
            "settle",
            lambda error: {
                "queue": queue,
                "leases": [lease],
                "action": "dead_letter",
                "results": [error],
            },
            queue=queue,
            leases=[lease],
            action="dead_letter",
        ):
            with (
                self._holding(lease, SETTLE, "dead_letter") as receipt,
                deadline(self.lease_timeout([lease], limit, settle=True)),
            ):
                move(lease, receipt, reason)
            lost = lease._record.settled(LeaseState.DEAD_LETTERED)
            if lost is not None:  # reported lost while the move was in flight: it stays so
                raise lost
            self.discard_checkpoints([lease])
            self._events.emit("leasekit_lease_dead_lettered", lease=lease, reason=reason)

    # ------------------------------------------------------------ checkpoint

    def checkpoint_native(self, lease: Lease, data: bytes, limit: float | None) -> None:
        """Save ``data`` with the message and renew it for its last duration, in one call.

        For a backend with ``native_checkpoint``. The lease is taken as for a
        renewal (a keeper's renewal in flight is waited for), and the new
        receipt and expiry recorded; raises the entry's error (a
        :class:`LeaseLost` marks the lease lost and nothing was saved).
        """
        record = lease._record
        with self._holding(lease, RENEW, "checkpoint") as receipt:
            seconds = record.duration
            entry = CheckpointEntry(receipt, lease.raw_message, data)
            timeout = self.lease_timeout([lease], limit, settle=False)
            started = time.monotonic()
            with deadline(timeout):
                [result] = self._runner.call(
                    "checkpoint", partial(self._runner.driver.checkpoint, [entry], seconds)
                )
        if not isinstance(result, Visibility):
            failure = self._runner.entry_error(result, "checkpoint")
            record.failed(lease, failure)
            raise failure
        lost = record.renewed(
            lease,
            result.receipt,
            result.visible_until,
            seconds,
            started,
            late_is_lost=not self._runner.capabilities.detects_stale_receipts,
        )
        if lost is not None:
            raise lost
        record.checkpointed()

    def checkpoint_stored(self, lease: Lease, data: bytes, limit: float | None) -> None:
        """Renew the lease (the service confirms the receipt), then save ``data`` in the store.

        The save carries ``delivery_count`` as its generation: a store that holds
        a later holder's checkpoint refuses it, and the lease is marked lost (see
        :mod:`leasekit.checkpoints`).
        """
        store = self._store
        assert store is not None
        runner = self._runner
        renewed = (
            arguments.past_total_cap(
                runner.capabilities, runner.driver.scheme, lease, lease.duration
            )
            or self.renew([lease], [lease.duration], limit)[0]
        )
        if renewed is not None:
            raise renewed
        message = lease.message
        try:
            written = store.save(message.id, data, message.delivery_count)
        except errors.LeaseError:
            raise
        except Exception as exc:
            raise errors.BackendError(
                f"checkpoint of message {message.id!r}: the checkpoint store failed: {exc!r}"
            ) from exc
        if not written:
            error = errors.LeaseLost(
                f"checkpoint of message {message.id!r} refused: a later delivery of it "
                f"(after delivery {message.delivery_count}) saved a checkpoint already"
            )
            lease._record.lose(lease, error)
            raise error
        # The store answered, but by core's clock the lease may have ended while it
        # wrote: another consumer may hold the message and have read the store before
        # this write. The holder is stale; it must not go on as if its progress were kept.
        late = lease._record.expire(
            lease, reason="the checkpoint store's write ended after the lease's deadline"
        )
        if late is not None or lease.state is LeaseState.LOST:
            raise late or lease._record.lost_error or errors.LeaseLost("the lease was lost")
        lease._record.checkpointed()

    def discard_checkpoints(self, leases: Sequence[Lease]) -> None:
        """Forget the stored checkpoints of completed or dead-lettered leases (store only).

        Only messages that had one (read at receive, or saved by this holder) cost
        a store call; a failure is logged, never raised: the entry is then never
        read again (the message is gone) and the store's retention purges it.
        """
        store = self._store
        if store is None:
            return
        for lease in leases:
            if lease.message.checkpoint is None and not lease._record.checkpoints:
                continue
            try:
                store.discard(lease.message.id)
            except Exception as exc:
                _log.warning(
                    "could not discard the checkpoint of message %r: %r", lease.message.id, exc
                )

    # ----------------------------------------------------------------- renew

    def renew(
        self,
        leases: Sequence[Lease],
        seconds: Sequence[float],
        timeout: float | None = None,
        *,
        event: bool = True,
        raise_whole: bool = True,
        lateness: Sequence[float] | None = None,
    ) -> _Results:
        """Renew leases for their ``seconds``, batched where the backend can; one result each.

        ``None``: renewed; otherwise the leasekit error for that lease (a
        :class:`LeaseLost` has marked it lost). A call that fails as a whole
        raises (see :meth:`_batch_call`).

        A renewal never outlives the lease it renews: its deadline is the least
        time left on the leases of its batch, and a lease whose time is up is
        not renewed (where the backend detects stale receipts it is asked anyway,
        for a receipt it may still honour). On a backend that cannot detect stale
        receipts, a renewal that returns after the lease ended counts as lost.
        A ``timeout`` bounds the whole call besides (see
        :meth:`leasekit.Queue.renew_many`). ``seconds`` must already be
        validated. With ``event`` the ``before_``/``after_renew`` pair and each
        ``leasekit_lease_renewed`` are emitted (the latter with the lease's
        ``lateness``, when given, by position).
        """
        queue = self._owner
        events = self._events if event else _QUIET
        results: list[Any] = [None] * len(leases)
        renewed: list[int] = []  # positions
        with events.bracket(
            "renew",
            lambda error: {
                "queue": queue,
                "leases": leases,
                "results": _reported(leases, results, {id(leases[i]) for i in renewed}, error),
            },
            queue=queue,
            leases=leases,
        ):
            try:
                self._renew_batches(leases, seconds, timeout, raise_whole, results, renewed)
            finally:
                if renewed and events.observed("leasekit_lease_renewed"):
                    for i in renewed:
                        events.emit(
                            "leasekit_lease_renewed",
                            lease=leases[i],
                            lateness=None if lateness is None else lateness[i],
                        )
        return results

    def _renew_batches(
        self,
        leases: Sequence[Lease],
        seconds: Sequence[float],
        timeout: float | None,
        raise_whole: bool,
        results: list[Any],
        renewed: list[int],
    ) -> None:
        """The work of :meth:`renew`: results to ``results``, renewed positions to ``renewed``."""
        caps = self._runner.capabilities
        late_is_lost = not caps.detects_stale_receipts
        taken: list[_Taken] | None = None
        repeats: list[tuple[int, int]] = []
        if (
            timeout is None
            and 1 < len(leases) <= caps.max_renew_batch
            and seconds.count(seconds[0]) == len(seconds)
        ):  # a keeper's batch
            records = [lease._record for lease in leases]
            receipts = take_together(records, RENEW)
            if receipts is not None:  # one receive's leases, all free
                if not late_is_lost or min([r.deadline for r in records]) > time.monotonic():
                    self._renew_together(
                        leases, records, receipts, seconds[0], raise_whole, results, renewed
                    )
                    return
                taken = list(zip(range(len(leases)), leases, receipts, strict=True))
        if taken is None:
            taken, repeats = self._take(leases, RENEW, "renew", results)
        if late_is_lost:
            taken = self._drop_expired(taken, results)
        groups: dict[float, list[_Taken]] = {}
        for item in taken:
            groups.setdefault(seconds[item[0]], []).append(item)
        size = caps.max_renew_batch
        plan = [
            (physical, group[start : start + size])
            for physical, group in groups.items()
            for start in range(0, len(group), size)
        ]
        chunks = [chunk for _, chunk in plan]
        # A timeout given bounds the whole call; without one (the keeper's way) each
        # chunk's deadline is its own leases' time left, so one hung chunk fails no other.
        with deadline(timeout):
            for position, (physical, chunk) in enumerate(plan):
                if timeout is not None and self._out_of_time("renew", chunks, position, results):
                    break
                receipts = [receipt for _, _, receipt in chunk]
                left = self.lease_timeout([lz for _, lz, _ in chunk], timeout, settle=False)
                started = time.monotonic()
                outcome = self._batch_call(
                    "renew",
                    partial(self._runner.driver.change_visibility, receipts, physical),
                    left,
                    chunks,
                    position,
                    raise_whole=raise_whole,
                )
                for (i, lease, _), result in zip(chunk, outcome, strict=True):
                    results[i] = self._renewal_outcome(
                        i, lease, result, physical, started, late_is_lost, renewed
                    )
        _copy_repeats(results, repeats)

    def _renew_together(
        self,
        leases: Sequence[Lease],
        records: list[LeaseRecord],
        receipts: list[str],
        physical: float,
        raise_whole: bool,
        results: list[Any],
        renewed: list[int],
    ) -> None:
        """:meth:`_renew_batches` for leases taken together that fit one backend call.

        A keeper's batch. The same deadline, call, outcomes and error handling
        as the general path for its one chunk, without its tuple per lease: those
        lived as long as the call, so a young collection during it moved them on,
        and one of the middle generation promoted them (measured on Redis keeping
        100,000 leases: two thirds of what renewals promoted, bringing full
        collections, each of which walks every held lease).
        """
        late_is_lost = not self._runner.capabilities.detects_stale_receipts
        left = self.lease_timeout(leases, None, settle=False)
        started = time.monotonic()
        call = partial(self._runner.driver.change_visibility, receipts, physical)
        outcome: list[Any]
        try:
            with deadline(left):
                outcome = list(self._runner.call("renew", call))
        except errors.LeaseError as exc:
            if raise_whole:
                for lease in leases:
                    lease._record.failed(lease, exc)
                raise
            outcome = [exc] * len(leases)
        except BaseException:
            for record in records:
                record.release()
            raise
        for i, (lease, result) in enumerate(zip(leases, outcome, strict=True)):
            results[i] = self._renewal_outcome(
                i, lease, result, physical, started, late_is_lost, renewed
            )

    def _renewal_outcome(
        self,
        i: int,
        lease: Lease,
        result: Any,
        physical: float,
        started: float,
        late_is_lost: bool,
        renewed: list[int],
    ) -> errors.LeaseError | None:
        """One lease's answer to a renewal: ``None`` if renewed (``i`` noted), else its error."""
        if isinstance(result, Visibility):
            lost = lease._record.renewed(
                lease,
                result.receipt,
                result.visible_until,
                physical,
                started,
                late_is_lost=late_is_lost,
            )
            if lost is None:
                renewed.append(i)
            return lost
        failure = self._runner.entry_error(result, "renew")
        lease._record.failed(lease, failure)
        return failure

    def _drop_expired(self, taken: list[_Taken], results: list[Any]) -> list[_Taken]:
        """Leases whose time is up are lost, not renewed (stale receipts cannot be told here)."""
        alive = []
        for item in taken:
            i, lease, _ = item
            record = lease._record
            if record.time_left() > 0:
                alive.append(item)
                continue
            record.release()
            error = record.expire(lease)
            results[i] = error or record.unusable("renew", lease.message.id)
        return alive

    # ----------------------------------------------------------- group state

    def group_state(
        self, lease: Lease, limit: float | None, *, write: bool = False, state: bytes | None = None
    ) -> bytes | None:
        """Read (or, with ``write``, replace) the state of ``lease``'s group, within its time.

        The caller has checked the capability, the group and that the lease is held.
        """
        receipt = lease.receipt
        with deadline(self.lease_timeout([lease], limit, settle=False)):
            if write:
                self._runner.call(
                    "set_group_state", partial(self._runner.driver.set_group_state, receipt, state)
                )
                return None
            return self._runner.call(
                "group_state", partial(self._runner.driver.group_state, receipt)
            )

    # ------------------------------------------------------------- machinery

    @staticmethod
    @contextmanager
    def _holding(lease: Lease, operation: str, action: str) -> Iterator[str]:
        """Take one lease for the call in the block; yield the receipt to use.

        Raises the lease's error if it cannot be taken. A :class:`LeaseError`
        out of the block fails the lease (a :class:`LeaseLost` marks it lost);
        anything else gives it back unchanged. After a block that ends normally
        the lease is still taken: the caller reports the outcome to its record.
        """
        record = lease._record
        taken = record.take(operation, action, lease.message.id)
        if isinstance(taken, BaseException):
            raise taken
        try:
            yield taken
        except errors.LeaseError as exc:
            record.failed(lease, exc)
            raise
        except BaseException:
            record.release()
            raise

    def lease_timeout(self, leases: Sequence[Lease], limit: float | None, *, settle: bool) -> float:
        """The deadline for a call on ``leases``: the least time left on them, within bounds.

        A settle gets at least ``MIN_SETTLE_TIMEOUT`` (a receipt past its expiry
        may still be honoured, and settling late harms nobody); a renewal gets
        what is left, so it never outlives the lease it renews.
        """
        if len(leases) == 1:
            left = leases[0]._record.deadline - time.monotonic()
        else:
            left = min([lease._record.deadline for lease in leases]) - time.monotonic()
        if settle or left <= 0:  # a renewal past the deadline: where stale receipts are refused
            left = max(left, MIN_SETTLE_TIMEOUT)
        return min(left, self._runner.call_timeout if limit is None else limit)

    @staticmethod
    def _take(
        leases: Sequence[Lease], operation: str, action: str, results: list[Any]
    ) -> tuple[list[_Taken], list[tuple[int, int]]]:
        """Take each lease for ``operation``; the errors of those that cannot go to ``results``.

        A lease busy with another operation is waited for, at most until its
        time is up. Takes go in a fixed order (by ``id``), so two callers taking
        overlapping lists cannot wait for each other. A lease given twice is
        taken once: the second list pairs each later position with its first,
        whose result it gets (see :func:`_copy_repeats`).
        """
        if len(leases) == 1:  # the common single settle: nothing to order or repeat
            lease = leases[0]
            outcome = lease._record.take(operation, action, lease.message.id)
            if isinstance(outcome, str):
                return [(0, lease, outcome)], []
            results[0] = outcome
            return [], []
        if not leases:
            return [], []
        receipts = take_together([lease._record for lease in leases], operation)
        if receipts is not None:  # one receive's leases, all free: taken in one hold of its lock
            return list(zip(range(len(leases)), leases, receipts, strict=True)), []
        order = sorted(range(len(leases)), key=lambda i: id(leases[i]))
        taken: list[_Taken] = []
        seen: dict[int, int] = {}
        repeats: list[tuple[int, int]] = []
        for i in order:
            lease = leases[i]
            first = seen.setdefault(id(lease), i)
            if first != i:
                repeats.append((i, first))
                continue
            outcome = lease._record.take(operation, action, lease.message.id)
            if isinstance(outcome, str):
                taken.append((i, lease, outcome))
            else:
                results[i] = outcome
        taken.sort(key=lambda item: item[0])
        return taken, repeats

    def _batch_call(
        self,
        action: str,
        fn: Callable[[], list[T]],
        timeout: float | None,
        chunks: list[list[_Taken]],
        position: int,
        *,
        raise_whole: bool = True,
    ) -> list[T | BaseException]:
        """One backend call for ``chunks[position]``, under ``timeout`` (``None``: the enclosing).

        A call that fails as a whole (the queue is gone, the backend is out of
        reach) raises its leasekit error, after the leases of this chunk are
        given back as failed and those of later chunks unchanged; without
        ``raise_whole`` the error is each lease's result instead, and the next
        chunk is tried. What failed for one entry only is that entry's result.
        """
        chunk = chunks[position]
        try:
            with deadline(timeout):
                return list(self._runner.call(action, fn))
        except errors.LeaseError as exc:
            if not raise_whole:
                return [exc] * len(chunk)
            for _, lease, _ in chunk:
                lease._record.failed(lease, exc)
            _release_chunks(chunks[position + 1 :])
            raise
        except BaseException:
            _release_chunks(chunks[position:])
            raise

    def _out_of_time(
        self, action: str, chunks: list[list[_Taken]], position: int, results: list[Any]
    ) -> bool:
        """Whether the call's deadline passed before ``chunks[position]`` was sent.

        If it did, each lease of that chunk and the later ones gets a
        :class:`BackendUnavailable` result without a backend call, and is given
        back unchanged: still held, so a caller may try again.
        """
        left = time_left()
        if left is None or left > 0:
            return False
        error = self._late(action)
        for chunk in chunks[position:]:
            for i, lease, _ in chunk:
                lease._record.release()
                results[i] = error
        return True

    def _late(self, action: str) -> errors.BackendUnavailable:
        """The result of a lease whose call's deadline passed before it was sent."""
        return errors.BackendUnavailable(
            f"{action} on {self._runner.name!r}: the call's timeout passed before this lease's "
            "batch was sent (nothing was asked of the backend; the lease is still held)"
        )


def _release_chunks(chunks: list[list[_Taken]]) -> None:
    """Give the leases of ``chunks`` back unchanged (no call was made for them)."""
    for chunk in chunks:
        for _, lease, _ in chunk:
            lease._record.release()


def _copy_repeats(results: list[Any], repeats: list[tuple[int, int]]) -> None:
    """Give each repeated lease's later position the result of its first one."""
    for later, first in repeats:
        results[later] = results[first]


def _reported(
    leases: Sequence[Lease], results: list[Any], succeeded: set[int], error: BaseException | None
) -> list[Any]:
    """``results`` for an ``after_`` event: after a raise, ``error`` for what was not reached."""
    if error is None:
        return results
    return [
        error if result is None and id(lease) not in succeeded else result
        for lease, result in zip(leases, results, strict=True)
    ]
