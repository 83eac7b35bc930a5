"""Small HTTP servers on threads that a slow or hostile client cannot pile up.

``http.server``'s threading server starts a thread per connection and its
handlers read without a timeout, so every client that sends half a request and
waits pins a thread for as long as it keeps the connection (300 of them took a
worker from 8 to 307 threads). :class:`BoundedThreadingMixIn` caps the
connections served at once and handlers built with :data:`REQUEST_TIMEOUT` give
up on a client that does not finish its request.

A cap alone lets a flood of slow clients refuse everybody else: 32 connections
that never finish their request kept a liveness probe from being answered, and
a probe that fails restarts a healthy pod. So when every slot is taken, a new
connection evicts the oldest one still *reading its request head* (one that has
sent a whole request is never evicted): a probe, which sends its request at
once, is answered under any such flood. Handlers mark the end of their request
head with :class:`RequestHeadMixIn`.

Used by :class:`leasekit.HealthServer` and the Prometheus endpoint of
``leasekit.plugins.otel``.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from typing import Any

__all__ = [
    "EVICT_WAIT",
    "MAX_CONNECTIONS",
    "REQUEST_TIMEOUT",
    "BoundedThreadingMixIn",
    "RequestHeadMixIn",
]

#: Seconds a handler waits for each read of a request (a probe or a scrape
#: sends its request at once; a client that stalls longer is dropped).
REQUEST_TIMEOUT = 5.0
#: Connections served at once; more are closed when accepted. Probes and scrapes
#: come a few at a time, so this only bites a flood.
MAX_CONNECTIONS = 32
#: Seconds a new connection waits for the slot of the connection it evicted (its
#: thread wakes from its read at once; this only bounds a thread that does not).
EVICT_WAIT = 1.0


class BoundedThreadingMixIn(socketserver.ThreadingMixIn):
    """``ThreadingMixIn`` with at most ``max_connections`` handler threads at once.

    A connection accepted while all are busy evicts the oldest connection still
    reading its request head (its socket is shut down, so its thread's read ends
    at once) and takes its slot; when every connection has sent its request, the
    new one is closed without an answer. The threads are daemons (a hung client
    never keeps the process alive). The handler must include
    :class:`RequestHeadMixIn` for a connection to count as having sent its request.
    """

    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    #: The listen backlog (socketserver's default is 5): connections arriving
    #: faster than the loop accepts them wait here instead of retrying their SYN
    #: a second later.
    request_queue_size = 128

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._heads_lock = threading.Lock()
        #: Connections still reading their request head, oldest first (dicts keep order).
        self._reading_head: dict[Any, None] = {}
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve on a new thread, evicting a stalled connection if no slot is free."""
        if not self._slots.acquire(blocking=False) and not (
            self._evict_oldest_reading() and self._slots.acquire(timeout=EVICT_WAIT)
        ):
            # TCPServer.shutdown_request: the mixin always sits on a TCPServer.
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        with self._heads_lock:
            self._reading_head[request] = None
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve one connection, then free its slot."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def request_head_read(self, request: Any) -> None:
        """``request`` has sent its whole request head: it is no longer evictable."""
        with self._heads_lock:
            self._reading_head.pop(request, None)

    def _release(self, request: Any) -> None:
        self.request_head_read(request)
        self._slots.release()

    def _evict_oldest_reading(self) -> bool:
        """Shut down the oldest connection still reading its head; False if there is none."""
        with self._heads_lock:
            if not self._reading_head:
                return False
            oldest = next(iter(self._reading_head))
            del self._reading_head[oldest]
        # Its thread's blocked read returns b"" at once. An OSError: it closed on its
        # own meanwhile, and its slot is coming back anyway.
        with contextlib.suppress(OSError):
            oldest.shutdown(socket.SHUT_RDWR)
        return True


class RequestHeadMixIn:
    """For a handler served by :class:`BoundedThreadingMixIn`: marks when the request head is in.

    ``parse_request`` (``http.server`` and ``wsgiref`` handlers both call it) reads
    the request line's headers; once it returns, the connection has sent its
    request and may no longer be evicted by a newcomer.
    """

    request: Any
    server: Any

    def parse_request(self) -> bool:
        """Parse the request head (the base class's), then mark it read."""
        parsed: bool = super().parse_request()  # type: ignore[misc]
        mark = getattr(self.server, "request_head_read", None)
        if mark is not None:
            mark(self.request)
        return parsed
