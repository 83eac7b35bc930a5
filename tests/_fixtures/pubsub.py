"""Pub/Sub fixtures: leasekit's emulator in a subprocess, and the client's own system tests.

``pubsub_server`` starts the emulator on first use on a free loopback port, shares
it with the whole session and stops it at its end. Clients reach it through
``PUBSUB_EMULATOR_HOST`` (the ``address``), as the official client documents;
tests set that variable with ``monkeypatch`` or pass ``endpoint=`` to the
leasekit backend. ``pubsub_system_tests`` fetches the client's ``tests/system.py``.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


#: The packages the client's ``tests/system.py`` imports besides the client itself,
#: installed (once) into a folder of their own, never into the virtualenv: ``flaky``
#: is a pytest plugin and would load into every test run.
SYSTEM_TEST_DEPS = ("flaky==3.8.1", "google-cloud-testutils==1.10.1")


@dataclass(frozen=True)
class PubSubSystemTests:
    """The client's own ``tests/system.py`` and a folder with the packages it imports."""

    system_py: Path
    deps: Path
    version: str


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pip", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="session")
def pubsub_system_tests() -> PubSubSystemTests:
    """``tests/system.py`` of the installed google-cloud-pubsub's sdist (downloaded once).

    Kept under the virtualenv, as the Service Bus samples are. Fails the test,
    saying why, when pip cannot fetch the sdist or the test packages.
    """
    pytest.importorskip("google.cloud.pubsub_v1")
    version = importlib.metadata.version("google-cloud-pubsub")
    cache = Path(sys.prefix) / "sdk-samples" / f"google-cloud-pubsub-{version}"
    system_py, deps = cache / "system.py", cache / "deps"
    if not system_py.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            done = _pip(
                "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                f"google-cloud-pubsub=={version}", "-d", tmp,
            )  # fmt: skip
            archives = list(Path(tmp).glob("*.tar.gz"))
            if done.returncode != 0 or not archives:
                pytest.fail(
                    f"could not download the google-cloud-pubsub {version} sdist for its "
                    f"tests/system.py: {done.stderr.strip()[-500:]}"
                )
            with tarfile.open(archives[0]) as tar:
                [member] = [m for m in tar.getmembers() if m.name.endswith("/tests/system.py")]
                tar.extractall(tmp, members=[member], filter="data")
            cache.mkdir(parents=True, exist_ok=True)
            shutil.move(Path(tmp) / member.name, system_py)
    if not (deps / "flaky").is_dir():
        done = _pip("install", "--quiet", "--no-deps", "--target", str(deps), *SYSTEM_TEST_DEPS)
        if done.returncode != 0:
            pytest.fail(f"could not install {SYSTEM_TEST_DEPS}: {done.stderr.strip()[-500:]}")
    return PubSubSystemTests(system_py=system_py, deps=deps, version=version)
