"""Queue state and Service Bus semantics, independent of AMQP.

Everything here is plain data driven by explicit ``now`` timestamps (seconds,
``time.time()`` scale), so the rules are deterministic and testable without a
network. The AMQP layer calls these methods on the proton container thread only.

Emulated (as documented for Azure Service Bus queues):
    * sequence numbers (per queue, from 1), enqueued time, scheduled enqueue time (a
      scheduled message gets a new sequence number when it becomes due);
    * PeekLock: a lock token per receive, ``locked_until`` = now + LockDuration,
      renew extends from now by LockDuration and keeps the token;
    * complete removes; abandon and lock expiry make the message available again
      (redelivered in sequence order) and count a failed delivery; release (an AMQP
      ``released`` outcome) makes it available without counting;
    * after MaxDeliveryCount failed deliveries the message moves to the dead-letter
      sub-queue with ``DeadLetterReason=MaxDeliveryCountExceeded``;
    * explicit dead-letter with reason and description; defer (then receivable only by
      sequence number); ReceiveAndDelete;
    * time-to-live: min(message TTL, queue DefaultMessageTimeToLive); an expired
      message is dropped or, with DeadLetteringOnMessageExpiration, dead-lettered
      with ``TTLExpiredException``; a locked message does not expire until its lock
      ends; a deferred one only when it is received by sequence number;
      dead-lettered messages never expire;
    * any use of a lost or expired lock raises :class:`LockLost`;
    * a lock taken by a receive link belongs to that link's connection: once the
      connection is gone (:meth:`Broker.drop_connection_locks`), the lock can no
      longer settle the message by token (``update-disposition``), as Service Bus
      "does not support recovery of existing AMQP links on a different
      connection"; it can still be renewed (the service keeps renewing such locks)
      and ends at its expiry, which counts a failed delivery.

``delivery_count`` here is the number of failed deliveries so far (abandons and lock
expiries), which is what Service Bus puts in the AMQP header on the wire; SDKs that
show a 1-based count add one on receive.

    * sessions of a ``RequiresSession`` queue (:mod:`.sessions`): accepting a named
      or the next available session, its lock (the lock of its messages), renewal,
      expiry (the session is released, its locked messages come back with a failed
      delivery counted), and session state.

Not emulated: topics/subscriptions, duplicate detection, auto-forwarding,
partitioning, entity size quotas (the message and property quotas are the AMQP
layer's), transactions.
"""

from __future__ import annotations

import datetime
import heapq
import itertools
import logging
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .config import EmulatorConfig, QueueProperties
from .sessions import Session, SessionCannotBeLocked, SessionLockLost

__all__ = [
    "DEAD_LETTER_SUFFIX",
    "Broker",
    "EntityNotFound",
    "LockLost",
    "MessageNotFound",
    "MessageState",
    "Queue",
    "Session",
    "SessionCannotBeLocked",
    "SessionLockLost",
    "StoredMessage",
    "SubQueue",
]

_log = logging.getLogger("leasekit.emulators.servicebus")

DEAD_LETTER_SUFFIX = "$deadletterqueue"
MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
TTL_EXPIRED_REASON = "TTLExpiredException"
#: Longest entity path (QueueProperties.Name: "Max length is 260 chars").
MAX_ENTITY_NAME = 260
#: One path segment: letters, digits, periods, hyphens and underscores, starting and
#: ending with a letter or digit (the service's 400: "Entity segments can contain only
#: letters, numbers, periods (.), hyphens (-), and underscores (_)").
_SEGMENT = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def entity_name_error(name: str) -> str | None:
    """Why ``name`` is not a valid queue name, or ``None`` if it is.

    A name is ``/``-separated segments (a queue may be ``app/orders/v1``), at most
    260 characters, each segment following :data:`_SEGMENT`.
    """
    if not name or len(name) > MAX_ENTITY_NAME:
        return f"The entity name {name!r} must be 1 to {MAX_ENTITY_NAME} characters long."
    if not all(_SEGMENT.fullmatch(segment) for segment in name.split("/")):
        return (
            f"The entity name {name!r} is not valid. Entity segments can contain only "
            "letters, numbers, periods (.), hyphens (-), and underscores (_), and must "
            "start and end with a letter or number."
        )
    return None


