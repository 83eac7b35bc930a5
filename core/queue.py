"""The portable queue: validation, receipt tracking, retries and the long-poll loop, once."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from . import dead_letters, errors
from .capabilities import Capabilities
from .deadline import deadline
from .error_mapping import wrap_error
from .events import Events
from .lease import Lease
from .lease_record import RENEW, SETTLE
from .message import LeaseState, Message
from .options import as_items, check_text, is_number
from .retry import RetryPolicy
from .spi import DeadLetter, Driver, OutgoingMessage, QueueStats, RawMessage, Visibility

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "MAX_LEASE_BATCH",
    "MIN_SETTLE_TIMEOUT",
    "POISON_SUFFIX",
    "Queue",
]

T = TypeVar("T")

#: Most messages one ``Queue.lease`` call may ask for; core splits it into
#: receives of ``capabilities.max_receive_batch``. Bounded so a typo cannot
#: lease a whole queue into one process.
MAX_LEASE_BATCH = 1000
#: Where core dead-letters on backends without a dead-letter store or queue of their own.
POISON_SUFFIX = dead_letters.POISON_SUFFIX
#: Polling between empty receives on backends that cannot long-poll: start
#: small for latency, back off to keep an idle SQLite file cheap.
POLL_START = 0.005
POLL_MAX = 0.1
#: Longest reason kept on a dead-lettered message (Service Bus allows 4096).
MAX_REASON = 4096
#: Longest one backend call may take, retries included, when nothing tighter
#: bounds it (a send, an admin call; a receive gets this beyond its long poll).
#: Shorter fails faster on a dead network; longer rides out a slow service.
DEFAULT_CALL_TIMEOUT = 10.0
#: Least time a settle call gets even when the lease's time is (nearly) up: a
#: receipt past its expiry may still be honoured, and settling late harms nobody.
MIN_SETTLE_TIMEOUT = 1.0
#: Largest ``peek_dead_letters`` limit passed to a driver (fits every backend's integer).
MAX_PEEK = 2**31 - 1

_log = logging.getLogger("leasekit")

#: The queue-call event pairs (``core/hookspecs.py``); built only when observed.
_BEFORE_SEND, _AFTER_SEND = "leasekit_before_send", "leasekit_after_send"
_BEFORE_RECEIVE, _AFTER_RECEIVE = "leasekit_before_receive", "leasekit_after_receive"
_BEFORE_SETTLE, _AFTER_SETTLE = "leasekit_before_settle", "leasekit_after_settle"
_BEFORE_RENEW, _AFTER_RENEW = "leasekit_before_renew", "leasekit_after_renew"


def _copy_repeats(results: list[Any], repeats: list[tuple[int, int]]) -> None:
    """Give each repeated lease's later position the result of its first one."""
    for later, first in repeats:
        results[later] = results[first]


#: Not asked yet (``Driver.dead_letter_queue`` may be ``None``).
_UNKNOWN = object()


def _weight(message: OutgoingMessage) -> int:
    """What a message counts against ``max_send_batch_bytes``: body, property names and values."""
    return len(message.body) + sum(
        len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
        for k, v in message.properties.items()
    )


