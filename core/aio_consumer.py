"""The asyncio face of the worker: AsyncConsumer, tasks driving the rules of ``worker_policy``.

What happens to a message — poison, duplicates, the handler, its outcome, retries
of a completion, what giving back counts — is :mod:`leasekit.worker_policy`'s,
the same code the threaded :class:`~leasekit.Consumer` drives. Here are only
the ways of waiting: a receive task, handler tasks, a completer that gathers
completions into batch calls, loop signals, and cancellation at every await.
Import it as ``leasekit.aio.AsyncConsumer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any

from . import errors
from .aio_queue import AsyncLease, AsyncQueue, off_loop
from .health import Health, HealthLimits, WorkerPulse, assess
from .keeper import LeaseKeeper
from .lease import Lease
from .message import LeaseState
from .options import MAX_SECONDS, check_number
from .worker_policy import (
    LEASE_WAIT,
    ROOM_WAIT,
    SHUTDOWN_CALL_TIMEOUT,
    ConsumerStats,
    Failure,
    FreeBuffer,
    GroupBuffer,
    HandlerStopped,
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
    transient,
)

__all__ = ["AsyncConsumer"]

_log = logging.getLogger("leasekit.aio")

#: How long a cancelled AsyncConsumer waits for its completion calls in flight
#: before it raises (they go on; a lease whose completion fails comes back when
#: its physical lease ends).
CANCEL_SETTLE_WAIT = 0.5
#: Least pause between two looks at a running handler's lease deadline (a lease
#: nobody renews any more is marked lost there, and its handler cancelled).
LOST_POLL = 0.05
#: A running AsyncConsumer stamps its event loop's tick this often, so its health
#: shows a blocked loop (a handler doing CPU work or blocking I/O) as it happens.
LOOP_TICK = 0.25


def _is_async_callable(handler: object) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


class _Completer:
    """Completes handled leases in backend-sized batches, gathered for ``window`` seconds."""

    def __init__(self, queue: AsyncQueue, size: int, window: float) -> None:
        self._queue = queue
        self._size = size
        self._window = window
        self._pending: list[tuple[Lease, asyncio.Future[Failure]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()
        self._busy: set[int] = set()  # ids of the leases submitted and not yet settled

    def submit(self, lease: Lease) -> asyncio.Future[Failure]:
        """Queue ``lease`` for a shared batch; the future gets its result (never an error)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Failure] = loop.create_future()
        self._pending.append((lease, future))
        self._busy.add(id(lease))
        if len(self._pending) >= self._size:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(completion_window([lease], self._window), self._flush)
        return future

    def holds(self, lease: Lease) -> bool:
        """Whether ``lease`` waits for, or is in, a completion call."""
        return id(lease) in self._busy

    async def drain(self, timeout: float) -> None:
        """Send what waits for company now; wait up to ``timeout`` s for the calls in flight."""
        self._flush()
        if self._flushing:
            await asyncio.wait(list(self._flushing), timeout=timeout)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            batch, self._pending = self._pending[: self._size], self._pending[self._size :]
            task = asyncio.ensure_future(self._settle(batch))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def _settle(self, batch: list[tuple[Lease, asyncio.Future[Failure]]]) -> None:
        leases = [lease for lease, _ in batch]
        try:
            results: list[Failure] = await self._queue.complete_many(leases)
        except errors.LeaseError as exc:
            results = [exc] * len(batch)
        except Exception as exc:  # never leave a waiting completion stranded
            results = [errors.BackendError(f"batch complete failed: {exc!r}")] * len(batch)
        for (lease, future), result in zip(batch, results, strict=True):
            self._busy.discard(id(lease))
            if not future.done():
                future.set_result(result)


