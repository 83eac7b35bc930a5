"""Running the conformance suite through ``leasekit.aio``: the same matrix, either way.

:class:`AsyncUrlHarness` opens each queue with :func:`leasekit.aio.open` on an
event loop of its own (a thread), and hands the suite a :class:`BlockingQueue`:
a thin synchronous face whose every call is an ``await`` of the async API on
that loop. So each conformance test drives the backend through ``AsyncQueue``
and ``AsyncLease`` — their validation, errors, leases and settles — while the
suite itself stays one synchronous suite::

    class TestMyBackendAsync(ConformanceSuite):
        @pytest.fixture(scope="class")
        @classmethod
        def harness(cls):
            harness = AsyncUrlHarness("mybackend", endpoint=...)
            yield harness
            harness.close()
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from leasekit import aio
from leasekit.capabilities import Capabilities
from leasekit.lease import Lease
from leasekit.message import LeaseState, Message
from leasekit.spi import DeadLetter, Driver, QueueStats

from .harness import Harness

__all__ = ["AsyncUrlHarness", "BlockingLease", "BlockingQueue"]

T = TypeVar("T")


class _Loop:
    """An event loop running on a daemon thread; ``run(coro)`` waits for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="leasekit-conformance-aio", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class BlockingLease:
    """An :class:`~leasekit.aio.AsyncLease` seen synchronously (each settle awaited on the loop)."""

    def __init__(self, queue: BlockingQueue, lease: aio.AsyncLease) -> None:
        self._queue = queue
        self.alease = lease

    def __getattr__(self, name: str) -> Any:
        # Reads (message, receipt, state, lost, time_left, ...) are the async lease's own.
        return getattr(self.alease, name)

    @property
    def queue(self) -> BlockingQueue:
        """The queue this lease came from."""
        return self._queue

    @property
    def message(self) -> Message:
        """The leased message."""
        return self.alease.message

    @property
    def receipt(self) -> str:
        """The newest receipt."""
        return self.alease.receipt

    @property
    def expires_at(self) -> datetime:
        """The backend's expiry."""
        return self.alease.expires_at

    @property
    def state(self) -> LeaseState:
        """The lease's state."""
        return self.alease.state

    def renew(self, duration: float | None = None) -> None:
        """``await lease.renew(duration)``."""
        self._queue.loop.run(self.alease.renew(duration))

    def checkpoint(self, data: bytes) -> None:
        """``await lease.checkpoint(data)``."""
        self._queue.loop.run(self.alease.checkpoint(data))

    def complete(self) -> None:
        """``await lease.complete()``."""
        self._queue.loop.run(self.alease.complete())

    def abandon(self, delay: float = 0) -> None:
        """``await lease.abandon(delay)``."""
        self._queue.loop.run(self.alease.abandon(delay))

    def dead_letter(self, reason: str) -> None:
        """``await lease.dead_letter(reason)``."""
        self._queue.loop.run(self.alease.dead_letter(reason))

    def twin(self, receipt: str | None = None) -> BlockingLease:
        """A second lease on the same message (and ``receipt``): for stale-receipt checks."""
        lease = self.alease.lease
        twin = Lease(
            lease.queue,
            lease.message,
            receipt or lease.receipt,
            lease.expires_at,
            lease.duration,
            lease.raw_message,
        )
        return BlockingLease(self._queue, aio.AsyncLease(self.alease.queue, twin))


