"""The worker, written once: what happens to a message, driven by threads or by tasks.

:class:`~leasekit.Consumer` (threads) and :class:`~leasekit.aio.AsyncConsumer`
(tasks) differ only in how they wait. Everything they decide is here, once:

- the settings and their checks (:class:`WorkerSettings`) and the counters
  (:class:`ConsumerStats`, kept by a :class:`Tally`);
- the receive budget (:class:`ReceiveBudget`): how many messages to ask for,
  when there is room, the pause after a failed receive and its log lines;
- what happens to one message (:func:`message_flow`): poison → duplicate →
  handler → outcome, as a generator that *yields* each step that waits —
  a :class:`Call` (dead-letter, idempotency check or record, complete,
  abandon) or :class:`RunHandler` — and *returns* the :class:`Outcome`. The
  threaded face performs a step by calling it, the asyncio face by awaiting
  it; a step's error is thrown back into the flow (the pattern of httpx's
  ``Auth.auth_flow``);
- what a completion came to (:meth:`Worker.finish`), how transiently failed
  completions are retried (:func:`retry_flow`), and how giving leases back
  is counted (:meth:`Worker.given_back`).

- on an ordered queue (``capabilities.ordered``), which buffered message may
  start (:class:`GroupBuffer`): one message per group at a time, in order,
  the group's next only once the previous one is settled; after a message that
  did not end in order (abandoned, lost, unsettled) the rest of its group that
  the consumer holds is given back, unhandled, so nothing overtakes it.

The rule for a lease found lost while its handler ran, the same on both faces:
a handler that *returned* did its work, so its id is recorded in the
idempotency store and the completion is tried (a receipt nobody re-leased may
still be honoured); if the backend refuses it, it counts as
``stale_on_complete``. A handler that *raised* (``lease.check()`` inside it,
say) did not finish: nothing is recorded, and the message counts as ``lost``.

One more on the asyncio face only: :class:`~leasekit.aio.AsyncConsumer` *stops*
a handler whose lease is found lost (by the keeper at the lease's deadline, by a
failed renewal, or at the deadline after ``max_lifetime`` let it go) by
cancelling its task; the face then throws :class:`HandlerStopped` into the flow,
and the message counts as ``cancelled_on_loss`` (outcome ``cancelled_on_loss``)
— neither ``failed`` nor ``lost``, nothing recorded, nothing settled. A thread
cannot be stopped from outside, so the threaded face has no such outcome: its
handler watches ``lease.lost`` / ``lease.check()`` and raises (``lost``).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from . import errors
from .capabilities import Capabilities
from .duration_policy import FixedLeaseDuration, LeaseDurationPolicy
from .health import WorkerPulse
from .idempotency import IdempotencyStore
from .keeper import LeaseKeeper
from .lease import Lease
from .message import LeaseState
from .options import MAX_SECONDS, check_bool, check_int, check_number

if TYPE_CHECKING:
    from .queue import Queue

__all__ = [
    "LEASE_WAIT",
    "RECEIVE_BACKOFF_MAX",
    "RECEIVE_BACKOFF_START",
    "ROOM_WAIT",
    "SETTLE_BACKOFF_MAX",
    "SETTLE_BACKOFF_START",
    "SETTLE_RETRY_LIMIT",
    "SHUTDOWN_CALL_TIMEOUT",
    "Call",
    "ConsumerStats",
    "Failure",
    "FreeBuffer",
    "GroupBuffer",
    "HandlerStopped",
    "Outcome",
    "Pause",
    "ReceiveBudget",
    "RunHandler",
    "Tally",
    "Worker",
    "WorkerSettings",
    "abandon_delay",
    "completion_outcome",
    "completion_window",
    "poison_reason",
    "receive_pause",
    "retry_flow",
    "settle_pause",
    "transient",
]

_log = logging.getLogger("leasekit.consumer")

#: How long one lease call waits for messages; bounds how fast ``stop()`` is noticed.
LEASE_WAIT = 1.0
#: How long the receive loop waits at a time for room in the buffer.
ROOM_WAIT = 0.5
#: Backoff after a failed receive (seconds): first, and the cap. A worker loop
#: never exits on a transient fault; it waits and tries again while its workers
#: and the keeper go on.
RECEIVE_BACKOFF_START = 0.1
RECEIVE_BACKOFF_MAX = 5.0
#: Backoff between retries of a completion that failed transiently (first, cap).
SETTLE_BACKOFF_START = 0.1
SETTLE_BACKOFF_MAX = 2.0
#: Longest a handled message's completion is retried while its lease stays
#: held (the keeper renews it meanwhile); after that it is left to come back.
SETTLE_RETRY_LIMIT = 60.0
#: How long giving leases back at shutdown may take in all; a lease not given
#: back in time comes back by itself when its physical lease runs out.
SHUTDOWN_CALL_TIMEOUT = 2.0

#: What settling one lease came to: ``None`` (done) or the error.
Failure = errors.LeaseError | errors.LeaseStateError | None
#: States a handler given the lease may leave it in, and the counter each adds to.
#: (A lease found lost is not among them: see the module's rule.)
SELF_SETTLED = {
    LeaseState.COMPLETED: "completed",
    LeaseState.ABANDONED: "abandoned",
    LeaseState.DEAD_LETTERED: "dead_lettered",
}


@dataclass
class ConsumerStats:
    """What a consumer did. Counters only grow; ``in_flight`` and ``buffered`` are current.

    ``buffered``: leased, not yet taken by a worker. ``in_flight``: taken by a
    worker (being handled, or next in its chunk), not yet finished.
    """

    received: int = 0
    completed: int = 0
    failed: int = 0
    abandoned: int = 0
    dead_lettered: int = 0
    duplicates_skipped: int = 0
    stale_on_complete: int = 0
    lost: int = 0
    #: Handlers cancelled because their lease was found lost (asyncio face only).
    cancelled_on_loss: int = 0
    settle_errors: int = 0
    settle_retries: int = 0
    receive_errors: int = 0
    abandoned_at_shutdown: int = 0
    #: Ordered queues: messages given back unhandled because an earlier message
    #: of their group did not end in order (they come back after it).
    returned_in_order: int = 0
    in_flight: int = 0
    buffered: int = 0
    lease_duration: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The counters as a plain dict."""
        return asdict(self)


