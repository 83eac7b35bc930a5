"""The azure-servicebus SDK's own samples, from its source distribution on PyPI.

The samples are not copied into this repository: :func:`servicebus_samples` downloads
the SDK's sdist with pip (once; kept under the virtualenv) and unpacks its
``samples/`` folder. Release 7.11.4 is the last whose samples authenticate with a
connection string (``SERVICEBUS_CONNECTION_STR``); later ones use
``DefaultAzureCredential`` against a TLS endpoint, which an emulator without TLS
and Entra ID cannot serve. Their session code is the same as 7.15's (only the
client construction differs), and they run here with the installed SDK.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

#: The azure-servicebus release whose samples the tests run (see the module docstring).
SAMPLES_RELEASE = "7.11.4"


def servicebus_samples() -> Path:
    """The ``samples`` folder of azure-servicebus ``SAMPLES_RELEASE`` (downloaded once).

    Fails the test, saying why, when pip cannot fetch the sdist.
    """
    cache = Path(sys.prefix) / "sdk-samples" / f"azure-servicebus-{SAMPLES_RELEASE}"
    samples = cache / "samples"
    if samples.is_dir():
        return samples
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"azure-servicebus=={SAMPLES_RELEASE}",
            "-d",
            tmp,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        archives = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            pytest.fail(
                f"could not download the azure-servicebus {SAMPLES_RELEASE} sdist for its "
                f"samples: {done.stderr.strip()[-500:]}"
            )
        with tarfile.open(archives[0]) as tar:
            members = [m for m in tar.getmembers() if "/samples/" in m.name and m.isfile()]
            tar.extractall(tmp, members=members, filter="data")
        [root] = [p for p in Path(tmp).iterdir() if p.is_dir()]
        cache.mkdir(parents=True, exist_ok=True)
        shutil.move(root / "samples", samples)
    return samples