class EntityNotFound(LookupError):
    """The queue does not exist (and may not be created on first use)."""


class LockLost(Exception):
    """The lock token is unknown, expired, or its message was settled."""


class MessageNotFound(LookupError):
    """No deferred message has the requested sequence number."""


class MessageState(Enum):
    """Where a stored message is in its life."""

    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


@dataclass(eq=False)
class StoredMessage:
    """One message held by a sub-queue.

    Parameters:
        sequence_number: unique within the queue, increasing with enqueue order.
        payload: the message as the protocol layer stored it (opaque here).
        enqueued_at: when it was (or, if scheduled, will be) enqueued.
        expires_at: when its time-to-live ends; ``None`` for never.
        visible_at: scheduled enqueue time; it cannot be received before.
        message_id: the application's message id, if any (for logging).
        size: the message's size in bytes (for the entity's SizeInBytes).
    """

    sequence_number: int
    payload: Any
    enqueued_at: float
    expires_at: float | None = None
    visible_at: float = 0.0
    message_id: str | None = None
    size: int = 0
    delivery_count: int = 0
    state: MessageState = MessageState.ACTIVE
    lock_token: uuid.UUID | None = None
    locked_until: float | None = None
    #: The connection whose receive link holds the lock (``None``: not tied to one,
    #: e.g. a deferred message received by sequence number).
    lock_owner: int | None = None
    #: The owning connection is gone: the lock cannot settle the message any more.
    lock_dropped: bool = False
    dead_letter_properties: dict[str, str] = field(default_factory=dict)
    #: The time-to-live applied (seconds), min(message's, queue's); kept when the
    #: message is dead-lettered (where it no longer expires).
    time_to_live: float | None = None
    #: The ``SessionId`` (AMQP ``group-id``) it was sent with, if any.
    session_id: str | None = None


