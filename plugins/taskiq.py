"""A taskiq broker on any leasekit queue (``pip install 'leasekit[taskiq]'``).

``LeasekitBroker(url, lease_duration=30, **open_options)`` is a taskiq
``AsyncBroker``: :meth:`~LeasekitBroker.kick` sends the task message with
``Queue.send``; :meth:`~LeasekitBroker.listen` leases messages, hands each
lease to a keeper (renewed on the keeper's own thread, so a busy event loop
cannot starve it) and yields taskiq's ``AckableMessage``, whose ``ack``
completes the lease. So:

* a task that runs longer than ``lease_duration`` is renewed, not redelivered;
* a worker that dies (its keeper with it) leaves its tasks to come back after
  at most ``lease_duration`` seconds, with ``delivery_count`` one higher;
* a message delivered more than ``max_deliveries`` times (a task that kills its
  worker every time) is dead-lettered with the reason, never run again.

taskiq acknowledges a task that *raised* too (its error is the task's result),
so leasekit's delivery count only grows when a worker died or lost the lease.
Retrying on an exception is taskiq's retry middleware (``SimpleRetryMiddleware``,
``SmartRetryMiddleware``): it kicks a *new* message, so the two counts never mix —
``max_retries`` bounds exceptions, ``max_deliveries`` bounds crashes; see
``docs/taskiq.md``. Importing this module imports taskiq (a hard dependency of
this plugin only).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Any

from taskiq import AckableMessage, AsyncBroker, BrokerMessage

from leasekit import aio, errors
from leasekit.options import check_int, check_number

__all__ = ["LeasekitBroker"]

_log = logging.getLogger("leasekit.taskiq")

#: Message properties the broker writes (for people and tools reading the queue).
TASK_NAME = "taskiq-task-name"
TASK_ID = "taskiq-task-id"
#: Seconds one receive waits before ``listen`` asks again (also how soon it
#: notices shutdown); longer costs idle workers fewer calls.
DEFAULT_WAIT = 1.0


class LeasekitBroker(AsyncBroker):
    """A taskiq broker whose messages are leasekit leases, kept alive while their task runs.

    Parameters
    ----------
        url: the queue's URL (or backend name, with ``queue=`` among the options),
            as for :func:`leasekit.open`.
        lease_duration: the physical lease in seconds, renewed by the keeper while
            the task runs: how soon a dead worker's task comes back. On a backend with
            a fixed lock (Service Bus) the lock is used instead.
        max_deliveries: dead-letter a message delivered more than this many times
            (``None``: never).
        receive_batch: messages one receive asks for (each is kept alive from the
            moment it is received until its task is acknowledged).
        wait: seconds one receive waits for a message.
        create: create the queue at startup if it is missing.
        open_options: backend options (credentials, endpoints) for :func:`leasekit.aio.open`.

    The queue is opened by :meth:`startup` (taskiq calls it in workers and clients)
    and closed by :meth:`shutdown`.
    """

    def __init__(
        self,
        url: str,
        *,
        lease_duration: float = 30,
        max_deliveries: int | None = None,
        receive_batch: int = 1,
        wait: float = DEFAULT_WAIT,
        create: bool = False,
        **open_options: Any,
    ) -> None:
        super().__init__()
        check_number(lease_duration, "lease_duration", above=0)
        if max_deliveries is not None:
            check_int(max_deliveries, "max_deliveries", minimum=1)
        check_int(receive_batch, "receive_batch", minimum=1)
        check_number(wait, "wait", minimum=0)
        self.url = url
        self.lease_duration = float(lease_duration)
        self.max_deliveries = max_deliveries
        self.receive_batch = receive_batch
        self.wait = float(wait)
        self._create = create
        self._open_options = open_options
        self._queue: aio.AsyncQueue | None = None
        self._keeper: aio.AsyncLeaseKeeper | None = None
        self._duration = self.lease_duration
        #: Leases received and not yet acknowledged (given back at shutdown).
        self._held: set[aio.AsyncLease] = set()

    def __repr__(self) -> str:
        queue = self._queue.name if self._queue is not None else "not started"
        return f"<LeasekitBroker {queue}>"

    @property
    def queue(self) -> aio.AsyncQueue:
        """The queue (after :meth:`startup`).

        Raises:
            LeaseStateError: the broker was not started.
        """
        if self._queue is None:
            raise errors.LeaseStateError("LeasekitBroker: call startup() first")
        return self._queue

    async def startup(self) -> None:
        """Open the queue and start the keeper, then taskiq's own startup."""
        if self._queue is None:
            queue = await aio.open(self.url, create=self._create, **self._open_options)
            fixed = queue.capabilities.fixed_lease
            try:
                self._duration = queue.queue.check_duration(
                    fixed if fixed is not None else self.lease_duration
                )
            except BaseException:
                await queue.close()
                raise
            self._queue = queue
            self._keeper = aio.AsyncLeaseKeeper().start()
        await super().startup()

    async def shutdown(self) -> None:
        """Run taskiq's shutdown, then give back unacknowledged leases, stop the keeper, close."""
        await super().shutdown()
        queue, keeper = self._queue, self._keeper
        self._queue = self._keeper = None
        if queue is None or keeper is None:
            return
        held, self._held = list(self._held), set()
        keeper.discard_many(held)
        if held:
            try:
                await queue.abandon_many(held)
            except (errors.LeaseError, errors.LeaseStateError) as exc:
                _log.info("taskiq: %d lease(s) not given back (%s)", len(held), exc)
        await keeper.stop()
        await queue.close()

    async def kick(self, message: BrokerMessage) -> None:
        """Send the task's message (its name and id also as message properties)."""
        await self.queue.send(
            message.message,
            properties={TASK_NAME: message.task_name, TASK_ID: message.task_id},
        )

    async def listen(self) -> AsyncGenerator[bytes | AckableMessage, None]:
        """Lease messages and yield them, each kept alive until taskiq acknowledges it.

        Leases received but not yet yielded when the generator is closed (the
        worker stops) are given back to the queue at once.
        """
        queue = self.queue
        keeper = self._keeper
        assert keeper is not None  # set with the queue
        while True:
            leases = await queue.lease(self.receive_batch, duration=self._duration, wait=self.wait)
            leases = [lease for lease in leases if await self._deliverable(lease)]
            keeper.add_many(leases)
            self._held.update(leases)
            for position, lease in enumerate(leases):
                try:
                    yield AckableMessage(data=lease.message.body, ack=self._acker(lease))
                except BaseException:
                    await self._give_back(leases[position:])
                    raise
            await asyncio.sleep(0)

    async def _deliverable(self, lease: aio.AsyncLease) -> bool:
        """``False`` for a message past ``max_deliveries``, which is dead-lettered here."""
        count = lease.message.delivery_count
        if self.max_deliveries is None or count <= self.max_deliveries:
            return True
        reason = (
            f"taskiq: delivered {count} times, more than max_deliveries={self.max_deliveries} "
            "(its worker died or lost the lease each time)"
        )
        _log.warning("dead-lettering message %r: %s", lease.message.id, reason)
        try:
            await lease.dead_letter(reason)
        except (errors.LeaseError, errors.LeaseStateError) as exc:
            _log.warning("could not dead-letter %r: %s", lease.message.id, exc)
        return False

    def _acker(self, lease: aio.AsyncLease) -> Any:
        async def ack() -> None:
            """Complete the lease (taskiq calls this once the task is done)."""
            if self._keeper is not None:
                self._keeper.discard(lease)
            self._held.discard(lease)
            try:
                await lease.complete()
            except (errors.LeaseError, errors.LeaseStateError) as exc:
                # Lost (the lease ended before the task did) or given back at
                # shutdown: the message is delivered again (at least once).
                _log.warning("taskiq ack of %r did not complete it: %s", lease.message.id, exc)

        return ack

    async def _give_back(self, leases: list[aio.AsyncLease]) -> None:
        keeper, queue = self._keeper, self._queue
        if keeper is None or queue is None:
            return
        keeper.discard_many(leases)
        self._held.difference_update(leases)
        try:
            await queue.abandon_many(leases)
        except (errors.LeaseError, errors.LeaseStateError) as exc:
            _log.info("taskiq: %d lease(s) not given back (%s)", len(leases), exc)
