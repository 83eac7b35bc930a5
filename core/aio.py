"""``leasekit.aio``: the asyncio face of leasekit — the same queues, leases and rules, awaitable.

::

    import leasekit.aio

    async with leasekit.aio.open("sqlite:///jobs.db?queue=jobs", create=True) as queue:
        await queue.send(b"hello")
        async with queue.lease_one(duration=30, wait=5) as lease:
            await handle(lease.message)
            await lease.complete()

    consumer = leasekit.aio.AsyncConsumer(queue, handle, concurrency=200)
    await consumer.run()

It is a face over core, not a second core. An :class:`AsyncQueue` wraps a
:class:`leasekit.Queue` and runs its calls on a small thread pool of its own
(``threads``), so validation, receipts and lease state, call deadlines, retries,
batching, plugin events, capabilities and errors are exactly the sync API's:
bad input raises the same typed error before any backend call, from the same
code. The event loop never makes a backend call, and never renews: leases are
kept alive by :class:`leasekit.LeaseKeeper`, which runs on a thread of its own,
so a handler that blocks the loop (CPU work, a forgotten ``time.sleep``) cannot
starve renewals — the way asyncio lock renewers lose their locks.

Why threads and not each SDK's own async client: measured in
``benchmarks/bench_asyncio.py`` (results in ``docs/asyncio.md``). Core batches
receives and completions, so a consumer makes few backend calls however many
handlers await at once; a few threads carry them, and the handlers themselves
are coroutines, not threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from functools import partial
from queue import SimpleQueue
from types import TracebackType
from typing import Any, TypeVar

from . import errors
from .capabilities import Capabilities
from .events import Events
from .health import Health, HealthLimits, WorkerPulse, assess
from .keeper import KeeperStats, LeaseKeeper
from .lease import Lease
from .message import LeaseState, Message
from .options import MAX_SECONDS, check_int, check_number, is_number
from .queue import Queue
from .registry import default_registry
from .retry import RetryPolicy
from .spi import DeadLetter, Driver, QueueStats
from .worker_policy import (
    LEASE_WAIT,
    ROOM_WAIT,
    SHUTDOWN_CALL_TIMEOUT,
    ConsumerStats,
    Failure,
    MessageFlow,
    Outcome,
    Pause,
    ReceiveBudget,
    RunHandler,
    Tally,
    Worker,
    WorkerSettings,
    retry_flow,
    transient,
)

__all__ = [
    "DEFAULT_THREADS",
    "AsyncConsumer",
    "AsyncLease",
    "AsyncLeaseKeeper",
    "AsyncQueue",
    "open",
]

T = TypeVar("T")

_log = logging.getLogger("leasekit.aio")

#: Threads an AsyncQueue makes backend calls on. Each call in flight holds one
#: (a long poll for its wait): a consumer needs its receive plus a few settles,
#: and batching keeps that small however many handlers await at once.
DEFAULT_THREADS = 8
#: Longest step of ``lease_one(wait=None)``: it waits in long polls of this many seconds.
LEASE_ONE_STEP = 20.0

#: How long a cancelled AsyncConsumer waits for its completion calls in flight
#: before it raises (they go on; a lease whose completion fails comes back when
#: its physical lease ends).
CANCEL_SETTLE_WAIT = 0.5
#: A running AsyncConsumer stamps its event loop's tick this often, so its health
#: shows a blocked loop (a handler doing CPU work or blocking I/O) as it happens.
LOOP_TICK = 0.25


class _Workers:
    """Threads that run sync calls for one event loop's coroutines.

    A call is queued with its asyncio future; a worker runs it and hands the
    result back with ``call_soon_threadsafe``. Not a ``ThreadPoolExecutor``
    because of two things it cannot do: its threads are joined at interpreter
    exit, so one call hanging on a dead network would keep the process from
    exiting (these are daemons), and a result whose event loop has closed
    meanwhile — leases nobody can receive any more — is handed to ``orphan``
    to give back. It is not faster: a round trip costs what
    ``run_in_executor``'s does (45–100 µs on the project's VMs; the two thread
    wake-ups are the cost). Threads start on demand up to ``size``; idle ones
    wait on the queue.
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._jobs: SimpleQueue[_Job | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def run(
        self, call: Callable[[], T], orphan: Callable[[T], None] | None = None
    ) -> asyncio.Future[T]:
        """Queue ``call``; the future (of the running loop) gets its result or error.

        ``orphan(result)`` runs (on the worker) for a result nobody can receive any
        more because the event loop closed meanwhile.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        # In the caller's context (as asyncio.to_thread does): plugins see its contextvars,
        # e.g. a tracing plugin makes a settle span the child of the handler's span.
        call = partial(contextvars.copy_context().run, call)
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # an idle worker takes it
            elif len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._jobs.put((call, loop, future, orphan))
        return future

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            call, loop, future, orphan = job
            error: BaseException | None = None
            result: Any = None
            try:
                result = call()
            except BaseException as exc:
                error = exc
            try:
                loop.call_soon_threadsafe(_deliver, future, result, error)
            except RuntimeError:  # the loop closed while the call ran: nobody waits
                if orphan is not None and error is None:
                    orphan(result)
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        """Let every worker finish its job and end."""
        for _ in self._threads:
            self._jobs.put(None)


_Job = tuple[
    Callable[[], Any],
    asyncio.AbstractEventLoop,
    "asyncio.Future[Any]",
    Callable[[Any], None] | None,
]


def _deliver(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile: nobody waits
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


#: Threads for calls that belong to no queue (stopping a keeper); every call
#: leasekit.aio makes off the event loop goes through a ``_Workers`` pool.
_SHARED = _Workers(2, "leasekit-aio-shared")


def off_loop(call: Callable[[], T]) -> asyncio.Future[T]:
    """Run a blocking ``call`` that belongs to no queue off the event loop; await the result."""
    return _SHARED.run(call)


# --------------------------------------------------------------------- opening


class _Opening:
    """What :func:`open` returns: await it for the queue, or use it as ``async with``."""

    def __init__(self, make: Callable[[], Awaitable[AsyncQueue]]) -> None:
        self._make = make
        self._queue: AsyncQueue | None = None

    def __await__(self) -> Generator[Any, None, AsyncQueue]:
        return self._make().__await__()

    async def __aenter__(self) -> AsyncQueue:
        self._queue = await self._make()
        return self._queue

    async def __aexit__(self, *exc_info: object) -> None:
        if self._queue is not None:
            await self._queue.close()


def open(
    target: str,
    *,
    create: bool = False,
    lease_duration: float | None = None,
    retry: RetryPolicy | None = None,
    call_timeout: float | None = None,
    threads: int = DEFAULT_THREADS,
    **options: Any,
) -> _Opening:
    """Open a queue for asyncio: await it, or use it as ``async with ... as queue``.

    The same targets and options as :func:`leasekit.open`; ``threads`` is the size
    of the queue's thread pool for backend calls. Bad input (a malformed URL, an
    unknown option) raises at once, before any call; ``create=True`` creates the
    queue off the event loop.

    Raises:
        InvalidURL, BackendNotFound, BackendNotInstalled: as :func:`leasekit.open`.
    """
    check_int(threads, "threads", minimum=1)
    queue = default_registry().open(
        target,
        create=False,
        lease_duration=lease_duration,
        retry=retry,
        call_timeout=call_timeout,
        **options,
    )
    if not isinstance(create, bool):
        queue.close()
        raise errors.InvalidArgument(f"create must be True or False, got {create!r}")

    async def make() -> AsyncQueue:
        opened = AsyncQueue(queue, threads=threads)
        if create:
            try:
                await opened.create()
            except BaseException:
                await opened.close()
                raise
        return opened

    return _Opening(make)


# ----------------------------------------------------------------------- queue


class AsyncQueue:
    """One queue for asyncio: :class:`leasekit.Queue`'s methods, awaitable.

    Parameters
    ----------
        queue: the sync queue it drives (:func:`open` makes it).
        threads: the thread pool's size for backend calls.

    Every method runs the sync queue's method on the pool: same arguments,
    same results (leases come as :class:`AsyncLease`), same errors, raised
    before any backend call for bad input. A context manager (``async with``);
    :meth:`close` releases the backend's connections and the pool.
    """

    def __init__(self, queue: Queue, *, threads: int = DEFAULT_THREADS) -> None:
        if not isinstance(queue, Queue):
            raise errors.InvalidArgument(f"queue must be a leasekit Queue, got {queue!r}")
        check_int(threads, "threads", minimum=1)
        self._queue = queue
        self._threads = threads
        self._workers = _Workers(threads, "leasekit-aio")
        self._closed = False
        #: Receives in flight, each with the monotonic time by which it must have returned.
        self._receives: dict[asyncio.Future[list[Lease]], float] = {}
        #: Give-backs in flight (of receives whose caller was cancelled).
        self._giving_back: set[asyncio.Future[None]] = set()

    # ------------------------------------------------------------- properties

    @property
    def queue(self) -> Queue:
        """The sync queue underneath (the same leases, keeper and events)."""
        return self._queue

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._queue.name

    @property
    def capabilities(self) -> Capabilities:
        """What this backend guarantees."""
        return self._queue.capabilities

    @property
    def driver(self) -> Driver:
        """The backend driver (for vendors and tests)."""
        return self._queue.driver

    @property
    def default_lease_duration(self) -> float:
        """The physical lease used when a call gives none."""
        return self._queue.default_lease_duration

    @property
    def call_timeout(self) -> float:
        """The longest one backend call may take when nothing tighter bounds it."""
        return self._queue.call_timeout

    @property
    def events(self) -> Events:
        """The plugin event hooks this queue's work reports to."""
        return self._queue.events

    @property
    def threads(self) -> int:
        """The thread pool's size for backend calls."""
        return self._threads

    def __repr__(self) -> str:
        return f"<AsyncQueue {self._queue.driver.scheme}:{self.name}>"

    # --------------------------------------------------------------- plumbing

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a sync call on the pool; the event loop waits without blocking."""
        if self._closed:
            raise errors.LeaseStateError(f"queue {self.name!r} is closed; open it again")
        return await self._workers.run(partial(fn, *args, **kwargs))

    def _wrap(self, leases: Iterable[Lease]) -> list[AsyncLease]:
        return [AsyncLease(self, lease) for lease in leases]

    @staticmethod
    def _unwrap(leases: Iterable[AsyncLease | Lease]) -> list[Lease]:
        unwrapped = []
        for lease in leases:
            if isinstance(lease, AsyncLease):
                unwrapped.append(lease.lease)
            elif isinstance(lease, Lease):
                unwrapped.append(lease)
            else:
                raise errors.InvalidArgument(f"expected an AsyncLease, got {lease!r}")
        return unwrapped

    # ---------------------------------------------------------------- sending

    async def send(
        self,
        body: bytes,
        *,
        delay: float = 0,
        ttl: float | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> str:
        """Send one message and return its id (see :meth:`leasekit.Queue.send`)."""
        return await self._run(self._queue.send, body, delay=delay, ttl=ttl, properties=properties)

    async def send_many(
        self,
        bodies: Iterable[bytes],
        *,
        delay: float = 0,
        ttl: float | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Send several messages; return their ids (see :meth:`leasekit.Queue.send_many`)."""
        return await self._run(
            self._queue.send_many, list(bodies), delay=delay, ttl=ttl, properties=properties
        )

    # ---------------------------------------------------------------- leasing

    async def lease(
        self, max_messages: int = 1, *, duration: float | None = None, wait: float = 0
    ) -> list[AsyncLease]:
        """Lease up to ``max_messages`` messages (see :meth:`leasekit.Queue.lease`).

        Cancelling the awaiting task gives back (abandons) what the receive got.
        """
        if self._closed:
            raise errors.LeaseStateError(f"queue {self.name!r} is closed; open it again")
        call = partial(self._queue.lease, max_messages, duration=duration, wait=wait)
        future = self._workers.run(call, orphan=partial(_abandon_quietly, self._queue))
        # close() waits for it until it must have returned: its long poll, then its deadline.
        waits = wait if is_number(wait) and 0 <= wait < MAX_SECONDS else 0.0
        self._receives[future] = time.monotonic() + float(waits) + self.call_timeout
        future.add_done_callback(self._receives.pop)
        try:
            leases = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._give_back_when_done)
            raise
        return self._wrap(leases)

    def _give_back_when_done(self, future: asyncio.Future[list[Lease]]) -> None:
        """A receive whose caller was cancelled: abandon what it got, off the loop.

        :meth:`close` waits for these give-backs before it closes the queue.
        """
        if future.cancelled() or future.exception() is not None:
            return
        leases = future.result()
        if leases and not self._closed:
            giving = self._workers.run(partial(_abandon_quietly, self._queue, leases))
            self._giving_back.add(giving)
            giving.add_done_callback(self._giving_back.discard)

    @contextlib.asynccontextmanager
    async def lease_one(
        self, *, duration: float | None = None, wait: float | None = None
    ) -> AsyncIterator[AsyncLease]:
        """Lease one message for an ``async with`` block; leaving without settling abandons it.

        Parameters
        ----------
            duration: the physical lease; the queue's default if ``None``.
            wait: seconds to wait for a message; ``None`` waits until one arrives.

        Raises
        ------
            QueueEmpty: ``wait`` passed with no message.
        """
        until = None if wait is None else time.monotonic() + check_number(wait, "wait", minimum=0)
        while True:
            step = LEASE_ONE_STEP if until is None else max(0.0, until - time.monotonic())
            leases = await self.lease(1, duration=duration, wait=step)
            if leases:
                break
            if until is not None and time.monotonic() >= until:
                raise errors.QueueEmpty(f"no message on {self.name!r} within {wait} s")
        async with leases[0] as lease:
            yield lease

    # -------------------------------------------------------- lease batches

    async def complete_many(
        self, leases: Iterable[AsyncLease | Lease], *, timeout: float | None = None
    ) -> list[Failure]:
        """Complete several leases; one result each (see :meth:`leasekit.Queue.complete_many`)."""
        return await self._run(self._queue.complete_many, self._unwrap(leases), timeout=timeout)

    async def renew_many(
        self,
        leases: Iterable[AsyncLease | Lease],
        duration: float | None = None,
        *,
        timeout: float | None = None,
    ) -> list[Failure]:
        """Renew several leases; one result each (see :meth:`leasekit.Queue.renew_many`)."""
        return await self._run(
            self._queue.renew_many, self._unwrap(leases), duration, timeout=timeout
        )

    async def abandon_many(
        self,
        leases: Iterable[AsyncLease | Lease],
        delay: float = 0,
        *,
        timeout: float | None = None,
    ) -> list[Failure]:
        """Give several leases back; one result each (see :meth:`leasekit.Queue.abandon_many`)."""
        return await self._run(
            self._queue.abandon_many, self._unwrap(leases), delay, timeout=timeout
        )

    # ------------------------------------------------------------------ admin

    async def stats(self) -> QueueStats:
        """Message counts where the backend can tell (see :meth:`leasekit.Queue.stats`)."""
        return await self._run(self._queue.stats)

    async def peek_dead_letters(self, limit: int = 10) -> list[DeadLetter]:
        """Read dead-lettered messages without removing them."""
        return await self._run(self._queue.peek_dead_letters, limit)

    async def create(self) -> None:
        """Create the queue if it does not exist."""
        await self._run(self._queue.create)

    async def delete(self) -> None:
        """Delete the queue and every message in it (see :meth:`leasekit.Queue.delete`)."""
        await self._run(self._queue.delete)

    async def close(self) -> None:
        """Release the backend's connections and the thread pool; idempotent.

        Receives still in flight are waited for first (each at most until its
        long poll and deadline end), and what those whose caller was cancelled
        got is given back before the queue closes: the usual shutdown order —
        cancel the tasks, then close the queue — leaves no message hidden.
        """
        if self._closed:
            return
        if self._receives:
            until = max(self._receives.values())
            await asyncio.wait(list(self._receives), timeout=max(0.0, until - time.monotonic()))
            await asyncio.sleep(0)  # the done callbacks queue their give-backs
        if self._giving_back:
            await asyncio.wait(list(self._giving_back), timeout=SHUTDOWN_CALL_TIMEOUT + 1)
        await self._workers.run(self._queue.close)
        self._closed = True
        self._workers.close()

    aclose = close

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _abandon_quietly(queue: Queue, leases: list[Lease]) -> None:
    """Give back leases nobody will handle (a cancelled receive); log, never raise."""
    if not leases:
        return
    try:
        queue.abandon_many(leases, timeout=SHUTDOWN_CALL_TIMEOUT)
    except (errors.LeaseError, errors.LeaseStateError) as exc:
        _log.warning("could not give back %d leases: %s", len(leases), exc)


