"""leasekit.aio: the same queue, leases, errors and worker rules as the sync API, awaitable.

Each test runs its coroutine with ``asyncio.run`` (no pytest plugin needed).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import leasekit
import leasekit.aio
from leasekit import errors
from leasekit.aio import AsyncConsumer, AsyncLease, AsyncQueue


def _run(make: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(make())  # type: ignore[arg-type]


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/aio-{uuid.uuid4().hex[:8]}.db?queue=jobs"


def test_open_as_await_and_as_async_with_and_the_basic_calls(tmp_path: Path) -> None:
    url = _url(tmp_path)

    async def main() -> None:
        queue = await leasekit.aio.open(url, create=True)
        assert isinstance(queue, AsyncQueue) and queue.name == "jobs"
        await queue.close()
        async with leasekit.aio.open(url) as queue:
            message_id = await queue.send(b"one", properties={"k": "v"})
            assert len(await queue.send_many([b"two", b"three"])) == 2
            [lease] = await queue.lease(1, duration=30)
            assert isinstance(lease, AsyncLease)
            assert (lease.message.id, lease.message.body) == (message_id, b"one")
            assert lease.message.properties == {"k": "v"}
            before = lease.time_left
            await lease.renew(60)
            assert lease.time_left > before and lease.duration == 60
            await lease.complete()
            assert lease.state is leasekit.LeaseState.COMPLETED
            rest = await queue.lease(5, duration=30)
            assert sorted(lz.message.body for lz in rest) == [b"three", b"two"]
            assert await queue.renew_many(rest, 45) == [None, None]
            assert await queue.abandon_many(rest[:1]) == [None]
            assert await queue.complete_many(rest[1:]) == [None]
            assert (await queue.stats()).visible == 1

    _run(main)


def test_errors_are_the_sync_apis_and_come_before_any_call(tmp_path: Path) -> None:
    async def main() -> None:
        async with leasekit.aio.open(_url(tmp_path), create=True) as queue:
            calls = leasekit.conformance.CountingDriver.install(queue.driver)
            with pytest.raises(errors.InvalidArgument):
                await queue.send("text")  # type: ignore[arg-type]
            with pytest.raises(errors.InvalidLeaseDuration):
                await queue.lease(1, duration=-1)
            with pytest.raises(errors.InvalidArgument):
                await queue.complete_many(["not a lease"])  # type: ignore[list-item]
            assert calls.calls == []
            calls.uninstall()
            await queue.send(b"x")
            [lease] = await queue.lease(1, duration=30)
            await lease.complete()
            with pytest.raises(errors.LeaseStateError):
                await lease.complete()
        with pytest.raises(errors.LeaseStateError):
            await queue.send(b"closed")
        with pytest.raises(errors.InvalidURL):
            leasekit.aio.open("sqlite:///x.db?queue=q&nope=1")

    _run(main)


def test_lease_one_abandons_when_left_unsettled_and_times_out_empty(tmp_path: Path) -> None:
    async def main() -> None:
        async with leasekit.aio.open(_url(tmp_path), create=True) as queue:
            await queue.send(b"back")
            async with queue.lease_one(duration=30, wait=1) as lease:
                assert lease.message.body == b"back"
            [again] = await queue.lease(1, duration=30)
            assert again.message.delivery_count == 2
            await again.complete()
            started = time.monotonic()
            with pytest.raises(errors.QueueEmpty):
                async with queue.lease_one(wait=0.3):
                    pass
            assert time.monotonic() - started < 3

    _run(main)


def test_a_cancelled_lease_call_gives_back_what_it_received(tmp_path: Path) -> None:
    async def main() -> None:
        async with leasekit.aio.open(_url(tmp_path), create=True) as queue:
            task = asyncio.ensure_future(queue.lease(1, duration=60, wait=5))
            await asyncio.sleep(0.1)  # the receive is polling the empty queue now
            await queue.send(b"caught mid-receive")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            got: list[AsyncLease] = []
            until = time.monotonic() + 5
            while not got and time.monotonic() < until:
                got = await queue.lease(1, duration=30, wait=0.2)
            assert [lz.message.body for lz in got] == [b"caught mid-receive"]
            await got[0].complete()

    _run(main)


def test_an_async_consumer_handles_every_message_once(tmp_path: Path) -> None:
    handled: Counter[bytes] = Counter()

    async def handler(message: leasekit.Message) -> None:
        await asyncio.sleep(0.01)
        handled[message.body] += 1

    async def main() -> leasekit.ConsumerStats:
        async with leasekit.aio.open(_url(tmp_path), create=True) as queue:
            await queue.send_many([b"%d" % i for i in range(60)])
            consumer = AsyncConsumer(queue, handler, concurrency=20, handle_signals=False)
            stats = await consumer.run(until_idle=True)
            assert (await queue.stats()).total == 0
            return stats

    stats = _run(main)
    assert stats.completed == 60 and set(handled.values()) == {1}


def test_a_failing_handler_backs_off_then_its_message_is_dead_lettered(tmp_path: Path) -> None:
    async def handler(message: leasekit.Message) -> None:
        raise RuntimeError("poison")

    async def main() -> None:
        async with leasekit.aio.open(_url(tmp_path), create=True) as queue:
            await queue.send(b"bad")
            consumer = AsyncConsumer(
                queue, handler, max_deliveries=2, backoff_base=0, handle_signals=False
            )
            stats = await consumer.run(until_idle=True)
            assert (stats.failed, stats.abandoned, stats.dead_lettered) == (2, 2, 1)
            [letter] = await queue.peek_dead_letters()
            assert letter.body == b"bad" and "max_deliveries" in (letter.reason or "")

    _run(main)


def test_a_consumer_refuses_a_plain_function_and_bad_settings(tmp_path: Path) -> None:
    async def main() -> None:
        async with leasekit.aio.open(_url(tmp_path), create=True) as queue:
            with pytest.raises(errors.InvalidArgument, match="async function"):
                AsyncConsumer(queue, lambda message: None)
            for bad in ({"concurrency": 0}, {"max_deliveries": 0}, {"backoff_base": -1}):
                with pytest.raises(errors.InvalidArgument):
                    AsyncConsumer(queue, _noop, **bad)  # type: ignore[arg-type]
            with pytest.raises(errors.InvalidArgument):
                AsyncConsumer(queue.queue, _noop)  # type: ignore[arg-type]

    _run(main)


async def _noop(message: leasekit.Message) -> None:
    return None


@pytest.mark.parametrize(
    ("messages", "backend"),
    [
        (10, "sqlite"),  # more than the handlers: some wait in the buffer
        # Fewer: the receiver is in a long poll when run() is cancelled. On memory://
        # a long poll wakes at once when messages are given back: a receive left
        # running would take them (a second delivery) and hand them back later.
        (2, "memory"),
    ],
)
def test_cancelling_run_gives_back_every_lease_and_loses_nothing(
    tmp_path: Path, messages: int, backend: str
) -> None:
    started = 0

    async def handler(message: leasekit.Message) -> None:
        nonlocal started
        started += 1
        await asyncio.sleep(60)  # still running when run() is cancelled

    async def main() -> None:
        url = _url(tmp_path) if backend == "sqlite" else f"memory://cancel-{time.monotonic_ns()}"
        async with leasekit.aio.open(url, create=True) as queue:
            await queue.send_many([b"%d" % i for i in range(messages)])
            consumer = AsyncConsumer(queue, handler, concurrency=4, handle_signals=False)
            task = asyncio.ensure_future(consumer.run())
            until = time.monotonic() + 5
            while started < min(4, messages) and time.monotonic() < until:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # the receiver goes back to leasing
            task.cancel()
            began = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert time.monotonic() - began < 5, "cancel waited for the handlers"
            # Every message is visible again once run() has raised (a receive still
            # in flight was waited for, not left to take them), none lost.
            back = await queue.lease(10, duration=30)
            assert len(back) == messages
            assert [lease.message.delivery_count for lease in back] == [2] * messages
            assert consumer.stats.abandoned_at_shutdown == messages

    _run(main)


def test_stop_ends_run_and_a_keeper_can_be_used_from_async_code(tmp_path: Path) -> None:
    async def main() -> None:
        async with leasekit.aio.open(_url(tmp_path), create=True) as queue:
            await queue.send(b"k")
            [lease] = await queue.lease(1, duration=0.3)
            async with leasekit.aio.AsyncLeaseKeeper() as keeper, keeper.hold(lease):
                await asyncio.sleep(1.0)  # three leases long: the keeper renews it
                assert await queue.lease(1, duration=5) == []
                await lease.complete()
            assert keeper.stats.renewed >= 2 and keeper.stats.lost == 0

            consumer = AsyncConsumer(queue, _noop, handle_signals=False)
            task = asyncio.ensure_future(consumer.run())
            await asyncio.sleep(0.2)
            consumer.stop()
            stats = await asyncio.wait_for(task, 5)
            assert stats.received == 0

    _run(main)


# -------------------------------------------------------- the blocked event loop


def _blocked_loop_run(
    queue_of: Callable[[], Any], lease: float, messages: int
) -> tuple[Counter[bytes], leasekit.ConsumerStats, int]:
    """Handlers that block the loop for 3x the physical lease; count who handled what."""
    handled: Counter[bytes] = Counter()

    async def blocking(message: leasekit.Message) -> None:
        time.sleep(3 * lease)  # blocks the event loop: nothing on it runs meanwhile
        handled[message.body] += 1

    async def main() -> tuple[leasekit.ConsumerStats, int]:
        async with queue_of() as queue:
            await queue.send_many([b"%d" % i for i in range(messages)])
            consumer = AsyncConsumer(
                queue,
                blocking,
                concurrency=messages,
                lease_duration=lease,
                handle_signals=False,
            )
            stats = await consumer.run(until_idle=True)
            left = (await queue.stats()).total
            return stats, int(left or 0)

    stats, left = asyncio.run(main())
    return handled, stats, left


def test_leases_survive_a_blocked_event_loop_on_sqlite(tmp_path: Path) -> None:
    url = _url(tmp_path)
    handled, stats, left = _blocked_loop_run(lambda: leasekit.aio.open(url, create=True), 0.5, 3)
    assert dict(handled) == {b"0": 1, b"1": 1, b"2": 1}, "a message ran twice or not at all"
    assert (stats.completed, stats.lost, stats.stale_on_complete) == (3, 0, 0)
    assert left == 0


def test_leases_survive_a_blocked_event_loop_on_mns(mns_server: Any) -> None:
    options = {
        "endpoint": mns_server.endpoint,
        "access_key_id": mns_server.access_key_id,
        "access_key_secret": mns_server.access_key_secret,
    }
    name = f"aio-{uuid.uuid4().hex[:12]}"
    handled, stats, _ = _blocked_loop_run(
        lambda: leasekit.aio.open("aliyun-mns", queue=name, create=True, **options), 1.0, 2
    )
    assert dict(handled) == {b"0": 1, b"1": 1}, "a message ran twice or not at all"
    assert (stats.completed, stats.lost, stats.stale_on_complete) == (2, 0, 0)
    with leasekit.open("aliyun-mns", queue=name, **options) as queue:
        assert queue.lease(1, duration=5, wait=1) == []
        queue.delete_queue()


def test_the_keeper_never_runs_on_the_event_loop(tmp_path: Path) -> None:
    loop_threads: set[int] = set()

    async def main() -> None:
        loop_threads.add(threading.get_ident())
        async with leasekit.aio.open(_url(tmp_path), create=True) as queue:
            await queue.send(b"k")
            [lease] = await queue.lease(1, duration=0.3)
            renewers: set[int] = set()

            @leasekit.hookimpl
            def leasekit_lease_renewed(lease: leasekit.Lease) -> None:
                renewers.add(threading.get_ident())

            watch = type(
                "Watch", (), {"leasekit_lease_renewed": staticmethod(leasekit_lease_renewed)}
            )
            registry = leasekit.default_registry()
            registry.register_plugin(watch)
            try:
                async with leasekit.aio.AsyncLeaseKeeper() as keeper, keeper.hold(lease):
                    time.sleep(1.0)  # the loop is blocked; renewals still happen
            finally:
                registry.plugin_manager.unregister(watch)
            await lease.complete()
            assert renewers and not renewers & loop_threads

    _run(main)


def test_the_web_app_lifespan_pattern_of_the_docs(tmp_path: Path) -> None:
    """docs/asyncio.md's FastAPI-style lifespan, without FastAPI: start, serve, stop cleanly."""
    import contextlib

    url = _url(tmp_path)
    handled: list[bytes] = []

    async def handle(message: leasekit.Message) -> None:
        handled.append(message.body)

    @contextlib.asynccontextmanager
    async def lifespan(app: object) -> Any:
        queue = await leasekit.aio.open(url, create=True)
        consumer = AsyncConsumer(queue, handle, concurrency=50, handle_signals=False)
        worker = asyncio.create_task(consumer.run())
        try:
            yield queue
        finally:
            consumer.stop()
            await worker
            await queue.close()

    async def main() -> None:
        async with lifespan(object()) as queue:  # the app serves requests meanwhile
            await queue.send_many([b"a", b"b", b"c"])
            until = time.monotonic() + 5
            while len(handled) < 3 and time.monotonic() < until:
                await asyncio.sleep(0.01)
        with leasekit.open(url) as sync_queue:
            assert sync_queue.stats().total == 0

    _run(main)
    assert sorted(handled) == [b"a", b"b", b"c"]


def test_delete_queue_and_its_deprecated_alias() -> None:
    async def main() -> None:
        name = f"memory://aio-delete-{time.monotonic_ns()}"
        async with leasekit.aio.open(name, create=True) as queue:
            await queue.delete_queue()
            with pytest.raises(errors.QueueNotFound):
                await queue.lease(1)
            await queue.create()
            with pytest.warns(DeprecationWarning, match=r"use AsyncQueue\.delete_queue\(\)"):
                await queue.delete()
            with pytest.raises(errors.QueueNotFound):
                await queue.lease(1)

    _run(main)


def test_lease_one_refuses_a_bad_wait_with_the_sync_apis_words(tmp_path: Path) -> None:
    async def main() -> None:
        sync = leasekit.open(_url(tmp_path), create=True)
        with pytest.raises(errors.InvalidArgument) as sync_error, sync.lease_one(wait=-1):
            pass
        async with leasekit.aio.AsyncQueue(sync) as queue:
            with pytest.raises(errors.InvalidArgument) as async_error:
                async with queue.lease_one(wait=-1):
                    pass
        assert str(async_error.value) == str(sync_error.value)

    _run(main)