class SubQueue:
    """The active messages of a queue, or its dead-letter sub-queue.

    Parameters:
        queue: the owning queue (its properties and sequence counter).
        dead_letter: ``True`` for ``<queue>/$deadletterqueue``.
    """

    def __init__(self, queue: Queue, *, dead_letter: bool) -> None:
        self.queue = queue
        self.is_dead_letter = dead_letter
        self._messages: dict[int, StoredMessage] = {}
        self._ready: list[int] = []  # heap of sequence numbers that may be available
        self._locks: dict[uuid.UUID, StoredMessage] = {}
        self._lock_heap: list[tuple[float, int, uuid.UUID]] = []
        self._time_heap: list[tuple[float, int]] = []  # (scheduled or expiry time, seq)
        self._sessions: dict[str, Session] = {}
        self._session_heap: list[tuple[float, int, str]] = []  # (lock end, tiebreak, id)
        #: Sessions whose lock expired, as (holder, session id), for the protocol
        #: layer to detach their links; it empties the list.
        self.lost_sessions: list[tuple[Any, str]] = []

    @property
    def sessionful(self) -> bool:
        """Whether this sub-queue keeps sessions (a RequiresSession queue's active messages)."""
        return self.queue.properties.requires_session and not self.is_dead_letter

    @property
    def path(self) -> str:
        """The entity path, e.g. ``orders`` or ``orders/$deadletterqueue``."""
        return f"{self.queue.name}/{DEAD_LETTER_SUFFIX}" if self.is_dead_letter else self.queue.name

    def __len__(self) -> int:
        return len(self._messages)

    def messages(self) -> list[StoredMessage]:
        """Every message held here (available, locked, deferred, scheduled), by number."""
        return [self._messages[seq] for seq in sorted(self._messages)]

    # -- adding ---------------------------------------------------------------------------

    def enqueue(
        self,
        payload: Any,
        now: float,
        *,
        ttl: float | None = None,
        scheduled_at: float | None = None,
        message_id: str | None = None,
        size: int = 0,
        session_id: str | None = None,
    ) -> StoredMessage:
        """Store a new message and return it.

        Parameters:
            payload: the message, opaque to the broker.
            now: current time.
            ttl: the message's own time-to-live in seconds, if it set one.
            scheduled_at: scheduled enqueue time, if later than now.
            message_id: the application's message id.
            size: its size in bytes.
            session_id: its ``SessionId``, if it has one.

        Returns:
            The stored message with its sequence number.
        """
        visible_at = scheduled_at if scheduled_at is not None and scheduled_at > now else now
        message = StoredMessage(
            sequence_number=self.queue.next_sequence_number(),
            payload=payload,
            enqueued_at=visible_at,
            visible_at=visible_at,
            message_id=message_id,
            size=size,
            session_id=session_id,
        )
        if not self.is_dead_letter:
            default_ttl = self.queue.properties.default_ttl
            effective = [t for t in (ttl, default_ttl) if t is not None and t > 0]
            if effective:
                message.time_to_live = min(effective)
                message.expires_at = visible_at + message.time_to_live
        if visible_at > now:
            message.state = MessageState.SCHEDULED
            heapq.heappush(self._time_heap, (visible_at, message.sequence_number))
        else:
            self._make_ready(message)
        self._messages[message.sequence_number] = message
        return message

    def _adopt(self, message: StoredMessage) -> None:
        """Take a message dead-lettered from the active sub-queue (keeps its number)."""
        message.state = MessageState.ACTIVE
        message.lock_token = None
        message.locked_until = None
        message.expires_at = None
        self._messages[message.sequence_number] = message
        self._make_ready(message)

    def _make_ready(self, message: StoredMessage) -> None:
        if message.session_id is not None and self.sessionful:
            self.session(message.session_id).push(message.sequence_number)
        else:
            heapq.heappush(self._ready, message.sequence_number)
        if message.expires_at is not None:
            heapq.heappush(self._time_heap, (message.expires_at, message.sequence_number))

    # -- time -----------------------------------------------------------------------------

    def expire(self, now: float) -> bool:
        """Apply lock expiry, scheduled enqueue and time-to-live up to ``now``.

        Parameters:
            now: current time.

        Returns:
            ``True`` if a message became available here or in the dead-letter queue.
        """
        changed = False
        while self._session_heap and self._session_heap[0][0] <= now:
            _, _, session_id = heapq.heappop(self._session_heap)
            session = self._sessions.get(session_id)
            if session is None or session.holder is None or session.locked_until is None:
                continue  # released
            if session.locked_until > now:
                continue  # renewed (a newer heap entry exists)
            holder = session.holder
            self._release(session, now, failed=True)
            self.lost_sessions.append((holder, session_id))
            changed = True
        while self._lock_heap and self._lock_heap[0][0] <= now:
            _, _, token = heapq.heappop(self._lock_heap)
            message = self._locks.get(token)
            if message is None or message.locked_until is None or message.locked_until > now:
                continue  # settled, or renewed (a newer heap entry exists)
            self._unlock(message)
            self._count_failed_delivery(message, now)
            changed = True
        while self._time_heap and self._time_heap[0][0] <= now:
            _, seq = heapq.heappop(self._time_heap)
            message = self._messages.get(seq)
            if message is None:
                continue
            if message.state is MessageState.SCHEDULED and message.visible_at <= now:
                self._activate(message)
                changed = True
            if (
                message.expires_at is not None
                and message.expires_at <= now
                and message.lock_token is None
                # "Deferred messages aren't expired and automatically moved to a
                # dead-letter queue until a client app attempts to receive them"
                # (Microsoft Learn, Message deferral): see receive_deferred.
                and message.state is not MessageState.DEFERRED
            ):
                self._expire_message(message)
                changed = True
        return changed

    def _activate(self, message: StoredMessage) -> None:
        """A scheduled message became due: enqueue it now, with a new sequence number.

        "The SequenceNumber for a scheduled message is only valid while the message
        is in this state. As the message transitions to the active state, the
        message is appended to the queue as if had been enqueued at the current
        instant, which includes assigning a new SequenceNumber" (Microsoft Learn,
        Message sequencing and timestamps).
        """
        del self._messages[message.sequence_number]
        message.sequence_number = self.queue.next_sequence_number()
        message.state = MessageState.ACTIVE
        self._messages[message.sequence_number] = message
        self._make_ready(message)

    def _expire_message(self, message: StoredMessage) -> None:
        self._messages.pop(message.sequence_number, None)
        if self.queue.properties.dead_lettering_on_message_expiration:
            self._dead_letter(
                message, TTL_EXPIRED_REASON, "The message expired and was dead lettered."
            )

    def _count_failed_delivery(self, message: StoredMessage, now: float) -> None:
        message.delivery_count += 1
        limit = self.queue.properties.max_delivery_count
        if not self.is_dead_letter and message.delivery_count >= limit:
            self._messages.pop(message.sequence_number, None)
            self._dead_letter(
                message,
                MAX_DELIVERY_REASON,
                f"Message could not be consumed after {limit} delivery attempts.",
            )
        elif message.expires_at is not None and message.expires_at <= now:
            self._expire_message(message)
        else:
            self._make_ready(message)

    def _dead_letter(self, message: StoredMessage, reason: str, description: str) -> None:
        message.dead_letter_properties = {
            "DeadLetterReason": reason,
            "DeadLetterErrorDescription": description,
        }
        self.queue.dead_letter._adopt(message)

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`expire` has something to do, if any."""
        heaps = (self._lock_heap, self._time_heap, self._session_heap)
        times = [heap[0][0] for heap in heaps if heap]
        return min(times) if times else None

    # -- receiving ------------------------------------------------------------------------

    def receive(
        self,
        now: float,
        *,
        lock: bool,
        owner: int | None = None,
        session: Session | None = None,
    ) -> StoredMessage | None:
        """Take the available message with the lowest sequence number.

        Parameters:
            now: current time.
            lock: PeekLock (``True``) locks it; ReceiveAndDelete removes it.
            owner: the connection whose receive link takes it (see
                :meth:`drop_connection_locks`).
            session: on a sessionful queue, the session the receiver holds: only
                its messages, locked under its lock.

        Returns:
            The message, or ``None`` when none is available.
        """
        self.expire(now)
        ready = self._ready if session is None else session.ready
        if session is not None and not session.is_held(now):
            return None
        while ready:
            seq = heapq.heappop(ready)
            message = self._messages.get(seq)
            if (
                message is None
                or message.state is not MessageState.ACTIVE
                or message.lock_token is not None
            ):
                continue
            if message.expires_at is not None and message.expires_at <= now:
                self._expire_message(message)
                continue
            if lock:
                self._lock(message, now, owner, session)
            else:
                del self._messages[seq]
            return message
        return None

    def has_available(self, now: float, session: Session | None = None) -> bool:
        """Whether :meth:`receive` would return a message now (from ``session``, if given)."""
        self.expire(now)
        if session is not None and not session.is_held(now):
            return False
        return self._head(self._ready if session is None else session.ready) is not None

    def _head(self, ready: list[int]) -> int | None:
        """The first available sequence number of ``ready`` (dropping stale entries)."""
        while ready:
            message = self._messages.get(ready[0])
            if (
                message is not None
                and message.state is MessageState.ACTIVE
                and message.lock_token is None
            ):
                return ready[0]
            heapq.heappop(ready)
        return None

    def _lock(
        self,
        message: StoredMessage,
        now: float,
        owner: int | None = None,
        session: Session | None = None,
    ) -> None:
        token = uuid.uuid4()
        message.lock_token = token
        message.lock_owner = owner
        message.lock_dropped = False
        self._locks[token] = message
        if session is not None:
            # A session's messages are locked by the session lock (no lock of their own).
            message.locked_until = session.locked_until
            session.locked.add(message.sequence_number)
            return
        message.locked_until = now + self.queue.properties.lock_duration
        heapq.heappush(self._lock_heap, (message.locked_until, next(_tiebreak), token))

    def _unlock(self, message: StoredMessage) -> None:
        if message.lock_token is not None:
            self._locks.pop(message.lock_token, None)
        if message.session_id is not None and message.session_id in self._sessions:
            self._sessions[message.session_id].locked.discard(message.sequence_number)
        message.lock_token = None
        message.locked_until = None
        message.lock_owner = None
        message.lock_dropped = False

    def locked(
        self, token: uuid.UUID, now: float, *, settle: bool = False, session: str | None = None
    ) -> StoredMessage:
        """The message locked by ``token``.

        Parameters:
            token: the lock token.
            now: current time.
            settle: the lock is to settle the message by token; a lock whose
                receiving connection is gone cannot (see :meth:`drop_connection_locks`).
            session: the session the caller holds (its receive link's, or the one a
                management request names); its lock must still be held.

        Returns:
            The locked message.

        Raises:
            SessionLockLost: the session's lock is lost (expired, released).
            LockLost: the token is unknown, expired, or already settled; or, with
                ``settle``, its receiving connection is gone.
        """
        self.expire(now)
        if session is not None:
            held = self._sessions.get(session)
            if held is None or not held.is_held(now):
                raise SessionLockLost(f"the lock of session {session!r} is lost")
        message = self._locks.get(token)
        if message is not None and message.session_id is not None and self.sessionful:
            owner = self._sessions.get(message.session_id)
            if owner is None or not owner.is_held(now):
                raise SessionLockLost(f"the lock of session {message.session_id!r} is lost")
            if settle and message.lock_dropped:
                raise LockLost(f"{token}: the connection that received the message is gone")
            return message
        if message is None or message.locked_until is None or message.locked_until <= now:
            raise LockLost(str(token))
        if settle and message.lock_dropped:
            raise LockLost(f"{token}: the connection that received the message is gone")
        return message

    def drop_connection_locks(self, owner: int) -> int:
        """Mark the locks taken through connection ``owner`` as unable to settle.

        The locks stay (renewable) until they expire; only settling by token is refused.

        Returns:
            How many locks were marked.
        """
        count = 0
        for message in self._locks.values():
            if message.lock_owner == owner and not message.lock_dropped:
                message.lock_dropped = True
                count += 1
        return count

    # -- settling -------------------------------------------------------------------------

    def complete(
        self, token: uuid.UUID, now: float, *, session: str | None = None
    ) -> StoredMessage:
        """Remove the locked message for good.

        Raises:
            LockLost: see :meth:`locked`.
        """
        message = self.locked(token, now, settle=True, session=session)
        self._unlock(message)
        del self._messages[message.sequence_number]
        return message

    def abandon(
        self, token: uuid.UUID, now: float, *, failed: bool = True, session: str | None = None
    ) -> StoredMessage:
        """Unlock the message so it is available again.

        Parameters:
            token: the lock token.
            now: current time.
            failed: count a failed delivery (abandon); ``False`` for a release.

        Raises:
            LockLost: see :meth:`locked`.
        """
        message = self.locked(token, now, settle=True, session=session)
        self._unlock(message)
        if failed:
            self._count_failed_delivery(message, now)
        elif message.expires_at is not None and message.expires_at <= now:
            self._expire_message(message)
        else:
            self._make_ready(message)
        return message

    def dead_letter(
        self,
        token: uuid.UUID,
        now: float,
        reason: str | None,
        description: str | None,
        *,
        session: str | None = None,
    ) -> StoredMessage:
        """Move the locked message to the dead-letter sub-queue.

        A message in the dead-letter queue cannot be dead-lettered further: there
        the lock is released and the message stays.

        Raises:
            LockLost: see :meth:`locked`.
        """
        message = self.locked(token, now, settle=True, session=session)
        self._unlock(message)
        if self.is_dead_letter:
            self._make_ready(message)
        else:
            del self._messages[message.sequence_number]
            props: dict[str, str] = {}
            if reason is not None:
                props["DeadLetterReason"] = reason
            if description is not None:
                props["DeadLetterErrorDescription"] = description
            message.dead_letter_properties = props
            self.queue.dead_letter._adopt(message)
        return message

    def defer(self, token: uuid.UUID, now: float, *, session: str | None = None) -> StoredMessage:
        """Set the locked message aside; only receive-by-sequence-number gets it.

        Raises:
            LockLost: see :meth:`locked`.
        """
        message = self.locked(token, now, settle=True, session=session)
        self._unlock(message)
        message.state = MessageState.DEFERRED
        return message

    def renew(self, token: uuid.UUID, now: float) -> float:
        """Extend the lock by the lock duration from now; the token stays.

        Returns:
            The new ``locked_until``.

        Raises:
            LockLost: see :meth:`locked`.
        """
        message = self.locked(token, now)
        if message.session_id is not None and self.sessionful:
            # The lock of a session's message is the session lock: renew-session-lock.
            assert message.locked_until is not None
            return message.locked_until
        message.locked_until = now + self.queue.properties.lock_duration
        heapq.heappush(self._lock_heap, (message.locked_until, next(_tiebreak), token))
        return message.locked_until

    # -- sessions -------------------------------------------------------------------------

    def session(self, session_id: str) -> Session:
        """The session ``session_id`` (made on first mention)."""
        found = self._sessions.get(session_id)
        if found is None:
            found = self._sessions[session_id] = Session(session_id)
        return found

    def accept_session(self, session_id: str | None, holder: Any, now: float) -> Session | None:
        """Lock a session to ``holder`` for the queue's LockDuration.

        Parameters:
            session_id: the session to accept; ``None`` for the next available one
                (an unlocked session with an available message; the one whose first
                such message has the lowest sequence number).
            holder: the receive link taking it.
            now: current time.

        Returns:
            The session, or ``None`` when no session is available (next available only).

        Raises:
            SessionCannotBeLocked: the named session is locked by another receiver.
        """
        self.expire(now)
        if session_id is not None:
            session = self.session(session_id)
            if session.is_held(now) and session.holder is not holder:
                raise SessionCannotBeLocked(
                    f"The requested session '{session_id}' cannot be accepted. It may be "
                    "locked by another receiver."
                )
        else:
            best: tuple[int, Session] | None = None
            for candidate in self._sessions.values():
                if candidate.holder is not None:
                    continue
                head = self._head(candidate.ready)
                if head is not None and (best is None or head < best[0]):
                    best = (head, candidate)
            if best is None:
                return None
            session = best[1]
        session.holder = holder
        self._lock_session(session, now)
        return session

    def _lock_session(self, session: Session, now: float) -> None:
        session.locked_until = now + self.queue.properties.lock_duration
        heapq.heappush(
            self._session_heap, (session.locked_until, next(_tiebreak), session.session_id)
        )
        for seq in session.locked:
            message = self._messages.get(seq)
            if message is not None:
                message.locked_until = session.locked_until

    def held_session(self, session_id: str, now: float, holds: Any = None) -> Session:
        """The session ``session_id`` if its lock is held (by a holder ``holds`` accepts).

        Parameters:
            session_id: the session.
            now: current time.
            holds: a predicate on the holder (the requester's receive link); ``None``
                accepts any.

        Raises:
            SessionLockLost: nobody (or somebody else) holds its lock.
        """
        self.expire(now)
        session = self._sessions.get(session_id)
        if session is None or not session.is_held(now) or (holds and not holds(session.holder)):
            raise SessionLockLost(
                f"The session lock has expired on the MessageSession '{session_id}'. Accept "
                "a new MessageSession."
            )
        return session

    def renew_session(self, session_id: str, now: float, holds: Any = None) -> float:
        """Renew a held session's lock (and so its messages' locks) by the LockDuration.

        Returns:
            The new ``locked_until``.

        Raises:
            SessionLockLost: see :meth:`held_session`.
        """
        session = self.held_session(session_id, now, holds)
        self._lock_session(session, now)
        assert session.locked_until is not None
        return session.locked_until

    def release_session(self, session_id: str, holder: Any, now: float) -> bool:
        """``holder`` detached: release its session; its locked messages come back uncounted.

        Returns:
            Whether a session was released (messages may be available again).
        """
        session = self._sessions.get(session_id)
        if session is None or session.holder is not holder:
            return False
        self._release(session, now, failed=False)
        return True

    def _release(self, session: Session, now: float, *, failed: bool) -> None:
        for seq in sorted(session.locked):
            message = self._messages.get(seq)
            if message is None or message.lock_token is None:
                continue
            self._unlock(message)
            if failed:
                self._count_failed_delivery(message, now)
            elif message.expires_at is not None and message.expires_at <= now:
                self._expire_message(message)
            else:
                self._make_ready(message)
        session.locked.clear()
        session.holder = None
        session.locked_until = None

    # -- browsing and by-number operations ------------------------------------------------

    def peek(
        self, from_sequence_number: int, count: int, now: float, session: str | None = None
    ) -> list[StoredMessage]:
        """Browse messages without locking them (active, locked, deferred, scheduled).

        Parameters:
            from_sequence_number: the lowest sequence number to include.
            count: the most messages to return.
            now: current time.
            session: only this session's messages (a session receiver's peek).

        Returns:
            Messages in sequence order.
        """
        self.expire(now)
        seqs = sorted(
            s
            for s, m in self._messages.items()
            if s >= from_sequence_number and (session is None or m.session_id == session)
        )
        return [self._messages[s] for s in seqs[: max(count, 0)]]

    def receive_deferred(
        self, sequence_numbers: Iterable[int], now: float, *, lock: bool
    ) -> list[StoredMessage]:
        """Receive deferred messages by sequence number.

        A deferred message is checked for expiry only here, as Service Bus does
        ("When a client tries to retrieve a deferred message, it's checked for
        expired condition and moved to a dead-letter queue if it's already
        expired", Microsoft Learn, Message deferral): an expired one is
        dead-lettered (or dropped, without DeadLetteringOnMessageExpiration) and
        not found.

        Raises:
            MessageNotFound: a number does not name a deferred message here (or
                it had expired).
        """
        self.expire(now)
        found: list[StoredMessage] = []
        missing: list[str] = []
        for seq in sequence_numbers:
            message = self._messages.get(seq)
            if message is None or message.state is not MessageState.DEFERRED:
                missing.append(f"deferred message {seq} not found in {self.path}")
            elif message.lock_token is not None and message.locked_until is not None:
                missing.append(f"deferred message {seq} is locked")
            elif message.expires_at is not None and message.expires_at <= now:
                self._expire_message(message)
                missing.append(f"deferred message {seq} had expired")
            else:
                found.append(message)
        if missing:
            raise MessageNotFound("; ".join(missing))
        for message in found:
            if lock:
                self._lock(message, now)
            else:
                del self._messages[message.sequence_number]
        return found

    def cancel_scheduled(self, sequence_numbers: Iterable[int]) -> None:
        """Drop scheduled messages that are not enqueued yet (unknown numbers are ignored)."""
        for seq in sequence_numbers:
            message = self._messages.get(seq)
            if message is not None and message.state is MessageState.SCHEDULED:
                del self._messages[seq]


_tiebreak = itertools.count()


class Queue:
    """A queue: its properties, active messages and dead-letter sub-queue.

    Parameters:
        name: the queue name as declared.
        properties: its properties.

    ``created_at`` and ``updated_at`` (UTC) are shown by the management API.
    """

    def __init__(self, name: str, properties: QueueProperties) -> None:
        self.name = name
        self.properties = properties
        self.created_at = self.updated_at = datetime.datetime.now(datetime.UTC)
        self._sequence = itertools.count(1)
        self.active = SubQueue(self, dead_letter=False)
        self.dead_letter = SubQueue(self, dead_letter=True)

    def next_sequence_number(self) -> int:
        """Allocate the next sequence number."""
        return next(self._sequence)

    def expire(self, now: float) -> bool:
        """Apply timers on both sub-queues; ``True`` if something became available."""
        changed = self.active.expire(now)
        return self.dead_letter.expire(now) or changed

    def next_deadline(self) -> float | None:
        """The earliest pending timer of either sub-queue."""
        times = [t for t in (self.active.next_deadline(), self.dead_letter.next_deadline()) if t]
        return min(times) if times else None


class Broker:
    """All queues of the emulated namespace.

    Parameters:
        config: declared queues and the auto-create policy.
    """

    def __init__(self, config: EmulatorConfig | None = None) -> None:
        self.config = config or EmulatorConfig()
        self.created_at = datetime.datetime.now(datetime.UTC)
        self._queues: dict[str, Queue] = {}
        for name, properties in self.config.queues.items():
            self.create_queue(name, properties)

    @property
    def queues(self) -> list[Queue]:
        """The queues that exist now."""
        return list(self._queues.values())

    def create_queue(self, name: str, properties: QueueProperties | None = None) -> Queue:
        """Create (or replace the properties of) a queue.

        Parameters:
            name: the queue name (case-insensitive, as in Service Bus).
            properties: its properties; the configured defaults if ``None``.

        Returns:
            The queue.

        Raises:
            ValueError: the name breaks Service Bus' entity-name rules
                (:func:`entity_name_error`).
        """
        error = entity_name_error(name)
        if error is not None:
            raise ValueError(error)
        key = name.casefold()
        queue = self._queues.get(key)
        props = properties or self.config.default_properties
        if queue is None:
            queue = Queue(name, props)
            self._queues[key] = queue
        else:
            queue.properties = props
        return queue

    def delete_queue(self, name: str) -> None:
        """Delete a queue and its messages.

        Raises:
            EntityNotFound: no such queue.
        """
        if self._queues.pop(name.casefold(), None) is None:
            raise EntityNotFound(name)

    def queue(self, name: str, *, create: bool = True) -> Queue:
        """Find a queue by name, creating it on first use if the policy allows.

        Parameters:
            name: the queue name.
            create: allow creation on first use.

        Returns:
            The queue.

        Raises:
            EntityNotFound: it does not exist and may not be created.
        """
        queue = self._queues.get(name.casefold())
        if queue is not None:
            return queue
        if create and self.config.may_auto_create(name) and entity_name_error(name) is None:
            # Service Bus would answer MessagingEntityNotFound: say loudly that this
            # name (a typo, a topic?) became a queue.
            _log.warning("AutoCreateQueues: created queue %r on first use", name)
            return self.create_queue(name)
        raise EntityNotFound(name)

    def entity(self, path: str, *, create: bool = True) -> SubQueue:
        """Resolve ``<queue>`` or ``<queue>/$deadletterqueue`` to a sub-queue.

        A queue name may itself hold ``/`` (``app/orders``); only a last segment
        ``$deadletterqueue`` names a sub-queue.

        Raises:
            EntityNotFound: no such entity.
        """
        name = path.strip("/")
        queue_name, _, last = name.rpartition("/")
        if queue_name and last.casefold() == DEAD_LETTER_SUFFIX:
            return self.queue(queue_name, create=create).dead_letter
        if "$" in name:
            raise EntityNotFound(path)
        return self.queue(name, create=create).active

    def drop_connection_locks(self, owner: int) -> int:
        """Connection ``owner`` is gone: its receive links' locks can no longer settle.

        Service Bus "does not support recovery of existing AMQP links on a different
        connection": after a broken connection the lock is dropped
        (message-transfers-locks-settlement), so a settle by lock token from another
        connection is refused (``com.microsoft:message-lock-lost``). The message
        stays locked until the lock ends, then comes back (a failed delivery).

        Returns:
            How many locks were dropped.
        """
        return sum(
            sub.drop_connection_locks(owner)
            for queue in self._queues.values()
            for sub in (queue.active, queue.dead_letter)
        )

    def expire(self, now: float) -> list[Queue]:
        """Apply timers on every queue.

        Returns:
            The queues where messages became available.
        """
        return [queue for queue in self._queues.values() if queue.expire(now)]
