"""The health and metrics servers under clients that send half a request and wait.

Each such client used to pin a server thread for as long as it kept its
connection (300 of them: 8 -> 307 threads). Now each server serves at most
``MAX_CONNECTIONS`` connections at once and drops a client that does not finish
its request within ``REQUEST_TIMEOUT``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

import leasekit
from leasekit.serving import MAX_CONNECTIONS, REQUEST_TIMEOUT

#: Clients that send half a request and keep the connection open.
STALLED = 300


@contextlib.contextmanager
def _health_server() -> Iterator[str]:
    with leasekit.HealthServer(lambda: leasekit.Health(live=True, ready=True)) as server:
        yield f"{server.url}/livez"


@contextlib.contextmanager
def _prometheus_server() -> Iterator[str]:
    otel = pytest.importorskip("leasekit.plugins.otel")
    endpoint = otel.start_prometheus_server(port=0, host="127.0.0.1")
    try:
        yield endpoint.url
    finally:
        endpoint.shutdown()


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("serve", [_health_server, _prometheus_server], ids=["health", "metrics"])
def test_half_sent_requests_do_not_pin_server_threads(
    serve: Callable[[], contextlib.AbstractContextManager[str]],
    record_property: Callable[[str, object], None],
) -> None:
    with serve() as url:
        host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        baseline = threading.active_count()
        stalled: list[socket.socket] = []
        peak = baseline
        try:
            for _ in range(STALLED):
                client = socket.create_connection((host, int(port)), timeout=5)
                client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: unfinished
                stalled.append(client)
                peak = max(peak, threading.active_count())
            time.sleep(0.2)  # let the server accept the last ones
            peak = max(peak, threading.active_count())
            record_property("peak_extra_threads", peak - baseline)
            assert peak - baseline <= MAX_CONNECTIONS + 2, (
                f"{peak - baseline} threads for {STALLED} stalled clients"
            )
            # The clients keep their connections; the server lets go of them.
            began = time.monotonic()
            _wait_until(
                lambda: threading.active_count() <= baseline + 1,
                REQUEST_TIMEOUT + 3,
                "the server's threads to end",
            )
            record_property("threads_back_after_s", round(time.monotonic() - began, 2))
            with urllib.request.urlopen(url, timeout=5) as response:
                assert response.status == 200
        finally:
            for client in stalled:
                client.close()


#: Slow clients in the flood: twice the cap, so every slot is taken and more wait.
FLOOD = 2 * MAX_CONNECTIONS


@pytest.mark.parametrize("serve", [_health_server, _prometheus_server], ids=["health", "metrics"])
def test_probes_are_answered_while_slow_clients_hold_every_connection(
    serve: Callable[[], contextlib.AbstractContextManager[str]],
    record_property: Callable[[str, object], None],
) -> None:
    """A flood of clients that never finish their request cannot keep a probe unanswered.

    Before the eviction rule, the 33rd connection was closed unanswered: a local
    client holding 32 slow connections failed every liveness probe.
    """
    with serve() as url:
        host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        paths = ["/livez", "/readyz"] if "livez" in url else [""]
        base = url.rsplit("/", 1)[0] if "livez" in url else url
        stalled: list[socket.socket] = []
        stop = threading.Event()

        def flood() -> None:
            # Keep opening stalled connections for the whole test (bounded in count).
            for _ in range(FLOOD * 4):
                if stop.is_set():
                    return
                try:
                    client = socket.create_connection((host, int(port)), timeout=5)
                    client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never finished
                except OSError:
                    continue
                stalled.append(client)
                time.sleep(0.01)

        try:
            for _ in range(FLOOD):
                client = socket.create_connection((host, int(port)), timeout=5)
                client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
                stalled.append(client)
            flooder = threading.Thread(target=flood, daemon=True)
            flooder.start()
            slowest = 0.0
            for _ in range(10):
                for path in paths:
                    began = time.monotonic()
                    with urllib.request.urlopen(base + path, timeout=5) as response:
                        assert response.status == 200
                    slowest = max(slowest, time.monotonic() - began)
            record_property("slowest_probe_s", round(slowest, 3))
            assert slowest < 2.0, f"a probe took {slowest:.2f} s under the flood"
        finally:
            stop.set()
            for client in stalled:
                client.close()