class BlockingQueue:
    """An :class:`~leasekit.aio.AsyncQueue` seen synchronously: each call is awaited on the loop."""

    def __init__(self, loop: _Loop, queue: aio.AsyncQueue) -> None:
        self.loop = loop
        self.aqueue = queue

    @property
    def name(self) -> str:
        """The queue's name."""
        return self.aqueue.name

    @property
    def capabilities(self) -> Capabilities:
        """What this backend guarantees."""
        return self.aqueue.capabilities

    @property
    def driver(self) -> Driver:
        """The backend driver."""
        return self.aqueue.driver

    @property
    def default_lease_duration(self) -> float:
        """The physical lease used when a call gives none."""
        return self.aqueue.default_lease_duration

    @property
    def checkpoint_store(self) -> Any:
        """Where checkpoints go on a backend that cannot keep them, or ``None``."""
        return self.aqueue.checkpoint_store

    @property
    def can_checkpoint(self) -> bool:
        """Whether leases of this queue can checkpoint."""
        return self.aqueue.can_checkpoint

    def __repr__(self) -> str:
        return f"<BlockingQueue over {self.aqueue!r}>"

    def _leases(self, leases: list[aio.AsyncLease]) -> list[BlockingLease]:
        return [BlockingLease(self, lease) for lease in leases]

    @staticmethod
    def _unwrap(leases: Iterable[Any]) -> list[Any]:
        return [lz.alease if isinstance(lz, BlockingLease) else lz for lz in leases]

    def send(self, body: bytes, **kwargs: Any) -> str:
        """``await queue.send(...)``."""
        return self.loop.run(self.aqueue.send(body, **kwargs))

    def send_many(self, bodies: Iterable[bytes], **kwargs: Any) -> list[str]:
        """``await queue.send_many(...)``."""
        return self.loop.run(self.aqueue.send_many(bodies, **kwargs))

    def lease(self, max_messages: int = 1, **kwargs: Any) -> list[BlockingLease]:
        """``await queue.lease(...)``."""
        return self._leases(self.loop.run(self.aqueue.lease(max_messages, **kwargs)))

    @contextmanager
    def lease_one(self, **kwargs: Any) -> Iterator[BlockingLease]:
        """``async with queue.lease_one(...)``, entered and left on the loop."""
        manager = self.aqueue.lease_one(**kwargs)
        lease = self.loop.run(manager.__aenter__())
        try:
            yield BlockingLease(self, lease)
        except BaseException as exc:
            if not self.loop.run(manager.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self.loop.run(manager.__aexit__(None, None, None))

    def complete_many(self, leases: Iterable[Any], **kwargs: Any) -> list[Any]:
        """``await queue.complete_many(...)``."""
        return self.loop.run(self.aqueue.complete_many(self._unwrap(leases), **kwargs))

    def renew_many(self, leases: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        """``await queue.renew_many(...)``."""
        return self.loop.run(self.aqueue.renew_many(self._unwrap(leases), *args, **kwargs))

    def abandon_many(self, leases: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        """``await queue.abandon_many(...)``."""
        return self.loop.run(self.aqueue.abandon_many(self._unwrap(leases), *args, **kwargs))

    def stats(self) -> QueueStats:
        """``await queue.stats()``."""
        return self.loop.run(self.aqueue.stats())

    def peek_dead_letters(self, limit: int = 10) -> list[DeadLetter]:
        """``await queue.peek_dead_letters(limit)``."""
        return self.loop.run(self.aqueue.peek_dead_letters(limit))

    def create(self) -> None:
        """``await queue.create()``."""
        self.loop.run(self.aqueue.create())

    def delete_queue(self) -> None:
        """``await queue.delete_queue()``."""
        self.loop.run(self.aqueue.delete_queue())

    def close(self) -> None:
        """``await queue.close()``."""
        self.loop.run(self.aqueue.close())


class AsyncUrlHarness(Harness):
    """A harness that opens queues with :func:`leasekit.aio.open` (see the module docstring).

    Parameters
    ----------
        target: a backend name or URL, as for :class:`~leasekit.conformance.UrlHarness`.
        **options: backend options.
    """

    def __init__(self, target: str, **options: Any) -> None:
        super().__init__()
        self.target = target
        self.options: Mapping[str, Any] = options
        self._loop = _Loop()

    def __repr__(self) -> str:
        return f"<AsyncUrlHarness {self.target!r}>"

    def open_queue(self, name: str, *, create: bool) -> Any:
        """``await leasekit.aio.open(target, queue=name, create=create, **options)``."""

        async def opened() -> aio.AsyncQueue:
            return await aio.open(self.target, queue=name, create=create, **self.options)

        return BlockingQueue(self._loop, self._loop.run(opened()))

    def close(self) -> None:
        """Close every queue still open, then the loop."""
        super().close()
        self._loop.close()
