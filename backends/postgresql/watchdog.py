"""Deadlines for calls: one watchdog thread per process ends a statement past its call's."""

from __future__ import annotations

import heapq
import itertools
import math
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .settings import CUT_GRACE, TIMEOUT_STEPS_MS

if TYPE_CHECKING:
    import psycopg


# --------------------------------------------------------------- deadlines


class _Watchdog:
    """Cuts a connection whose call outlived its deadline: one daemon thread per process.

    A statement the server runs too long is stopped by the server's
    ``statement_timeout``; a call whose network hangs (no answer at all) is
    stopped here, by shutting down the connection's socket, which makes libpq's
    wait return with an error at once. The connection is then broken and the
    pool replaces it. A call that finished is unregistered first (under the
    lock), so a connection back in the pool is never cut.

    Every open pool holds the watchdog (:meth:`hold`); when the last one is
    closed (:meth:`release`), its thread ends before ``close()`` returns.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # watch/unwatch hold the plain lock (a C-level ``with``); the thread waits
        # on a condition over the same lock.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int]] = []
        self._calls: dict[int, tuple[int, list[bool]]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._users = 0
        #: When the thread wakes next on its own (monotonic; 0: not waiting). A
        #: call whose deadline comes later needs no wake-up: the thread finds it
        #: then. Waking it for every call costs two context switches a call.
        self._wakes_at = 0.0

    def after_fork(self) -> None:
        """In a forked child: none of the parent's calls, pools or thread are this process's.

        The parent's lock may have been held by one of its other threads at the
        fork (it would stay locked here): the child starts with new ones.
        """
        self._reset()

    def hold(self) -> None:
        """An open pool uses the watchdog."""
        with self._cond:
            self._users += 1

    def release(self) -> None:
        """A pool was closed; the last one ends the thread (and waits for it, briefly)."""
        with self._cond:
            self._users = max(0, self._users - 1)
            if self._users:
                return
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)

    def watch(self, fd: int, timeout: float | None) -> tuple[int, list[bool]] | None:
        """Watch the call on socket ``fd`` for ``timeout`` seconds: its key and ``[cut]``.

        ``None`` when there is nothing to watch (no deadline, no socket). The
        caller gives the key to :meth:`unwatch` when the call ends (in a ``finally``).
        """
        if timeout is None or fd < 0:
            return None
        cut = [False]
        key = next(self._ids)
        due = time.monotonic() + timeout + CUT_GRACE
        with self._lock:
            self._calls[key] = (fd, cut)
            heapq.heappush(self._heap, (due, key))
            if self._thread is None:  # none yet, released, or ended (see _run)
                self._thread = threading.Thread(
                    target=self._run, name="leasekit-postgresql-watchdog", daemon=True
                )
                self._thread.start()
            elif due < self._wakes_at:
                self._cond.notify()
        return key, cut

    def unwatch(self, key: int) -> None:
        """The call ended: its connection is not to be cut.

        Finished calls at the top of the heap are dropped here: calls mostly end
        in the order they began, so the heap holds about the calls in flight,
        not every call of the last ``timeout`` seconds (thousands a second under
        load) for the watchdog thread to pop at once, holding the lock.
        """
        with self._lock:
            self._calls.pop(key, None)
            heap, calls = self._heap, self._calls
            while heap and heap[0][1] not in calls:
                heapq.heappop(heap)

    @contextmanager
    def guard(self, fd: int, timeout: float | None) -> Iterator[list[bool]]:
        """Watch the call on socket ``fd`` for ``timeout`` seconds; yields ``[cut]``."""
        watched = self.watch(fd, timeout)
        try:
            yield [False] if watched is None else watched[1]
        finally:
            if watched is not None:
                self.unwatch(watched[0])

    def _run(self) -> None:
        me = threading.current_thread()
        try:
            self._watch_calls(me)
        finally:
            with self._lock:  # ended (released, or an error): the next call starts another
                if self._thread is me:
                    self._thread = None

    def _watch_calls(self, me: threading.Thread) -> None:
        while True:
            with self._cond:
                while True:
                    if self._thread is not me:
                        return  # released: no pool left to watch
                    now = time.monotonic()
                    while self._heap and self._heap[0][1] not in self._calls:
                        heapq.heappop(self._heap)  # finished in time
                    if self._heap and self._heap[0][0] <= now:
                        _, key = heapq.heappop(self._heap)
                        fd, cut = self._calls.pop(key)
                        cut[0] = True
                        _shutdown(fd)
                        continue
                    wait = self._heap[0][0] - now if self._heap else 60.0
                    self._wakes_at = now + wait
                    self._cond.wait(wait)
                    self._wakes_at = 0.0


#: The process's watchdog, shared by every pool.
_WATCHDOG = _Watchdog()


def _shutdown(fd: int) -> None:
    """Shut the socket ``fd`` down both ways (its blocked reader wakes with EOF); keep the fd."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def _timeout_band(wanted_ms: float) -> tuple[float, float, int]:
    """The server-side statement_timeout for a call of ``wanted_ms``: ``(low, high, step)``.

    ``step`` (ms) is the first of :data:`TIMEOUT_STEPS_MS` at or above the time
    wanted (0, no limit, past an hour); every time in ``(low, high]`` gets it.
    """
    low = 0.0
    for step in TIMEOUT_STEPS_MS:
        if wanted_ms <= step:
            return low, float(step), step
        low = float(step)
    return low, math.inf, 0


#: libpq's transaction status of a connection outside any transaction.
_IDLE = 0


def _closed_by_server(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server closed this idle connection (a restart, a cut network).

    No round trip: an idle connection has nothing to read unless the server
    closed it (EOF, a reset, or a FATAL message before closing), so a readable
    socket means it is gone.
    """
    try:
        fd = conn.pgconn.socket
        readable, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError, Exception):
        return True
    return bool(readable)
