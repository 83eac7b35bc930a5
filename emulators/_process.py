"""Start and stop a local server process on a free loopback port.

Every emulator and test server leasekit's tests need (Azurite, moto, the MNS and
Service Bus emulators) is started through :class:`ServerProcess`, so they all
share one way to pick a port, wait until the port accepts connections, and stop
the process (SIGTERM, then SIGKILL after a grace period) without leaving it behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import IO

__all__ = [
    "PORTS_ENV",
    "ServerProcess",
    "ServerStartError",
    "free_port",
    "launch_argv",
    "python_module",
    "wait_for_port",
]

LOOPBACK = "127.0.0.1"

#: Environment variable ``FIRST-LAST``: :func:`free_port` takes ports from this
#: range only. leasekit's test run gives each parallel worker a range of its own,
#: below the kernel's ephemeral ports, so that two workers never pick the same
#: port and no client connection holds one as its local port.
PORTS_ENV = "LEASEKIT_TEST_PORTS"

_ports_lock = threading.Lock()
_next_port: dict[tuple[int, int], int] = {}  # range -> where the next search starts


class ServerStartError(RuntimeError):
    """Raised when a server process exits or does not open its port in time."""


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that is free right now.

    The port is released before returning, so another process could take it
    before the server binds it. Where :data:`PORTS_ENV` names a range, the port
    comes from that range, searched from just after the previous call's port,
    so no other worker of the test run and not this process's next call picks
    it. Otherwise the kernel picks one of its ephemeral ports, and workers of a
    parallel run could get the same one.
    """
    span = _port_range()
    if span is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
            return port
    first, last = span
    size = last - first + 1
    with _ports_lock:
        start = _next_port.get(span, first + random.randrange(size))
        for step in range(size):
            candidate = first + (start - first + step) % size
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, candidate))
                except OSError:
                    continue
            _next_port[span] = first + (candidate - first + 1) % size
            return candidate
    raise OSError(f"no free port on {host} in {PORTS_ENV}={first}-{last}")


def _port_range() -> tuple[int, int] | None:
    """``(first, last)`` from :data:`PORTS_ENV`, or ``None`` if it is not set."""
    text = os.environ.get(PORTS_ENV, "").strip()
    if not text:
        return None
    first_text, _, last_text = text.partition("-")
    try:
        first, last = int(first_text), int(last_text)
    except ValueError:
        raise ValueError(
            f"{PORTS_ENV} must be FIRST-LAST (two port numbers), not {text!r}"
        ) from None
    if not 1 <= first <= last <= 65535:
        raise ValueError(f"{PORTS_ENV}={text!r} is not a range of TCP ports")
    return first, last


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    """Poll until ``host:port`` accepts a TCP connection or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
    return False


class ServerProcess:
    """A subprocess serving on ``host:port``; a context manager.

    Parameters:
        argv: the command line to run.
        port: the port the command will listen on (see :func:`free_port`).
        host: the address it listens on; loopback by default.
        env: extra environment variables for the child.
        cwd: working directory for the child.
        start_timeout: seconds to wait for the port to open.
        name: a short name for error messages.
        user: the user to run the child as (a server that refuses root, run as root).

    The child's stdout and stderr go to a temporary file whose tail is put in
    the :class:`ServerStartError` message if the server fails to start.
    """

    def __init__(
        self,
        argv: Sequence[str],
        port: int,
        *,
        host: str = LOOPBACK,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        start_timeout: float = 30.0,
        name: str | None = None,
        user: str | None = None,
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.host = host
        self.env = dict(env or {})
        self.cwd = cwd
        self.start_timeout = start_timeout
        self.name = name or os.path.basename(self.argv[0])
        self.user = user
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __repr__(self) -> str:
        return f"<ServerProcess {self.name} {self.host}:{self.port}>"

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._proc.pid if self._proc else None

    def start(self) -> ServerProcess:
        """Start the process and wait until its port accepts connections."""
        env = {**os.environ, **self.env}
        argv = launch_argv(self.argv, user=self.user, path=env.get("PATH"))
        self._log = tempfile.TemporaryFile(prefix=f"{self.name}-")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.cwd,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                out = self.output()
                self.stop()
                raise ServerStartError(
                    f"{self.name} exited with code {self._proc.returncode} before "
                    f"listening on {self.host}:{self.port}:\n{out[-4000:]}"
                )
            # A child that died meanwhile did not start, whoever answers on its port
            # (another process took the port first); the check above then says so.
            if wait_for_port(self.host, self.port, timeout=0.2) and self._proc.poll() is None:
                return self
        out = self.output()
        self.stop()
        raise ServerStartError(
            f"{self.name} did not listen on {self.host}:{self.port} within "
            f"{self.start_timeout:.0f} s:\n{out[-4000:]}"
        )

    def exit_code(self) -> int | None:
        """The child's exit code once it has exited (negative: the signal), else ``None``."""
        return None if self._proc is None else self._proc.poll()

    def output(self) -> str:
        """Everything the child printed so far."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        data = self._log.read()
        self._log.seek(0, os.SEEK_END)
        return data.decode("utf-8", "replace")

    def stop(self, grace: float = 5.0) -> None:
        """Stop the process group: SIGTERM, then SIGKILL after ``grace`` seconds."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


#: Runs in a fresh interpreter in place of the server, then becomes it (``exec``):
#: asks Linux for SIGTERM when the starting thread dies, leaves if that has
#: already happened, takes the user's uid if one is named. argv: the parent's
#: pid, the user ("" for none), the server's argv.
_LAUNCHER = """
import os, signal, sys
parent, user, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
if sys.platform.startswith("linux"):
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
if os.getppid() != parent:
    sys.exit(f"the process that started {argv[0]} has already gone")
if user:
    import pwd
    uid = pwd.getpwnam(user).pw_uid
    os.setreuid(uid, uid)
os.execvp(argv[0], argv)
"""


def launch_argv(
    argv: Sequence[str], *, user: str | None = None, path: str | None = None
) -> list[str]:
    """Argv that runs ``argv`` as a child that dies with this process, as ``user`` if named.

    The child gets SIGTERM when the thread that started it dies (Linux), so a
    server in a session of its own does not outlive a test run killed before
    its fixtures tear down.

    This is done by a small launcher that ``exec``s the server, not by
    ``subprocess``'s ``preexec_fn`` or ``user``: those make ``subprocess`` fork
    the whole process (where it otherwise uses ``vfork``), and a fork runs the
    fork handlers of every library loaded. gRPC's (grpcio 1.81 and later,
    grpc/grpc#43055) restart its poller thread in the child, which aborts on
    the epoll descriptor that ``close_fds`` closes before ``exec``: about one
    start in 300 died with code -6 beside a live gRPC channel here.

    Raises ``FileNotFoundError`` here, as ``subprocess`` would, when the
    program is not found on ``path`` (default: this process's ``PATH``).
    """
    if not argv:
        raise ValueError("no command to launch")
    if shutil.which(argv[0], path=path) is None:
        raise FileNotFoundError(f"no such program: {argv[0]!r}")
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), user or "", *argv]


def python_module(module: str, *args: str) -> list[str]:
    """Argv that runs ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]
