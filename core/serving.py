"""Small HTTP servers on threads that a slow or hostile client cannot pile up.

``http.server``'s threading server starts a thread per connection and its
handlers read without a timeout, so every client that sends half a request and
waits pins a thread for as long as it keeps the connection (300 of them took a
worker from 8 to 307 threads). :class:`BoundedThreadingMixIn` caps the
connections served at once (more are closed at once) and handlers built with
:data:`REQUEST_TIMEOUT` give up on a client that does not finish its request.
Used by :class:`leasekit.HealthServer` and the Prometheus endpoint of
``leasekit.plugins.otel``.
"""

from __future__ import annotations

import socketserver
import threading
from typing import Any

__all__ = ["MAX_CONNECTIONS", "REQUEST_TIMEOUT", "BoundedThreadingMixIn"]

#: Seconds a handler waits for each read of a request (a probe or a scrape
#: sends its request at once; a client that stalls longer is dropped).
REQUEST_TIMEOUT = 5.0
#: Connections served at once; more are closed when accepted. Probes and scrapes
#: come a few at a time, so this only bites a flood.
MAX_CONNECTIONS = 32


class BoundedThreadingMixIn(socketserver.ThreadingMixIn):
    """``ThreadingMixIn`` with at most ``max_connections`` handler threads at once.

    A connection accepted while all are busy is closed without an answer. The
    threads are daemons (a hung client never keeps the process alive).
    """

    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    #: The listen backlog (socketserver's default is 5): connections arriving
    #: faster than the loop accepts them wait here instead of retrying their SYN
    #: a second later.
    request_queue_size = 128

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve on a new thread if a slot is free; close the connection otherwise."""
        if not self._slots.acquire(blocking=False):
            # TCPServer.shutdown_request: the mixin always sits on a TCPServer.
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve one connection, then free its slot."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
