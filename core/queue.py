"""The portable queue: validation, receipt tracking, retries and the long-poll loop, once."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from . import errors
from .capabilities import Capabilities
from .error_mapping import wrap_error
from .lease import Lease
from .message import LeaseState, Message
from .options import as_items, check_text, is_number
from .retry import RetryPolicy
from .spi import DeadLetter, Driver, OutgoingMessage, QueueStats, RawMessage, Visibility

__all__ = ["MAX_LEASE_BATCH", "POISON_SUFFIX", "Queue"]

T = TypeVar("T")

#: Most messages one ``Queue.lease`` call may ask for; core splits it into
#: receives of ``capabilities.max_receive_batch``. Bounded so a typo cannot
#: lease a whole queue into one process.
MAX_LEASE_BATCH = 1000
#: Where core dead-letters on backends without a native dead-letter store
#: (Azure Functions' convention).
POISON_SUFFIX = "-poison"
#: Polling between empty receives on backends that cannot long-poll: start
#: small for latency, back off to keep an idle SQLite file cheap.
POLL_START = 0.005
POLL_MAX = 0.1
#: Longest reason kept on a dead-lettered message (Service Bus allows 4096).
MAX_REASON = 4096
#: Largest ``peek_dead_letters`` limit passed to a driver (fits every backend's integer).
MAX_PEEK = 2**31 - 1

_log = logging.getLogger("leasekit")


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
    ) -> None:
        if not isinstance(driver, Driver):
            raise errors.InvalidArgument(f"driver must be a leasekit Driver, got {driver!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise errors.InvalidArgument(
                f"retry must be a leasekit.RetryPolicy or None, got {type(retry).__name__}"
            )
        self._driver = driver
        self._retry = retry or RetryPolicy()
        self._hooks = hooks
        self._closed = False
        self._poison: Driver | None = None
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
        return self._call("send", lambda: self._driver.send(outgoing))

    def send_many(
        self,
        bodies: Iterable[bytes],
        *,
        delay: float = 0,
        ttl: float | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Send several messages (in batches where the backend has a batch form); return ids.

        Every body is validated before anything is sent. If a batch fails part
        way, the first error is raised; the messages before it were sent.
        """
        outgoing = [
            self._outgoing(body, delay, ttl, properties) for body in as_items(bodies, "bodies")
        ]
        self._require_open()
        ids: list[str] = []
        size = self.capabilities.max_send_batch
        for start in range(0, len(outgoing), size):
            chunk = outgoing[start : start + size]
            if len(chunk) == 1:
                ids.append(self._call("send", partial(self._driver.send, chunk[0])))
                continue
            results = self._call("send", partial(self._driver.send_batch, chunk))
            for result in results:
                if isinstance(result, BaseException):
                    raise wrap_error(self._driver, result, "send") from result
                ids.append(result)
        return ids

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
        seconds = self._physical_duration(duration, None)
        wait = self._check_wait(wait)
        self._require_open()
        caps = self.capabilities
        deadline = time.monotonic() + wait
        leases: list[Lease] = []
        poll = POLL_START
        while True:
            want = min(max_messages - len(leases), caps.max_receive_batch)
            remaining = max(0.0, deadline - time.monotonic())
            call_wait = 0.0 if leases else min(remaining, caps.max_wait)
            batch = self._call("receive", partial(self._driver.receive, want, seconds, call_wait))
            leases.extend(self._leases_from(batch, seconds))
            if len(leases) >= max_messages:
                break
            if batch and len(batch) >= want:
                continue
            if leases or time.monotonic() >= deadline:
                break
            if caps.max_wait <= 0 or call_wait <= 0:
                time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
                poll = min(poll * 2, POLL_MAX)
        for lease in leases:
            self._emit("leasekit_lease_acquired", lease=lease)
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
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            step = 20.0 if deadline is None else max(0.0, deadline - time.monotonic())
            leases = self.lease(1, duration=duration, wait=step)
            if leases:
                return leases[0]
            if deadline is not None and time.monotonic() >= deadline:
                raise errors.QueueEmpty(f"no message on {self.name!r} within {wait} s")

    # ----------------------------------------------------------------- admin

    def stats(self) -> QueueStats:
        """Counts of visible, leased, delayed and dead-lettered messages where the backend can tell.

        Raises:
            UnsupportedOperation: the backend cannot count (``capabilities.queue_stats``).
        """
        self._require_open()
        if not self.capabilities.queue_stats:
            raise errors.UnsupportedOperation(f"{self._driver.scheme} cannot report queue stats")
        return self._call("stats", self._driver.stats)

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
        if self.capabilities.native_dead_letter:
            return self._call("read dead letters", lambda: self._driver.dead_letters(limit))
        poison = self._poison_driver()
        return self._call("read dead letters", lambda: poison.dead_letters(limit))

    def create(self) -> None:
        """Create the queue if it does not exist."""
        self._require_open()
        self._call("create queue", self._driver.create_queue)

    def delete(self) -> None:
        """Delete the queue and every message in it (and its poison queue, if core made one)."""
        self._require_open()
        self._call("delete queue", self._driver.delete_queue)
        if not self.capabilities.native_dead_letter:
            try:
                poison = self._poison_driver(create=False)
            except errors.UnsupportedOperation:
                return
            try:
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

    # ------------------------------------------------- calls leases make here

    def _change_visibility(self, lease: Lease, seconds: float) -> Visibility:
        self._require_open()
        try:
            return self._call(
                "renew", lambda: self._driver.change_visibility(lease.receipt, seconds)
            )
        except errors.LeaseLost as exc:
            lease._mark_lost(exc)
            raise

    def _delete(self, lease: Lease) -> None:
        self._require_open()
        try:
            self._call("complete", lambda: self._driver.delete(lease.receipt))
        except errors.LeaseLost as exc:
            lease._mark_lost(exc)
            raise

    def _abandon(self, lease: Lease, delay: float) -> None:
        self._require_open()
        try:
            self._call("abandon", lambda: self._driver.abandon(lease.receipt, delay))
        except errors.LeaseLost as exc:
            lease._mark_lost(exc)
            raise

    def _dead_letter(self, lease: Lease, reason: str) -> None:
        self._require_open()
        try:
            if self.capabilities.native_dead_letter:
                raw = lease._raw_message
                self._call(
                    "dead-letter", lambda: self._driver.dead_letter(lease.receipt, reason, raw)
                )
                return
            # No native store: copy to <queue>-poison first, then delete, so a
            # failure in between leaves a duplicate, never a lost message.
            poison = self._poison_driver()
            message = lease.message
            properties = dict(message.properties) if self.capabilities.supports_properties else {}
            copy = OutgoingMessage(
                body=message.body,
                properties={
                    **properties,
                    "leasekit-dead-letter-reason": reason,
                    "leasekit-original-id": message.id,
                    "leasekit-delivery-count": str(message.delivery_count),
                },
            )
            try:
                self._call("dead-letter (send to poison queue)", lambda: poison.send(copy))
            except errors.MessageTooLarge:
                # A body near the maximum has no room for the reason properties: keep
                # the message (its own properties only) rather than let it loop forever.
                self._log.warning(
                    "dead-lettering %r without its reason properties (no room): %s",
                    message.id,
                    reason,
                )
                bare = OutgoingMessage(body=message.body, properties=properties)
                self._call("dead-letter (send to poison queue)", lambda: poison.send(bare))
            self._call("dead-letter (delete original)", lambda: self._driver.delete(lease.receipt))
        except errors.LeaseLost as exc:
            lease._mark_lost(exc)
            raise

    def complete_many(
        self, leases: Sequence[Lease]
    ) -> list[errors.LeaseError | errors.LeaseStateError | None]:
        """Complete several leases in as few backend calls as the backend allows.

        Parameters:
            leases: leases of this queue.

        Returns:
            One result per lease, in order: ``None`` when completed; a
            :class:`LeaseLost` (the lease is marked lost) or another leasekit
            error from the backend; a :class:`LeaseStateError` for a lease that
            was already settled. Nothing is raised for one bad lease.

        Raises:
            InvalidArgument: a lease of another queue (nothing is completed).
        """
        leases = as_items(leases, "leases")
        for lease in leases:
            if not isinstance(lease, Lease):
                raise errors.InvalidArgument(f"complete_many takes leases, got {lease!r}")
            if lease.queue is not self:
                raise errors.InvalidArgument(
                    f"lease of message {lease.message.id!r} belongs to queue "
                    f"{lease.queue.name!r}, not {self.name!r}"
                )
        return self._settle_many(leases)

    def _settle_many(
        self, leases: Sequence[Lease]
    ) -> list[errors.LeaseError | errors.LeaseStateError | None]:
        """Complete held leases in backend-sized batches; one result each (see complete_many)."""
        self._require_open()
        results: list[errors.LeaseError | errors.LeaseStateError | None] = [None] * len(leases)
        size = self.capabilities.max_delete_batch
        for start in range(0, len(leases), size):
            chunk = list(leases[start : start + size])
            # A stable lock order, so two callers settling overlapping lists cannot deadlock.
            for lease in sorted(set(chunk), key=id):
                lease._lock.acquire()
            try:
                live = [(i, lz) for i, lz in enumerate(chunk) if lz._state is LeaseState.HELD]
                for i, lz in enumerate(chunk):
                    if lz._state is LeaseState.LOST:
                        results[start + i] = errors.LeaseLost(
                            f"message {lz.message.id!r}: the lease was lost earlier"
                        )
                    elif lz._state is not LeaseState.HELD:
                        results[start + i] = errors.LeaseStateError(
                            f"message {lz.message.id!r}: the lease is already {lz._state.value}"
                        )
                if not live:
                    continue
                receipts = [lz.receipt for _, lz in live]
                if len(receipts) == 1:
                    outcome: list[BaseException | None] = []
                    try:
                        self._call("complete", partial(self._driver.delete, receipts[0]))
                        outcome.append(None)
                    except errors.LeaseError as exc:
                        outcome.append(exc)
                else:
                    outcome = list(
                        self._call("complete", partial(self._driver.delete_batch, receipts))
                    )
                for (i, lz), result in zip(live, outcome, strict=True):
                    if result is None:
                        lz._state = LeaseState.COMPLETED
                        continue
                    error = wrap_error(self._driver, result, f"complete on {self.name!r}")
                    if error is not result:
                        error.__cause__ = result
                    if isinstance(error, errors.LeaseLost):
                        lz._mark_lost(error)
                    results[start + i] = error
            finally:
                for lease in set(chunk):
                    lease._lock.release()
            for i, lz in enumerate(chunk):
                if results[start + i] is None:
                    self._emit("leasekit_lease_completed", lease=lz)
        return results

    def _renew_many(
        self, leases: Sequence[Lease], seconds: float
    ) -> list[errors.LeaseError | bool | None]:
        """Renew several held leases for ``seconds``, batched where the backend can.

        One result per lease: ``None`` renewed; ``False`` skipped because the
        lease was busy (being settled by its holder) or no longer held; or the
        leasekit error for that lease (a :class:`LeaseLost` has marked it lost).
        Used by the keeper; ``seconds`` must already be validated.
        """
        self._require_open()
        results: list[errors.LeaseError | bool | None] = [False] * len(leases)
        size = self.capabilities.max_renew_batch
        for start in range(0, len(leases), size):
            chunk = list(enumerate(leases[start : start + size], start))
            locked = [(i, lz) for i, lz in chunk if lz._lock.acquire(blocking=False)]
            try:
                live = [(i, lz) for i, lz in locked if lz._state is LeaseState.HELD]
                if not live:
                    continue
                outcome: list[Visibility | BaseException]
                try:
                    if len(live) == 1:
                        receipt = live[0][1].receipt
                        outcome = [
                            self._call(
                                "renew", partial(self._driver.change_visibility, receipt, seconds)
                            )
                        ]
                    else:
                        receipts = [lz.receipt for _, lz in live]
                        outcome = list(
                            self._call(
                                "renew",
                                partial(self._driver.change_visibility_batch, receipts, seconds),
                            )
                        )
                except errors.LeaseError as exc:
                    outcome = [exc] * len(live)
                for (i, lz), result in zip(live, outcome, strict=True):
                    if isinstance(result, Visibility):
                        lz._receipt = result.receipt
                        lz._expires_at = result.visible_until
                        lz._duration = seconds
                        results[i] = None
                        continue
                    error = wrap_error(self._driver, result, f"renew on {self.name!r}")
                    if error is not result:
                        error.__cause__ = result
                    if isinstance(error, errors.LeaseLost):
                        lz._mark_lost(error)
                    results[i] = error
            finally:
                for _, lz in locked:
                    lz._lock.release()
            if self._has_observers("leasekit_lease_renewed"):
                for i, lz in chunk:
                    if results[i] is None:
                        self._emit("leasekit_lease_renewed", lease=lz)
        return results

    # ------------------------------------------------------------- validation

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

    def _physical_duration(self, duration: float | None, lease: Lease | None) -> float:
        if duration is None:
            seconds = lease.duration if lease is not None else self._default_duration
        else:
            seconds = self._check_duration(duration)
        cap = self.capabilities.max_total_lease
        if lease is not None and cap is not None:
            held = time.monotonic() - lease.received_at
            if held + seconds > cap:
                raise errors.InvalidLeaseDuration(
                    f"{self._driver.scheme} keeps a message invisible for at most {cap:g} s "
                    f"in total since it was received; this lease has had {held:.0f} s, "
                    f"so {seconds:g} s more is refused"
                )
        return seconds

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
        return OutgoingMessage(body=data, delay=delay_s, ttl=ttl_s, properties=props)

    # --------------------------------------------------------------- plumbing

    def _require_open(self) -> None:
        if self._closed:
            raise errors.LeaseStateError(f"queue {self.name!r} is closed; open it again")

    def _call(self, doing: str, fn: Callable[[], T]) -> T:
        try:
            return self._retry.call(fn, self._driver.is_retryable)
        except Exception as exc:
            error = wrap_error(self._driver, exc, f"{doing} on {self.name!r}")
            if error is exc:
                raise
            raise error from exc

    def _leases_from(self, batch: Sequence[RawMessage], seconds: float) -> list[Lease]:
        leases = []
        for raw in batch:
            message = Message(
                id=raw.id,
                body=raw.body,
                delivery_count=raw.delivery_count,
                enqueued_at=raw.enqueued_at,
                properties=dict(raw.properties),
            )
            leases.append(Lease(self, message, raw.receipt, raw.visible_until, seconds, raw))
        if self.capabilities.lease_set_after_receive:
            leases = self._apply_duration(leases, seconds)
        return leases

    def _apply_duration(self, leases: list[Lease], seconds: float) -> list[Lease]:
        """Set the lease duration right after receive where the receive could not (MNS)."""
        kept = []
        for lease in leases:
            remaining = lease.expires_at.timestamp() - time.time()
            if abs(remaining - seconds) <= self.capabilities.lease_resolution:
                kept.append(lease)
                continue
            try:
                visibility = self._change_visibility(lease, seconds)
            except errors.LeaseLost:
                continue
            except (errors.BackendUnavailable, errors.BackendError) as exc:
                # The message is already leased: hand it out with the visibility the
                # receive gave it rather than drop it (it would stay invisible unused).
                # Renewals still ask for ``seconds``.
                self._log.warning(
                    "could not set the lease of message %r to %.0f s (%s); it keeps the "
                    "%.0f s the receive gave it",
                    lease.message.id,
                    seconds,
                    exc,
                    remaining,
                )
                kept.append(lease)
                continue
            lease._receipt = visibility.receipt
            lease._expires_at = visibility.visible_until
            kept.append(lease)
        return kept

    def _poison_driver(self, create: bool = True) -> Driver:
        with self._poison_lock:
            if self._poison is not None:
                return self._poison
            sibling = self._call(
                "open poison queue", lambda: self._driver.sibling(self.name + POISON_SUFFIX)
            )
            if not create:
                return sibling
            self._call("create poison queue", sibling.create_queue)
            self._poison = sibling
            return sibling

    def _has_observers(self, hook: str) -> bool:
        """Whether any plugin implements ``hook`` (skip building events nobody reads)."""
        caller = getattr(self._hooks, hook, None) if self._hooks is not None else None
        return bool(caller is not None and caller.get_hookimpls())

    def _emit(self, hook: str, **kwargs: Any) -> None:
        """Call an event hook's observers; one observer's error is logged, never raised.

        ``after_`` hooks run in reverse of the ``before_`` order, so the first
        observer to see a message go in is the last to see it come out.
        """
        if self._hooks is None:
            return
        caller = getattr(self._hooks, hook, None)
        if caller is None:
            return
        impls = caller.get_hookimpls()
        if not impls:
            return
        # Observers run in registration order; "after" hooks in reverse (like middleware).
        ordered = reversed(impls) if "_after_" in hook else impls
        for impl in ordered:
            try:
                impl.function(**{name: kwargs[name] for name in impl.argnames if name in kwargs})
            except Exception:
                self._log.exception("leasekit plugin %r failed in %s", impl.plugin_name, hook)
