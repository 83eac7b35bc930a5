"""The taskiq broker, run by taskiq's own receiver (``taskiq.api.run_receiver_task``).

Each test runs its coroutine with ``asyncio.run``. Backends: SQLite, memory and
SQS (moto's server, the session fixture ``moto_server``), Redis, and Pub/Sub
(leasekit's emulator, ``pubsub_server``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from taskiq.api import run_receiver_task
from taskiq.middlewares import SimpleRetryMiddleware

import leasekit
from leasekit.plugins.taskiq import TASK_NAME, LeasekitBroker


@contextlib.asynccontextmanager
async def worker(broker: LeasekitBroker) -> AsyncIterator[None]:
    """The broker started and taskiq's receiver running on it, stopped on leaving."""
    await broker.startup()
    task = asyncio.create_task(run_receiver_task(broker, max_async_tasks=10))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await broker.shutdown()


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture(params=["sqlite", "memory", "sqs", "redis", "gcp-pubsub"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(url, open options) of a fresh queue on each backend; the queue is created."""
    name = f"tq-{uuid.uuid4().hex[:10]}"
    if request.param == "sqlite":
        url, options = f"sqlite:///{tmp_path}/taskiq.db?queue={name}", {}
    elif request.param == "memory":
        url, options = f"memory://{name}", {}
    elif request.param == "redis":
        url, options = f"{request.getfixturevalue('redis_server').url()}?queue={name}", {}
    elif request.param == "gcp-pubsub":
        server = request.getfixturevalue("pubsub_server")
        url = f"gcp-pubsub://{server.project}/{name}?endpoint={server.address}"
        options = {"dead_letter_topic": "tq-dead-letters"}  # exact delivery counts
    else:
        moto = request.getfixturevalue("moto_server")
        url, options = "aws-sqs", {"queue": name, **moto.options}
    with leasekit.open(url, create=True, **options) as queue:
        yield url, options
        queue.delete_queue()


def _empty(url: str, options: dict[str, Any]) -> bool:
    with leasekit.open(url, **options) as queue:
        leases = queue.lease(10, wait=0)
        for lease in leases:
            lease.abandon()
        return not leases


def test_kicked_tasks_run_once_each_and_their_messages_are_completed(
    target: tuple[str, dict[str, Any]],
) -> None:
    url, options = target
    broker = LeasekitBroker(url, lease_duration=2, **options)
    done: list[int] = []

    @broker.task
    async def add(x: int) -> None:
        done.append(x)

    async def main() -> None:
        async with worker(broker):
            for x in range(5):
                await add.kiq(x)
            await until(lambda: len(done) == 5, 30, "five tasks")

    asyncio.run(main())
    assert sorted(done) == [0, 1, 2, 3, 4]
    assert _empty(url, options)


def test_kick_writes_the_task_name_as_a_property(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/p.db?queue=p"
    broker = LeasekitBroker(url, create=True)

    @broker.task(task_name="named")
    async def named() -> None:  # pragma: no cover - never run here
        pass

    async def main() -> None:
        await broker.startup()
        await named.kiq()
        await broker.shutdown()

    asyncio.run(main())
    with leasekit.open(url) as queue:
        [lease] = queue.lease()
        assert lease.message.properties[TASK_NAME] == "named"


def test_a_task_longer_than_its_lease_is_renewed_not_redelivered(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/long.db?queue=long"
    broker = LeasekitBroker(url, lease_duration=0.3, create=True)
    runs: list[float] = []

    @broker.task
    async def slow() -> None:
        runs.append(time.monotonic())
        await asyncio.sleep(1.5)  # the work itself: five leases long

    async def main() -> None:
        async with worker(broker):
            await slow.kiq()
            await until(lambda: len(runs) == 1, 10, "the task to start")
            await until(lambda: _empty(url, {}) and not broker._held, 10, "the ack")

    asyncio.run(main())
    assert len(runs) == 1
    with leasekit.open(url) as queue:
        assert queue.stats().total == 0


WORKER = """
import asyncio, pathlib, sys
from taskiq.api import run_receiver_task
from leasekit.plugins.taskiq import LeasekitBroker

broker = LeasekitBroker(sys.argv[1], lease_duration=1)
marker = pathlib.Path(sys.argv[2])

@broker.task(task_name="hang")
async def hang() -> None:
    with marker.open("a") as out:
        out.write("died\\n")
    await asyncio.Event().wait()  # never returns: the process is killed here

async def main() -> None:
    await broker.startup()
    await run_receiver_task(broker)

asyncio.run(main())
"""


def test_a_dead_workers_task_comes_back_after_the_lease(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/dead.db?queue=dead"
    marker = tmp_path / "runs.txt"
    (tmp_path / "dying_worker.py").write_text(textwrap.dedent(WORKER))
    broker = LeasekitBroker(url, lease_duration=1, create=True)

    @broker.task(task_name="hang")
    async def hang() -> None:
        with marker.open("a") as out:
            out.write("finished\n")

    async def kick() -> None:
        await broker.startup()
        await hang.kiq()
        await broker.shutdown()

    asyncio.run(kick())
    process = subprocess.Popen(
        [sys.executable, str(tmp_path / "dying_worker.py"), url, str(marker)], cwd=tmp_path
    )
    try:
        deadline = time.monotonic() + 30
        while not (marker.exists() and marker.read_text()):
            assert time.monotonic() < deadline, "the worker never started the task"
            assert process.poll() is None, "the worker exited"
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    killed = time.monotonic()

    async def recover() -> float:
        async with worker(broker):
            await until(lambda: marker.read_text().count("finished") == 1, 20, "the rerun")
            return time.monotonic()

    rerun = asyncio.run(recover())
    assert marker.read_text() == "died\nfinished\n"
    assert rerun - killed < 15  # it came back after the 1 s lease, not never
    assert _empty(url, {})


def test_max_deliveries_dead_letters_a_message_whose_worker_keeps_dying(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/poison.db?queue=poison"
    broker = LeasekitBroker(url, lease_duration=1, max_deliveries=1, create=True)
    runs: list[str] = []

    @broker.task(task_name="poison")
    async def poison() -> None:  # pragma: no cover - must never run
        runs.append("ran")

    async def kick() -> None:
        await broker.startup()
        await poison.kiq()
        await broker.shutdown()

    asyncio.run(kick())
    with leasekit.open(url) as queue:  # a first delivery whose worker died: never settled
        [first] = queue.lease(duration=0.05)
        assert first.message.delivery_count == 1
        deadline = time.monotonic() + 10
        while not queue.stats().visible:
            assert time.monotonic() < deadline
            time.sleep(0.02)

    async def main() -> None:
        async with worker(broker):
            await until(lambda: _dead_letters(url) == 1, 10, "the dead letter")

    asyncio.run(main())
    assert runs == []
    with leasekit.open(url) as queue:
        [dead] = queue.peek_dead_letters()
        assert dead.reason is not None and "max_deliveries=1" in dead.reason
        assert dead.delivery_count == 2


def _dead_letters(url: str) -> int:
    with leasekit.open(url) as queue:
        return len(queue.peek_dead_letters(100))


def test_taskiq_retries_kick_new_messages_so_max_deliveries_never_counts_them(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/retry.db?queue=retry"
    broker = LeasekitBroker(url, lease_duration=2, max_deliveries=1, create=True)
    broker.add_middlewares(SimpleRetryMiddleware(default_retry_count=3))
    runs: list[int] = []

    @broker.task(retry_on_error=True)
    async def flaky() -> None:
        runs.append(1)
        raise RuntimeError("always fails")

    async def main() -> None:
        async with worker(broker):
            await flaky.kiq()
            await until(lambda: len(runs) == 3 and _empty(url, {}), 20, "three runs")

    asyncio.run(main())
    assert len(runs) == 3  # max_retries=3: the first run and two retries
    assert _dead_letters(url) == 0  # each retry was a new message, delivered once


def test_shutdown_gives_back_what_was_received_and_not_acknowledged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/back.db?queue=back"
    broker = LeasekitBroker(url, lease_duration=30, create=True)
    started: list[int] = []

    @broker.task
    async def stuck() -> None:
        started.append(1)
        await asyncio.Event().wait()

    async def main() -> None:
        async with worker(broker):
            await stuck.kiq()
            await until(lambda: started == [1], 10, "the task to start")

    asyncio.run(main())
    with leasekit.open(url) as queue:  # visible at once, not after the 30 s lease
        [lease] = queue.lease()
        # Delivered to the stuck task; a receive still in flight at shutdown may
        # have taken it once more and given it back as well.
        assert lease.message.delivery_count >= 2


def test_bad_arguments_are_refused_before_anything_opens() -> None:
    with pytest.raises(leasekit.InvalidArgument):
        LeasekitBroker("memory://x", lease_duration=0)
    with pytest.raises(leasekit.InvalidArgument):
        LeasekitBroker("memory://x", max_deliveries=0)
    broker = LeasekitBroker("memory://x")
    with pytest.raises(leasekit.LeaseStateError):
        broker.queue  # noqa: B018 - not started
