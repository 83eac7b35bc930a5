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

:class:`AsyncConsumer` (module ``aio_consumer``) drives the same worker rules
as :class:`leasekit.Consumer` (``leasekit.worker_policy``) with tasks. Every
call this module makes off the event loop goes through one kind of pool
(``_Workers``): a queue's own, or a shared one for calls of no queue.

Why threads and not each SDK's own async client: measured in
``benchmarks/bench_asyncio.py`` (results in ``docs/asyncio.md``). Core batches
receives and completions, so a consumer makes few backend calls however many
handlers await at once; a few threads carry them, and the handlers themselves
are coroutines, not threads.
"""

from __future__ import annotations

from .aio_consumer import AsyncConsumer
from .aio_queue import DEFAULT_THREADS, AsyncLease, AsyncLeaseKeeper, AsyncQueue, open

__all__ = [
    "DEFAULT_THREADS",
    "AsyncConsumer",
    "AsyncLease",
    "AsyncLeaseKeeper",
    "AsyncQueue",
    "open",
]