class Tally:
    """A worker's :class:`ConsumerStats`, counted from any thread or task.

    ``lock`` guards the counters; the threaded face uses it for its own state too.
    """

    def __init__(self, lock: threading.Lock | threading.RLock | None = None) -> None:
        self.lock = lock or threading.Lock()
        self.stats = ConsumerStats()

    def add(self, counter: str, count: int = 1) -> None:
        """Add ``count`` to the counter named ``counter``."""
        if count:
            with self.lock:
                setattr(self.stats, counter, getattr(self.stats, counter) + count)


@dataclass(frozen=True)
class WorkerSettings:
    """A worker's settings, checked once (see :class:`~leasekit.Consumer` for each)."""

    concurrency: int
    duration_policy: LeaseDurationPolicy
    max_deliveries: int | None
    idempotency: IdempotencyStore | None
    keeper: LeaseKeeper | None
    max_lifetime: float | None
    prefetch: int
    backoff_base: float
    backoff_max: float
    shutdown_grace: float
    pass_lease: bool
    handle_signals: bool

    @classmethod
    def check(
        cls,
        capabilities: Capabilities,
        default_lease: float,
        check_duration: Any,
        *,
        concurrency: object,
        lease_duration: object,
        duration_policy: object,
        max_deliveries: object,
        idempotency: object,
        keeper: object,
        max_lifetime: object,
        prefetch: object,
        backoff_base: object,
        backoff_max: object,
        shutdown_grace: object,
        pass_lease: object,
        handle_signals: object,
        receivers: int = 1,
    ) -> WorkerSettings:
        """Check every setting; raise :class:`~leasekit.InvalidArgument` for the first bad one.

        ``check_duration`` is the queue's (``Queue.check_duration``).
        """
        check_int(concurrency, "concurrency", minimum=1)
        assert isinstance(concurrency, int)
        if max_deliveries is not None:
            check_int(max_deliveries, "max_deliveries", minimum=1)
        if prefetch is not None:
            check_int(prefetch, "prefetch", minimum=0)
        for name, seconds in (
            ("backoff_base", backoff_base),
            ("backoff_max", backoff_max),
            ("shutdown_grace", shutdown_grace),
        ):
            check_number(seconds, name, minimum=0, maximum=MAX_SECONDS)
        if max_lifetime is not None:
            check_number(max_lifetime, "max_lifetime", above=0, maximum=MAX_SECONDS)
        check_bool(pass_lease, "pass_lease")
        check_bool(handle_signals, "handle_signals")
        if duration_policy is not None and not isinstance(duration_policy, LeaseDurationPolicy):
            raise errors.InvalidArgument(
                f"duration_policy must be a LeaseDurationPolicy, got {duration_policy!r}"
            )
        if keeper is not None and not isinstance(keeper, LeaseKeeper):
            raise errors.InvalidArgument(f"keeper must be a LeaseKeeper, got {keeper!r}")
        if lease_duration is not None and duration_policy is not None:
            raise errors.InvalidArgument("give lease_duration or duration_policy, not both")
        if idempotency is not None and not isinstance(idempotency, IdempotencyStore):
            raise errors.InvalidArgument("idempotency must have seen(), record() and close()")
        if duration_policy is None:
            seconds = default_lease if lease_duration is None else check_duration(lease_duration)
            duration_policy = FixedLeaseDuration(seconds)
        assert isinstance(duration_policy, LeaseDurationPolicy)
        # Default: room for a whole receive batch beyond the busy handlers, so receives
        # and grouped completions stay large; at most 4x concurrency, so a consumer
        # does not hoard a big backend's batch.
        batch = capabilities.max_receive_batch
        default_prefetch = max(concurrency, min(receivers * batch, 4 * concurrency))
        return cls(
            concurrency=concurrency,
            duration_policy=duration_policy,
            max_deliveries=max_deliveries,  # type: ignore[arg-type]
            idempotency=idempotency,
            keeper=keeper,
            max_lifetime=max_lifetime,  # type: ignore[arg-type]
            prefetch=default_prefetch if prefetch is None else prefetch,  # type: ignore[arg-type]
            backoff_base=float(backoff_base),  # type: ignore[arg-type]
            backoff_max=float(backoff_max),  # type: ignore[arg-type]
            shutdown_grace=float(shutdown_grace),  # type: ignore[arg-type]
            pass_lease=bool(pass_lease),
            handle_signals=bool(handle_signals),
        )

    def lease_duration(self, capabilities: Capabilities, check_duration: Any) -> float:
        """The physical lease for the next receive (the policy's, within the backend's range)."""
        if capabilities.fixed_lease is not None:
            return capabilities.fixed_lease
        wanted = self.duration_policy.current()
        seconds: float = check_duration(capabilities.clamp_lease(wanted))
        return seconds


