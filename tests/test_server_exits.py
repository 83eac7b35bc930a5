"""Test servers: a dead one is named in a failed test's report; workers never share a port;
starting one runs no fork handler and it dies with the process that started it."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import pytest
from _fixtures.server_exits import dead_servers

from leasekit.emulators._process import PORTS_ENV, ServerProcess, free_port, launch_argv

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


#: Set while a test below watches for forks of this process.
_forks_seen: list[int] | None = None


def _count_fork() -> None:
    if _forks_seen is not None:
        _forks_seen.append(1)


os.register_at_fork(before=_count_fork)  # once per process: it cannot be unregistered


def test_starting_a_server_runs_no_fork_handler() -> None:
    """A full fork runs every loaded library's fork handlers; gRPC's abort the child.

    ``preexec_fn`` or ``user`` made ``subprocess`` fork this whole process, and
    one server start in about 300 beside a live gRPC channel died with code -6
    (grpc/grpc#43055). Without them it uses ``vfork``, which runs none: Python's
    own ``before`` fork hook stands here for gRPC's ``pthread_atfork`` ones.
    """
    global _forks_seen
    port = free_port()
    _forks_seen = []
    try:
        subprocess.run(["true"], preexec_fn=lambda: None, check=True)  # the check can fail
        assert _forks_seen == [1], "a preexec_fn forks and runs the fork hooks"
        _forks_seen = []
        argv = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
        with ServerProcess(argv, port, name="no-fork"):
            pass
        subprocess.run(launch_argv(["true"], user="root" if os.getuid() == 0 else None), check=True)
        assert _forks_seen == []
    finally:
        _forks_seen = None


def test_a_server_dies_with_the_process_that_started_it() -> None:
    """Killed without a chance to stop its servers, a process takes them with it."""
    starter = textwrap.dedent(
        """
        import subprocess, sys, time
        from leasekit.emulators._process import launch_argv
        child = subprocess.Popen(launch_argv(["sleep", "60"]), start_new_session=True)
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    with subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        try:
            deadline = time.monotonic() + 10
            while _comm(child) != "sleep":
                assert time.monotonic() < deadline, "the launcher never became the server"
                time.sleep(0.02)  # a poll with a deadline
            parent.kill()
            parent.wait()
            deadline = time.monotonic() + 10
            while _state(child) not in (None, "Z"):
                assert time.monotonic() < deadline, "the server outlived its starter"
                time.sleep(0.02)  # a poll with a deadline
        finally:
            parent.kill()
            if _comm(child) == "sleep":  # the test failed: do not leave it behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)


def test_a_missing_program_is_not_found_before_anything_starts() -> None:
    with pytest.raises(FileNotFoundError, match="no-such-server"):
        ServerProcess(["no-such-server"], free_port()).start()


def _state(pid: int) -> str | None:
    """The process's state letter in ``/proc`` (``None``: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def _comm(pid: int) -> str | None:
    """The process's command name in ``/proc`` (``None``: gone)."""
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except FileNotFoundError:
        return None