# ----------------------------------------------------------------------- lease


class AsyncLease:
    """A :class:`leasekit.Lease` for asyncio: the same state and rules, awaitable settles.

    Reading it (``receipt``, ``state``, ``lost``, ``time_left``) never waits;
    :meth:`renew`, :meth:`complete`, :meth:`abandon` and :meth:`dead_letter` run
    on the queue's thread pool. Used as ``async with``, leaving without settling
    abandons it.
    """

    __slots__ = ("_lease", "_queue")

    def __init__(self, queue: AsyncQueue, lease: Lease) -> None:
        self._queue = queue
        self._lease = lease

    @property
    def lease(self) -> Lease:
        """The sync lease underneath (what a :class:`leasekit.LeaseKeeper` keeps)."""
        return self._lease

    @property
    def queue(self) -> AsyncQueue:
        """The queue this lease came from."""
        return self._queue

    @property
    def message(self) -> Message:
        """The leased message."""
        return self._lease.message

    @property
    def receipt(self) -> str:
        """The newest receipt."""
        return self._lease.receipt

    @property
    def expires_at(self) -> datetime:
        """When the current physical lease ends, as the backend said (UTC)."""
        return self._lease.expires_at

    @property
    def time_left(self) -> float:
        """Seconds until the lease ends by leasekit's own clock."""
        return self._lease.time_left

    @property
    def deadline(self) -> float:
        """When the lease ends by leasekit's own clock, on :func:`time.monotonic`."""
        return self._lease.deadline

    @property
    def duration(self) -> float:
        """The physical lease duration last set, in seconds."""
        return self._lease.duration

    @property
    def state(self) -> LeaseState:
        """The lease's state."""
        return self._lease.state

    @property
    def lost(self) -> threading.Event:
        """Set when the lease is found lost (poll ``lease.lost.is_set()``, or :meth:`wait_lost`)."""
        return self._lease.lost

    @property
    def lost_error(self) -> errors.LeaseLost | None:
        """The error that marked the lease lost, or ``None``."""
        return self._lease.lost_error

    @property
    def raw(self) -> Any:
        """The SDK's own message object."""
        return self._lease.raw

    @property
    def can_abandon_with_delay(self) -> bool:
        """Whether :meth:`abandon` accepts a delay greater than zero on this backend."""
        return self._lease.can_abandon_with_delay

    def __repr__(self) -> str:
        return repr(self._lease).replace("<Lease", "<AsyncLease", 1)

    async def renew(self, duration: float | None = None) -> None:
        """Keep the message invisible for ``duration`` more seconds (see :meth:`Lease.renew`)."""
        await self._queue._run(self._lease.renew, duration)

    async def complete(self) -> None:
        """Delete the message: it is never delivered again (see :meth:`Lease.complete`)."""
        await self._queue._run(self._lease.complete)

    async def abandon(self, delay: float = 0) -> None:
        """Give the message back, visible now or after ``delay`` (see :meth:`Lease.abandon`)."""
        await self._queue._run(self._lease.abandon, delay)

    async def dead_letter(self, reason: str) -> None:
        """Move the message to the dead-letter place (see :meth:`Lease.dead_letter`)."""
        await self._queue._run(self._lease.dead_letter, reason)

    def check(self) -> None:
        """Raise :class:`~leasekit.LeaseLost` if the lease was found lost."""
        self._lease.check()

    def on_lost(self, callback: Callable[[AsyncLease, errors.LeaseLost], None]) -> None:
        """Call ``callback(lease, error)`` when the lease is found lost (on the keeper's thread)."""
        if not callable(callback):
            raise errors.InvalidArgument(f"callback must be callable, got {callback!r}")
        self._lease.on_lost(lambda lease, error: callback(self, error))

    async def wait_lost(self, timeout: float | None = None) -> bool:
        """Wait (without a thread) until the lease is found lost; ``False`` after ``timeout``.

        A wait that times out or is cancelled leaves nothing behind on the lease.
        """
        if timeout is not None:
            check_number(timeout, "timeout", minimum=0)
        if self._lease.lost.is_set():
            return True
        loop = asyncio.get_running_loop()
        found: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not found.done():
                found.set_result(None)

        def tell(lease: Lease, error: errors.LeaseLost) -> None:
            loop.call_soon_threadsafe(settle)

        self._lease.on_lost(tell)
        try:
            async with asyncio.timeout(timeout):
                await found
        except TimeoutError:
            return False
        finally:
            self._lease.remove_on_lost(tell)
        return True

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.state is LeaseState.HELD:
            with contextlib.suppress(errors.LeaseLost):
                await self.abandon()


