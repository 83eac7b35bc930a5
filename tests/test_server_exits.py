"""Test servers: a dead one is named in a failed test's report; workers never share a port."""

from __future__ import annotations

import itertools
import socket
import sys
import time
from dataclasses import dataclass

import pytest
from _fixtures.server_exits import dead_servers

from leasekit.emulators._process import PORTS_ENV, ServerProcess, free_port

# Listens, says goodbye, exits with code 3 once a client has connected.
SERVER = """
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
s.accept()
print("goodbye from the server", flush=True)
sys.exit(3)
"""


@dataclass
class _Server:
    process: ServerProcess


def test_a_dead_server_is_found_with_its_exit_code_and_output() -> None:
    port = free_port()
    process = ServerProcess([sys.executable, "-c", SERVER, str(port)], port, name="dies")
    process.start()  # its port answered: the server accepted and is exiting
    try:
        deadline = time.monotonic() + 10
        while process.exit_code() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # a poll with a deadline
        found = dead_servers({"server": _Server(process), "other": 1, "itself": process})
        assert [name for name, _ in found] == ["server", "itself"]
        assert process.exit_code() == 3
        assert "goodbye from the server" in process.output()
    finally:
        process.stop()


def test_a_live_server_is_not_reported() -> None:
    port = free_port()
    with ServerProcess(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)], port, name="lives"
    ) as process:
        assert dead_servers({"server": _Server(process)}) == []
        assert process.exit_code() is None


def test_free_ports_come_from_the_range_named_and_never_twice_in_a_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # 20 ports after it: other processes' connections may hold some of them
        # (the held port is an ephemeral one), not all.
        last = min(taken + 20, 65535)
        monkeypatch.setenv(PORTS_ENV, f"{taken}-{last}")
        ports = [free_port() for _ in range(4)]
    assert taken not in ports  # in use: skipped
    assert all(taken < port <= last for port in ports)
    assert all(a != b for a, b in itertools.pairwise(ports))


@pytest.mark.parametrize("text", ["20000", "x-y", "30000-20000", "0-10"])
def test_a_bad_port_range_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(PORTS_ENV, text)
    with pytest.raises(ValueError, match=PORTS_ENV):
        free_port()
