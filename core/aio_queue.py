"""The asyncio queue, lease and keeper: :mod:`leasekit.aio`'s face over core.

Imported through :mod:`leasekit.aio` (which adds the worker,
:mod:`leasekit.aio_consumer`); see that module for the whole picture. Split out so
that the worker builds on this module and the public module on both, with no
import circle between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Mapping
from datetime import datetime
from functools import partial
from queue import SimpleQueue
from types import TracebackType
from typing import Any, TypeVar

from . import arguments, errors
from .capabilities import Capabilities
from .checkpoints import CheckpointStore
from .events import Events
from .keeper import KeeperStats, LeaseKeeper
from .lease import Lease
from .message import LeaseState, Message
from .options import MAX_SECONDS, check_int, check_number, is_number
from .queue import Queue
from .registry import default_registry
from .retry import RetryPolicy
from .spi import DeadLetter, Driver, QueueStats
from .worker_policy import (
    SHUTDOWN_CALL_TIMEOUT,
    Failure,
)

__all__ = [
    "DEFAULT_THREADS",
    "AsyncLease",
    "AsyncLeaseKeeper",
    "AsyncQueue",
    "off_loop",
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

    @property
    def checkpoint_store(self) -> CheckpointStore | None:
        """Where checkpoints go on a backend that cannot keep them (see :class:`leasekit.Queue`)."""
        return self._queue.checkpoint_store

    @property
    def can_checkpoint(self) -> bool:
        """Whether :meth:`AsyncLease.checkpoint` works (natively or with a store)."""
        return self._queue.can_checkpoint

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
        group: str | None = None,
        dedup_key: str | None = None,
    ) -> str:
        """Send one message and return its id (see :meth:`leasekit.Queue.send`)."""
        return await self._run(
            self._queue.send,
            body,
            delay=delay,
            ttl=ttl,
            properties=properties,
            group=group,
            dedup_key=dedup_key,
        )

    async def send_many(
        self,
        bodies: Iterable[bytes],
        *,
        delay: float = 0,
        ttl: float | None = None,
        properties: Mapping[str, str] | None = None,
        group: str | None = None,
    ) -> list[str]:
        """Send several messages; return their ids (see :meth:`leasekit.Queue.send_many`)."""
        return await self._run(
            self._queue.send_many,
            list(bodies),
            delay=delay,
            ttl=ttl,
            properties=properties,
            group=group,
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
        until = None if wait is None else time.monotonic() + arguments.wait(wait)
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

    async def delete_queue(self) -> None:
        """Delete the queue and every message in it (see :meth:`leasekit.Queue.delete_queue`)."""
        await self._run(self._queue.delete_queue)

    async def delete(self) -> None:
        """Deprecated alias of :meth:`delete_queue`: it deletes the whole queue, not a message.

        Warns with a :class:`DeprecationWarning`; use :meth:`delete_queue`.
        """
        warnings.warn(
            "AsyncQueue.delete() is deprecated: it deletes the whole queue; "
            "use AsyncQueue.delete_queue()",
            DeprecationWarning,
            stacklevel=2,
        )
        await self.delete_queue()

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

    async def checkpoint(self, data: bytes) -> None:
        """Save ``data`` as the message's progress; the lease stays held (:meth:`Lease.checkpoint`).

        Cancelled while the call is in flight, the call still ends on its own
        (its thread cannot be interrupted): the checkpoint may or may not be saved.
        """
        await self._queue._run(self._lease.checkpoint, data)

    async def group_state(self) -> bytes | None:
        """The state kept with the message's group (see :meth:`Lease.group_state`)."""
        state: bytes | None = await self._queue._run(self._lease.group_state)
        return state

    async def set_group_state(self, state: bytes | None) -> None:
        """Replace the state kept with the message's group (:meth:`Lease.set_group_state`)."""
        await self._queue._run(self._lease.set_group_state, state)

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
        if self._lease.lost_error is not None:  # not ``lost.is_set()``: no Event made for it
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
