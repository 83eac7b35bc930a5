"""The portable queue: the one type users hold, over a driver, composing core's parts.

:class:`Queue` checks every argument before any call (:mod:`leasekit.arguments`),
sends in the backend's batches, runs the long-poll loop of :meth:`Queue.lease`,
runs the admin calls, and retries transient failures within each call's
deadline. Making leases of a received batch, renewing, settling and
checkpointing them is :class:`~leasekit.lease_operations.LeaseOperations`' work,
and dead-lettering where the backend has no store of its own is
:class:`~leasekit.dead_letters.DeadLetters`'; re-driving dead letters is
:mod:`leasekit.redrive`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from . import arguments, errors
from .call_runner import CallRunner
from .capabilities import Capabilities
from .checkpoints import CheckpointStore
from .dead_letters import DeadLetters, with_total
from .deadline import deadline
from .error_mapping import wrap_error
from .events import Events
from .lease import Lease
from .lease_operations import MIN_SETTLE_TIMEOUT, LeaseOperations, SettleSpec
from .message import LeaseState
from .options import as_items, check_text
from .retry import RetryPolicy
from .spi import DeadLetter, Driver, OutgoingMessage, QueueStats

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "MAX_LEASE_BATCH",
    "MIN_SETTLE_TIMEOUT",
    "Queue",
]

T = TypeVar("T")

#: Most messages one ``Queue.lease`` call may ask for; core splits it into
#: receives of ``capabilities.max_receive_batch``. Bounded so a typo cannot
#: lease a whole queue into one process.
MAX_LEASE_BATCH = 1000
#: Polling between empty receives on backends that cannot long-poll: start
#: small for latency, back off to keep an idle SQLite file cheap.
POLL_START = 0.005
POLL_MAX = 0.1
#: Longest one backend call may take, retries included, when nothing tighter
#: bounds it (a send, an admin call; a receive gets this beyond its long poll).
#: Shorter fails faster on a dead network; longer rides out a slow service.
DEFAULT_CALL_TIMEOUT = 10.0
#: Largest ``peek_dead_letters`` limit passed to a driver (fits every backend's integer).
MAX_PEEK = 2**31 - 1

_log = logging.getLogger("leasekit")


def _weight(message: OutgoingMessage) -> int:
    """What a message counts against ``max_send_batch_bytes``: body, property names and values."""
    return len(message.body) + sum(
        len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
        for k, v in message.properties.items()
    )


class Queue:
    """One queue on one backend; obtain it with :func:`leasekit.open`.

    Parameters
    ----------
        driver: the backend driver for this queue.
        lease_duration: the physical lease used when a call gives none.
        retry: backoff for errors the driver calls retryable.
        hooks: the plugin hook relay for lease events (the default registry's).
        call_timeout: the longest one backend call may take, retries included,
            when nothing tighter bounds it (default ``DEFAULT_CALL_TIMEOUT``). A
            renewal never outlives the lease it renews, a settle is bounded by
            the lease's time left, and a receive gets this beyond its long poll.
        checkpoint_store: where :meth:`Lease.checkpoint` saves progress on a
            backend without ``capabilities.native_checkpoint`` (see
            :mod:`leasekit.checkpoints`); unused where the backend keeps
            checkpoints itself. The caller keeps it (``close()`` leaves it open).

    A queue is thread-safe and a context manager; :meth:`close` releases the
    backend's connections. It sends, receives and runs the admin calls
    itself, after checking the arguments (:mod:`leasekit.arguments`); renewing
    and settling go through its :class:`~leasekit.lease_operations.LeaseOperations`,
    dead-lettering without a native store through its
    :class:`~leasekit.dead_letters.DeadLetters`.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        lease_duration: float | None = None,
        retry: RetryPolicy | None = None,
        hooks: Any = None,
        call_timeout: float | None = None,
        checkpoint_store: CheckpointStore | None = None,
    ) -> None:
        if not isinstance(driver, Driver):
            raise errors.InvalidArgument(f"driver must be a leasekit Driver, got {driver!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise errors.InvalidArgument(
                f"retry must be a leasekit.RetryPolicy or None, got {type(retry).__name__}"
            )
        if checkpoint_store is not None and not isinstance(checkpoint_store, CheckpointStore):
            raise errors.InvalidArgument(
                "checkpoint_store must have load(), save(), discard() and close() "
                f"(a leasekit.CheckpointStore), got {checkpoint_store!r}"
            )
        self._driver = driver
        # Native checkpoints win: a store given for a backend that keeps them is unused.
        self._checkpoint_store = None if driver.capabilities.native_checkpoint else checkpoint_store
        self._retry = retry or RetryPolicy()
        self._call_timeout = arguments.timeout(call_timeout, "call_timeout") or (
            DEFAULT_CALL_TIMEOUT
        )
        self._events = Events(hooks)
        self._closed = False
        self._log = _log
        #: Every driver call goes through it: the queue's and its parts' alike.
        self._runner = CallRunner(driver, self._retry, self._call_timeout)
        self._operations = LeaseOperations(self, self._runner, self._events, self._checkpoint_store)
        #: How a completion is done (made on first use, remade if the capabilities change).
        self._complete_spec: SettleSpec | None = None
        self._dead_letters = DeadLetters(self._runner)
        caps = driver.capabilities
        if lease_duration is None:
            default = caps.fixed_lease if caps.fixed_lease is not None else 30.0
            lease_duration = caps.clamp_lease(default)
        self._default_duration = self.check_duration(lease_duration)
        #: The last duration :meth:`lease` was given and its answer, with the
        #: capabilities it was checked against (a loop asks the same each time).
        self._last_duration: tuple[Capabilities, float | int, float] | None = None

    # ------------------------------------------------------------- properties

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._driver.queue

    @property
    def capabilities(self) -> Capabilities:
        """What this backend guarantees."""
        return self._driver.capabilities

    @property
    def driver(self) -> Driver:
        """The backend driver (for vendors and tests; apps should not need it)."""
        return self._driver

    @property
    def default_lease_duration(self) -> float:
        """The physical lease used when a call gives none."""
        return self._default_duration

    @property
    def events(self) -> Events:
        """The plugin event hooks this queue's work reports to (see :mod:`leasekit.events`)."""
        return self._events

    @property
    def call_timeout(self) -> float:
        """The longest one backend call may take when nothing tighter bounds it."""
        return self._call_timeout

    @property
    def checkpoint_store(self) -> CheckpointStore | None:
        """The store checkpoints go to, or ``None`` (none given, or the backend keeps them)."""
        return self._checkpoint_store

    @property
    def can_checkpoint(self) -> bool:
        """Whether :meth:`Lease.checkpoint` works: natively, or with a ``checkpoint_store``."""
        return self.capabilities.native_checkpoint or self._checkpoint_store is not None

    def __repr__(self) -> str:
        return f"<Queue {self._driver.scheme}:{self.name}>"

    # ---------------------------------------------------------------- sending

    def send(
        self,
        body: bytes,
        *,
        delay: float = 0,
        ttl: float | None = None,
        properties: Mapping[str, str] | None = None,
        group: str | None = None,
        dedup_key: str | None = None,
    ) -> str:
        """Send one message and return its id.

        Parameters
        ----------
            body: the payload, bytes (encode text yourself).
            delay: seconds before the message becomes visible.
            ttl: seconds the message may live in the queue; the backend's default if ``None``.
            properties: string key/value pairs carried with the message.
            group: the ordered group the message joins (``capabilities.ordered``):
                a group's messages are handed out one lease at a time, in the order
                sent (see ``docs/ordering.md``). 1 to 128 letters, digits and ASCII
                punctuation; a message of a group cannot be delayed.
            dedup_key: the deduplication id (``capabilities.deduplicates``): a second
                message with the same key within the backend's window is dropped.

        Raises
        ------
            InvalidArgument: a non-bytes body or bad delay/ttl/properties/group/dedup_key
                (no call made).
            MessageTooLarge: the body is over ``capabilities.max_message_size``.
            UnsupportedOperation: delay, ttl, properties, group or dedup_key the
                backend cannot carry.
        """
        messages = [self._outgoing(body, delay, ttl, properties, group, dedup_key)]
        self._require_open()
        extra: dict[str, str] = {}  # properties the send event's observers add
        result = ""
        with self._events.bracket(
            "send",
            lambda error: {
                "queue": self,
                "messages": messages,
                "results": [result if error is None else error],
            },
            queue=self,
            messages=messages,
            properties=extra,
        ):
            messages = self._with_extra(messages, extra)
            result = self._send_outgoing(messages[0])
        return result

    def _send_outgoing(self, outgoing: OutgoingMessage) -> str:
        with deadline(self._call_timeout):
            [result] = self._runner.call("send", partial(self._driver.send, [outgoing]))
        if isinstance(result, BaseException):
            raise self._runner.entry_error(result, "send")
        return result

    def send_many(
        self,
        bodies: Iterable[bytes],
        *,
        delay: float = 0,
        ttl: float | None = None,
        properties: Mapping[str, str] | None = None,
        group: str | None = None,
    ) -> list[str]:
        """Send several messages (in batches where the backend has a batch form); return ids.

        Every message is validated before anything is sent. Batches follow the
        backend's limits (``max_send_batch`` messages, ``max_send_batch_bytes``).
        With ``group`` they all join that ordered group, in the order given (see
        :meth:`send`); batches go one after another, so the order holds.

        Raises:
            InvalidArgument, MessageTooLarge, UnsupportedOperation: a message that
                cannot be sent (nothing is sent).
            SendIncomplete: some messages were not sent; its ``results`` give, per
                message, the id it was sent with or the error it got. After a batch
                call that failed as a whole, the rest are not tried (they get its error).
        """
        outgoing = [
            self._outgoing(body, delay, ttl, properties, group)
            for body in as_items(bodies, "bodies")
        ]
        self._require_open()
        results: list[str | errors.LeaseError] = []
        extra: dict[str, str] = {}  # properties the send event's observers add
        with self._events.bracket(
            "send",
            lambda error: {
                "queue": self,
                "messages": outgoing,
                "results": results
                if error is None
                else [*results, *[error] * (len(outgoing) - len(results))],
            },
            queue=self,
            messages=outgoing,
            properties=extra,
        ):
            outgoing = self._with_extra(outgoing, extra)
            return self._send_all(outgoing, results)

    def _send_all(
        self, outgoing: list[OutgoingMessage], results: list[str | errors.LeaseError]
    ) -> list[str]:
        """Send ``outgoing`` in batches; each message's id or error goes to ``results``."""
        failure: errors.LeaseError | None = None
        for chunk in self._send_batches(outgoing):
            if failure is not None:
                results += [failure] * len(chunk)
                continue
            try:
                with deadline(self._call_timeout):
                    sent = self._runner.call("send", partial(self._driver.send, chunk))
            except errors.LeaseError as exc:
                failure = exc
                results += [exc] * len(chunk)
                continue
            results += [
                self._runner.entry_error(r, "send") if isinstance(r, BaseException) else r
                for r in sent
            ]
        failed = [r for r in results if isinstance(r, errors.LeaseError)]
        if failed:
            error = errors.SendIncomplete(
                f"send_many on {self.name!r}: {len(results) - len(failed)} of {len(results)} "
                f"messages sent; the first failure: {failed[0]}",
                results,
            )
            raise error from failed[0]
        return [r for r in results if isinstance(r, str)]

    def _with_extra(
        self, messages: list[OutgoingMessage], extra: dict[str, str]
    ) -> list[OutgoingMessage]:
        """``messages`` with the properties the send event's observers gave, where they fit."""
        if not extra or not self.capabilities.supports_properties:
            return messages
        added = {}
        for key, value in extra.items():
            try:
                if isinstance(key, str) and key and isinstance(value, str):
                    caps, scheme = self.capabilities, self._driver.scheme
                    name = arguments.check_nul(caps, scheme, check_text(key, "a name"), "a name")
                    added[name] = arguments.check_nul(
                        caps, scheme, check_text(value, "a value"), "a value"
                    )
                    continue
            except errors.InvalidArgument:
                pass
            self._log.warning("a plugin's property %r: %r is not sendable; left out", key, value)
        return [self._with_properties(message, added) for message in messages]

    def _with_properties(self, message: OutgoingMessage, extra: dict[str, str]) -> OutgoingMessage:
        """``message`` with ``extra`` added (the caller's own win), or as it is if they do not fit.

        A message the caller made to the backend's limits (size, property count)
        must still be sendable, so the driver judges the message with them.
        """
        own = message.properties
        added = {key: value for key, value in extra.items() if key not in own}
        if not added:
            return message
        candidate = dataclasses.replace(message, properties={**own, **added})
        try:
            self._driver.validate(candidate)
        except Exception:
            return message  # over a limit with them: sent without
        return candidate

    def _send_batches(self, outgoing: list[OutgoingMessage]) -> Iterator[list[OutgoingMessage]]:
        """``outgoing`` in batches within ``max_send_batch`` and ``max_send_batch_bytes``."""
        caps = self.capabilities
        size, limit = caps.max_send_batch, caps.max_send_batch_bytes
        batch: list[OutgoingMessage] = []
        used = 0
        for message in outgoing:
            weight = _weight(message) if limit is not None else 0
            if batch and (len(batch) >= size or (limit is not None and used + weight > limit)):
                yield batch
                batch, used = [], 0
            batch.append(message)
            used += weight
        if batch:
            yield batch

    # ---------------------------------------------------------------- leasing

    def lease(
        self, max_messages: int = 1, *, duration: float | None = None, wait: float = 0
    ) -> list[Lease]:
        """Lease up to ``max_messages`` messages, each hidden for ``duration`` seconds.

        Parameters
        ----------
            max_messages: 1 to 1000; more than the backend's receive batch is
                fetched in several receives.
            duration: the physical lease; the queue's default if ``None``.
            wait: seconds to wait for the first message (long poll); 0 returns at once.

        Returns
        -------
            The leases, possibly none.

        Raises
        ------
            InvalidArgument / InvalidLeaseDuration: bad arguments (no call made).
            QueueNotFound: the queue does not exist.
        """
        if not isinstance(max_messages, int) or isinstance(max_messages, bool):
            raise errors.InvalidArgument(f"max_messages must be an int, got {max_messages!r}")
        if not 1 <= max_messages <= MAX_LEASE_BATCH:
            raise errors.InvalidArgument(
                f"max_messages must be between 1 and {MAX_LEASE_BATCH}, got {max_messages}"
            )
        seconds = self._default_duration if duration is None else self._lease_seconds(duration)
        wait = arguments.wait(wait)
        self._require_open()
        leases: list[Lease] = []
        with self._events.bracket(
            "receive",
            lambda error: {"queue": self, "leases": leases if error is None else []},
            queue=self,
            max_messages=max_messages,
        ):
            leases = self._receive(max_messages, seconds, wait)
            if leases and self._events.observed("leasekit_lease_acquired"):
                for lease in leases:
                    self._events.emit("leasekit_lease_acquired", lease=lease)
        return leases

    def _receive(self, max_messages: int, seconds: float, wait: float) -> list[Lease]:
        """The long-poll loop of :meth:`lease` (arguments validated)."""
        caps = self.capabilities
        until = time.monotonic() + wait
        leases: list[Lease] = []
        poll = POLL_START
        while True:
            want = min(max_messages - len(leases), caps.max_receive_batch)
            remaining = max(0.0, until - time.monotonic())
            call_wait = 0.0 if leases else min(remaining, caps.max_wait)
            if caps.wait_resolution > 0:  # whole steps only; the rest is waited below
                call_wait = math.floor(call_wait / caps.wait_resolution) * caps.wait_resolution
            started = time.monotonic()
            with deadline(call_wait + self._call_timeout):
                batch = self._runner.call(
                    "receive", partial(self._driver.receive, want, seconds, call_wait)
                )
                leases.extend(self._operations.leases_from(batch, seconds, started))
            if len(leases) >= max_messages:
                break
            if batch and len(batch) >= want:
                continue
            rest = until - time.monotonic()
            if leases or rest <= 0:
                break
            if 0 < rest < caps.wait_resolution:
                time.sleep(rest)  # a fraction no long poll can wait: wait here, look once more
            elif caps.max_wait <= 0 or call_wait <= 0:
                time.sleep(min(poll, rest))
                poll = min(poll * 2, POLL_MAX)
        return leases

    @contextmanager
    def lease_one(
        self, *, duration: float | None = None, wait: float | None = None
    ) -> Iterator[Lease]:
        """Lease one message for a ``with`` block; leaving without settling abandons it.

        Parameters
        ----------
            duration: the physical lease; the queue's default if ``None``.
            wait: seconds to wait for a message; ``None`` waits until one arrives.

        Raises
        ------
            QueueEmpty: ``wait`` passed with no message.
        """
        lease = self._lease_one(duration, wait)
        with lease:
            yield lease

    def _lease_one(self, duration: float | None, wait: float | None) -> Lease:
        if wait is not None:
            arguments.wait(wait)
        until = None if wait is None else time.monotonic() + wait
        while True:
            step = 20.0 if until is None else max(0.0, until - time.monotonic())
            leases = self.lease(1, duration=duration, wait=step)
            if leases:
                return leases[0]
            if until is not None and time.monotonic() >= until:
                raise errors.QueueEmpty(f"no message on {self.name!r} within {wait} s")

    # ----------------------------------------------------------------- admin

    def stats(self) -> QueueStats:
        """Counts of visible, leased, delayed, dead-lettered and all messages, where known.

        Approximate on the cloud services. Which counts are filled in (the others
        are ``None``) is ``capabilities.counted``: what the backend tells, plus
        ``total`` when it tells visible, leased and delayed apart, and, where core
        dead-letters to ``<queue>-poison``, ``dead_lettered`` as that queue's total
        (one more call; 0 while no message was dead-lettered, as core creates
        the poison queue on the first).

        Raises:
            UnsupportedOperation: the backend cannot count (``capabilities.queue_stats``).
        """
        self._require_open()
        caps = self.capabilities
        if not caps.queue_stats:
            raise errors.UnsupportedOperation(f"{self._driver.scheme} cannot report queue stats")
        derived = caps.counted - caps.counts  # core's to fill in
        with deadline(self._call_timeout):
            counts = self._runner.call("stats", self._driver.stats)
            if "total" in derived:
                counts = with_total(counts)
            if "dead_lettered" in derived:
                counts = dataclasses.replace(counts, dead_lettered=self._dead_letters.count())
        if counts.oldest_age is not None and not caps.reports_oldest_age:
            counts = dataclasses.replace(counts, oldest_age=None)  # only what is declared
        return counts

    def peek_dead_letters(self, limit: int = 10, *, after: str | None = None) -> list[DeadLetter]:
        """Read up to ``limit`` dead-lettered messages without removing them, oldest first.

        ``after``: the id of a dead letter read before; read the ones after it (the
        next page), without reading those before it again.

        Raises:
            UnsupportedOperation: the backend cannot read dead letters back, or
                cannot page them (``after`` given: only native stores whose driver
                has ``dead_letters_after``).
            InvalidArgument: ``after`` is not a dead letter of this queue (any more).
        """
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise errors.InvalidArgument(f"limit must be a positive int, got {limit!r}")
        if after is not None and (not isinstance(after, str) or not after):
            raise errors.InvalidArgument(f"after must be a dead letter's id, got {after!r}")
        limit = min(limit, MAX_PEEK)  # "up to": a larger limit reads everything there is
        self._require_open()
        if not self.capabilities.inspect_dead_letters:
            raise errors.UnsupportedOperation(
                f"{self._driver.scheme} cannot read dead-lettered messages back"
            )
        if after is not None:
            if not self.capabilities.native_dead_letter or (
                type(self._driver).dead_letters_after is Driver.dead_letters_after
            ):
                raise errors.UnsupportedOperation(
                    f"{self._driver.scheme} cannot page its dead letters (no "
                    "dead_letters_after): read them from the oldest"
                )
            with deadline(self._call_timeout):
                return self._runner.call(
                    "read dead letters", partial(self._dead_letters_after, after, limit)
                )
        with deadline(self._call_timeout):
            if self.capabilities.native_dead_letter:
                return self._runner.call(
                    "read dead letters", lambda: self._driver.dead_letters(limit)
                )
            return self._dead_letters.peek(limit)

    def _dead_letters_after(self, after: str, limit: int) -> list[DeadLetter]:
        try:
            return self._driver.dead_letters_after(after, limit)
        except KeyError:
            raise errors.InvalidArgument(
                f"{after!r} is not a dead letter of {self.name!r} (any more: re-driven or "
                "removed); read from the oldest again"
            ) from None

    def redrive(
        self,
        limit: int | None = None,
        *,
        older_than: float | timedelta | None = None,
        where: Callable[[DeadLetter], bool] | None = None,
    ) -> int:
        """Move up to ``limit`` dead letters back to this queue; return how many moved.

        Each is leased in the dead-letter place, sent back (body, properties, and
        the reason as ``leasekit-redriven-reason``), then completed there: an
        interruption leaves every message in one place or both, never in neither.
        ``older_than`` (seconds or a ``timedelta``) and ``where(letter)`` select
        which. See :mod:`leasekit.redrive`.

        Raises:
            UnsupportedOperation: the backend cannot re-drive dead letters.
        """
        from .redrive import redrive

        return redrive(self, limit, older_than=older_than, where=where)

    def create(self) -> None:
        """Create the queue if it does not exist."""
        self._require_open()
        with deadline(self._call_timeout):
            self._runner.call("create queue", self._driver.create_queue)

    def delete_queue(self) -> None:
        """Delete the queue and its messages, and ``<queue>-poison`` if core dead-letters there.

        A dead-letter queue the service names (SQS's redrive target) is shared
        and never deleted. To delete one message, complete its lease.
        """
        self._require_open()
        with deadline(self._call_timeout):
            named = None
            if not self.capabilities.native_dead_letter:
                with contextlib.suppress(errors.QueueNotFound):  # asked before it is gone
                    named = self._dead_letters.named_queue()
            self._runner.call("delete queue", self._driver.delete_queue)
            if self.capabilities.native_dead_letter or named is not None:
                return
        self._dead_letters.delete_poison_queue()

    def delete(self) -> None:
        """Deprecated alias of :meth:`delete_queue`: it deletes the whole queue, not a message.

        Warns with a :class:`DeprecationWarning`; use :meth:`delete_queue`.
        """
        warnings.warn(
            "Queue.delete() is deprecated: it deletes the whole queue; use Queue.delete_queue()",
            DeprecationWarning,
            stacklevel=2,
        )
        self.delete_queue()

    def close(self) -> None:
        """Release the backend's connections; further calls raise :class:`LeaseStateError`."""
        if self._closed:
            return
        self._closed = True
        try:
            self._driver.close()
        finally:
            self._dead_letters.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------- lease operations

    def renew_many(
        self,
        leases: Sequence[Lease],
        duration: float | None = None,
        *,
        timeout: float | None = None,
        lateness: Sequence[float] | None = None,
    ) -> list[errors.LeaseError | errors.LeaseStateError | None]:
        """Renew several held leases, in as few backend calls as the backend allows.

        Parameters:
            leases: leases of this queue.
            duration: the new physical lease for each; each lease's last one if ``None``.
            timeout: the longest the whole call may take: one deadline for all its
                backend calls, each getting at most what is left of it (and never
                more than its leases' time left); leases whose batch was not sent
                before it passed get a :class:`BackendUnavailable`, still held.
                Without it (the keeper's way), each batch's deadline is the least
                time left on its own leases, at most the queue's ``call_timeout``,
                so one hung batch fails no other. A renewal never outlives the
                lease it renews.
            lateness: for a keeper, per lease, how many seconds after its planned
                point this renewal started; passed on to ``leasekit_lease_renewed``.

        Returns:
            One result per lease, in order: ``None`` when renewed; a
            :class:`LeaseLost` (the lease is marked lost) or another leasekit error;
            a :class:`LeaseStateError` for a lease already settled, or an
            :class:`InvalidLeaseDuration` for one that would pass the backend's
            total cap. Nothing is raised for one bad lease.

        Raises:
            InvalidArgument: a lease of another queue, or a bad ``timeout`` (nothing is renewed).
            InvalidLeaseDuration: ``duration`` is out of the backend's range (no call made).
        """
        leases = self._check_own(leases)
        checked = None if duration is None else self.check_duration(duration)
        limit = arguments.timeout(timeout)
        if lateness is not None and len(lateness) != len(leases):
            raise errors.InvalidArgument(
                f"lateness needs one value per lease ({len(leases)}), got {len(lateness)}"
            )
        self._require_open()
        if checked is not None and self.capabilities.max_total_lease is None:
            # the keeper's way
            return self._operations.renew(leases, [checked] * len(leases), limit, lateness=lateness)
        results: list[errors.LeaseError | errors.LeaseStateError | None] = [None] * len(leases)
        seconds: list[float] = []
        caps, scheme = self.capabilities, self._driver.scheme
        for i, lease in enumerate(leases):
            physical = lease.duration if checked is None else checked
            refused = arguments.past_total_cap(caps, scheme, lease, physical)
            results[i] = refused
            seconds.append(-1.0 if refused else physical)
        wanted = [i for i, s in enumerate(seconds) if s >= 0]
        renewed = self._operations.renew(
            [leases[i] for i in wanted],
            [seconds[i] for i in wanted],
            limit,
            lateness=None if lateness is None else [lateness[i] for i in wanted],
        )
        for i, result in zip(wanted, renewed, strict=True):
            results[i] = result
        return results

    def complete_many(
        self, leases: Sequence[Lease], *, timeout: float | None = None
    ) -> list[errors.LeaseError | errors.LeaseStateError | None]:
        """Complete several leases in as few backend calls as the backend allows.

        Parameters:
            leases: leases of this queue.
            timeout: the longest the whole call may take (default: the least time
                left on the leases, at least ``MIN_SETTLE_TIMEOUT``, at most the
                queue's ``call_timeout``). One deadline for all its backend calls:
                each batch gets at most what is left of it, and the leases of a
                batch not sent before it passed get a :class:`BackendUnavailable`
                without a call (still held). A lease busy with a renewal is waited
                for before the deadline starts, at most until its time is up.

        Returns:
            One result per lease, in order: ``None`` when completed; a
            :class:`LeaseLost` (the lease is marked lost) or another leasekit
            error from the backend (the lease stays held: a transient failure may
            be retried); a :class:`LeaseStateError` for a lease that was already
            settled. Nothing is raised for one bad lease.

        Raises:
            InvalidArgument: a lease of another queue (nothing is completed).
        """
        leases = self._check_own(leases)
        limit = arguments.timeout(timeout)
        return self._operations.settle(leases, self._completion(), limit)

    def _complete_one(self, lease: Lease) -> None:
        """``lease.complete()``: complete this queue's ``lease``; raise its error."""
        self._operations.complete_one(lease, self._completion())

    def _completion(self) -> SettleSpec:
        """How a complete is done (raises if the queue is closed)."""
        self._require_open()
        complete = self._complete_spec
        if complete is None or complete.batch != self.capabilities.max_delete_batch:
            complete = self._complete_spec = SettleSpec(
                action="complete",
                state=LeaseState.COMPLETED,
                batch=self.capabilities.max_delete_batch,
                call=self._driver.delete,
                hook="leasekit_lease_completed",
            )
        return complete

    def abandon_many(
        self, leases: Sequence[Lease], delay: float = 0, *, timeout: float | None = None
    ) -> list[errors.LeaseError | errors.LeaseStateError | None]:
        """Give several leases back: visible again now, or after ``delay`` seconds.

        Parameters:
            leases: leases of this queue.
            delay: seconds before the messages are visible again (at least the
                backend's ``min_abandon_delay``).
            timeout: the longest the whole call may take (see :meth:`complete_many`).

        Returns:
            One result per lease, as :meth:`complete_many` gives.

        Raises:
            InvalidArgument: a bad delay or timeout, or a lease of another queue (no call made).
            UnsupportedOperation: a delay on a backend that cannot delay.
        """
        leases = self._check_own(leases)
        seconds = arguments.abandon_delay(self.capabilities, self._driver.scheme, delay)
        limit = arguments.timeout(timeout)
        self._require_open()
        abandon = SettleSpec(
            action="abandon",
            state=LeaseState.ABANDONED,
            batch=self.capabilities.max_renew_batch,
            call=partial(self._driver.abandon, delay=seconds),
            hook="leasekit_lease_abandoned",
            hook_kwargs={"delay": seconds},
        )
        return self._operations.settle(leases, abandon, limit)

    def dead_letter(self, lease: Lease, reason: str, *, timeout: float | None = None) -> None:
        """Move a leased message to the dead-letter place with ``reason``.

        Without a native dead-letter store the message is copied to
        ``<queue>-poison`` first and deleted after, so a failure in between
        leaves a duplicate, never a lost message.

        Raises:
            InvalidArgument: an empty or non-string reason, or a lease of another queue.
            LeaseLost: the receipt is stale (the lease is marked lost).
            LeaseStateError: the lease was already settled.
        """
        self._check_own([lease])
        reason = arguments.dead_letter_reason(reason, self.capabilities, self._driver.scheme)
        limit = arguments.timeout(timeout)
        self._require_open()
        self._operations.dead_letter(lease, reason, limit, self._dead_letters.move)

    def checkpoint(self, lease: Lease, data: bytes, *, timeout: float | None = None) -> None:
        """Save ``data`` as the progress of ``lease``'s message; the lease stays held.

        The next holder of the message reads it as ``lease.message.checkpoint``.
        A checkpoint also renews the lease for its last duration: natively in the
        same call (Azure Storage Queue's Update Message; SQLite and memory keep it
        with the message); elsewhere the renewal confirms the receipt is current
        and the ``checkpoint_store`` is written after it (see
        :mod:`leasekit.checkpoints`).

        Raises:
            InvalidArgument: ``data`` is not bytes, or a lease of another queue.
            UnsupportedOperation: the backend keeps no checkpoints and no
                ``checkpoint_store`` was given to :func:`leasekit.open`.
            MessageTooLarge: the backend cannot hold this much with the message.
            LeaseLost: the receipt is stale, or a later holder saved a checkpoint
                (the lease is marked lost; nothing was saved).
            LeaseStateError: the lease was already settled.
        """
        self._check_own([lease])
        if not isinstance(data, bytes):
            raise errors.InvalidArgument(
                f"a checkpoint is bytes, got {type(data).__name__} (encode it yourself)"
            )
        limit = arguments.timeout(timeout)
        self._require_open()
        native = self.capabilities.native_checkpoint
        if not native and self._checkpoint_store is None:
            raise errors.UnsupportedOperation(
                f"{self._driver.scheme} cannot keep a checkpoint with the message; give "
                "leasekit.open(..., checkpoint_store=leasekit.SqliteCheckpointStore(path)) "
                "(the checkpoint_store option) to keep checkpoints there"
            )
        if native:
            self._operations.checkpoint_native(lease, data, limit)
        else:
            self._operations.checkpoint_stored(lease, data, limit)
        self._events.emit("leasekit_lease_checkpointed", lease=lease, size=len(data))

    def group_state(self, lease: Lease, *, timeout: float | None = None) -> bytes | None:
        """The state kept with ``lease``'s group (Service Bus session state); ``None``: none.

        Raises:
            UnsupportedOperation: the backend keeps no group state
                (``capabilities.group_state``), or the message has no group.
            LeaseLost: the lease is lost (its group may be held by another now).
            LeaseStateError: the lease was already settled.
        """
        self._check_group_state(lease)
        return self._operations.group_state(lease, arguments.timeout(timeout))

    def set_group_state(
        self, lease: Lease, state: bytes | None, *, timeout: float | None = None
    ) -> None:
        """Replace (``None``: clear) the state kept with ``lease``'s group.

        Raises:
            InvalidArgument: ``state`` is not bytes or ``None``.
            UnsupportedOperation, LeaseLost, LeaseStateError: see :meth:`group_state`.
        """
        if state is not None and not isinstance(state, bytes):
            raise errors.InvalidArgument(
                f"a group state is bytes or None, got {type(state).__name__}"
            )
        self._check_group_state(lease)
        self._operations.group_state(lease, arguments.timeout(timeout), write=True, state=state)

    def _check_group_state(self, lease: Lease) -> None:
        self._check_own([lease])
        self._require_open()
        if not self.capabilities.group_state:
            raise errors.UnsupportedOperation(
                f"{self._driver.scheme} keeps no state per group on queue {self.name!r}"
            )
        if lease.message.group is None:
            raise errors.UnsupportedOperation(
                f"message {lease.message.id!r} was sent without a group: it has no group state"
            )
        lease.check()
        if lease.state is not LeaseState.HELD:
            raise errors.LeaseStateError(
                f"the lease of message {lease.message.id!r} is {lease.state.value}: only a "
                "held lease reads or sets its group's state"
            )

    def _check_own(self, leases: Sequence[Lease]) -> Sequence[Lease]:
        """``leases`` as a sequence, each a lease of this queue (else InvalidArgument)."""
        leases = as_items(leases, "leases")
        for lease in leases:
            if type(lease) is Lease and lease._queue is self:  # the common case, cheaply
                continue
            if not isinstance(lease, Lease):
                raise errors.InvalidArgument(f"expected a Lease, got {lease!r}")
            if lease.queue is not self:
                raise errors.InvalidArgument(
                    f"lease of message {lease.message.id!r} belongs to queue "
                    f"{lease.queue.name!r}, not {self.name!r}"
                )
        return leases

    # ------------------------------------------------------------- validation

    def check_duration(self, duration: object) -> float:
        """Validate a lease duration for this backend; return it as the backend will use it.

        Raises:
            InvalidLeaseDuration: not a finite number, or outside the backend's range.
        """
        return arguments.lease_duration(self.capabilities, self._driver.scheme, duration)

    def _lease_seconds(self, duration: object) -> float:
        """:meth:`check_duration` for :meth:`lease`, answering a repeated int or float at once.

        Only a plain ``int`` or ``float`` equal to the last one checked, against
        the same capabilities, is answered from memory (NaN equals nothing, so it
        is always checked, and refused); anything else is checked as given.
        """
        if type(duration) is not float and type(duration) is not int:
            return self.check_duration(duration)
        caps = self.capabilities
        last = self._last_duration
        if (
            last is not None
            and last[0] is caps
            and last[1] == duration
            and type(last[1]) is type(duration)
        ):
            return last[2]
        seconds = self.check_duration(duration)
        self._last_duration = (caps, duration, seconds)
        return seconds

    def renewable_for(self, lease: Lease, seconds: float) -> float | None:
        """How long ``lease`` may be renewed for now: ``seconds``, within the backend's total cap.

        Where the backend caps invisibility in total since receive (SQS: 12 h),
        a renewal asks for no more than what is left of it (less a second, in the
        backend's resolution); ``None`` when less than half of ``seconds`` (or
        less than the shortest lease) is left: the message comes back when its
        lease runs out. Without that floor a keeper would close in on the cap in
        ever shorter renewals, each one due sooner, until one came too late and
        the lease was reported lost instead of let go. The keeper asks this
        before each renewal.
        """
        caps = self.capabilities
        if caps.max_total_lease is None:
            return seconds
        allowance = caps.max_total_lease - (time.monotonic() - lease.received_at) - 1.0
        allowance = int(allowance / caps.lease_resolution) * caps.lease_resolution
        if allowance < max(caps.min_lease, seconds / 2):
            return None
        return min(seconds, allowance)

    @property
    def retry_policy(self) -> RetryPolicy:
        """The backoff this queue retries transient failures with (the keeper's too)."""
        return self._retry

    def _outgoing(
        self,
        body: object,
        delay: object,
        ttl: object,
        properties: Mapping[str, str] | None,
        group: object = None,
        dedup_key: object = None,
    ) -> OutgoingMessage:
        """The message to send, checked by core and by the driver (no call made)."""
        message = arguments.outgoing(
            self.capabilities, self._driver.scheme, body, delay, ttl, properties, group, dedup_key
        )
        try:
            self._driver.validate(message)  # what only the driver can tell; no call made
        except Exception as exc:
            raise wrap_error(self._driver, exc, f"send on {self.name!r}") from exc
        return message

    # --------------------------------------------------------------- plumbing

    def _require_open(self) -> None:
        if self._closed:
            raise errors.LeaseStateError(f"queue {self.name!r} is closed; open it again")
