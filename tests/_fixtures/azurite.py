"""The ``azurite`` fixture: Microsoft's Azure Storage emulator (queue service) in a subprocess.

Azurite is pinned in the repository's ``package.json``/``package-lock.json`` and
installed with ``npm ci`` in the repository root. It is started on first use on
a free loopback port with in-memory storage, shared by the whole session and
stopped at its end. Tests should use a fresh queue each and delete it: Azurite
slows down as its store grows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from leasekit.emulators._process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
AZURITE_QUEUE = ROOT / "node_modules" / ".bin" / "azurite-queue"

#: Azurite's well-known development account (public, documented by Microsoft).
ACCOUNT_NAME = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@dataclass(frozen=True)
class Azurite:
    """Where Azurite's queue service listens and how to reach it."""

    host: str
    port: int
    account_name: str = ACCOUNT_NAME
    account_key: str = field(default=ACCOUNT_KEY, repr=False)

    @property
    def account_url(self) -> str:
        """The path-style queue endpoint, ``http://127.0.0.1:PORT/devstoreaccount1``."""
        return f"http://{self.host}:{self.port}/{self.account_name}"

    @property
    def connection_string(self) -> str:
        """A connection string for the development account."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.account_name};"
            f"AccountKey={self.account_key};QueueEndpoint={self.account_url}"
        )


def azurite_argv(port: int, host: str = "127.0.0.1") -> list[str]:
    """The command line that runs Azurite's queue service on ``host:port``, in memory."""
    if not AZURITE_QUEUE.exists():
        raise FileNotFoundError(
            f"Azurite is not installed ({AZURITE_QUEUE} is missing): run `npm ci` in {ROOT} "
            "(it installs the version pinned in package-lock.json; needs Node >= 20)"
        )
    return [
        str(AZURITE_QUEUE),
        "--queueHost",
        host,
        "--queuePort",
        str(port),
        "--inMemoryPersistence",
        "--silent",
        "--disableTelemetry",
        "--skipApiVersionCheck",
    ]


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """Run Azurite's queue service for the session and yield its address."""
    port = free_port()
    try:
        argv = azurite_argv(port)
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    with ServerProcess(argv, port, cwd=str(ROOT), name="azurite-queue"):
        yield Azurite(host="127.0.0.1", port=port)