class AsyncConsumer:
    """Runs an ``async`` handler on every message of a queue, with leases kept alive by a keeper.

    Parameters:
        queue: the :class:`AsyncQueue` to consume.
        handler: an ``async def`` called as ``await handler(message)`` (or with the
            :class:`AsyncLease`, ``pass_lease=True``). Returning completes the message;
            raising abandons it with an exponential backoff delay.
        concurrency: handlers running at once (tasks, not threads).
        batch_window: longest a completion waits for others to share its batch call.

    The other parameters are :class:`leasekit.Consumer`'s, with the same rules
    (``leasekit.worker_policy``): poison messages are dead-lettered after
    ``max_deliveries``, an idempotency store skips processed ids, failed
    receives and completions are retried while that can help, and the keeper —
    a :class:`leasekit.LeaseKeeper` on its own thread — keeps every leased
    message alive even while a handler blocks the event loop.

    :meth:`run` returns on :meth:`stop`, SIGINT/SIGTERM (``handle_signals``, in the
    main thread), or, with ``until_idle``, when the queue is drained. Cancelling it
    gives back (abandons) every lease it holds and loses nothing.

    Raises:
        InvalidArgument: a handler that is not a coroutine function, concurrency < 1, ...
    """

    def __init__(
        self,
        queue: AsyncQueue,
        handler: Callable[[Any], Awaitable[object]],
        *,
        concurrency: int = 1,
        lease_duration: float | None = None,
        duration_policy: Any = None,
        max_deliveries: int | None = None,
        idempotency: Any = None,
        keeper: LeaseKeeper | None = None,
        max_lifetime: float | None = None,
        prefetch: int | None = None,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        shutdown_grace: float = 30.0,
        pass_lease: bool = False,
        handle_signals: bool = True,
        batch_window: float = 0.005,
    ) -> None:
        if not isinstance(queue, AsyncQueue):
            raise errors.InvalidArgument(
                f"queue must be a leasekit.aio.AsyncQueue, got {queue!r}; "
                "open one with leasekit.aio.open(...)"
            )
        if not _is_async_callable(handler):
            raise errors.InvalidArgument(
                f"handler must be an async function (async def), got {handler!r}; "
                "use leasekit.Consumer for a plain function"
            )
        check_number(batch_window, "batch_window", minimum=0, maximum=MAX_SECONDS)
        self.settings = WorkerSettings.check(
            queue.capabilities,
            queue.default_lease_duration,
            queue.queue.check_duration,
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
        )
        self.queue = queue
        self.handler = handler
        self.concurrency = self.settings.concurrency
        self.batch_window = batch_window
        self._tally = Tally()
        self._worker = Worker(queue.queue, self.settings, self._tally)
        self._running = False
        self._stop: asyncio.Event | None = None
        # On an ordered queue, by group (see worker_policy.GroupBuffer).
        self._buffer: FreeBuffer | GroupBuffer = self._worker.buffer
        self._in_flight: dict[int, Lease] = {}
        # The receive call in flight: a cancelled run() waits for it (its thread
        # cannot be interrupted) and gives back what it got with the rest.
        self._receiving: asyncio.Future[list[AsyncLease]] | None = None
        self._shutdown_deadline: float | None = None  # set while stopping
        self._keeper: LeaseKeeper | None = self.settings.keeper
        self._pulse = WorkerPulse()  # what the receive loop did last, for health()
        self._ticker: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ public

    @property
    def stats(self) -> ConsumerStats:
        """A snapshot of the counters (and the lease-duration policy's figures)."""
        snapshot = replace(self._tally.stats)
        snapshot.buffered = len(self._buffer)
        snapshot.in_flight = len(self._in_flight)
        snapshot.lease_duration = dict(self.settings.duration_policy.figures())
        return snapshot

    def health(self, limits: HealthLimits | None = None) -> Health:
        """Liveness and readiness, measured now; a plain method, safe from any thread.

        As :meth:`leasekit.Consumer.health`. A blocked event loop shows here: the
        receive loop cannot come back when it said it would, so after
        ``limits.stuck_after`` seconds the consumer is not live. Serve it with
        :class:`leasekit.health.HealthServer`, which runs on its own thread and
        so answers while the loop is blocked.
        """
        keeper = self._keeper
        return assess(self._pulse, None if keeper is None else keeper.progress(), limits)

    def stop(self) -> None:
        """Ask :meth:`run` to stop: no new leases; running handlers get ``shutdown_grace``."""
        if self._stop is not None:
            self._stop.set()

    async def run(self, *, until_idle: bool = False) -> ConsumerStats:
        """Consume until :meth:`stop` (or a signal), or with ``until_idle`` until drained.

        Returns:
            The final stats; after a clean return no message is left leased by
            this consumer. Cancelled, it gives back what it holds, then re-raises.

        Raises:
            the receive's error when retrying cannot help (``QueueNotFound``,
            ``AuthenticationFailed``...), after giving back every lease.
        """
        if self._running:
            raise errors.LeaseStateError("this AsyncConsumer is already running")
        self._running = True
        self._stop = asyncio.Event()
        self._worker.begin()
        settings = self.settings
        keeper = settings.keeper or LeaseKeeper()
        own_keeper = settings.keeper is None
        keeper.start()
        self._keeper = keeper
        self._pulse.begin()
        self._tick()
        completer = _Completer(
            self.queue,
            self.queue.capabilities.max_delete_batch,
            self.batch_window,
        )
        ready = asyncio.Condition()
        workers = [
            asyncio.ensure_future(self._work(keeper, completer, ready))
            for _ in range(settings.concurrency)
        ]
        restore = self._install_signals()
        events = self.queue.events
        details = {"queue": self.queue.name, "concurrency": settings.concurrency}
        events.emit("leasekit_worker_event", name="started", details=details)
        grace = settings.shutdown_grace
        try:
            await self._receive(keeper, ready, until_idle)
        except asyncio.CancelledError:
            grace = 0.0  # cancelled: give everything back now, do not wait for handlers
            raise
        finally:
            self._pulse.stopping()
            events.emit("leasekit_worker_event", name="stopping", details=details)
            await asyncio.shield(
                self._shutdown(workers, keeper, completer, ready, own_keeper, grace)
            )
            restore()
            if self._ticker is not None:
                self._ticker.cancel()
                self._ticker = None
            self._running = False
            if own_keeper:
                self._keeper = None
            self._pulse.end()
            events.emit("leasekit_worker_event", name="stopped", details=details)
        return self.stats

    def _tick(self) -> None:
        """Stamp the event loop's tick for health(), and come back in ``LOOP_TICK`` s."""
        self._pulse.ticked(LOOP_TICK)
        self._ticker = asyncio.get_running_loop().call_later(LOOP_TICK, self._tick)

    def _outstanding(self) -> int:
        return len(self._buffer) + len(self._in_flight)

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    # ------------------------------------------------------------ the receiver

    async def _receive(
        self, keeper: LeaseKeeper, ready: asyncio.Condition, until_idle: bool
    ) -> None:
        """Lease in batches while there is room; the workers take from the buffer.

        Every wait here lets a cancellation through: waits are bounded with
        ``asyncio.timeout``, which (unlike ``asyncio.wait_for`` around a
        condition on Python 3.11) never turns a cancel into a normal return.
        """
        stop = self._stop
        assert stop is not None
        budget = ReceiveBudget(self.settings, self.queue.capabilities, self._pulse, self.queue.name)
        while not stop.is_set():
            budget.pulse.expect(ROOM_WAIT)
            async with ready:
                while budget.full(self._outstanding()) and not stop.is_set():
                    budget.pulse.expect(ROOM_WAIT)
                    await _wait(ready.wait(), ROOM_WAIT)
            if stop.is_set():
                return
            want = budget.want(self._outstanding())
            try:
                budget.receiving(self.queue.call_timeout)
                duration = self._worker.lease_duration()
                self._receiving = asyncio.ensure_future(
                    self.queue.lease(want, duration=duration, wait=LEASE_WAIT)
                )
                got = await asyncio.shield(self._receiving)
                self._receiving = None
            except errors.LeaseError as exc:
                self._receiving = None
                pause = budget.failed(exc, self._tally)
                if pause is None:
                    raise
                await _wait(stop.wait(), pause)
                continue
            budget.received()
            if not got:
                if until_idle and not self._outstanding():
                    return
                continue
            leases = [alease.lease for alease in got]
            keeper.add_many(leases, max_lifetime=self.settings.max_lifetime)
            self._tally.add("received", len(leases))
            async with ready:
                self._buffer.extend(leases)
                ready.notify(len(leases))

    # ------------------------------------------------------------- the workers

    async def _work(
        self, keeper: LeaseKeeper, completer: _Completer, ready: asyncio.Condition
    ) -> None:
        """A worker task: take a message, handle it, settle it; until the buffer is closed."""
        while True:
            async with ready:
                # Once stop() is asked, no new message is started: the buffer goes back.
                while (not self._buffer or self._stopping()) and not self._worker.shutting_down:
                    await ready.wait()
                if not self._buffer:
                    return
                lease = self._buffer.popleft()
                self._in_flight[id(lease)] = lease
                ready.notify_all()
            try:
                await self._process(lease, keeper, completer)
            except Exception:
                _log.exception("worker failed on message %r; giving it back", lease.message.id)
                await self._give_back([lease], keeper, "abandoned")
                await self._release(lease, "error", keeper)
            finally:
                self._in_flight.pop(id(lease), None)
                async with ready:
                    ready.notify_all()

    async def _process(self, lease: Lease, keeper: LeaseKeeper, completer: _Completer) -> None:
        """One message's flow, then its completion in a shared batch; hooks around it."""
        events = self.queue.events
        events.emit("leasekit_before_process", lease=lease)
        outcome = await self._drive(self._worker.message_flow(lease))
        if outcome.name == "handled":
            outcome = self._completed(lease, await self._complete(lease, keeper, completer))
        keeper.discard(lease)
        events.emit(
            "leasekit_after_process", lease=lease, error=outcome.error, outcome=outcome.name
        )
        await self._release(lease, outcome.name, keeper)

    async def _release(self, lease: Lease, outcome: str, keeper: LeaseKeeper) -> None:
        """Ordered queues: ``lease`` is settled; its group's next may start, or goes back.

        See :class:`~leasekit.worker_policy.GroupBuffer` (the worker task's
        ``finally`` wakes the other workers); a no-op on an unordered queue.
        """
        back = self._buffer.release(lease, outcome)
        if back:
            await self._give_back(back, keeper, "returned_in_order")

    def _completed(self, lease: Lease, failure: Failure) -> Outcome:
        outcome = self._worker.finish(lease, failure)
        if outcome.name == "completed":
            self._tally.add("completed")
        return outcome

    def _completed_late(
        self, lease: Lease, keeper: LeaseKeeper, future: asyncio.Future[Failure]
    ) -> None:
        """A completion whose worker was cancelled meanwhile ended: count it as any other."""
        if future.cancelled():
            return
        outcome = self._completed(lease, future.result())
        keeper.discard(lease)
        self.queue.events.emit(
            "leasekit_after_process", lease=lease, error=outcome.error, outcome=outcome.name
        )

    async def _drive(self, flow: MessageFlow) -> Outcome:
        """Run a message's flow to its outcome: blocking steps off the loop, the handler awaited."""
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
                    await self._run_handler(step.lease)
                else:
                    result = await self.queue._run(step.fn)
            except Exception as exc:
                error = exc

    async def _run_handler(self, lease: Lease) -> None:
        """Await the handler in a task of its own, cancelled if its lease is found lost.

        The lease is found lost by the keeper (at its deadline, or a renewal
        refused) or, once nothing renews it (``max_lifetime``), by a timer here
        at its deadline. A handler stopped so raises :class:`HandlerStopped`
        into the flow, however it ended after the cancel; the worker's own
        cancellation (shutdown, ``run()`` cancelled) cancels the handler too and
        goes on as a cancellation.
        """
        loop = asyncio.get_running_loop()
        argument = AsyncLease(self.queue, lease) if self.settings.pass_lease else lease.message
        handler = asyncio.ensure_future(self.handler(argument))  # copies the context (spans)
        stopped = False
        timer: asyncio.TimerHandle | None = None

        def stop() -> None:
            nonlocal stopped
            if not handler.done() and handler.cancel():
                stopped = True

        def lost(_lease: Lease, _error: errors.LeaseLost) -> None:
            loop.call_soon_threadsafe(stop)  # from the keeper's thread, or at once here

        def watch() -> None:
            nonlocal timer
            timer = None
            if handler.done() or lease.state is not LeaseState.HELD:
                return
            if lease.expire(reason="nothing renewed it while its handler ran") is None:
                timer = loop.call_later(max(LOST_POLL, lease.time_left), watch)

        lease.on_lost(lost)
        timer = loop.call_later(max(LOST_POLL, lease.time_left), watch)
        try:
            await handler
        except asyncio.CancelledError:
            if not stopped or _cancelling():
                raise
        finally:
            lease.remove_on_lost(lost)
            if timer is not None:
                timer.cancel()
        if stopped:
            raise HandlerStopped(lease.lost_error)

    async def _complete(self, lease: Lease, keeper: LeaseKeeper, completer: _Completer) -> Failure:
        """Complete in a shared batch; retry a transient failure (``retry_flow``).

        Cancelled while the completion call is in flight, the call still ends on
        its own; it is counted (and its hook emitted) then.
        """
        future = completer.submit(lease)
        try:
            failure = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(partial(self._completed_late, lease, keeper))
            raise
        if not transient(failure):
            return failure
        flow = retry_flow([lease], [failure], self._tally, self._give_up_at)
        try:
            step = next(flow)
            while True:
                if isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                    step = flow.send([])
                else:
                    step = flow.send([await completer.submit(again) for again in step])
        except StopIteration as stop:
            return stop.value[0]  # type: ignore[no-any-return]

    def _give_up_at(self) -> float:
        end = self._shutdown_deadline
        return float("inf") if end is None else end

    # ---------------------------------------------------------------- shutdown

    async def _shutdown(
        self,
        workers: list[asyncio.Task[None]],
        keeper: LeaseKeeper,
        completer: _Completer,
        ready: asyncio.Condition,
        own_keeper: bool,
        grace: float,
    ) -> None:
        """Give back what is buffered, let handlers finish (``grace`` s), give back the rest.

        A receive still in flight (``run()`` was cancelled during it) is waited
        for first — its thread cannot be interrupted, and it would otherwise take
        the messages given back below and return them later — and what it got
        is given back with the rest.
        """
        self._worker.shutting_down = True
        self._shutdown_deadline = time.monotonic() + grace
        receiving, self._receiving = self._receiving, None
        if receiving is not None:
            try:
                got = await receiving
            except Exception:  # a failed receive: the receive loop dealt with it
                got = []
            await self._give_back([alease.lease for alease in got], keeper, "abandoned_at_shutdown")
        async with ready:
            unstarted = list(self._buffer)
            self._buffer.clear()
            ready.notify_all()
        await self._give_back(unstarted, keeper, "abandoned_at_shutdown")
        if workers:
            _, running = await asyncio.wait(workers, timeout=grace) if grace > 0 else ((), workers)
            overdue = list(self._in_flight.values())  # before the cancelled workers drop them
            for task in running:
                task.cancel()
            if running:
                # A handler that swallows its cancellation is not waited for past this.
                await asyncio.wait(running, timeout=SHUTDOWN_CALL_TIMEOUT)
            # Completions in flight end on their own (and are counted then); wait for
            # them briefly, and leave their leases alone: they are being settled.
            await completer.drain(SHUTDOWN_CALL_TIMEOUT if grace > 0 else CANCEL_SETTLE_WAIT)
            overdue = [lease for lease in overdue if not completer.holds(lease)]
            if overdue:
                _log.warning(
                    "%d handler(s) did not finish within the %.0f s grace period; abandoning "
                    "their leases",
                    len(overdue),
                    grace,
                )
            await self._give_back(overdue, keeper, "abandoned_at_shutdown")
        self._in_flight.clear()
        if own_keeper:
            await off_loop(keeper.stop)
        self._worker.shutting_down = False
        self._shutdown_deadline = None

    async def _give_back(self, leases: list[Lease], keeper: LeaseKeeper, counter: str) -> None:
        """Abandon the held ones of ``leases`` in one call bounded by ``SHUTDOWN_CALL_TIMEOUT``."""
        keeper.discard_many(leases)
        held = [lease for lease in leases if lease.state is LeaseState.HELD]
        if not held:
            return
        try:
            results: list[Any] = await self.queue.abandon_many(held, timeout=SHUTDOWN_CALL_TIMEOUT)
        except (errors.LeaseError, errors.LeaseStateError) as exc:
            results = [exc] * len(held)
        self._worker.given_back(held, results, counter)

    def _install_signals(self) -> Callable[[], None]:
        if not self.settings.handle_signals or threading.current_thread() is not (
            threading.main_thread()
        ):
            return lambda: None
        loop = asyncio.get_running_loop()
        installed = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(signum, self._on_signal, signum)
            except (NotImplementedError, RuntimeError):  # not on this loop / platform
                continue
            installed.append(signum)

        def restore() -> None:
            for signum in installed:
                loop.remove_signal_handler(signum)

        return restore

    def _on_signal(self, signum: int) -> None:
        _log.info("signal %d: stopping the consumer gracefully", signum)
        self.stop()


def _cancelling() -> bool:
    """Whether the current task itself is being cancelled (not only what it awaits)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _wait(awaitable: Awaitable[Any], timeout: float) -> None:
    """Await ``awaitable`` for at most ``timeout`` seconds; a cancellation always goes through.

    ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11 ``wait_for``
    returns the inner result when it completes in the same loop iteration as
    an outer cancel, swallowing the cancellation (cpython gh-86296).
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await awaitable
