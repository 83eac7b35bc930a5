"""The worker loop: lease, keep alive, handle, settle; poison messages, idempotency, shutdown."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from types import FrameType
from typing import Any

from . import errors
from .duration_policy import LeaseDurationPolicy
from .health import Health, HealthLimits, WorkerPulse, assess
from .idempotency import IdempotencyStore
from .keeper import LeaseKeeper
from .lease import Lease
from .message import LeaseState
from .options import MAX_SECONDS, check_bool, check_int, check_number
from .queue import Queue
from .worker_policy import (
    LEASE_WAIT,
    ROOM_WAIT,
    SHUTDOWN_CALL_TIMEOUT,
    ConsumerStats,
    FreeBuffer,
    GroupBuffer,
    MessageFlow,
    Outcome,
    Pause,
    ReceiveBudget,
    RunHandler,
    Tally,
    Worker,
    WorkerSettings,
    completion_window,
    retry_flow,
)

__all__ = ["LEASE_WAIT", "ROOM_WAIT", "Consumer", "ConsumerStats"]

_log = logging.getLogger("leasekit.consumer")


_Failure = errors.LeaseError | errors.LeaseStateError | None

#: Most messages one worker takes from the buffer at once (when handling is fast).
MAX_CHUNK = 16
#: Weight of the newest handler time in the running mean that sizes chunks.
_EWMA = 0.2


def _start_threads(
    prefix: str, indices: range, target: Callable[[int], None]
) -> list[threading.Thread]:
    """Start a daemon thread ``{prefix}-{i}`` running ``target(i)`` for each index."""
    threads = [
        threading.Thread(target=target, args=(index,), name=f"{prefix}-{index}", daemon=True)
        for index in indices
    ]
    for thread in threads:
        thread.start()
    return threads


class _GroupCompleter:
    """Completes leases from many worker threads in backend-sized batches (group commit).

    The first thread to arrive leads: it waits up to ``window`` seconds for
    others (or until ``size`` leases wait), completes them in one batch call
    and hands each thread its own results. When every lease in flight is
    already waiting it does not wait at all.
    """

    def __init__(self, queue: Queue, size: int, window: float, in_flight: Callable[[], int]):
        self.queue = queue
        self.size = size
        self.window = window
        self.in_flight = in_flight
        lock = threading.Lock()
        self.cond = threading.Condition(lock)  # followers wait here for their results
        self.arrived = threading.Condition(lock)  # the leader waits here for company
        self.waiting: list[Lease] = []
        self.results: dict[int, _Failure] = {}
        self.leading = False

    def complete(self, lease: Lease) -> _Failure:
        """Complete ``lease`` in a shared batch; return its error, if any."""
        return self.complete_many([lease])[0]

    def complete_many(self, leases: list[Lease]) -> list[_Failure]:
        """Complete ``leases`` in shared batches; return one error (or ``None``) each."""
        keys = [id(lease) for lease in leases]
        with self.cond:
            self.waiting.extend(leases)
            self.arrived.notify()
            while any(key not in self.results for key in keys):
                if self.leading:
                    self.cond.wait()
                    continue
                # Lead: gather others briefly, then settle one batch for everyone in it.
                self.leading = True
                try:
                    deadline = time.monotonic() + completion_window(self.waiting, self.window)
                    while len(self.waiting) < min(self.size, self.in_flight()):
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self.arrived.wait(remaining)
                    batch, self.waiting = self.waiting[: self.size], self.waiting[self.size :]
                    self.cond.release()
                    try:
                        outcome = self._settle(batch)
                    finally:
                        self.cond.acquire()
                    for item, result in zip(batch, outcome, strict=True):
                        self.results[id(item)] = result
                finally:
                    self.leading = False
                    self.cond.notify_all()
            return [self.results.pop(key) for key in keys]

    def _settle(self, batch: list[Lease]) -> list[_Failure]:
        return _settle_batch(self.queue, batch)


def _settle_batch(queue: Queue, batch: list[Lease]) -> list[_Failure]:
    """``queue.complete_many`` that reports a whole-batch failure per lease, never raises."""
    try:
        return queue.complete_many(batch)
    except errors.LeaseError as exc:
        return [exc] * len(batch)
    except Exception as exc:  # never leave a waiting completion stranded
        return [errors.BackendError(f"batch complete failed: {exc!r}")] * len(batch)


class Consumer:
    """Runs ``handler`` on every message of ``queue``, with leases kept alive by a keeper.

    Parameters:
        queue: the queue to consume.
        handler: called as ``handler(message)`` (or ``handler(lease)`` with
            ``pass_lease=True``). Returning completes the message; raising
            abandons it with an exponential backoff delay.
        concurrency: handler threads.
        lease_duration: the physical lease (fixed policy); the queue's default if ``None``.
        duration_policy: a :class:`~leasekit.duration_policy.LeaseDurationPolicy`
            (e.g. ``AdaptiveLeaseDuration``) instead of a fixed duration.
        max_deliveries: a message delivered more times than this is dead-lettered
            without calling the handler (poison); ``None`` never dead-letters.
        idempotency: a store of processed ids; a recorded id is completed
            without calling the handler (see :mod:`leasekit.idempotency`).
        keeper: a shared :class:`LeaseKeeper`; by default the consumer runs its own.
        max_lifetime: stop renewing a message after this many seconds (a hung
            handler lets go); ``None`` renews while the handler runs.
        prefetch: messages leased ahead of free handler threads (kept leased too);
            default: a receive batch, at least ``concurrency``, at most 4x ``concurrency``.
        receivers: threads leasing at once (each one receive call in flight). One
            is enough while a receive returns quickly; more help where receive
            latency, not CPU, bounds throughput (a distant region). The default
            ``prefetch`` grows to leave room for a batch per receiver.
        backoff_base, backoff_max: abandon delay ``base * 2**(delivery_count-1)``, capped.
        shutdown_grace: seconds in-flight handlers get to finish on stop.
        pass_lease: call the handler with the :class:`Lease` instead of the message.
        handle_signals: on ``run()`` in the main thread, SIGINT/SIGTERM stop gracefully.
        batch_complete: complete handled messages in batches where the backend has
            a batch delete: a worker's chunk in one call, and with ``concurrency > 1``
            completions of several workers together (group commit). ``None``
            (default): on whenever the backend can batch.
        batch_window: longest a completion waits for others to share its batch; also
            the handling time under which a worker takes several messages at once.

    How work flows: one loop leases in batches into a buffer (up to ``prefetch``
    beyond the busy workers), and ``concurrency`` worker threads take from it.
    While handling is slow, a worker takes one message at a time, so every
    worker is busy; when a whole chunk is handled within ``batch_window``, a
    worker takes up to ``MAX_CHUNK`` at once and completes them in one call,
    which keeps the cost per message near that of a hand-written batch loop.
    A handled message is completed before the worker starts a message more than
    ``batch_window`` later, so a slow handler never holds others' completions.
    A plugin implementing ``leasekit_before_process`` sees each message's
    ``before_process``/``after_process`` pair nested on its worker thread (the
    after hook once the message is settled); with such a plugin registered,
    workers take one message at a time (completions are still grouped across
    workers). ``leasekit_before_handle``/``after_handle`` bracket just the
    handler call, always nested, and leave the batching alone.

    Raises:
        InvalidArgument: a non-callable handler, concurrency < 1, max_deliveries < 1, ...
    """

    def __init__(
        self,
        queue: Queue,
        handler: Callable[[Any], object],
        *,
        concurrency: int = 1,
        lease_duration: float | None = None,
        duration_policy: LeaseDurationPolicy | None = None,
        max_deliveries: int | None = None,
        idempotency: IdempotencyStore | None = None,
        keeper: LeaseKeeper | None = None,
        max_lifetime: float | None = None,
        prefetch: int | None = None,
        receivers: int = 1,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        shutdown_grace: float = 30.0,
        pass_lease: bool = False,
        handle_signals: bool = True,
        batch_complete: bool | None = None,
        batch_window: float = 0.005,
    ) -> None:
        if not isinstance(queue, Queue):
            raise errors.InvalidArgument(f"queue must be a leasekit Queue, got {queue!r}")
        if not callable(handler):
            raise errors.InvalidArgument(f"handler must be callable, got {handler!r}")
        check_int(receivers, "receivers", minimum=1)
        check_number(batch_window, "batch_window", minimum=0, maximum=MAX_SECONDS)
        if batch_complete is not None:
            check_bool(batch_complete, "batch_complete")
        settings = WorkerSettings.check(
            queue.capabilities,
            queue.default_lease_duration,
            queue.check_duration,
            concurrency=concurrency,
            lease_duration=lease_duration,
            duration_policy=duration_policy,
            max_deliveries=max_deliveries,
            idempotency=idempotency,
            keeper=keeper,
            max_lifetime=max_lifetime,
            prefetch=prefetch,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            shutdown_grace=shutdown_grace,
            pass_lease=pass_lease,
            handle_signals=handle_signals,
            receivers=receivers,
        )
        self.settings = settings
        self.queue = queue
        self.handler = handler
        self.concurrency = settings.concurrency
        self.duration_policy = settings.duration_policy
        self.max_deliveries = settings.max_deliveries
        self.idempotency = settings.idempotency
        self.max_lifetime = settings.max_lifetime
        self.prefetch = settings.prefetch
        self.receivers = receivers
        self.backoff_base = settings.backoff_base
        self.backoff_max = settings.backoff_max
        self.shutdown_grace = settings.shutdown_grace
        self.pass_lease = settings.pass_lease
        self.handle_signals = settings.handle_signals
        can_batch = queue.capabilities.max_delete_batch > 1
        self.batch_complete = can_batch if batch_complete is None else batch_complete and can_batch
        self.batch_window = batch_window
        # Across workers: group commit. Within one worker: a chunk's completions go together.
        self._completer = (
            _GroupCompleter(
                queue,
                queue.capabilities.max_delete_batch,
                batch_window,
                lambda: len(self._started),
            )
            if self.batch_complete and concurrency > 1
            else None
        )
        self._max_chunk = max(1, min(MAX_CHUNK, self.prefetch + 1))
        self._handler_mean: float | None = None  # running mean of handler seconds
        # Plugins with per-message worker hooks see them nested on the worker thread
        # (before a, after a, before b, ...): then a worker takes one message at a time.
        self._nested_hooks = False
        self._handle_hooks = False  # a plugin brackets each handler call
        self._keeper = keeper
        self._own_keeper = keeper is None
        # Re-entrant: stop() may run from a signal handler while the main thread holds it.
        mutex = threading.RLock()
        self._tally = Tally(mutex)
        self._stats = self._tally.stats
        self._worker = Worker(queue, settings, self._tally)
        self._lock = threading.Condition(mutex)  # the receive loop waits here for room
        self._ready = threading.Condition(mutex)  # idle workers wait here for messages
        self._stop = threading.Event()
        self._running = False
        # Received, not yet taken by a worker; on an ordered queue, by group (one
        # message of a group in a worker's hands at a time, in order).
        self._buffer: FreeBuffer | GroupBuffer = self._worker.buffer
        self._ordered = queue.capabilities.ordered
        self._reserved = 0  # room taken by receive calls in progress
        self._receiver_errors: list[BaseException] = []
        self._started: dict[int, Lease] = {}  # taken by a worker, not yet finished
        self._current: dict[int, Lease] = {}  # worker index -> the lease in its handler
        self._closing = False
        self._shutdown_deadline: float | None = None  # set while stopping
        self._pulse = WorkerPulse()  # what the receive loop did last, for health()

    # ------------------------------------------------------------------ public

    @property
    def stats(self) -> ConsumerStats:
        """A snapshot of the counters (and the lease-duration policy's figures)."""
        with self._lock:
            snapshot = replace(self._stats)
        snapshot.lease_duration = dict(self.duration_policy.figures())
        return snapshot

    def health(self, limits: HealthLimits | None = None) -> Health:
        """Liveness and readiness, measured now (any thread; see :mod:`leasekit.health`).

        Live while the receive loop comes back when it said it would and the
        keeper's scheduler keeps its heartbeat with no renewal overdue for longer
        than ``limits.stuck_after``; ready while live and the last receive
        reached the queue. Serve it with :class:`leasekit.health.HealthServer`.
        """
        keeper = self._keeper
        return assess(self._pulse, None if keeper is None else keeper.progress(), limits)

    def stop(self) -> None:
        """Ask ``run()`` to stop: no new leases; in-flight handlers get the grace period."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()

    def run(self, *, until_idle: bool = False) -> ConsumerStats:
        """Consume until :meth:`stop` (or a signal), or with ``until_idle`` until drained.

        "Drained" means a lease call (waiting up to ``LEASE_WAIT``) found no message
        while this consumer had none buffered or in flight. Messages not visible
        then are not waited for: ones abandoned with a backoff delay after a
        handler failure, sent with a delay, or leased by another consumer.

        Returns:
            The final stats. After a clean return no message is left leased by
            this consumer: unstarted ones are abandoned, and in-flight handlers
            that outlive the grace period have their leases abandoned.
        """
        with self._lock:
            if self._running:
                raise errors.LeaseStateError("this Consumer is already running")
            self._running = True
            self._closing = False
        self._stop.clear()
        self._worker.begin()
        # Nesting needs one message at a time only when a plugin opens something per
        # message before it (an after hook alone sees the messages in order anyway).
        self._nested_hooks = self.queue.events.observed("leasekit_before_process")
        keeper = self._keeper or LeaseKeeper()
        self._keeper = keeper
        self._pulse.begin()
        workers = _start_threads(
            "leasekit-worker", range(self.concurrency), lambda i: self._work(i, keeper)
        )
        restore = self._install_signals()
        self.queue.events.emit("leasekit_worker_event", name="started", details=self._details())
        self._receiver_errors = []
        receivers = _start_threads(  # the first receiver is this thread's own loop
            "leasekit-receiver",
            range(1, self.receivers),
            lambda i: self._receive(keeper, until_idle),
        )
        try:
            self._loop(keeper, until_idle)
            for receiver in receivers:
                receiver.join()
            if self._receiver_errors:
                raise self._receiver_errors[0]
        finally:
            self._pulse.stopping()
            self.queue.events.emit(
                "leasekit_worker_event", name="stopping", details=self._details()
            )
            self._stop.set()  # extra receivers end before the shutdown gives back the buffer
            for receiver in receivers:
                receiver.join()
            self._shutdown(workers, keeper)
            restore()
            with self._lock:
                self._running = False
            self._pulse.end()
            self.queue.events.emit("leasekit_worker_event", name="stopped", details=self._details())
        return self.stats

    # ---------------------------------------------------------------- the loop

    def _loop(self, keeper: LeaseKeeper, until_idle: bool) -> None:
        """Lease in batches while there is room; the workers take from the buffer."""
        budget = ReceiveBudget(self.settings, self.queue.capabilities, self._pulse, self.queue.name)
        while not self._stop.is_set():
            budget.pulse.expect(ROOM_WAIT)
            with self._lock:
                while budget.full(self._outstanding()) and not self._stop.is_set():
                    budget.pulse.expect(ROOM_WAIT)
                    self._lock.wait(ROOM_WAIT)
                if self._stop.is_set():
                    return
                want = budget.want(self._outstanding())
                self._reserved += want
            try:
                budget.receiving(self.queue.call_timeout)
                leases = self.queue.lease(
                    want, duration=self._worker.lease_duration(), wait=LEASE_WAIT
                )
            except errors.LeaseError as exc:
                pause = budget.failed(exc, self._tally)
                if pause is None:
                    raise
                self._stop.wait(pause)
                continue
            finally:
                with self._lock:
                    self._reserved -= want
                    self._lock.notify_all()
            budget.received()
            if not leases:
                with self._lock:
                    idle = not self._buffer and not self._started
                if until_idle and idle:
                    return  # other receivers return when they find it idle too
                continue
            keeper.add_many(leases, max_lifetime=self.max_lifetime)
            with self._lock:
                self._stats.received += len(leases)
                self._buffer.extend(leases)
                self._stats.buffered = len(self._buffer)
                chunk = self._chunk_size(self._buffer.takeable())
                self._ready.notify(-(-len(leases) // chunk))

    def _outstanding(self) -> int:
        """Messages buffered, in a worker's hands or being received (call with the lock held)."""
        return len(self._buffer) + len(self._started) + self._reserved

    def _receive(self, keeper: LeaseKeeper, until_idle: bool) -> None:
        """An extra receiver thread (``receivers > 1``): the loop, its error kept for run()."""
        try:
            self._loop(keeper, until_idle)
        except BaseException as exc:
            self._receiver_errors.append(exc)
            self.stop()

    def _chunk_size(self, buffered: int) -> int:
        """How many buffered messages one worker takes (call with the lock held).

        One at a time while handling takes long enough for parallel workers to
        matter; when a whole chunk is handled within ``batch_window``, a worker
        takes up to ``MAX_CHUNK`` at once, saving a hand-off per message and
        settling them in one batch call.
        """
        mean = self._handler_mean
        if mean is None or buffered <= 1 or self._nested_hooks:
            return 1
        if buffered <= self.concurrency and self._buffer.grouped():
            return 1  # few groups free: one each, so they run in parallel, not in one chunk
        fits = int(self.batch_window / mean) if mean > 0 else self._max_chunk
        return max(1, min(fits, self._max_chunk, buffered))

    def _work(self, index: int, keeper: LeaseKeeper) -> None:
        """A worker thread: take a chunk from the buffer, handle it, repeat until closing."""
        while True:
            with self._lock:
                # Once stop() is asked, no new message is started: the buffer goes back.
                while (not self._buffer or self._stop.is_set()) and not self._closing:
                    self._ready.wait()
                if not self._buffer:
                    return
                size = self._chunk_size(self._buffer.takeable())
                chunk = [self._buffer.popleft() for _ in range(size)]
                for lease in chunk:
                    self._started[id(lease)] = lease
                self._stats.buffered = len(self._buffer)
                self._stats.in_flight = len(self._started)
                if self._buffer:
                    self._ready.notify()  # more for another idle worker
            try:
                self._process_chunk(index, chunk, keeper)
            except Exception:
                # A bug outside the handler (an idempotency store failing, say): keep the
                # worker alive and give back what it had not finished.
                _log.exception("worker %d failed; abandoning its unfinished messages", index)
                self._give_back_many(chunk, keeper, "abandoned")
                for lease in chunk:
                    self._release(lease, "error", keeper)
            finally:
                with self._lock:
                    for lease in chunk:
                        self._started.pop(id(lease), None)
                    self._stats.in_flight = len(self._started)
                    self._lock.notify_all()

    def _process_chunk(self, index: int, chunk: list[Lease], keeper: LeaseKeeper) -> None:
        """Handle each lease of ``chunk``; completions are settled together (see ``_flush``)."""
        done: list[Lease] = []  # handled, waiting to be completed
        oldest = 0.0
        for position, lease in enumerate(chunk):
            if self._closing or self._stop.is_set():
                # Stopping: what this worker has not started goes back to the queue.
                self._flush(done, keeper)
                self._give_back_many(chunk[position:], keeper, "abandoned_at_shutdown")
                for lease in chunk[position:]:
                    self._release(lease, "abandoned_at_shutdown", keeper)
                return
            if done and time.monotonic() - oldest >= self.batch_window:
                self._flush(done, keeper)  # do not hold a completion behind a slow handler
                done = []
            if lease.state is not LeaseState.HELD and lease.state is not LeaseState.LOST:
                continue  # abandoned at shutdown before it started (a lost one is counted)
            self._current[index] = lease
            try:
                self.queue.events.emit("leasekit_before_process", lease=lease)
                outcome = self._drive(self._worker.message_flow(lease))
            finally:
                self._current.pop(index, None)
            if outcome.name == "handled":
                if not done:
                    oldest = time.monotonic()
                done.append(lease)
                continue
            keeper.discard(lease)
            self.queue.events.emit(
                "leasekit_after_process", lease=lease, error=outcome.error, outcome=outcome.name
            )
            self._release(lease, outcome.name, keeper)
        self._flush(done, keeper)

    def _flush(self, done: list[Lease], keeper: LeaseKeeper) -> None:
        """Complete handled leases (in one batch where the backend allows); count each outcome."""
        if not done:
            return
        with self._lock:
            # Handled messages need no worker slot: make room for the receive loop now,
            # so the next receive overlaps this settle call instead of waiting for it.
            for lease in done:
                self._started.pop(id(lease), None)
            self._stats.in_flight = len(self._started)
            self._lock.notify_all()
        if self._completer is not None:
            failures = self._completer.complete_many(done)
        elif self.batch_complete and len(done) > 1:
            failures = _settle_batch(self.queue, done)
        else:
            failures = [self._complete_one(lease) for lease in done]
        if any(isinstance(failure, errors.BackendUnavailable) for failure in failures):
            failures = self._retry_settles(done, failures)
        keeper.discard_many(done)
        completed = 0
        for lease, failure in zip(done, failures, strict=True):
            outcome = self._worker.finish(lease, failure)
            completed += outcome.name == "completed"
            self.queue.events.emit(
                "leasekit_after_process", lease=lease, error=outcome.error, outcome=outcome.name
            )
            self._release(lease, outcome.name, keeper)
        self._tally.add("completed", completed)

    def _release(self, lease: Lease, outcome: str, keeper: LeaseKeeper) -> None:
        """Ordered queues: ``lease`` is settled; its group's next may start, or goes back.

        See :class:`~leasekit.worker_policy.GroupBuffer`; a no-op on an unordered queue.
        """
        if not self._ordered:
            return
        with self._lock:
            back = self._buffer.release(lease, outcome)
            self._stats.buffered = len(self._buffer)
            if self._buffer:
                self._ready.notify()
            self._lock.notify_all()
        if back:
            self._give_back_many(back, keeper, "returned_in_order")

    def _retry_settles(self, done: list[Lease], failures: list[_Failure]) -> list[_Failure]:
        """Retry transiently failed completions (:func:`~leasekit.worker_policy.retry_flow`)."""
        flow = retry_flow(done, failures, self._tally, self._give_up_at)
        try:
            step = next(flow)
            while True:
                if isinstance(step, Pause):
                    time.sleep(step.seconds)
                    step = flow.send([])
                else:
                    step = flow.send(_settle_batch(self.queue, step))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def _give_up_at(self) -> float:
        """When retrying completions stops: never before the shutdown grace ends."""
        end = self._shutdown_deadline
        return float("inf") if end is None else end

    @staticmethod
    def _complete_one(lease: Lease) -> _Failure:
        try:
            lease.complete()
        except (errors.LeaseError, errors.LeaseStateError) as exc:
            return exc
        return None

    def _drive(self, flow: MessageFlow) -> Outcome:
        """Run a message's flow to its outcome, each step a call on this worker thread."""
        result: Any = None
        error: Exception | None = None
        while True:
            try:
                step = flow.send(result) if error is None else flow.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            result = error = None
            try:
                if isinstance(step, RunHandler):
                    self._run_handler(step.lease)
                else:
                    result = step.fn()
            except Exception as exc:
                error = exc

    def _run_handler(self, lease: Lease) -> None:
        """Call the handler; keep the running mean of its time that sizes chunks."""
        start = time.monotonic()
        self.handler(lease if self.pass_lease else lease.message)
        elapsed = time.monotonic() - start
        mean = self._handler_mean
        self._handler_mean = elapsed if mean is None else mean + _EWMA * (elapsed - mean)

    def _count(self, name: str) -> None:
        self._tally.add(name)

    # ---------------------------------------------------------------- shutdown

    def _shutdown(self, workers: list[threading.Thread], keeper: LeaseKeeper) -> None:
        self._worker.shutting_down = True
        with self._lock:
            self._closing = True
            unstarted = list(self._buffer)
            self._buffer.clear()
            self._stats.buffered = 0
            self._ready.notify_all()
        self._give_back_many(unstarted, keeper, "abandoned_at_shutdown")
        deadline = time.monotonic() + self.shutdown_grace
        self._shutdown_deadline = deadline
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            overdue = list(self._started.values())
        running = {id(lease) for lease in list(self._current.values())}
        for lease in overdue:
            if id(lease) in running:
                _log.warning(
                    "handler for message %r did not finish within the %.0f s grace period; "
                    "abandoning its lease",
                    lease.message.id,
                    self.shutdown_grace,
                )
        self._give_back_many(overdue, keeper, "abandoned_at_shutdown")
        if self._own_keeper:
            keeper.stop()
            self._keeper = None
        self._worker.shutting_down = False
        self._shutdown_deadline = None

    def _give_back_many(self, leases: list[Lease], keeper: LeaseKeeper, counter: str) -> None:
        """Abandon the held ones of ``leases`` in one call bounded by ``SHUTDOWN_CALL_TIMEOUT``.

        A lease not given back in time is left to expire: it comes back then,
        and nothing is lost.
        """
        keeper.discard_many(leases)
        held = [lease for lease in leases if lease.state is LeaseState.HELD]
        if not held:
            return
        try:
            results: list[Any] = self.queue.abandon_many(held, timeout=SHUTDOWN_CALL_TIMEOUT)
        except (errors.LeaseError, errors.LeaseStateError) as exc:
            results = [exc] * len(held)
        self._worker.given_back(held, results, counter)

    def _install_signals(self) -> Callable[[], None]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous: dict[int, Any] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            _log.info("signal %d: stopping the consumer gracefully", signum)
            self.stop()

        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, on_signal)

        def restore() -> None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

        return restore

    def _details(self) -> dict[str, Any]:
        return {"queue": self.queue.name, "concurrency": self.concurrency}