def completion_window(leases: Iterable[Lease], batch_window: float) -> float:
    """How long completing ``leases`` waits for others to share its batch call.

    ``batch_window``, unless a lease is of an ordered group: its group's next
    message waits for this completion, so it waits for no company (completions
    arriving together still share a call).
    """
    for lease in leases:
        if lease.message.group is not None:
            return 0.0
    return batch_window


def poison_reason(delivery_count: int, max_deliveries: int | None) -> str | None:
    """Why a message delivered ``delivery_count`` times is poison, or ``None`` if it is not."""
    if max_deliveries is None or delivery_count <= max_deliveries:
        return None
    return f"delivered {delivery_count} times; max_deliveries is {max_deliveries}"


def abandon_delay(
    delivery_count: int, settings: WorkerSettings, capabilities: Capabilities
) -> float:
    """How long a message whose handler failed waits: ``base * 2**(count-1)``, capped."""
    limit = capabilities.max_abandon_delay
    if limit <= 0 or settings.backoff_base <= 0:
        return 0.0
    delay = settings.backoff_base * 2.0 ** min(max(0, delivery_count - 1), 64)
    return float(min(delay, settings.backoff_max, limit))


def receive_pause(failures: int) -> float:
    """Seconds to wait after ``failures`` failed receives in a row (capped, jittered)."""
    pause = min(RECEIVE_BACKOFF_MAX, RECEIVE_BACKOFF_START * 2.0 ** min(failures - 1, 64))
    return pause * (0.5 + random.random() / 2)