# ---------------------------------------------------------------------- keeper


class AsyncLeaseKeeper:
    """A :class:`leasekit.LeaseKeeper` for asyncio code: renews on its own thread, never the loop.

    Takes the same parameters. ``add``/``discard`` never wait; ``stop`` (and
    leaving ``async with``) waits for the keeper's threads off the loop.
    """

    def __init__(self, **options: Any) -> None:
        self._keeper = LeaseKeeper(**options)

    @property
    def keeper(self) -> LeaseKeeper:
        """The sync keeper underneath."""
        return self._keeper

    @property
    def stats(self) -> KeeperStats:
        """The keeper's counters."""
        return self._keeper.stats

    def add(self, lease: AsyncLease | Lease, **options: Any) -> None:
        """Start keeping ``lease`` alive (see :meth:`LeaseKeeper.add`)."""
        self._keeper.add(AsyncQueue._unwrap([lease])[0], **options)

    def add_many(self, leases: Iterable[AsyncLease | Lease], **options: Any) -> None:
        """Start keeping several leases alive."""
        self._keeper.add_many(AsyncQueue._unwrap(leases), **options)

    def discard(self, lease: AsyncLease | Lease) -> None:
        """Stop keeping ``lease`` alive."""
        self._keeper.discard(AsyncQueue._unwrap([lease])[0])

    def discard_many(self, leases: Iterable[AsyncLease | Lease]) -> None:
        """Stop keeping several leases alive."""
        self._keeper.discard_many(AsyncQueue._unwrap(leases))

    @contextlib.asynccontextmanager
    async def hold(self, lease: AsyncLease, **options: Any) -> AsyncIterator[AsyncLease]:
        """Keep ``lease`` alive for an ``async with`` block."""
        self.add(lease, **options)
        try:
            yield lease
        finally:
            self.discard(lease)

    def start(self) -> AsyncLeaseKeeper:
        """Start the keeper's scheduler thread."""
        self._keeper.start()
        return self

    async def stop(self) -> None:
        """Stop renewing, off the loop (returns within the keeper's ``stop_timeout``)."""
        await off_loop(self._keeper.stop)

    async def __aenter__(self) -> AsyncLeaseKeeper:
        return self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def __contains__(self, lease: object) -> bool:
        return (lease.lease if isinstance(lease, AsyncLease) else lease) in self._keeper

    def __len__(self) -> int:
        return len(self._keeper)


# -------------------------------------------------------------------- consumer


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
            self._timer = loop.call_later(self._window, self._flush)
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
        self._buffer: deque[Lease] = deque()
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
            self.queue, self.queue.capabilities.max_delete_batch, self.batch_window
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
                    lease = step.lease
                    pass_lease = self.settings.pass_lease
                    await self.handler(
                        AsyncLease(self.queue, lease) if pass_lease else lease.message
                    )
                else:
                    result = await self.queue._run(step.fn)
            except Exception as exc:
                error = exc

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


async def _wait(awaitable: Awaitable[Any], timeout: float) -> None:
    """Await ``awaitable`` for at most ``timeout`` seconds; a cancellation always goes through.

    ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11 ``wait_for``
    returns the inner result when it completes in the same loop iteration as
    an outer cancel, swallowing the cancellation (cpython gh-86296).
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await awaitable