def _number(value: object) -> bool:
    return is_number(value)  # also refuses an int too large for a float


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

    A queue is thread-safe and a context manager; :meth:`close` releases the
    backend's connections.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        lease_duration: float | None = None,
        retry: RetryPolicy | None = None,
        hooks: Any = None,
        call_timeout: float | None = None,
    ) -> None:
        if not isinstance(driver, Driver):
            raise errors.InvalidArgument(f"driver must be a leasekit Driver, got {driver!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise errors.InvalidArgument(
                f"retry must be a leasekit.RetryPolicy or None, got {type(retry).__name__}"
            )
        self._driver = driver
        self._retry = retry or RetryPolicy()
        self._call_timeout = self._check_timeout(call_timeout, "call_timeout") or (
            DEFAULT_CALL_TIMEOUT
        )
        self._events = Events(hooks)
        self._closed = False
        self._poison: Driver | None = None  # where core copies dead letters (opened on first use)
        self._named_dead_letter_queue: object = _UNKNOWN
        self._poison_lock = threading.Lock()
        self._log = _log
        caps = driver.capabilities
        if lease_duration is None:
            default = caps.fixed_lease if caps.fixed_lease is not None else 30.0
            lease_duration = min(max(default, caps.min_lease), caps.max_lease)
        self._default_duration = self._check_duration(lease_duration)

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
    ) -> str:
        """Send one message and return its id.

        Parameters
        ----------
            body: the payload, bytes (encode text yourself).
            delay: seconds before the message becomes visible.
            ttl: seconds the message may live in the queue; the backend's default if ``None``.
            properties: string key/value pairs carried with the message.

        Raises
        ------
            InvalidArgument: a non-bytes body or bad delay/ttl/properties (no call made).
            MessageTooLarge: the body is over ``capabilities.max_message_size``.
            UnsupportedOperation: delay, ttl or properties the backend cannot carry.
        """
        outgoing = self._outgoing(body, delay, ttl, properties)
        self._require_open()
        if not self._observes(_BEFORE_SEND, _AFTER_SEND):
            return self._send_outgoing(outgoing)
        [outgoing] = self._before_send([outgoing])
        try:
            result = self._send_outgoing(outgoing)
        except BaseException as exc:
            self._events.emit(
                _AFTER_SEND, queue=self, messages=[outgoing], results=[exc], error=exc
            )
            raise
        self._events.emit(
            _AFTER_SEND, queue=self, messages=[outgoing], results=[result], error=None
        )
        return result

    def _send_outgoing(self, outgoing: OutgoingMessage) -> str:
        with deadline(self._call_timeout):
            [result] = self._call("send", partial(self._driver.send, [outgoing]))
        if isinstance(result, BaseException):
            raise self._entry_error(result, "send")
        return result

    def send_many(
        self,
        bodies: Iterable[bytes],
        *,
        delay: float = 0,
        ttl: float | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Send several messages (in batches where the backend has a batch form); return ids.

        Every message is validated before anything is sent. Batches follow the
        backend's limits (``max_send_batch`` messages, ``max_send_batch_bytes``).

        Raises:
            InvalidArgument, MessageTooLarge, UnsupportedOperation: a message that
                cannot be sent (nothing is sent).
            SendIncomplete: some messages were not sent; its ``results`` give, per
                message, the id it was sent with or the error it got. After a batch
                call that failed as a whole, the rest are not tried (they get its error).
        """
        outgoing = [
            self._outgoing(body, delay, ttl, properties) for body in as_items(bodies, "bodies")
        ]
        self._require_open()
        results: list[str | errors.LeaseError] = []
        if not self._observes(_BEFORE_SEND, _AFTER_SEND):
            return self._send_all(outgoing, results)
        outgoing = self._before_send(outgoing)
        try:
            ids = self._send_all(outgoing, results)
        except BaseException as exc:
            reported: list[str | BaseException] = [*results]
            reported += [exc] * (len(outgoing) - len(results))
            self._events.emit(
                _AFTER_SEND, queue=self, messages=outgoing, results=reported, error=exc
            )
            raise
        self._events.emit(_AFTER_SEND, queue=self, messages=outgoing, results=results, error=None)
        return ids

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
                    sent = self._call("send", partial(self._driver.send, chunk))
            except errors.LeaseError as exc:
                failure = exc
                results += [exc] * len(chunk)
                continue
            results += [
                self._entry_error(r, "send") if isinstance(r, BaseException) else r for r in sent
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

    def _before_send(self, messages: list[OutgoingMessage]) -> list[OutgoingMessage]:
        """Tell ``leasekit_before_send``; add the properties its observers gave where they fit."""
        extra: dict[str, str] = {}
        self._events.emit(_BEFORE_SEND, queue=self, messages=messages, properties=extra)
        if not extra or not self.capabilities.supports_properties:
            return messages
        added = {}
        for key, value in extra.items():
            try:
                if isinstance(key, str) and key and isinstance(value, str):
                    added[check_text(key, "a property name")] = check_text(
                        value, "a property value"
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
        candidate = OutgoingMessage(
            body=message.body, delay=message.delay, ttl=message.ttl, properties={**own, **added}
        )
        try:
            self._driver.validate(candidate)
        except Exception:
            return message  # over a limit with them: sent without
        return candidate

    def _observes(self, before: str, after: str) -> bool:
        """Whether a plugin implements either hook of a before_/after_ pair."""
        events = self._events
        return events.observed(before) or events.observed(after)

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
        seconds = self._default_duration if duration is None else self._check_duration(duration)
        wait = self._check_wait(wait)
        self._require_open()
        observed = self._observes(_BEFORE_RECEIVE, _AFTER_RECEIVE)
        if not observed:
            leases = self._receive(max_messages, seconds, wait)
            for lease in leases:
                self.events.emit("leasekit_lease_acquired", lease=lease)
            return leases
        self._events.emit(_BEFORE_RECEIVE, queue=self, max_messages=max_messages)
        try:
            leases = self._receive(max_messages, seconds, wait)
            for lease in leases:
                self.events.emit("leasekit_lease_acquired", lease=lease)
        except BaseException as exc:
            self._events.emit(_AFTER_RECEIVE, queue=self, leases=[], error=exc)
            raise
        self._events.emit(_AFTER_RECEIVE, queue=self, leases=leases, error=None)
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
                batch = self._call(
                    "receive", partial(self._driver.receive, want, seconds, call_wait)
                )
                leases.extend(self._leases_from(batch, seconds, started))
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
            self._check_wait(wait)
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
            counts = self._call("stats", self._driver.stats)
            if "total" in derived:
                counts = _with_total(counts)
            if "dead_lettered" in derived:
                counts = dataclasses.replace(counts, dead_lettered=self._poison_count())
        return counts

    def _poison_count(self) -> int | None:
        """All messages of the queue core dead-letters to (0 if it does not exist yet).

        ``None`` where that cannot be counted.
        """
        if self._poison is not None:
            target, opened = self._poison, False
        else:
            try:
                named = self._dead_letter_queue()
                target = self._sibling(named or self.name + dead_letters.POISON_SUFFIX)
            except errors.UnsupportedOperation:  # no sibling(): the backend cannot dead-letter
                return None
            opened = True
        try:
            if not target.capabilities.queue_stats:
                return None
            return _with_total(self._call("dead-letter queue stats", target.stats)).total
        except errors.QueueNotFound:
            return 0
        finally:
            if opened:
                target.close()

    def peek_dead_letters(self, limit: int = 10) -> list[DeadLetter]:
        """Read up to ``limit`` dead-lettered messages without removing them.

        Raises:
            UnsupportedOperation: the backend cannot read dead letters back.
        """
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise errors.InvalidArgument(f"limit must be a positive int, got {limit!r}")
        limit = min(limit, MAX_PEEK)  # "up to": a larger limit reads everything there is
        self._require_open()
        if not self.capabilities.inspect_dead_letters:
            raise errors.UnsupportedOperation(
                f"{self._driver.scheme} cannot read dead-lettered messages back"
            )
        with deadline(self._call_timeout):
            if self.capabilities.native_dead_letter:
                return self._call("read dead letters", lambda: self._driver.dead_letters(limit))
            target = self._dead_letter_driver()
            peeked = self._call("read dead letters", lambda: target.peek(limit))
        return [dead_letters.read(raw) for raw in peeked]

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
            self._call("create queue", self._driver.create_queue)

    def delete(self) -> None:
        """Delete the queue and its messages, and ``<queue>-poison`` if core dead-letters there.

        A dead-letter queue the service names (SQS's redrive target) is shared
        and never deleted.
        """
        self._require_open()
        with deadline(self._call_timeout):
            named = None
            if not self.capabilities.native_dead_letter:
                with contextlib.suppress(errors.QueueNotFound):  # asked before it is gone
                    named = self._dead_letter_queue()
            self._call("delete queue", self._driver.delete_queue)
            if self.capabilities.native_dead_letter or named is not None:
                return
        try:
            poison = self._sibling(self.name + dead_letters.POISON_SUFFIX)
        except errors.UnsupportedOperation:
            return
        try:
            with deadline(self._call_timeout):
                self._call("delete poison queue", poison.delete_queue)
        finally:
            if poison is not self._poison:
                poison.close()

    def close(self) -> None:
        """Release the backend's connections; further calls raise :class:`LeaseStateError`."""
        if self._closed:
            return
        self._closed = True
        try:
            self._driver.close()
        finally:
            if self._poison is not None:
                self._poison.close()

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
            timeout: the longest the whole call may take (default: the least time
                left on the leases, at most the queue's ``call_timeout``); a renewal
                never outlives the lease it renews.
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
        checked = None if duration is None else self._check_duration(duration)
        limit = self._check_timeout(timeout)
        if lateness is not None and len(lateness) != len(leases):
            raise errors.InvalidArgument(
                f"lateness needs one value per lease ({len(leases)}), got {len(lateness)}"
            )
        self._require_open()
        if checked is not None and self.capabilities.max_total_lease is None:
            # the keeper's way
            return self._renew(leases, [checked] * len(leases), limit, lateness=lateness)
        results: list[errors.LeaseError | errors.LeaseStateError | None] = [None] * len(leases)
        seconds: list[float] = []
        for i, lease in enumerate(leases):
            physical = lease.duration if checked is None else checked
            refused = self._past_total_cap(lease, physical)
            results[i] = refused
            seconds.append(-1.0 if refused else physical)
        wanted = [i for i, s in enumerate(seconds) if s >= 0]
        renewed = self._renew(
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
                queue's ``call_timeout``).

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
        limit = self._check_timeout(timeout)
        self._require_open()
        return self._settle(
            leases,
            "complete",
            LeaseState.COMPLETED,
            self.capabilities.max_delete_batch,
            self._driver.delete,
            limit,
            "leasekit_lease_completed",
        )

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
        seconds = self._abandon_delay(delay)
        limit = self._check_timeout(timeout)
        self._require_open()

        return self._settle(
            leases,
            "abandon",
            LeaseState.ABANDONED,
            self.capabilities.max_renew_batch,
            partial(self._driver.abandon, delay=seconds),
            limit,
            "leasekit_lease_abandoned",
            delay=seconds,
        )

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
        reason = self._check_reason(reason)
        limit = self._check_timeout(timeout)
        self._require_open()
        if not self._observes(_BEFORE_SETTLE, _AFTER_SETTLE):
            self._dead_letter(lease, reason, limit)
            return
        self._events.emit(_BEFORE_SETTLE, queue=self, leases=[lease], action="dead_letter")
        error: BaseException | None = None
        try:
            self._dead_letter(lease, reason, limit)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._events.emit(
                _AFTER_SETTLE,
                queue=self,
                leases=[lease],
                action="dead_letter",
                results=[error],
                error=error,
            )

    def _dead_letter(self, lease: Lease, reason: str, limit: float | None) -> None:
        record = lease._record
        taken = record.take(SETTLE, "dead_letter", lease.message.id)
        if isinstance(taken, BaseException):
            raise taken
        try:
            with deadline(self._lease_timeout([lease], limit, settle=True)):
                self._dead_letter_call(lease, taken, reason)
        except errors.LeaseError as exc:
            record.failed(exc)
            raise
        except BaseException:
            record.release()
            raise
        record.settled(LeaseState.DEAD_LETTERED)
        self.events.emit("leasekit_lease_dead_lettered", lease=lease, reason=reason)

    def _dead_letter_call(self, lease: Lease, receipt: str, reason: str) -> None:
        if self.capabilities.native_dead_letter:
            raw = lease.raw_message
            self._call("dead-letter", lambda: self._driver.dead_letter(receipt, reason, raw))
            return
        # No native store: copy to the dead-letter queue first, then delete, so a
        # failure in between leaves a duplicate, never a lost message.
        target = self._dead_letter_driver()
        supports = target.capabilities.supports_properties
        for keeps, copy in dead_letters.copies(lease.message, reason, properties=supports):
            try:
                self._send_one(target, copy, "dead-letter (send the copy)")
                break
            except errors.MessageTooLarge:
                # One rule for every backend: a smaller copy, never a message left to loop.
                self._log.warning(
                    "dead-letter copy of %r too large for %r; trying it %s",
                    lease.message.id,
                    target.queue,
                    keeps,
                )
        else:  # pragma: no cover - the last copy is the message as it was received
            raise errors.MessageTooLarge(f"message {lease.message.id!r} fits no dead-letter copy")
        [deleted] = self._call(
            "dead-letter (delete the original)", partial(self._driver.delete, [receipt])
        )
        if deleted is not None:
            raise self._entry_error(deleted, "dead-letter (delete the original)")

    def _send_one(self, driver: Driver, message: OutgoingMessage, doing: str) -> str:
        """Send one message through ``driver`` (the driver's own checks first); raise its error."""
        try:
            driver.validate(message)
        except Exception as exc:
            raise wrap_error(driver, exc, f"{doing} on {driver.queue!r}") from exc
        [result] = self._call(doing, partial(driver.send, [message]))
        if isinstance(result, BaseException):
            error = wrap_error(driver, result, f"{doing} on {driver.queue!r}")
            if error is not result:
                error.__cause__ = result
            raise error
        return result

    # ------------------------------------------------- the batch machinery

    def _take(
        self, leases: Sequence[Lease], operation: str, action: str, results: list[Any]
    ) -> tuple[list[tuple[int, Lease, str]], list[tuple[int, int]]]:
        """Take each lease for ``operation``; the errors of those that cannot go to ``results``.

        A lease busy with another operation is waited for, at most until its
        time is up. Takes go in a fixed order (by ``id``), so two callers taking
        overlapping lists cannot wait for each other. A lease given twice is
        taken once: the second list pairs each later position with its first,
        whose result it gets (see :func:`_copy_repeats`).
        """
        order = sorted(range(len(leases)), key=lambda i: id(leases[i]))
        taken: list[tuple[int, Lease, str]] = []
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

    def _settle(
        self,
        leases: Sequence[Lease],
        action: str,
        state: LeaseState,
        size: int,
        call: Callable[[list[str]], list[BaseException | None]],
        limit: float | None,
        hook: str,
        **hook_kwargs: Any,
    ) -> list[errors.LeaseError | errors.LeaseStateError | None]:
        """Settle held leases in backend-sized batches; one result each (see complete_many)."""
        results: list[Any] = [None] * len(leases)
        observed = self._observes(_BEFORE_SETTLE, _AFTER_SETTLE)
        if observed:
            self._events.emit(_BEFORE_SETTLE, queue=self, leases=leases, action=action)
        done: list[Lease] = []
        error: BaseException | None = None
        try:
            taken, repeats = self._take(leases, SETTLE, action, results)
            chunks = [taken[start : start + size] for start in range(0, len(taken), size)]
            for position, chunk in enumerate(chunks):
                receipts = [receipt for _, _, receipt in chunk]
                timeout = self._lease_timeout([lz for _, lz, _ in chunk], limit, settle=True)
                outcome = self._batch_call(
                    action, partial(call, receipts), timeout, chunks, position
                )
                for (i, lease, _), result in zip(chunk, outcome, strict=True):
                    if result is None:
                        lease._record.settled(state)
                        done.append(lease)
                        continue
                    failure = self._entry_error(result, action)
                    lease._record.failed(failure)
                    results[i] = failure
            _copy_repeats(results, repeats)
        except BaseException as exc:
            error = exc
            raise
        finally:
            if done and self.events.observed(hook):
                for lease in done:
                    self.events.emit(hook, lease=lease, **hook_kwargs)
            if observed:
                self._events.emit(
                    _AFTER_SETTLE,
                    queue=self,
                    leases=leases,
                    action=action,
                    results=_reported(leases, results, {id(lease) for lease in done}, error),
                    error=error,
                )
        return results

    def _batch_call(
        self,
        action: str,
        fn: Callable[[], list[T]],
        timeout: float,
        chunks: list[list[tuple[int, Lease, str]]],
        position: int,
        *,
        raise_whole: bool = True,
    ) -> list[T | BaseException]:
        """One backend call for ``chunks[position]``, under ``timeout``.

        A call that fails as a whole (the queue is gone, the backend is out of
        reach) raises its leasekit error, after the leases of this chunk are
        given back as failed and those of later chunks unchanged; without
        ``raise_whole`` the error is each lease's result instead, and the next
        chunk is tried. What failed for one entry only is that entry's result.
        """
        chunk = chunks[position]
        try:
            with deadline(timeout):
                return list(self._call(action, fn))
        except errors.LeaseError as exc:
            if not raise_whole:
                return [exc] * len(chunk)
            for _, lease, _ in chunk:
                lease._record.failed(exc)
            self._release_chunks(chunks[position + 1 :])
            raise
        except BaseException:
            self._release_chunks(chunks[position:])
            raise

    @staticmethod
    def _release_chunks(chunks: list[list[tuple[int, Lease, str]]]) -> None:
        for chunk in chunks:
            for _, lease, _ in chunk:
                lease._record.release()

    def _renew(
        self,
        leases: Sequence[Lease],
        seconds: Sequence[float],
        timeout: float | None = None,
        *,
        event: bool = True,
        raise_whole: bool = True,
        lateness: Sequence[float] | None = None,
    ) -> list[errors.LeaseError | errors.LeaseStateError | None]:
        """Renew leases for their ``seconds``, batched where the backend can; one result each.

        ``None``: renewed; otherwise the leasekit error for that lease (a
        :class:`LeaseLost` has marked it lost). A call that fails as a whole
        raises (see ``_batch_call``).

        A renewal never outlives the lease it renews: its deadline is the least
        time left on the leases of its batch, and a lease whose time is up is
        not renewed (where the backend detects stale receipts it is asked anyway,
        for a receipt it may still honour). On a backend that cannot detect stale
        receipts, a renewal that returns after the lease ended counts as lost.
        ``seconds`` must already be validated. With ``event`` the ``before_``/``after_renew``
        pair and each ``leasekit_lease_renewed`` are emitted (the latter with the
        lease's ``lateness``, when given, by position).
        """
        results: list[Any] = [None] * len(leases)
        observed = event and self._observes(_BEFORE_RENEW, _AFTER_RENEW)
        if observed:
            self._events.emit(_BEFORE_RENEW, queue=self, leases=leases)
        renewed: list[int] = []  # positions
        error: BaseException | None = None
        try:
            self._renew_batches(leases, seconds, timeout, raise_whole, results, renewed)
        except BaseException as exc:
            error = exc
            raise
        finally:
            if event and renewed and self.events.observed("leasekit_lease_renewed"):
                for i in renewed:
                    self.events.emit(
                        "leasekit_lease_renewed",
                        lease=leases[i],
                        lateness=None if lateness is None else lateness[i],
                    )
            if observed:
                self._events.emit(
                    _AFTER_RENEW,
                    queue=self,
                    leases=leases,
                    results=_reported(leases, results, {id(leases[i]) for i in renewed}, error),
                    error=error,
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
        """The work of :meth:`_renew`: results to ``results``, renewed positions to ``renewed``."""
        taken, repeats = self._take(leases, RENEW, "renew", results)
        caps = self.capabilities
        late_is_lost = not caps.detects_stale_receipts
        if late_is_lost:
            taken = self._drop_expired(taken, results)
        groups: dict[float, list[tuple[int, Lease, str]]] = {}
        for item in taken:
            groups.setdefault(seconds[item[0]], []).append(item)
        size = caps.max_renew_batch
        plan = [
            (physical, group[start : start + size])
            for physical, group in groups.items()
            for start in range(0, len(group), size)
        ]
        chunks = [chunk for _, chunk in plan]
        for position, (physical, chunk) in enumerate(plan):
            receipts = [receipt for _, _, receipt in chunk]
            fn = partial(self._driver.change_visibility, receipts, physical)
            left = self._lease_timeout([lz for _, lz, _ in chunk], timeout, settle=False)
            started = time.monotonic()
            outcome = self._batch_call("renew", fn, left, chunks, position, raise_whole=raise_whole)
            for (i, lease, _), result in zip(chunk, outcome, strict=True):
                if isinstance(result, Visibility):
                    lost = lease._record.renewed(
                        result.receipt,
                        result.visible_until,
                        physical,
                        started,
                        late_is_lost=late_is_lost,
                    )
                    if lost is None:
                        renewed.append(i)
                    results[i] = lost
                    continue
                failure = self._entry_error(result, "renew")
                lease._record.failed(failure)
                results[i] = failure
        _copy_repeats(results, repeats)

    def _drop_expired(
        self, taken: list[tuple[int, Lease, str]], results: list[Any]
    ) -> list[tuple[int, Lease, str]]:
        """Leases whose time is up are lost, not renewed (stale receipts cannot be told here)."""
        alive = []
        for item in taken:
            i, lease, _ = item
            record = lease._record
            if record.time_left() > 0:
                alive.append(item)
                continue
            record.release()
            error = record.expire()
            results[i] = error or record.unusable("renew", lease.message.id)
        return alive

    def _entry_error(self, result: BaseException, action: str) -> errors.LeaseError:
        error = wrap_error(self._driver, result, f"{action} on {self.name!r}")
        if error is not result:
            error.__cause__ = result
        return error

    def _lease_timeout(
        self, leases: Sequence[Lease], limit: float | None, *, settle: bool
    ) -> float:
        """The deadline for a call on ``leases``: the least time left on them, within bounds.

        A settle gets at least ``MIN_SETTLE_TIMEOUT`` (a receipt past its expiry
        may still be honoured, and settling late harms nobody); a renewal gets
        what is left, so it never outlives the lease it renews.
        """
        left = min(lease._record.deadline for lease in leases) - time.monotonic()
        if settle or left <= 0:  # a renewal past the deadline: where stale receipts are refused
            left = max(left, MIN_SETTLE_TIMEOUT)
        return min(left, self._call_timeout if limit is None else limit)

    def _check_own(self, leases: Sequence[Lease]) -> Sequence[Lease]:
        """``leases`` as a sequence, each a lease of this queue (else InvalidArgument)."""
        leases = as_items(leases, "leases")
        for lease in leases:
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
        return self._check_duration(duration)

    def _check_duration(self, duration: object, what: str = "lease duration") -> float:
        caps = self.capabilities
        if not _number(duration) or not math.isfinite(duration):  # type: ignore[arg-type]
            raise errors.InvalidLeaseDuration(
                f"{what} must be a finite number of seconds, got {duration!r}"
            )
        value = float(duration)  # type: ignore[arg-type]
        if caps.fixed_lease is not None and value != caps.fixed_lease:
            raise errors.InvalidLeaseDuration(
                f"{self._driver.scheme} locks a message for exactly {caps.fixed_lease:g} s "
                f"(a property of the queue), got {value:g} s; hold it longer with "
                "leasekit.LeaseKeeper, which renews in steps"
            )
        if not caps.min_lease <= value <= caps.max_lease:
            raise errors.InvalidLeaseDuration(
                f"{self._driver.scheme} holds a lease for {caps.min_lease:g} to "
                f"{caps.max_lease:g} s, got {value:g} s"
            )
        resolution = caps.lease_resolution
        steps = math.ceil(value / resolution - 1e-9)
        return min(steps * resolution, caps.max_lease)

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

    def _past_total_cap(self, lease: Lease, seconds: float) -> errors.InvalidLeaseDuration | None:
        """The error for renewing ``lease`` by ``seconds`` past the backend's total cap (SQS)."""
        cap = self.capabilities.max_total_lease
        if cap is None:
            return None
        held = time.monotonic() - lease.received_at
        if held + seconds <= cap:
            return None
        return errors.InvalidLeaseDuration(
            f"{self._driver.scheme} keeps a message invisible for at most {cap:g} s "
            f"in total since it was received; this lease has had {held:.0f} s, "
            f"so {seconds:g} s more is refused"
        )

    def _check_timeout(self, timeout: object, what: str = "timeout") -> float | None:
        if timeout is None:
            return None
        if not _number(timeout) or not math.isfinite(timeout) or timeout <= 0:  # type: ignore[operator, arg-type]
            raise errors.InvalidArgument(f"{what} must be a number of seconds > 0, got {timeout!r}")
        return float(timeout)  # type: ignore[arg-type]

    def _check_wait(self, wait: object) -> float:
        if not _number(wait) or not math.isfinite(wait) or wait < 0:  # type: ignore[operator, arg-type]
            raise errors.InvalidArgument(f"wait must be a number of seconds >= 0, got {wait!r}")
        return float(wait)  # type: ignore[arg-type]

    def _abandon_delay(self, delay: object) -> float:
        if not _number(delay) or not math.isfinite(delay) or delay < 0:  # type: ignore[operator, arg-type]
            raise errors.InvalidArgument(f"delay must be a number of seconds >= 0, got {delay!r}")
        value = float(delay)  # type: ignore[arg-type]
        limit = self.capabilities.max_abandon_delay
        if value > 0 and limit <= 0:
            raise errors.UnsupportedOperation(
                f"{self._driver.scheme} cannot delay an abandoned message; abandon with delay=0"
            )
        if value > limit:
            raise errors.InvalidArgument(
                f"{self._driver.scheme} delays an abandoned message by at most {limit:g} s, "
                f"got {value:g} s"
            )
        if value > 0:
            value = math.ceil(value / self.capabilities.lease_resolution - 1e-9) * (
                self.capabilities.lease_resolution
            )
        return max(value, self.capabilities.min_abandon_delay)

    def _check_reason(self, reason: object) -> str:
        if not isinstance(reason, str) or not reason.strip():
            raise errors.InvalidArgument(
                f"a dead-letter reason must be a non-empty str, got {reason!r}"
            )
        return check_text(reason, "a dead-letter reason")[:MAX_REASON]

    def _outgoing(
        self,
        body: object,
        delay: object,
        ttl: object,
        properties: Mapping[str, str] | None,
    ) -> OutgoingMessage:
        caps = self.capabilities
        scheme = self._driver.scheme
        if isinstance(body, str):
            raise errors.InvalidArgument(
                "a message body must be bytes, got str; encode it first, e.g. body.encode()"
            )
        if not isinstance(body, bytes | bytearray | memoryview):
            raise errors.InvalidArgument(f"a message body must be bytes, got {type(body).__name__}")
        data = bytes(body)
        if len(data) > caps.max_message_size:
            raise errors.MessageTooLarge(
                f"{scheme} accepts bodies of at most {caps.max_message_size} bytes, got {len(data)}"
            )
        if not _number(delay) or not math.isfinite(delay) or delay < 0:  # type: ignore[operator, arg-type]
            raise errors.InvalidArgument(f"delay must be a number of seconds >= 0, got {delay!r}")
        delay_s = float(delay)  # type: ignore[arg-type]
        if delay_s > 0 and caps.max_send_delay <= 0:
            raise errors.UnsupportedOperation(f"{scheme} cannot delay a sent message")
        if delay_s > caps.max_send_delay:
            raise errors.InvalidArgument(
                f"{scheme} delays a message by at most {caps.max_send_delay:g} s, got {delay_s:g}"
            )
        ttl_s: float | None = None
        if ttl is not None:
            if not _number(ttl) or not math.isfinite(ttl) or ttl <= 0:  # type: ignore[operator, arg-type]
                raise errors.InvalidArgument(f"ttl must be a number of seconds > 0, got {ttl!r}")
            ttl_s = float(ttl)  # type: ignore[arg-type]
            if caps.max_ttl is None:
                raise errors.UnsupportedOperation(f"{scheme} cannot set a time-to-live per message")
            if ttl_s > caps.max_ttl:
                raise errors.InvalidArgument(
                    f"{scheme} keeps a message for at most {caps.max_ttl:g} s, got ttl={ttl_s:g}"
                )
        if ttl_s is not None and delay_s >= ttl_s:
            raise errors.InvalidArgument(
                f"delay ({delay_s:g} s) must be shorter than ttl ({ttl_s:g} s): the message "
                "would expire before it becomes visible"
            )
        props: dict[str, str] = {}
        if properties is not None and not isinstance(properties, Mapping):
            raise errors.InvalidArgument("properties must be a mapping of str to str")
        if properties:
            if not caps.supports_properties:
                raise errors.UnsupportedOperation(f"{scheme} cannot carry message properties")
            for key, value in properties.items():
                if not isinstance(key, str) or not isinstance(value, str) or not key:
                    raise errors.InvalidArgument(
                        f"properties must map non-empty str to str, got {key!r}: {value!r}"
                    )
                props[check_text(key, "a property name")] = check_text(value, "a property value")
        message = OutgoingMessage(body=data, delay=delay_s, ttl=ttl_s, properties=props)
        try:
            self._driver.validate(message)  # what only the driver can tell; no call made
        except Exception as exc:
            raise wrap_error(self._driver, exc, f"send on {self.name!r}") from exc
        return message

    # --------------------------------------------------------------- plumbing

    def _require_open(self) -> None:
        if self._closed:
            raise errors.LeaseStateError(f"queue {self.name!r} is closed; open it again")

    def _call(self, doing: str, fn: Callable[[], T]) -> T:
        """Call the driver with core's retries (within the deadline); wrap its error once."""
        try:
            return self._retry.call(fn, self._driver.is_retryable)
        except Exception as exc:
            error = wrap_error(self._driver, exc, f"{doing} on {self.name!r}")
            if error is exc:
                raise
            raise error from exc

    def _leases_from(
        self, batch: Sequence[RawMessage], seconds: float, started: float
    ) -> list[Lease]:
        """Leases for a received batch; ``started`` is when the receive call began."""
        leases = []
        set_after = self.capabilities.lease_set_after_receive
        now = time.time()
        for raw in batch:
            message = Message(
                id=raw.id,
                body=raw.body,
                delivery_count=raw.delivery_count,
                enqueued_at=raw.enqueued_at,
                properties=dict(raw.properties),
            )
            physical = seconds
            if set_after:  # the receive used the queue's visibility, not ours
                physical = min(seconds, max(0.0, raw.visible_until.timestamp() - now))
            leases.append(
                Lease(
                    self,
                    message,
                    raw.receipt,
                    raw.visible_until,
                    seconds,
                    raw,
                    deadline=started + physical,
                )
            )
        if set_after:
            leases = self._apply_duration(leases, seconds)
        return leases

    def _apply_duration(self, leases: list[Lease], seconds: float) -> list[Lease]:
        """Set the lease duration right after receive where the receive could not (MNS)."""
        now = time.time()
        resolution = self.capabilities.lease_resolution
        change = [
            lease
            for lease in leases
            if abs(lease.expires_at.timestamp() - now - seconds) > resolution
        ]
        if not change:
            return leases
        results = self._renew(change, [seconds] * len(change), event=False, raise_whole=False)
        dropped: set[int] = set()
        for lease, result in zip(change, results, strict=True):
            if isinstance(result, errors.LeaseLost):
                dropped.add(id(lease))
            elif isinstance(result, errors.BackendUnavailable | errors.BackendError):
                # The message is already leased: hand it out with the visibility the
                # receive gave it rather than drop it (it would stay invisible unused).
                # Renewals still ask for ``seconds``.
                self._log.warning(
                    "could not set the lease of message %r to %.0f s (%s); it keeps the "
                    "%.0f s the receive gave it",
                    lease.message.id,
                    seconds,
                    result,
                    lease.expires_at.timestamp() - now,
                )
        return [lease for lease in leases if id(lease) not in dropped]

    def _dead_letter_queue(self) -> str | None:
        """The dead-letter queue the service names (asked once), or ``None``."""
        if self._named_dead_letter_queue is _UNKNOWN:
            name = self._call("find the dead-letter queue", self._driver.dead_letter_queue)
            self._named_dead_letter_queue = name
        named = self._named_dead_letter_queue
        return named if isinstance(named, str) else None

    def _sibling(self, name: str) -> Driver:
        return self._call("open the dead-letter queue", lambda: self._driver.sibling(name))

    def _dead_letter_driver(self) -> Driver:
        """The queue core copies dead letters to (``<queue>-poison``: made on first use)."""
        with self._poison_lock:
            if self._poison is not None:
                return self._poison
            named = self._dead_letter_queue()
            target = self._sibling(named or self.name + dead_letters.POISON_SUFFIX)
            if named is None:
                try:
                    self._call("create the poison queue", target.create_queue)
                except BaseException:
                    target.close()
                    raise
            self._poison = target
            return target


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


def _with_total(counts: QueueStats) -> QueueStats:
    """``counts`` with ``total`` added up where the driver told visible, leased and delayed."""
    if counts.total is not None:
        return counts
    parts = (counts.visible, counts.leased, counts.delayed)
    if any(part is None for part in parts):
        return counts
    return dataclasses.replace(counts, total=sum(part or 0 for part in parts))
