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
* "The lock is released when you call the close related methods on the receiver
  or when the lock expires" (Message sessions), and on a broken connection "the
  lock is dropped since Service Bus does not support recovery of existing AMQP
  links on a different connection" (Message transfers, locks, and settlement):
  a session receiver whose link detaches, or whose connection is gone (reset,
  closed), releases the session at once, and the next receiver may accept it
  then, long before the lock would have ended;
* the delivery count of such a session's messages is not raised: "Session is
  accepted, the messages within the session aren't completed (even if they are
  locked), and the session is closed" does not increment it, while "Session is
  accepted, but the session lock expires (due to timeout)" does (Message
  sessions, "Impact of delivery count");
* session state: an opaque binary value per session, set and read by the lock
  holder (``set-session-state`` / ``get-session-state``), kept while the session
  has no messages.

Not documented, chosen here: the next available session is the one whose first
available message has the lowest sequence number. A gone connection counts as a
closed session (the documents name only close and expiry; the connection's locks
are "dropped", not expired), so its messages come back uncounted; an Azure SDK
issue reports the same of the service ("The session lock is released (on the
server) if the connection between the client and the server is severed",
Azure/azure-service-bus#694).
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
