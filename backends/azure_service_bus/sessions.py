"""Service Bus sessions for :class:`~leasekit.backends.azure_service_bus.ServiceBusDriver`.

Used when the queue is opened with ``sessions=true`` (a ``RequiresSession`` queue):
leasekit's ``group`` is the Service Bus ``SessionId``.

Delivery semantics:
    A receive accepts the next available session (``NEXT_AVAILABLE_SESSION``: an
    unlocked session with an available message; none within the wait is an empty
    receive), or the one named by the ``session`` option (held elsewhere: an empty
    receive), on a receiver of its own, and takes up to ``max_messages`` of that
    session's messages, in order. The receiver, and so the session lock, is kept
    while any lease of the session is held: no other receiver, here or elsewhere,
    gets a message of the session meanwhile, which is leasekit's group rule 1.
    When the last lease of the session is settled the receiver is closed and the
    session released; its next message goes to whoever accepts it next.

    The lock of a session's messages is the session lock (the SDK refuses
    ``renew_message_lock`` on them): a lease's expiry is the session's
    ``locked_until``, and the keeper's renewal of any leases of one session is one
    ``renew-session-lock`` call, whose new expiry every one of them gets. A lost
    session lock (expired, or the service says ``SessionLockLostError``) makes
    every lease of that session lost, each reported once; the receiver is then
    closed. Settles go through the session's receiver, one SDK call at a time per
    session (different sessions do not wait for each other).

    Session state: ``Lease.group_state()`` / ``Lease.set_group_state(data)`` are the
    session's ``get_state`` / ``set_state`` through the receiver that holds it.

Limits:
    One session per receive call; each session receiver is an AMQP connection of
    its own (the SDK does not share connections), opened when the session is
    accepted (about 0.5 s: the SDK polls its handshake every 50 ms) and closed when
    it is released. Closing sends the detach at once (the session is released
    then) and then waits for the SDK's keep-alive thread, which sleeps in 1 s steps
    (with ``prefetch_count=0`` the SDK always starts one): that wait runs on a
    closer thread, off the settle's path; :meth:`SessionReceivers.close` joins them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from leasekit.clock import to_datetime
from leasekit.spi import DriverError, ErrorCode, RawMessage, Visibility

from .connection import _open_handler, _timeouts
from .settings import SOCKET_TIMEOUT


class SessionsOwner(Protocol):
    """What :class:`SessionReceivers` uses of the driver that owns it.

    Its client, deadline, message reading and error classification: a protocol,
    so that this part and the driver form no import circle.
    """

    queue: str
    session: str | None
    _setup_lock: threading.Lock
    _watch: Any

    def _get_client(self) -> Any: ...
    def _left(self) -> float: ...
    def _raw(self, message: Any, token: str, locked_until: float) -> RawMessage: ...
    def error_code(self, exc: BaseException) -> ErrorCode: ...


__all__ = ["SessionReceivers"]

_log = logging.getLogger("leasekit.backends.azure_service_bus")

#: Shortest wait for a session to accept: the SDK takes a zero ``max_wait_time`` as
#: "the service's default" (65 s), so a "return at once" receive waits this long.
MIN_ACCEPT_WAIT = 0.1
#: Client-side slack over the service's own accept timeout, so the service's
#: answer (``com.microsoft:timeout``) ends the wait rather than the client's clock.
ACCEPT_SLACK = 1.0
#: How long a receive waits for the accepted session's messages: they are
#: available (that is what made the session available), so this is a few reads.
FIRST_MESSAGES_WAIT = 1.0
#: Longest wait for one receiver's close at the driver's close (the SDK's
#: keep-alive thread ends within about 1 s).
CLOSE_TIMEOUT = 5.0


@dataclass(eq=False)
class _Session:
    """An accepted session: its receiver, its lock, and the leases held of it."""

    session_id: str
    receiver: Any
    locked_until: float
    messages: dict[str, Any] = field(default_factory=dict)  # lock token -> SDK message
    lost: BaseException | None = None
    #: The receiver's AMQP connection (watched: when it is gone, so is the session).
    connection: Any = None
    #: One SDK call at a time on the receiver (settles, renewals, state).
    lock: threading.Lock = field(default_factory=threading.Lock)


class SessionReceivers:
    """The sessions one driver holds; the driver's receive, renew and settles on a session queue.

    Parameters:
        driver: the owning driver (its client, deadline and error classification).
    """

    def __init__(self, driver: SessionsOwner) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._by_token: dict[str, _Session] = {}
        self._sessions: list[_Session] = []
        self._closers: list[threading.Thread] = []

    # -------------------------------------------------------------- receive

    def receive(self, max_messages: int, wait: float) -> list[RawMessage]:
        """Accept the next available session and take up to ``max_messages`` of it, in order."""
        from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode
        from azure.servicebus.exceptions import OperationTimeoutError, SessionCannotBeLockedError

        driver = self._driver
        self._drop_expired(time.time())
        accept_wait = max(wait, MIN_ACCEPT_WAIT)
        with driver._setup_lock:
            client = driver._get_client()
        receiver = client.get_queue_receiver(
            driver.queue,
            session_id=driver.session or NEXT_AVAILABLE_SESSION,
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
            prefetch_count=0,
            max_wait_time=accept_wait,
            socket_timeout=SOCKET_TIMEOUT,
        )
        try:
            _open_handler(receiver, min(accept_wait + ACCEPT_SLACK, driver._left()))
        except (OperationTimeoutError, SessionCannotBeLockedError):
            _close(receiver)
            return []  # no session available within the wait (or the named one is held)
        except BaseException:
            _close(receiver)
            raise
        try:
            messages = receiver.receive_messages(
                max_message_count=max_messages,
                max_wait_time=min(FIRST_MESSAGES_WAIT, max(driver._left(), MIN_ACCEPT_WAIT)),
            )
        except BaseException:
            _close(receiver)
            raise
        until = receiver.session.locked_until_utc
        if not messages or until is None:
            _close(receiver)  # the session emptied meanwhile: release it
            return []
        session = _Session(str(receiver.session.session_id), receiver, until.timestamp())
        session.connection = getattr(getattr(receiver, "_handler", None), "_connection", None)
        raws: list[RawMessage] = []
        for message in messages:
            token = str(message.lock_token)
            session.messages[token] = message
            raw = driver._raw(message, token, session.locked_until)
            raws.append(dataclasses.replace(raw, group=message.session_id))
        with self._lock:
            self._sessions.append(session)
            for token in session.messages:
                self._by_token[token] = session
        driver._watch.wake()
        return raws

    def holding(self) -> list[Any]:
        """The connections of the sessions held (for the driver's connection watch)."""
        with self._lock:
            return [s.connection for s in self._sessions if s.connection is not None]

    def connection_gone(self, connection: Any, error: BaseException) -> list[str]:
        """``connection`` is gone: its sessions are lost; return their leases' receipts.

        Service Bus released them when the connection went (another receiver may
        hold them already): each session is forgotten, its receiver closed, and
        any later use of its leases raises ``error``.
        """
        with self._lock:
            lost = [s for s in self._sessions if s.connection is connection]
        receipts: list[str] = []
        for session in lost:
            receipts += list(session.messages)
            self._lose(session, error)
        return receipts

    def _drop_expired(self, now: float) -> None:
        """Close the receivers of sessions whose lock ended (their leases are lost by now)."""
        from .settings import FORGET_AFTER

        with self._lock:
            ended = [s for s in self._sessions if s.locked_until + FORGET_AFTER < now]
            for session in ended:
                self._forget(session)
        for session in ended:
            self._close_later(session.receiver)

    def _forget(self, session: _Session) -> None:
        """Drop ``session`` and its tokens (``_lock`` held)."""
        if session in self._sessions:
            self._sessions.remove(session)
        for token in session.messages:
            if self._by_token.get(token) is session:
                del self._by_token[token]

    def _lookup(self, receipt: str) -> _Session:
        with self._lock:
            session = self._by_token.get(receipt)
        if session is None:
            raise DriverError(
                ErrorCode.LEASE_LOST,
                "azure-service-bus: this driver holds no session lock for that token "
                "(settled, expired, or received elsewhere)",
                backend_code="SessionLockLostError",
            )
        if session.lost is not None:
            raise session.lost
        return session

    def _lose(self, session: _Session, exc: BaseException) -> None:
        """The session lock is lost: every lease of it is, and its receiver is closed."""
        session.lost = exc
        with self._lock:
            self._forget(session)
        self._close_later(session.receiver)

    def _close_later(self, receiver: Any) -> None:
        """Close ``receiver`` on a closer thread (the detach goes out at once)."""
        closer = threading.Thread(
            target=_close, args=(receiver,), name="leasekit-sb-session-close", daemon=True
        )
        with self._lock:
            self._closers = [t for t in self._closers if t.is_alive()]
            self._closers.append(closer)
        closer.start()

    # --------------------------------------------------------------- renew

    def renew(self, receipts: Sequence[str]) -> list[Visibility | BaseException]:
        """Renew each session once (``renew-session-lock``); its leases get the new expiry."""
        results: list[Visibility | BaseException | None] = [None] * len(receipts)
        by_session: dict[int, tuple[_Session, list[int]]] = {}
        for index, receipt in enumerate(receipts):
            try:
                session = self._lookup(receipt)
            except BaseException as exc:
                results[index] = exc
                continue
            by_session.setdefault(id(session), (session, []))[1].append(index)
        for session, indexes in by_session.values():
            try:
                with session.lock:
                    if session.lost is not None:
                        raise session.lost
                    until = session.receiver.session.renew_lock(
                        timeout=self._driver._left()
                    ).timestamp()
            except BaseException as exc:
                if self._driver.error_code(exc) is ErrorCode.LEASE_LOST:
                    self._lose(session, exc)
                for index in indexes:
                    results[index] = exc
                continue
            session.locked_until = until
            for index in indexes:
                results[index] = Visibility(receipts[index], to_datetime(until))
        return [
            r if r is not None else DriverError(ErrorCode.UNKNOWN, "no result") for r in results
        ]

    # -------------------------------------------------------------- settle

    def settle(self, receipt: str, action: str, **kwargs: Any) -> None:
        """Complete/abandon/dead-letter on the session's receiver; release the session when done."""
        session = self._lookup(receipt)
        message = session.messages[receipt]
        try:
            with session.lock:
                if session.lost is not None:
                    raise session.lost
                left = self._driver._left()
                with _timeouts(session.receiver, left):
                    getattr(session.receiver, action)(message, **kwargs)
        except BaseException as exc:
            if self._driver.error_code(exc) is ErrorCode.LEASE_LOST:
                self._lose(session, exc)
            raise
        with self._lock:
            self._by_token.pop(receipt, None)
            del session.messages[receipt]
            done = not session.messages
            if done:
                self._forget(session)
        if done:
            self._close_later(session.receiver)  # the last lease of the session: release it

    # --------------------------------------------------------------- state

    def group_state(self, receipt: str) -> bytes | None:
        """The session's state (``get_state``), through the receiver holding it."""
        session = self._lookup(receipt)
        with session.lock:
            state = session.receiver.session.get_state(timeout=self._driver._left())
        return bytes(state) if state is not None else None

    def set_group_state(self, receipt: str, state: bytes | None) -> None:
        """Set (``None``: clear) the session's state (``set_state``)."""
        session = self._lookup(receipt)
        with session.lock:
            session.receiver.session.set_state(state, timeout=self._driver._left())

    # --------------------------------------------------------------- close

    def close(self) -> None:
        """Close every session receiver (the sessions are released); wait for the closers."""
        with self._lock:
            sessions = list(self._sessions)
            self._sessions.clear()
            self._by_token.clear()
            closers = list(self._closers)
            self._closers.clear()
        for session in sessions:
            self._close_later(session.receiver)
        with self._lock:
            closers += self._closers
            self._closers.clear()
        for closer in closers:
            closer.join(CLOSE_TIMEOUT)


def _close(receiver: Any) -> None:
    """Close an SDK receiver; closing must not raise (the session is released either way)."""
    try:
        receiver.close()
    except Exception:
        _log.debug("closing a session receiver failed", exc_info=True)
