"""Connections: the pool a driver and its siblings share, the idle list before it, forks."""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .error_codes import _connect_failure
from .settings import DIAL_POLL, KEEP_FOR, RECONNECT_TIMEOUT, REDIAL_EVERY, WAIT_SLICE
from .watchdog import _IDLE, _WATCHDOG, _closed_by_server, _Watchdog

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool


#: This process's id, kept current across forks: ``os.getpid()`` is a system
#: call, and a pool checks whose it is on every call.
_PROCESS = [os.getpid()]


#: Every pool holder of this process: a forked child renews their locks.
_ALL_SHARED: weakref.WeakSet[_Shared] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A child has none of its parent's threads: a lock one of them held stays locked."""
    _PROCESS[0] = os.getpid()
    _WATCHDOG.after_fork()
    for shared in list(_ALL_SHARED):
        shared.lock = threading.Lock()
        # The parent's idle connections are the parent's: dropped here, not
        # closed (psycopg leaves a connection of another process alone).
        shared.idle_lock = threading.Lock()
        shared.idle = []
        shared.waiting = 0
        shared.own = 0
        shared.dialing = False


os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------- the pool


@dataclass(eq=False)  # compared (and kept in _ALL_SHARED) by identity
class _Shared:
    """What a driver and its siblings share: the pool, the watchdog, the migration state."""

    conninfo: str
    kwargs: dict[str, Any]
    pool_size: int
    pool: ConnectionPool[Any] | None = None
    pid: int = 0
    migrated: bool = False
    watchdog: _Watchdog = field(default_factory=lambda: _WATCHDOG)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Connections out of the pool between two calls, for the next call of any
    #: thread (LIFO); each counts against ``pool_size`` as one in use does.
    idle: list[psycopg.Connection[Any]] = field(default_factory=list)
    #: Callers of this process waiting for a connection from the pool.
    waiting: int = 0
    idle_lock: threading.Lock = field(default_factory=threading.Lock)
    #: A connection was found cut (closed by the server, broken in a call) and the
    #: pool has not lent a live one since: waiting callers have connections made
    #: for them (:meth:`_dial`) rather than wait for the pool's reconnect schedule.
    cut: bool = False
    #: Connections made that way (not the pool's: closed, never given to it); at
    #: most ``pool_size`` at once.
    own: int = 0
    #: A connection is being made for waiting callers (one at a time), and when
    #: (monotonic) the last attempt failed.
    dialing: bool = False
    dial_failed_at: float = -math.inf
    #: The last such attempt's error when no retry mends it (the server refused
    #: the password, role or database: see :func:`_connect_failure`), else None.
    dial_error: Exception | None = None

    def __post_init__(self) -> None:
        _ALL_SHARED.add(self)

    def get(self, timeout: float | None) -> ConnectionPool[Any]:
        """The pool, opened on first use (and anew in a forked child).

        Before the pool opens, one connection is made in the calling thread
        (within ``timeout``): a refused password or a missing database is then
        raised as libpq reported it, where the pool's background connections
        would only time out.
        """
        pool = self.pool
        if pool is not None and self.pid == _PROCESS[0]:
            return pool
        with self.lock:
            if self.pool is not None and self.pid == _PROCESS[0]:
                return self.pool
            import psycopg
            from psycopg_pool import ConnectionPool

            probe: dict[str, Any] = dict(self.kwargs)
            if timeout is not None:
                probe["connect_timeout"] = str(max(2, math.ceil(timeout)))
            psycopg.connect(self.conninfo, **probe).close()

            # A pool must not cross a fork: the child makes its own, and leaves the
            # parent's sockets alone (closing them would end the parent's sessions).
            made: ConnectionPool[Any] = ConnectionPool(
                self.conninfo,
                kwargs=self.kwargs,
                min_size=1,
                max_size=self.pool_size,
                open=False,
                name="leasekit",
                # Give up a failing reconnection soon: the next call that needs a
                # connection starts a fresh attempt (the pool's backoff doubles
                # without bound, which after a long outage would delay recovery).
                reconnect_timeout=RECONNECT_TIMEOUT,
            )
            made.open(wait=False)
            self.pool = made
            self.pid = _PROCESS[0]
            self.watchdog.hold()
            return made

    def take(self, pool: ConnectionPool[Any], until: float) -> psycopg.Connection[Any]:
        """A live connection for one call: the one a call left idle, else the pool's by ``until``.

        A caller that finds none idle is counted as waiting while it asks the
        pool; meanwhile finished calls give their connections to the pool (which
        hands them to the waiters), never to the idle list. Counting and keeping
        happen under one lock, so no connection stays idle while a thread waits.
        Connections the server closed while idle (a restart, a cut) are closed
        and handed back, so the pool replaces them, and the next one is taken.
        After such a cut the caller does not wait for the pool's reconnect
        schedule: see :meth:`_wait_for_one`.
        """
        conn: psycopg.Connection[Any]
        while True:
            with self.idle_lock:
                if not self.idle or self.pool is not pool:
                    self.waiting += 1
                    break
                conn = self.idle.pop()
            if not _closed_by_server(conn):
                return conn
            self.discard(conn, pool)
        try:
            conn = self._wait_for_one(pool, until)
        finally:
            with self.idle_lock:
                self.waiting -= 1
        if not hasattr(conn, "_leasekit_own"):
            conn._leasekit_keep_until = time.monotonic() + KEEP_FOR  # type: ignore[attr-defined]
        return conn

    def _wait_for_one(self, pool: ConnectionPool[Any], until: float) -> psycopg.Connection[Any]:
        """A live connection from the pool by ``until``; after a cut, one made at once.

        The pool replaces a cut connection on its own schedule (at once, then
        after 1 s, then 2 s): a cut that ends just after an attempt is noticed
        up to 2 s late, and a renewal waiting for it loses its leases. So while
        :attr:`cut` is set the caller asks the pool only briefly at a time, and
        between asks a connection is made for it (:meth:`_dial`, in a thread of
        its own, so the call keeps its deadline however long a connect hangs),
        again :data:`REDIAL_EVERY` after each failure: the server is reached as
        soon as it can be. The first live connection the pool lends ends the cut.
        """
        from psycopg_pool import PoolTimeout

        began = time.monotonic()
        while True:
            if self.cut:
                error = self.dial_error
                if error is not None and self.dial_failed_at >= began:
                    # The server answers, and refuses: waiting mends nothing. (A
                    # copy: other waiting callers may raise the same one.)
                    raise type(error)(*error.args) from error
                with self.idle_lock:
                    made = self.idle.pop() if self.idle and self.pool is pool else None
                if made is not None:
                    if not _closed_by_server(made):
                        return made
                    self.discard(made, pool)
                    continue
            left = until - time.monotonic()
            if left <= 0:
                raise PoolTimeout("no connection in time (the server cannot be reached)")
            try:
                conn: psycopg.Connection[Any] = pool.getconn(
                    timeout=min(left, DIAL_POLL if self.cut else WAIT_SLICE)
                )
            except PoolTimeout:
                if until - time.monotonic() <= 0:
                    waited = time.monotonic() - began
                    raise PoolTimeout(f"couldn't get a connection in {waited:.2f} s") from None
                if self.cut:
                    self._start_dial(pool)
                continue
            if not _closed_by_server(conn):
                self.cut = False
                return conn
            self.discard(conn, pool)

    def _start_dial(self, pool: ConnectionPool[Any]) -> None:
        """Start making a connection for the waiting callers, unless one is under way."""
        now = time.monotonic()
        with self.idle_lock:
            if (
                self.dialing
                or self.own >= self.pool_size
                or now - self.dial_failed_at < REDIAL_EVERY
                or self.pool is not pool
            ):
                return
            self.dialing = True
            self.own += 1
        threading.Thread(
            target=self._dial, args=(pool,), name="leasekit-postgresql-connect", daemon=True
        ).start()

    def _dial(self, pool: ConnectionPool[Any]) -> None:
        """Connect (libpq's ``connect_timeout``) and leave the connection idle for the next call."""
        import psycopg

        try:
            conn = psycopg.connect(self.conninfo, **self.kwargs)
        except Exception as exc:
            with self.idle_lock:
                self.dialing = False
                self.own -= 1
                self.dial_error = exc if _connect_failure(exc) is not None else None
                self.dial_failed_at = time.monotonic()
            return
        self.dial_error = None
        conn._leasekit_own = True  # type: ignore[attr-defined]
        conn._leasekit_keep_until = time.monotonic() + KEEP_FOR  # type: ignore[attr-defined]
        with self.idle_lock:
            self.dialing = False
            if self.pool is pool:
                self.idle.append(conn)
                return
        self._close_own(conn)  # the pool was closed meanwhile

    def _close_own(self, conn: psycopg.Connection[Any]) -> None:
        conn.close()
        with self.idle_lock:
            self.own -= 1

    def discard(self, conn: psycopg.Connection[Any], pool: ConnectionPool[Any]) -> None:
        """A connection found cut: close it (the pool replaces its own) and mark the cut."""
        self.cut = True
        if hasattr(conn, "_leasekit_own"):
            self._close_own(conn)
            return
        conn.close()
        pool.putconn(conn)

    def give_back(self, conn: psycopg.Connection[Any], pool: ConnectionPool[Any]) -> None:
        """The end of a call: keep ``conn`` for the next one, or return it to its pool.

        Kept only when no caller waits for the pool, it is healthy (no
        transaction left, not broken), its pool is still this driver's and it
        has not been out for :data:`KEEP_FOR`; anything else goes back to the
        pool, which hands it on, checks, resets or replaces it. The list is
        LIFO, so after a burst its oldest connections may go unused: one out
        for ``KEEP_FOR`` is given back here too, and the pool shrinks as it
        would have (its ``max_idle``). A connection made for a caller after a
        cut (not the pool's) is kept the same way, or else closed. A broken
        connection marks a cut (see :meth:`_wait_for_one`).
        """
        now = time.monotonic()
        if conn.broken:
            self.cut = True
        elif conn.pgconn.transaction_status == _IDLE and now < getattr(
            conn, "_leasekit_keep_until", 0.0
        ):
            with self.idle_lock:
                # Not closed meanwhile; a connection of our own also while callers
                # wait after a cut (they take from this list, not the pool).
                if pool is self.pool and (
                    not self.waiting or (self.cut and hasattr(conn, "_leasekit_own"))
                ):
                    idle = self.idle
                    idle.append(conn)
                    if getattr(idle[0], "_leasekit_keep_until", 0.0) > now:
                        return
                    conn = idle.pop(0)  # the oldest, unused since KEEP_FOR at least
        if hasattr(conn, "_leasekit_own"):
            self._close_own(conn)
        else:
            pool.putconn(conn)

    def close(self) -> None:
        with self.lock:
            pool, self.pool = self.pool, None
        with self.idle_lock:  # after the pool is unset: no call keeps one from now on
            idle, self.idle = self.idle, []
        if pool is not None and self.pid == _PROCESS[0]:
            for conn in idle:
                if hasattr(conn, "_leasekit_own"):
                    self._close_own(conn)
                else:
                    pool.putconn(conn)
            pool.close(timeout=1.0)
            self.watchdog.release()
