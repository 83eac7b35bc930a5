"""Fixtures for the dashboard's tests: queues on SQLite and memory, and an HTTP client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import leasekit

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from starlette.applications import Starlette
from starlette.testclient import TestClient

from leasekit.dashboard import app


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/dash.db?queue=orders"


@pytest.fixture
def orders(sqlite_url: str) -> Iterator[leasekit.Queue]:
    with leasekit.open(sqlite_url, create=True) as queue:
        yield queue


MakeClient = Callable[..., tuple[TestClient, Starlette]]


@pytest.fixture
def make_client() -> Iterator[MakeClient]:
    """``make_client(queues, **app_kwargs)`` -> (client, app); apps are closed after the test."""
    made: list[tuple[TestClient, Starlette]] = []

    def make(queues: Any, **kwargs: Any) -> tuple[TestClient, Starlette]:
        kwargs.setdefault("allowed_hosts", ["testserver"])
        application = app(queues, **kwargs)
        application.state.dashboard.sample_now()
        client = TestClient(application, follow_redirects=False)
        made.append((client, application))
        return client, application

    yield make
    for _client, application in made:
        application.state.dashboard.close()
