"""The dashboard's handlers under cancellation: a request cancelled at its await.

An ASGI server cancels a handler's task when its client goes away. A handler
awaiting a backend call (on a thread) must then end at once, give back its
place among the ``max_connections`` requests served at once, and leave the
dashboard answering: cancelled requests must never pile up into a 503 for
everyone. The app is driven here through the ASGI interface itself, so the
cancellation lands exactly at the awaited backend call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import leasekit
from leasekit.dashboard import app

#: Cancelled requests: more than ``max_connections`` (4 here), so a leaked place shows.
CANCELLED = 10


def _scope(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


async def _get(application: Any, path: str) -> int:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await application(_scope(path), receive, send)
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start"))


def test_a_request_cancelled_at_its_backend_call_frees_its_place() -> None:
    queue = leasekit.open("memory://cancelled", create=True)
    entered = threading.Event()
    release = threading.Event()
    calls = 0
    original = queue.driver.dead_letters

    def blocked(limit: int) -> list[Any]:
        nonlocal calls
        calls += 1
        entered.set()
        release.wait(10)  # a backend that does not answer until the test says so
        return original(limit)

    queue.driver.dead_letters = blocked  # type: ignore[method-assign]
    application = app([queue], allowed_hosts=["testserver"], max_connections=4)
    dashboard = application.state.dashboard
    qid = next(iter(dashboard.targets))

    async def scenario() -> None:
        for _ in range(CANCELLED):
            entered.clear()
            task = asyncio.create_task(_get(application, f"/api/queues/{qid}/dead-letters"))
            while not entered.is_set():  # the handler is awaiting its backend call
                await asyncio.sleep(0.005)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 1)
            assert task.cancelled(), "the handler did not end at its cancellation"
        release.set()
        # Places given back: more requests than max_connections were cancelled, and
        # the dashboard still answers (not 503), backend calls included.
        assert await _get(application, "/") == 200
        assert await _get(application, f"/api/queues/{qid}/dead-letters") == 200

    try:
        asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        release.set()
        dashboard.close()
        queue.close()
    assert calls == CANCELLED + 1
