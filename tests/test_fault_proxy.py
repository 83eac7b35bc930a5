"""The fault-injecting proxy (``tests/_fixtures/fault_proxy.py``) does what each mode promises.

First against two tiny in-process servers (an echo server and an HTTP server that
counts requests), then in front of each real server the suite runs (the MNS
emulator, moto, Azurite, the Service Bus emulator): a leasekit queue opened
through the proxy works in pass mode and gets a typed leasekit error in drop mode.
"""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from _fixtures.azurite import Azurite
from _fixtures.fault_proxy import FaultProxy, MakeProxy

import leasekit
from leasekit import BackendUnavailable, LeaseError, Queue

# ------------------------------------------------------------ tiny servers


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with self.request, contextlib.suppress(ConnectionError):  # the proxy resets it
            while data := self.request.recv(65536):
                self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    request_queue_size = 64  # the default 5 drops SYNs from a burst of proxied connections
    allow_reuse_address = True
    block_on_close = False


class _CountingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.requests += 1
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CountingHandler)
        self.requests = 0
        self.lock = threading.Lock()


@pytest.fixture(scope="module")
def echo_port() -> Iterator[int]:
    server = _EchoServer(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def http_server() -> Iterator[_HttpServer]:
    server = _HttpServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


REQUEST = b"GET / HTTP/1.1\r\nHost: proxy-test\r\n\r\n"


def _connect(proxy: FaultProxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection((proxy.host, proxy.port), timeout=timeout)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def _read_response(sock: socket.socket) -> bytes:
    """Read one HTTP response from the counting server (its body is ``ok``)."""
    data = b""
    while not data.endswith(b"\r\n\r\nok"):
        chunk = sock.recv(4096)
        if not chunk:
            raise EOFError(f"connection closed after {data!r}")
        data += chunk
    return data


def _is_cut(sock: socket.socket) -> bool:
    """Whether the connection was reset or closed by the other end (waits up to 5 s)."""
    sock.settimeout(5)
    try:
        sock.sendall(b"x")
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _new_connection_is_cut(proxy: FaultProxy) -> bool:
    """Whether a new connection is accepted and then reset or closed (the RST may already
    arrive while ``connect`` returns).
    """
    try:
        sock = _connect(proxy)
    except ConnectionResetError:
        return True
    with sock:
        return _is_cut(sock)


def _echo(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    return _recv_exactly(sock, len(data))


# ------------------------------------------------------------------- modes


def test_pass_round_trips_bytes_both_ways_and_counts_them(
    fault_proxy: MakeProxy, echo_port: int
) -> None:
    proxy = fault_proxy(echo_port)
    assert proxy.mode == "pass"
    assert proxy.endpoint() == f"http://127.0.0.1:{proxy.port}"
    assert proxy.endpoint("sb") == f"sb://127.0.0.1:{proxy.port}"
    payload = os.urandom(300_000)  # several chunks each way
    with _connect(proxy) as sock:
        assert _echo(sock, payload) == payload
    stats = proxy.stats
    assert stats["accepted"] == 1
    assert stats["bytes_to_target"] == stats["bytes_to_client"] == len(payload)
    assert stats["resets"] == 0


def test_drop_resets_open_and_new_connections_until_pass(
    fault_proxy: MakeProxy, echo_port: int
) -> None:
    proxy = fault_proxy(echo_port)
    opened = [_connect(proxy) for _ in range(3)]
    for sock in opened:
        assert _echo(sock, b"before") == b"before"

    proxy.drop()
    assert proxy.mode == "drop"
    assert proxy.stats["open"] == 0
    with pytest.raises(ConnectionResetError):
        opened[0].recv(1)  # the RST arrived before drop() returned
    assert all(_is_cut(sock) for sock in opened[1:])
    assert _new_connection_is_cut(proxy)  # the listener accepts, then resets at once
    assert proxy.stats["resets"] == 4

    proxy.pass_()
    with _connect(proxy) as sock:
        assert _echo(sock, b"after") == b"after"
    for sock in opened:
        sock.close()


def test_blackhole_holds_a_request_until_pass_on_the_same_connection(
    fault_proxy: MakeProxy, http_server: _HttpServer
) -> None:
    proxy = fault_proxy(http_server.server_address[1])
    with _connect(proxy) as old:
        old.sendall(REQUEST)
        assert _read_response(old).startswith(b"HTTP/1.1 200")
        before = http_server.requests

        proxy.blackhole()
        with _connect(proxy) as new:  # accepted, never answered
            for sock in (old, new):
                sock.sendall(REQUEST)
                sock.settimeout(0.3)
                with pytest.raises(TimeoutError):
                    sock.recv(1)
            assert http_server.requests == before  # nothing reached the server
            assert proxy.stats["open"] == 2

            proxy.pass_()
            for sock in (old, new):
                sock.settimeout(5)
                assert _read_response(sock).startswith(b"HTTP/1.1 200")
    assert http_server.requests == before + 2


def test_blackhole_does_not_replay_a_request_whose_client_gave_up(
    fault_proxy: MakeProxy, http_server: _HttpServer
) -> None:
    proxy = fault_proxy(http_server.server_address[1])
    with _connect(proxy) as kept:
        kept.sendall(REQUEST)
        _read_response(kept)
        before = http_server.requests
        proxy.blackhole()
        kept.sendall(REQUEST)
        with _connect(proxy) as gave_up:
            gave_up.sendall(REQUEST)
        # Its FIN reaches the proxy's socket at once over loopback (and is not read).
        with _connect(proxy) as probe:  # a new connection that stays open
            probe.sendall(REQUEST)
            deadline = time.monotonic() + 5
            while proxy.stats["accepted"] != 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            proxy.pass_()
            assert proxy.stats["open"] == 2  # the abandoned one was closed, not resumed
            for sock in (kept, probe):
                assert _read_response(sock).startswith(b"HTTP/1.1 200")
    assert http_server.requests == before + 2


def test_latency_delays_every_chunk_in_both_directions(
    fault_proxy: MakeProxy, echo_port: int
) -> None:
    proxy = fault_proxy(echo_port)
    proxy.latency = 0.2
    with _connect(proxy) as sock:
        started = time.monotonic()
        assert _echo(sock, b"ping") == b"ping"
        assert time.monotonic() - started >= 0.4  # 0.2 s up, 0.2 s down
        proxy.latency = 0
        assert _echo(sock, b"pong") == b"pong"
    with pytest.raises(ValueError):
        proxy.latency = -1


def test_stop_returns_promptly_with_connections_parked_in_blackhole(
    echo_port: int,
) -> None:
    proxy = FaultProxy("127.0.0.1", echo_port, name="stop-test").start()
    clients = [_connect(proxy) for _ in range(20)]
    for sock in clients[:10]:
        assert _echo(sock, b"x") == b"x"  # connected to the target before the blackhole
    proxy.blackhole()
    for sock in clients:
        sock.sendall(b"held")
    thread = proxy._thread
    started = time.monotonic()
    proxy.stop()
    assert time.monotonic() - started < 2
    assert thread is not None and not thread.is_alive()
    assert all(_is_cut(sock) for sock in clients)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((proxy.host, proxy.port), timeout=2)
    for sock in clients:
        sock.close()


def test_modes_are_checked_and_a_context_manager_stops_the_proxy(echo_port: int) -> None:
    with FaultProxy("127.0.0.1", echo_port) as proxy:
        with pytest.raises(ValueError, match="blackhole"):
            proxy.set_mode("partition")
        assert proxy.mode == "pass"
        assert "pass" in repr(proxy)
        port = proxy.port
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_a_target_that_is_down_looks_like_a_reset(fault_proxy: MakeProxy) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    proxy = fault_proxy(closed_port)
    assert _new_connection_is_cut(proxy)


# ------------------------------------------------- in front of real servers


def _prove_pass_then_drop(q: Queue, proxy: FaultProxy, *, lock_on_connection: bool) -> None:
    """Send and lease through the proxy; a send fails typed in drop mode; pass recovers.

    ``lock_on_connection``: the backend ties a lease to the connection that took it
    (Service Bus settles only on the receiving AMQP link), so a reset loses it.
    """
    q.send(b"through the proxy")
    leases = q.lease(1, wait=5)
    assert [lease.message.body for lease in leases] == [b"through the proxy"]
    assert proxy.stats["bytes_to_target"] > 0 and proxy.stats["bytes_to_client"] > 0

    proxy.drop()
    with pytest.raises(BackendUnavailable):
        q.send(b"lost in a reset")
    assert proxy.stats["resets"] >= 1

    proxy.pass_()
    if lock_on_connection:
        with pytest.raises(LeaseError):
            leases[0].complete()
    else:
        leases[0].complete()  # over a new connection: the receipt outlives the reset
    q.send(b"after the outage")  # the client reconnects once the proxy forwards again
    again = q.lease(1, wait=5)
    assert [lease.message.body for lease in again] == [b"after the outage"]
    again[0].complete()


def _port(endpoint: str) -> int:
    port = urlsplit(endpoint).port
    assert port is not None
    return port


def test_mns_emulator_through_the_proxy(fault_proxy: MakeProxy, mns_server: Any) -> None:
    proxy = fault_proxy(_port(mns_server.endpoint))
    q = leasekit.open(
        "aliyun-mns",
        queue=f"proxy-{uuid.uuid4().hex[:12]}",
        create=True,
        endpoint=proxy.endpoint(),
        access_key_id=mns_server.access_key_id,
        access_key_secret=mns_server.access_key_secret,
    )
    try:
        _prove_pass_then_drop(q, proxy, lock_on_connection=False)
    finally:
        q.delete_queue()
        q.close()


def test_moto_sqs_through_the_proxy(fault_proxy: MakeProxy, moto_server: Any) -> None:
    proxy = fault_proxy(_port(moto_server.endpoint))
    options = {**moto_server.options, "endpoint_url": proxy.endpoint(), "max_attempts": 1}
    q = leasekit.open("aws-sqs", queue=f"proxy-{uuid.uuid4().hex[:12]}", create=True, **options)
    try:
        _prove_pass_then_drop(q, proxy, lock_on_connection=False)
    finally:
        q.delete_queue()
        q.close()


def test_azurite_through_the_proxy(fault_proxy: MakeProxy, azurite: Azurite) -> None:
    proxy = fault_proxy(azurite.port)
    via_proxy = Azurite(host=proxy.host, port=proxy.port)
    q = leasekit.open(
        "azure-storage-queue",
        queue=f"proxy-{uuid.uuid4().hex[:12]}",
        create=True,
        connection_string=via_proxy.connection_string,
        retry_total=0,
    )
    try:
        _prove_pass_then_drop(q, proxy, lock_on_connection=False)
    finally:
        q.delete_queue()
        q.close()


def test_servicebus_emulator_through_the_proxy(
    fault_proxy: MakeProxy, servicebus_server: Any
) -> None:
    pytest.importorskip("azure.servicebus")
    from leasekit.emulators.servicebus import connection_string

    proxy = fault_proxy(servicebus_server.port)
    q = leasekit.open(
        "azure-service-bus",
        queue=servicebus_server.queue_name("proxy"),
        create=True,
        connection_string=connection_string(proxy.host, proxy.port),
        admin_port=servicebus_server.http_port,
        lock_duration=5,
        retry_total=0,
    )
    try:
        _prove_pass_then_drop(q, proxy, lock_on_connection=True)
    finally:
        q.delete_queue()
        q.close()
