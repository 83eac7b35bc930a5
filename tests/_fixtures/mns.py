"""The ``mns_server`` fixture: leasekit's MNS emulator in a subprocess.

Started on first use on a free loopback port, shared by the whole session and
stopped at its end. The credentials reach the child through its environment,
not its command line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from leasekit.emulators._process import ServerProcess, free_port, python_module


@dataclass(frozen=True)
class MnsServer:
    """Where the emulator listens and the key it accepts."""

    endpoint: str
    access_key_id: str
    access_key_secret: str


@pytest.fixture(scope="session")
def mns_server() -> Iterator[MnsServer]:
    """Run ``python -m leasekit.emulators.mns`` for the session and yield its address."""
    port = free_port()
    server = MnsServer(
        endpoint=f"http://127.0.0.1:{port}",
        access_key_id="leasekit-test-key",
        access_key_secret="leasekit-test-secret",
    )
    process = ServerProcess(
        python_module("leasekit.emulators.mns", "--port", str(port), "--log-level", "WARNING"),
        port,
        env={
            "LEASEKIT_MNS_ACCESS_KEY_ID": server.access_key_id,
            "LEASEKIT_MNS_ACCESS_KEY_SECRET": server.access_key_secret,
        },
        name="mns-emulator",
    )
    with process:
        yield server
