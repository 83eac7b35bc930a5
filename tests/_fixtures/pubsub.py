"""The ``pubsub_server`` fixture: leasekit's Pub/Sub emulator in a subprocess.

Started on first use on a free loopback port, shared by the whole session and
stopped at its end. Clients reach it through ``PUBSUB_EMULATOR_HOST`` (the
``address``), as the official client documents; tests set that variable with
``monkeypatch`` or pass ``endpoint=`` to the leasekit backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from leasekit.emulators._process import ServerProcess, free_port, python_module


@dataclass(frozen=True)
class PubSubServer:
    """Where the emulator listens: ``address`` is ``host:port``."""

    address: str
    project: str = "leasekit-test"


@pytest.fixture(scope="session")
def pubsub_server() -> Iterator[PubSubServer]:
    """Run ``python -m leasekit.emulators.pubsub`` for the session and yield its address."""
    pytest.importorskip("google.cloud.pubsub_v1")
    port = free_port()
    process = ServerProcess(
        python_module("leasekit.emulators.pubsub", "--port", str(port), "--log-level", "WARNING"),
        port,
        name="pubsub-emulator",
    )
    with process:
        yield PubSubServer(address=f"127.0.0.1:{port}")