def settle_pause(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` of a completion (capped, jittered)."""
    pause = min(SETTLE_BACKOFF_MAX, SETTLE_BACKOFF_START * 2.0 ** min(attempt - 1, 64))
    return pause * (0.5 + random.random() / 2)


def transient(failure: BaseException | None) -> bool:
    """Whether a failed completion may work if tried again (the backend was unreachable)."""
    return isinstance(failure, errors.BackendUnavailable)


def completion_outcome(
    lease: Lease, failure: BaseException | None, *, shutting_down: bool
) -> tuple[str, str | None, BaseException | None]:
    """What completing a handled lease came to: ``(outcome, counter, error)``.

    ``outcome`` is the worker hook's (``completed``, ``stale``, ``error``,
    ``abandoned_at_shutdown``), ``counter`` the stats field to add one to
    (``None``: none; ``completed`` is counted by the caller, in bulk). Failures
    are logged here.
    """
    if failure is None:
        return "completed", None, None
    if isinstance(failure, errors.LeaseLost):
        _log.warning(
            "message %r was handled but its receipt was stale on complete (%s); "
            "it may be delivered again",
            lease.message.id,
            failure,
        )
        return "stale", "stale_on_complete", failure
    if isinstance(failure, errors.LeaseStateError):
        if lease.state is LeaseState.ABANDONED and shutting_down:
            return "abandoned_at_shutdown", None, None
        _log.error("could not complete message %r: %s", lease.message.id, failure)
        return "error", "settle_errors", failure
    _log.error("could not settle message %r: %s", lease.message.id, failure)
    return "error", "settle_errors", failure


# ----------------------------------------------------------- the buffers

#: Outcomes after which a group's next message may start: the message will not
#: come back (completed, dead-lettered, or a duplicate completed unhandled).
IN_ORDER = frozenset({"completed", "dead_lettered", "duplicate"})
#: Most message ids whose unhandled give-backs a worker remembers (for
#: ``max_deliveries``); the oldest are forgotten first.
MAX_REMEMBERED = 65536


class FreeBuffer(deque[Lease]):
    """The buffer of leased, unstarted messages on an unordered queue: first in, first out."""

    def takeable(self) -> int:
        """How many messages a worker may take now (all of them)."""
        return len(self)

    def release(self, lease: Lease, outcome: str) -> list[Lease]:
        """A taken message is settled (nothing waits for it here): nothing to give back."""
        return []

    def grouped(self) -> bool:
        """Whether some group's messages are buffered or in hand (never, here)."""
        return False

    def given_back(self, message_id: str) -> int:
        """Deliveries of ``message_id`` that ended unhandled for order's sake (none here)."""
        return 0


class GroupBuffer:
    """The buffer of leased, unstarted messages on an ordered queue (``capabilities.ordered``).

    A worker may take a message of a group only when no other message of that
    group is in a worker's hands, and a group's messages are taken in the order
    received (the backend hands them out in the order sent). Messages without a
    group are taken first in, first out, as on an unordered queue. The same
    interface as :class:`FreeBuffer` (a ``deque``): ``extend``, ``popleft`` (a
    takeable one), ``len`` (all buffered), truth (any takeable), iteration (all),
    ``clear``. Not thread-safe: each face calls it under its own lock.
    """

    def __init__(self) -> None:
        self._ready: deque[Lease] = deque()  # takeable: at most one per group
        self._waiting: dict[str, deque[Lease]] = {}  # per group, behind the one taken or ready
        self._held: set[str] = set()  # groups with a message ready or in a worker's hands
        self._size = 0
        self._given_back: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return bool(self._ready)

    def __iter__(self) -> Iterator[Lease]:
        yield from self._ready
        for waiting in self._waiting.values():
            yield from waiting

    def takeable(self) -> int:
        """How many messages workers may take now (one per free group, plus ungrouped ones)."""
        return len(self._ready)

    def grouped(self) -> bool:
        """Whether some group's messages are buffered or in a worker's hands."""
        return bool(self._held)

    def extend(self, leases: Iterable[Lease]) -> None:
        """Add received messages, in the order received."""
        for lease in leases:
            self._size += 1
            group = lease.message.group
            if group is None:
                self._ready.append(lease)
            elif group in self._held:
                self._waiting.setdefault(group, deque()).append(lease)
            else:
                self._held.add(group)
                self._ready.append(lease)

    def popleft(self) -> Lease:
        """Take the next takeable message (``IndexError`` if none, as a deque's)."""
        lease = self._ready.popleft()
        self._size -= 1
        return lease

    def clear(self) -> None:
        """Forget every buffered message (shutdown gives them back)."""
        self._ready.clear()
        self._waiting.clear()
        self._held.clear()
        self._size = 0

    def release(self, lease: Lease, outcome: str) -> list[Lease]:
        """A taken message ended with ``outcome``: free its group; return what must go back.

        After an outcome in :data:`IN_ORDER` the group's next buffered message
        becomes takeable. After any other (abandoned, lost, a failed settle, given
        back at shutdown) the message may come back, so the group's buffered
        messages are returned, to be given back unhandled: the backend then hands
        the group out again from that message.
        """
        group = lease.message.group
        if outcome in IN_ORDER:
            self._given_back.pop(lease.message.id, None)
        if group is None or group not in self._held:
            return []
        waiting = self._waiting.get(group)
        if outcome in IN_ORDER:
            if waiting:
                self._ready.append(waiting.popleft())
                if not waiting:
                    del self._waiting[group]
            else:
                self._held.discard(group)
            return []
        self._held.discard(group)
        back = list(self._waiting.pop(group, ()))
        self._size -= len(back)
        for other in back:
            key = other.message.id
            self._given_back[key] = self._given_back.pop(key, 0) + 1
        while len(self._given_back) > MAX_REMEMBERED:
            self._given_back.popitem(last=False)
        return back

    def given_back(self, message_id: str) -> int:
        """Deliveries of ``message_id`` that ended unhandled because its group waited."""
        return self._given_back.get(message_id, 0)


# ------------------------------------------------------------------ the steps


class HandlerStopped(Exception):
    """Thrown into a message's flow when the face stopped its handler: its lease was lost.

    ``error`` is the :class:`~leasekit.LeaseLost` that marked the lease lost.
    """

    def __init__(self, error: errors.LeaseLost | None) -> None:
        super().__init__(f"the handler was cancelled: its lease was lost ({error})")
        self.error = error


@dataclass(frozen=True, slots=True)
class Call:
    """A blocking step: the threaded face calls ``fn()``; the asyncio face runs it off the loop."""

    fn: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class RunHandler:
    """The step that runs the handler on ``lease`` (each face knows its handler and argument)."""

    lease: Lease


@dataclass(frozen=True, slots=True)
class Pause:
    """A step that waits ``seconds`` (or less, if the worker is told to stop)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of a message: the ``leasekit_after_process`` hook's outcome and error.

    ``handled``: the handler returned and the lease waits to be completed (each
    face completes in its own batches, then calls :meth:`Worker.finish`).
    """

    name: str
    error: BaseException | None = None


#: A message's flow: yields steps, is sent each step's result, returns its outcome.
MessageFlow = Generator[Call | RunHandler, Any, Outcome]


# ----------------------------------------------------------------- the worker


class Worker:
    """The rules one consumer applies, shared by its threaded or asyncio face.

    Parameters
    ----------
        queue: the (sync) queue consumed.
        settings: the checked settings.
        tally: where the counters go.
    """

    def __init__(self, queue: Queue, settings: WorkerSettings, tally: Tally) -> None:
        self.queue = queue
        self.settings = settings
        self.tally = tally
        self.capabilities = queue.capabilities
        #: Set while the worker gives its leases back: an abandoned lease is then
        #: counted ``abandoned_at_shutdown``, not an error.
        self.shutting_down = False
        #: Whether a plugin brackets each handler call (``leasekit_before_handle``...).
        self.bracket = False
        #: The face's buffer of leased, unstarted messages (ordered queues: by group).
        self.buffer: FreeBuffer | GroupBuffer = (
            GroupBuffer() if self.capabilities.ordered else FreeBuffer()
        )

    def begin(self) -> None:
        """A run starts: see which plugins observe the handler calls."""
        events = self.queue.events
        self.bracket = events.observed("leasekit_before_handle") or events.observed(
            "leasekit_after_handle"
        )
        self.shutting_down = False

    def lease_duration(self) -> float:
        """The physical lease for the next receive."""
        return self.settings.lease_duration(self.capabilities, self.queue.check_duration)

    def message_flow(self, lease: Lease) -> MessageFlow:
        """What happens to one leased message, as steps (see the module docstring).

        Poison (``delivery_count > max_deliveries``) is dead-lettered; an id in
        the idempotency store is completed without the handler; a lease found
        lost before its turn is left alone; otherwise the handler runs: raising
        abandons the message with backoff, returning records its id and leaves
        it to be completed (``handled``), unless a handler given the lease
        settled it itself.
        """
        settings = self.settings
        tally = self.tally
        message = lease.message
        events = self.queue.events
        # Deliveries that ended unhandled only because the group waited do not count.
        count = message.delivery_count - self.buffer.given_back(message.id)
        try:
            poison = poison_reason(count, settings.max_deliveries)
            if poison is not None:
                yield Call(lambda: lease.dead_letter(poison))
                tally.add("dead_lettered")
                return Outcome("dead_lettered")
            store = settings.idempotency
            if store is not None and (yield Call(lambda: store.seen(message.id))):
                tally.add("duplicates_skipped")
                with contextlib.suppress(errors.LeaseLost):  # someone else settles it then
                    yield Call(lease.complete)
                return Outcome("duplicate")
            if lease.state is LeaseState.LOST:
                # Found lost (a frozen worker, say) before its handler started.
                tally.add("lost")
                return Outcome("lost")
            bracket = self.bracket
            if bracket:
                events.emit("leasekit_before_handle", lease=lease)
            start = time.monotonic()
            try:
                yield RunHandler(lease)
            except HandlerStopped as stopped:
                if bracket:
                    events.emit("leasekit_after_handle", lease=lease, error=stopped)
                tally.add("cancelled_on_loss")
                _log.warning(
                    "handler of message %r cancelled: its lease was lost (%s)",
                    message.id,
                    stopped.error,
                )
                return Outcome("cancelled_on_loss", stopped.error or stopped)
            except Exception as exc:
                if bracket:
                    events.emit("leasekit_after_handle", lease=lease, error=exc)
                tally.add("failed")
                _log.warning("handler failed on message %r: %r", message.id, exc)
                delay = abandon_delay(count, settings, self.capabilities)
                yield Call(lambda: lease.abandon(delay))
                tally.add("abandoned")
                return Outcome("abandoned", exc)
            elapsed = time.monotonic() - start
            if bracket:
                events.emit("leasekit_after_handle", lease=lease, error=None)
            state = lease.state
            if settings.pass_lease and state in SELF_SETTLED:
                tally.add(SELF_SETTLED[state])  # the handler settled it itself
                return Outcome(state.value)
            settings.duration_policy.observe(elapsed)
            if store is not None:
                yield Call(lambda: store.record(message.id))
            return Outcome("handled")
        except errors.LeaseLost as exc:
            tally.add("lost")
            return Outcome("lost", exc)
        except errors.LeaseStateError as exc:
            if lease.state is LeaseState.ABANDONED and self.shutting_down:
                return Outcome("abandoned_at_shutdown")
            raise exc
        except errors.LeaseError as exc:
            tally.add("settle_errors")
            _log.error("could not settle message %r: %s", message.id, exc)
            return Outcome("error", exc)

    def finish(self, lease: Lease, failure: Failure) -> Outcome:
        """Count what completing a handled lease came to, and tell the lease policy."""
        outcome, counter, error = completion_outcome(
            lease, failure, shutting_down=self.shutting_down
        )
        if counter is not None:
            self.tally.add(counter)
        if outcome == "stale":
            self.settings.duration_policy.stale()
        return Outcome(outcome, error)

    def given_back(
        self, leases: Sequence[Lease], results: Sequence[BaseException | None], counter: str
    ) -> None:
        """Count the leases an ``abandon_many`` gave back in ``counter``; log the others.

        A lease settled meanwhile (a :class:`LeaseStateError`) is neither. One
        not given back comes back by itself when its physical lease runs out.
        """
        given = 0
        for lease, result in zip(leases, results, strict=True):
            if result is None:
                given += 1
            elif not isinstance(result, errors.LeaseStateError):
                _log.warning("could not abandon message %r: %s", lease.message.id, result)
        self.tally.add(counter, given)


def retry_flow(
    leases: Sequence[Lease],
    failures: Sequence[Failure],
    tally: Tally,
    give_up: Callable[[], float],
) -> Generator[Pause | list[Lease], list[Failure], list[Failure]]:
    """Retry completions that failed transiently while their leases are still held.

    Yields a :class:`Pause` to wait, or the list of leases to complete again
    (the face sends back one result each); returns the final results. The
    keeper goes on renewing the leases meanwhile, so a short outage costs a
    delay, not a second delivery. Stops for a lease when it is completed,
    found lost (the keeper marks it at its deadline) or refused for good; and
    for all once ``give_up()`` (a monotonic time: ``SETTLE_RETRY_LIMIT`` after
    the first try, or the shutdown grace's end) has passed.
    """
    results = list(failures)
    limit = time.monotonic() + SETTLE_RETRY_LIMIT
    attempt = 0
    while True:
        pending = [
            i
            for i, failure in enumerate(results)
            if transient(failure) and leases[i].state is LeaseState.HELD
        ]
        end = min(limit, give_up())
        now = time.monotonic()
        if not pending or now >= end:
            return results
        attempt += 1
        yield Pause(min(settle_pause(attempt), end - now))
        again = [leases[i] for i in pending]
        tally.add("settle_retries", len(again))
        outcome = yield again
        for i, failure in zip(pending, outcome, strict=True):
            results[i] = failure


class ReceiveBudget:
    """How a receive loop spends its room: how many to ask for, and how it backs off.

    Parameters
    ----------
        settings: the worker's settings (``concurrency + prefetch`` is the room).
        capabilities: the backend's (its receive batch).
        pulse: where the loop's progress is recorded for health.
        queue_name: for log lines.
    """

    def __init__(
        self,
        settings: WorkerSettings,
        capabilities: Capabilities,
        pulse: WorkerPulse,
        queue_name: str,
    ) -> None:
        self.limit = settings.concurrency + settings.prefetch
        self.batch = capabilities.max_receive_batch
        # Lease again only when a worthwhile batch fits: refilling one slot at a
        # time turns every completion into a receive call.
        self.refill = max(1, min(self.batch, self.limit // 2))
        self.pulse = pulse
        self.queue_name = queue_name
        self.failures = 0  # receives failed in a row

    def full(self, outstanding: int) -> bool:
        """Whether ``outstanding`` messages (buffered, in flight, being received) leave no room."""
        return outstanding > self.limit - self.refill

    def want(self, outstanding: int) -> int:
        """How many messages to ask for next."""
        return max(1, min(self.limit - outstanding, self.batch))

    def receiving(self, call_timeout: float) -> None:
        """A receive starts (for health: it returns within its long poll and ``call_timeout``)."""
        self.pulse.receiving(LEASE_WAIT, LEASE_WAIT + call_timeout)

    def failed(self, exc: errors.LeaseError, tally: Tally) -> float | None:
        """A receive failed: the pause before the next one, or ``None`` to stop (not transient).

        A transient failure (:class:`BackendUnavailable`) is counted and logged
        the first time and every tenth; the loop never exits on one. Anything
        else (authentication, queue not found) cannot be helped by retrying.
        """
        self.pulse.failed(exc)
        if not isinstance(exc, errors.BackendUnavailable):
            _log.error("consumer of %r stops: receiving failed: %s", self.queue_name, exc)
            return None
        self.failures += 1
        tally.add("receive_errors")
        pause = receive_pause(self.failures)
        if self.failures == 1 or self.failures % 10 == 0:
            _log.warning(
                "receiving from %r failed (%d in a row), retrying in %.1f s: %s",
                self.queue_name,
                self.failures,
                pause,
                exc,
            )
        self.pulse.expect(pause)
        return pause

    def received(self) -> None:
        """A receive reached the queue (with or without messages)."""
        self.pulse.received()
        if self.failures:
            _log.info("receiving from %r works again", self.queue_name)
            self.failures = 0
