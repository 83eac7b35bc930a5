"""A pool of ``aliyun-mns-sdk`` clients: one keep-alive connection each, timeouts per call."""

from __future__ import annotations

import threading
from typing import Any

from leasekit.deadline import call_timeout

TIMEOUT_SLACK = 0.01


class _Pooled:
    """One SDK client (one HTTP connection) and the SDK ``Queue`` objects made on it."""

    __slots__ = ("client", "queues")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.queues: dict[str, Any] = {}

    def queue(self, name: str) -> Any:
        sdk_queue = self.queues.get(name)
        if sdk_queue is None:
            from mns.queue import Queue as SdkQueue

            sdk_queue = SdkQueue(name, self.client)
            sdk_queue.set_encoding(False)  # leasekit base64-encodes bytes itself
            self.queues[name] = sdk_queue
        return sdk_queue


class _Borrowed:
    """``with pool.queue(name, wait) as sdk_queue:`` — a client for the length of one call.

    On entry the client's connection gets the call's timeouts: a connect
    timeout for opening it, and for reading the time left before core's
    deadline (at most ``read_timeout``, plus ``wait`` for a long poll).
    """

    __slots__ = ("_entry", "_name", "_pool", "_wait")

    def __init__(self, pool: _ClientPool, name: str, wait: float) -> None:
        self._pool = pool
        self._name = name
        self._wait = wait
        self._entry: _Pooled | None = None

    def __enter__(self) -> Any:
        entry = self._entry = self._pool.borrow(self._wait)
        sdk_queue = entry.queues.get(self._name)
        return sdk_queue if sdk_queue is not None else entry.queue(self._name)

    def __exit__(self, *exc_info: object) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            self._pool.give(entry)


class _ClientPool:
    """SDK clients to borrow one call at a time (an ``MNSClient`` is one HTTP connection).

    A client is not thread-safe, so each call takes one from the idle list (or
    makes a new one when all are busy) and gives it back afterwards; the pool
    grows to the peak number of concurrent calls and reuses warm connections
    (last in, first out).
    """

    def __init__(
        self,
        endpoint: str,
        credentials_provider: Any,
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        self.endpoint = endpoint
        self._provider = credentials_provider
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._idle: list[_Pooled] = []
        self._lock = threading.Lock()
        self._closed = False

    def _new(self) -> _Pooled:
        from mns.mns_client import MNSClient

        return _Pooled(MNSClient(self.endpoint, credentials_provider=self._provider))

    def apply_timeouts(self, client: Any, wait: float) -> None:
        """Give ``client``'s connection this call's timeouts, connecting it first if needed.

        The SDK opens its connection inside the request and reads with the
        connect timeout; connecting here lets the two differ (a long poll must
        not be cut at the connect timeout). The SDK's HTTPS connection has no
        timeout of its own: without this a dead peer would block forever.
        """
        read = call_timeout(self._read_timeout + wait)
        assert read is not None
        conn = client.http.conn
        if conn.sock is None:
            connect = min(self._connect_timeout, read)
            conn.timeout = connect  # used by HTTPSConnection.connect
            if hasattr(conn, "connection_timeout"):
                conn.connection_timeout = connect  # MNSHTTPConnection.connect
            try:
                conn.connect()
            except OSError as exc:
                conn.close()
                from mns.mns_exception import MNSClientNetworkException

                raise MNSClientNetworkException(
                    "NetWorkException", f"cannot connect to {self.endpoint}: {exc}"
                ) from exc
        # A reconnect inside the SDK (a dropped keep-alive) uses the read timeout too.
        conn.timeout = read
        if hasattr(conn, "connection_timeout"):
            conn.connection_timeout = read
        sock = conn.sock
        current = sock.gettimeout()
        # Setting a socket's timeout is a system call; the deadline moves a little
        # with every call. Keep the one set unless it would outlast this call's
        # by more than TIMEOUT_SLACK of it, or cut it short by more than a tenth.
        if current is None or not read * 0.9 <= current <= read * (1 + TIMEOUT_SLACK):
            sock.settimeout(read)

    def borrow(self, wait: float) -> _Pooled:
        """An idle client (or a new one) with this call's timeouts; :meth:`give` it back."""
        try:
            entry = self._idle.pop()  # one bytecode-level operation: no lock needed
        except IndexError:
            entry = self._new()
        self.apply_timeouts(entry.client, wait)
        return entry

    def give(self, entry: _Pooled) -> None:
        """Take back a borrowed client (closed instead once the pool is)."""
        with self._lock:
            if not self._closed:
                self._idle.append(entry)
                return
        entry.client.close_connection()

    def queue(self, name: str, wait: float = 0.0) -> _Borrowed:
        """An SDK ``Queue`` for ``name`` on a borrowed client, body encoding off.

        ``wait``: the call's long poll in seconds (the read timeout is extended by it).
        """
        return _Borrowed(self, name, wait)

    def close(self) -> None:
        """Close every idle connection; busy ones close when their call returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for entry in idle:
            entry.client.close_connection()
