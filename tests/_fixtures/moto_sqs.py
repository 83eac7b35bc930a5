"""The ``moto_server`` fixture: moto's server (``python -m moto.server``) for the SQS tests.

Started on first use on a free loopback port, shared by the whole session and
stopped at its end. Dummy credentials reach the child through its environment;
clients get them as keyword options (``MotoServer.options``), so the test
process's environment is left alone.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from leasekit.emulators._process import ServerProcess, free_port, python_module

REGION = "us-east-1"
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"  # moto's documented dummy value; not a secret


@dataclass(frozen=True)
class MotoServer:
    """Where moto listens, and the options that open an ``aws-sqs`` queue on it."""

    endpoint: str
    region: str = REGION
    options: dict[str, Any] = field(default_factory=dict, repr=False)

    def reset(self) -> None:
        """Drop every queue and message (``POST /moto-api/reset``)."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """Run ``python -m moto.server -H 127.0.0.1 -p PORT`` for the session and yield its address."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = MotoServer(
        endpoint=endpoint,
        options={
            "region": REGION,
            "endpoint_url": endpoint,
            "aws_access_key_id": ACCESS_KEY_ID,
            "aws_secret_access_key": SECRET_ACCESS_KEY,
        },
    )
    process = ServerProcess(
        python_module("moto.server", "-H", "127.0.0.1", "-p", str(port)),
        port,
        env={
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_DEFAULT_REGION": REGION,
        },
        name="moto-server",
    )
    with process:
        yield server
