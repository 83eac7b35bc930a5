"""Message sessions of a ``RequiresSession`` queue, as Azure Service Bus documents them.

Plain data, driven by :class:`~.broker.SubQueue` (the rules) and :mod:`.amqp` (the
wire). What Microsoft Learn ("Message sessions") and the SDKs' documentation say,
and what is emulated here:

* a session is the messages sent with one ``SessionId`` (AMQP ``group-id``); it
  exists while it has messages or state ("Sessions come into existence when there
  is at least one message with the session's SessionId", Java ``IMessageSession``);
* a receiver *accepts* a session: a named one, or the next available one, "the
  next unlocked session that contains Active messages"; with none, the accept
  times out after the operation timeout (.NET ``AcceptNextSessionAsync``:
  "If there are no unlocked sessions with Active messages, then the call will
  timeout after the configured TryTimeout value");
* the session is then locked to that receiver for the queue's LockDuration; the
  lock is renewed with ``renew-session-lock``, and the locks of the session's
  messages are the session lock (the SDKs refuse to renew them separately);
* "When the accepted session remains idle for the duration of lock ... the lock
  expires and the session is made available to other clients" (Java
  ``SessionLockLostException``): the messages it had locked come back, each with a
  failed delivery counted (as for any lock that ends, ``LockedUntil``: "When the
  lock expires, the DeliveryCount is incremented"), and any later use of the lost
  lock is ``com.microsoft:session-lock-lost``;
* session state: an opaque binary value per session, set and read by the lock
  holder (``set-session-state`` / ``get-session-state``), kept while the session
  has no messages.

Not documented, chosen here: the next available session is the one whose first
available message has the lowest sequence number; a session receiver that
detaches gives its unsettled messages back without counting a failed delivery
(the lock was released, not lost).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Session", "SessionCannotBeLocked", "SessionLockLost"]


class SessionLockLost(Exception):
    """The session lock expired, was released, or is held by another receiver."""


class SessionCannotBeLocked(Exception):
    """A named session is locked by another receiver."""


@dataclass(eq=False)
class Session:
    """One session of a queue.

    Parameters:
        session_id: the ``SessionId`` (AMQP ``group-id``), as sent.
    """

    session_id: str
    #: The session state (``None``: none set).
    state: bytes | None = None
    #: The receive link that holds the lock (opaque here), or ``None``.
    holder: Any = None
    #: When the lock ends (``time.time()`` scale), while held.
    locked_until: float | None = None
    #: Heap of sequence numbers of messages that may be available in this session.
    ready: list[int] = field(default_factory=list)
    #: Sequence numbers of the messages locked under the current lock.
    locked: set[int] = field(default_factory=set)

    def is_held(self, now: float) -> bool:
        """Whether a receiver holds the lock now."""
        return self.holder is not None and self.locked_until is not None and now < self.locked_until

    def push(self, sequence_number: int) -> None:
        """A message of this session may be available (abandoned, enqueued, due)."""
        heapq.heappush(self.ready, sequence_number)
