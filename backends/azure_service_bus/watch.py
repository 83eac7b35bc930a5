"""The connection watch of :class:`~leasekit.backends.azure_service_bus.ServiceBusDriver`.

Service Bus drops the locks of a connection that is gone, and releases the
sessions accepted on it (Microsoft Learn, *Message transfers, locks, and
settlement*: "If the reason is a broken network connection, the lock is dropped
since Service Bus does not support recovery of existing AMQP links on a
different connection"). A rival may then be handed the session's messages at
once, while the holder would only find out at its next call on that connection
(the SDK reads a socket only inside a call, or in its keep-alive every few
seconds). So while a connection holds leases, one thread per driver polls the
sockets of those connections for a hang-up (``POLLRDHUP``, ``POLLHUP``,
``POLLERR``; nothing is read, so the SDK's own reads see the same bytes), and
looks for connections the SDK closed (after an error, or when it replaced the
connection). The driver is told of each gone connection once, at once: a reset
wakes the poll.

A partition that neither side sees (no reset, no FIN) is not noticed here; the
leases then end by core's clock at their deadline, as on every backend.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["WATCH_INTERVAL", "ConnectionWatch", "socket_of"]

_log = logging.getLogger("leasekit.backends.azure_service_bus")

#: Seconds between two looks at the watched set when no socket hangs up (a
#: hang-up wakes the poll at once). Shorter picks up newly held connections and
#: the SDK's own closes sooner; each look is a few microseconds per connection.
WATCH_INTERVAL = 0.05
#: Longest sleep while no connection holds a lease.
IDLE_WAIT = 1.0
#: Seconds with no connection holding a lease after which the thread ends (the
#: next held lease starts it again): a driver that is never closed keeps no thread.
IDLE_EXIT = 5.0
#: Poll events that mean the peer is gone: reset (ERR, HUP) or its FIN (RDHUP).
_HANGUP = getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP | select.POLLERR


def socket_of(connection: Any) -> socket.socket | None:
    """The socket of a pyamqp connection (``None`` if it has none, or is not pyamqp's)."""
    transport = getattr(connection, "_transport", None)
    sock = getattr(transport, "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _closed(connection: Any) -> bool:
    """Whether pyamqp closed ``connection`` (its state ``END``, or no socket left)."""
    state = getattr(connection, "state", None)
    if getattr(state, "name", None) == "END":
        return True
    sock = socket_of(connection)
    return sock is None or sock.fileno() < 0


class ConnectionWatch:
    """Watches the connections that hold leases; reports each one that is gone, once.

    Parameters
    ----------
        holding: returns the connections that hold leases now (called on the watch thread).
        gone: called with a connection found gone (on the watch thread; must not raise).
    """

    def __init__(self, holding: Callable[[], Iterable[Any]], gone: Callable[[Any], None]) -> None:
        self._holding = holding
        self._gone = gone
        self._reported: weakref.WeakSet[Any] = weakref.WeakSet()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """A connection may hold leases now: start the thread, or wake it."""
        with self._lock:
            if self._stop.is_set():
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="leasekit-sb-connection-watch", daemon=True
                )
                self._thread.start()
            self._wake.set()  # under the lock: a thread about to end sees it and stays

    def close(self) -> None:
        """Stop the thread (within about ``WATCH_INTERVAL``)."""
        with self._lock:
            self._stop.set()
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(IDLE_WAIT + 1)

    def _run(self) -> None:
        idle_since: float | None = None
        while not self._stop.is_set():
            try:
                busy = self._look()
            except Exception:  # the watch must outlive a surprise; it is only a speed-up
                _log.debug("connection watch failed", exc_info=True)
                self._stop.wait(WATCH_INTERVAL)
                continue
            if busy:
                idle_since = None
                continue
            now = time.monotonic()
            if idle_since is None:
                idle_since = now
            elif now - idle_since >= IDLE_EXIT:
                with self._lock:
                    if not self._wake.is_set():
                        self._thread = None  # the next wake() starts a new one
                        return

    def _look(self) -> bool:
        """One look: report connections gone; wait for a hang-up up to ``WATCH_INTERVAL``.

        Returns whether any connection held leases (else it waited up to ``IDLE_WAIT``).
        """
        self._wake.clear()  # a wake from now on is kept for the idle wait below
        poller = select.poll()
        watched: dict[int, Any] = {}
        found: list[Any] = []
        for connection in self._holding():
            if connection in self._reported:
                continue
            sock = socket_of(connection)
            if sock is None or _closed(connection):
                found.append(connection)
                continue
            with contextlib.suppress(OSError, ValueError):
                fd = sock.fileno()
                poller.register(fd, _HANGUP)
                watched[fd] = connection
        if not found and watched:
            for fd, events in poller.poll(WATCH_INTERVAL * 1000):
                if events & _HANGUP and not events & select.POLLNVAL and fd in watched:
                    found.append(watched[fd])
        for connection in found:
            if connection not in self._reported:
                self._reported.add(connection)
                self._gone(connection)
        if not found and not watched:
            self._wake.wait(IDLE_WAIT)
            return False
        return True
