"""leasekit.aio measured: the async loop vs the sync one, AsyncConsumer vs Consumer, a blocked loop.

    .venv/bin/python benchmarks/bench_asyncio.py loop --backend sqlite --messages 3000 --turns 5
    .venv/bin/python benchmarks/bench_asyncio.py loop --backend mns --messages 2000 --turns 5
    .venv/bin/python benchmarks/bench_asyncio.py loop --backend mns --latency-ms 0.5 --messages 1000
    .venv/bin/python benchmarks/bench_asyncio.py consumers --concurrency 200 --io 0.05
    .venv/bin/python benchmarks/bench_asyncio.py blocked --backend sqlite
    .venv/bin/python benchmarks/bench_asyncio.py blocked --backend servicebus

``loop`` (target a): the same lease-and-complete loop written both ways —
``q.lease(10)`` then ``complete_many`` — draining equal queues in alternating
turns (who goes first alternates), so the machine's load hits both alike;
reports messages/s each way and the median of the per-turn ratios async/sync.

``consumers`` (target b): ``AsyncConsumer`` with ``concurrency`` handlers that
each ``await asyncio.sleep(io)`` vs the threaded ``Consumer`` with the same
concurrency and the handler made sync (``time.sleep(io)``), each in a fresh
child process on its own SQLite queue: messages/s, peak RSS and peak threads.

``blocked`` (target c): handlers that block the event loop (``time.sleep``) for
3x the physical lease. leasekit: an ``AsyncConsumer`` (its keeper renews on a
thread of its own); with ``--backend servicebus`` also the Service Bus SDK's own
``azure.servicebus.aio.AutoLockRenewer`` on the same emulator queue, the
messages held by a receiver while the loop is blocked. Reports per side: leases
or locks lost, messages handled twice, completed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import leasekit
import leasekit.aio
from leasekit.emulators._process import ServerProcess, free_port, python_module

HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------- backends


# The tests' fault proxy, run in a child process so its forwarding does not share
# this process's GIL with the loops being measured.
_PROXY = (
    "import sys\n"
    "from tests._fixtures.fault_proxy import FaultProxy\n"
    "proxy = FaultProxy('127.0.0.1', int(sys.argv[1]), name='latency').start()\n"
    "proxy.latency = float(sys.argv[2])\n"
    "print(proxy.port, flush=True)\n"
    "sys.stdin.read()\n"
)


@contextmanager
def latency_proxy(port: int, seconds: float) -> Iterator[int]:
    """Yield the port of a proxy to ``port`` that delays each chunk ``seconds`` each way."""
    child = subprocess.Popen(
        [sys.executable, "-c", _PROXY, str(port), str(seconds)],
        cwd=HERE.parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        yield int(child.stdout.readline())
    finally:
        child.terminate()
        child.wait(10)


@contextmanager
def backend(kind: str, latency: float = 0.0) -> Iterator[Callable[[str], dict[str, Any]]]:
    """Yield ``options(queue_name) -> open() keyword arguments`` for ``kind``.

    ``latency`` (MNS only): seconds the tests' fault proxy adds to each forwarded
    chunk in both directions, a stand-in for a network round trip.
    """
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield lambda name: {"target": "sqlite", "path": f"{tmp}/bench.db", "queue": name}
        return
    if kind == "mns":
        port = free_port()
        keys = {"access_key_id": "bench-key", "access_key_secret": "bench-secret"}
        env = {
            "LEASEKIT_MNS_ACCESS_KEY_ID": keys["access_key_id"],
            "LEASEKIT_MNS_ACCESS_KEY_SECRET": keys["access_key_secret"],
        }
        argv = python_module(
            "leasekit.emulators.mns", "--port", str(port), "--log-level", "WARNING"
        )
        with ExitStack() as stack:
            stack.enter_context(ServerProcess(argv, port, env=env, name="mns-emulator"))
            if latency > 0:
                port = stack.enter_context(latency_proxy(port, latency))
            endpoint = f"http://127.0.0.1:{port}"
            yield lambda name: {
                "target": "aliyun-mns",
                "endpoint": endpoint,
                "queue": name,
                **keys,
            }
        return
    if kind == "servicebus":
        from leasekit.emulators.servicebus import connection_string

        port, http_port = free_port(), free_port()
        argv = python_module(
            "leasekit.emulators.servicebus",
            "--port",
            str(port),
            "--http-port",
            str(http_port),
        )
        with ServerProcess(argv, port, name="servicebus-emulator"):
            yield lambda name: {
                "target": "azure-service-bus",
                "connection_string": connection_string("127.0.0.1", port),
                "admin_port": http_port,
                "queue": name,
                "lock_duration": 5,
            }
        return
    raise SystemExit(f"unknown backend {kind!r}")


def _open(options: dict[str, Any], **extra: Any) -> leasekit.Queue:
    target = options["target"]
    rest = {k: v for k, v in options.items() if k != "target"}
    return leasekit.open(target, create=True, **rest, **extra)


# ---------------------------------------------------------------- (a) loops


def sync_drain(queue: leasekit.Queue, total: int) -> float:
    start = time.perf_counter()
    done = 0
    while done < total:
        leases = queue.lease(10, duration=30, wait=1)
        queue.complete_many(leases)
        done += len(leases)
    return time.perf_counter() - start


async def async_drain(queue: leasekit.aio.AsyncQueue, total: int) -> float:
    start = time.perf_counter()
    done = 0
    while done < total:
        leases = await queue.lease(10, duration=30, wait=1)
        await queue.complete_many(leases)
        done += len(leases)
    return time.perf_counter() - start


def run_loops(kind: str, messages: int, turns: int, latency: float = 0.0) -> None:
    rates: dict[str, list[float]] = {"sync": [], "async": []}
    ratios: list[float] = []
    with backend(kind, latency) as options:
        for turn in range(turns):
            order = ["sync", "async"] if turn % 2 == 0 else ["async", "sync"]
            got: dict[str, float] = {}
            for side in order:
                opts = options(f"loop-{uuid.uuid4().hex[:10]}")
                queue = _open(opts)
                queue.send_many([b"x" * 64] * messages)
                if side == "sync":
                    seconds = sync_drain(queue, messages)
                else:
                    aqueue = leasekit.aio.AsyncQueue(queue)
                    seconds = asyncio.run(async_drain(aqueue, messages))
                queue.delete_queue()
                queue.close()
                got[side] = messages / seconds
                rates[side].append(got[side])
            ratios.append(got["async"] / got["sync"])
            print(
                f"  turn {turn + 1}: sync {got['sync']:,.0f} msg/s, async {got['async']:,.0f} "
                f"msg/s, ratio {ratios[-1]:.2f}",
                flush=True,
            )
    label = f"{kind} (+{latency * 1000:g} ms each way)" if latency else kind
    print(
        f"{label}: sync median {statistics.median(rates['sync']):,.0f} msg/s, async median "
        f"{statistics.median(rates['async']):,.0f} msg/s; async/sync median "
        f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}, "
        f"{turns} turns)"
    )


# ------------------------------------------------------------ (b) consumers


def consumer_child(kind: str, messages: int, concurrency: int, io: float) -> dict[str, Any]:
    """Run one consumer in this (child) process and measure it."""
    with tempfile.TemporaryDirectory() as tmp:
        queue = leasekit.open("sqlite", path=f"{tmp}/c.db", queue="c", create=True)
        queue.send_many([b"x"] * messages)
        peak_threads = threading.active_count()
        sampling = threading.Event()

        def sample() -> None:
            nonlocal peak_threads
            while not sampling.wait(0.05):
                peak_threads = max(peak_threads, threading.active_count())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.perf_counter()
        if kind == "async":

            async def handler(message: leasekit.Message) -> None:
                await asyncio.sleep(io)

            async def main() -> leasekit.ConsumerStats:
                aqueue = leasekit.aio.AsyncQueue(queue)
                return await leasekit.aio.AsyncConsumer(
                    aqueue, handler, concurrency=concurrency, handle_signals=False
                ).run(until_idle=True)

            stats = asyncio.run(main())
        else:

            def sync_handler(message: leasekit.Message) -> None:
                time.sleep(io)

            stats = leasekit.Consumer(
                queue, sync_handler, concurrency=concurrency, handle_signals=False
            ).run(until_idle=True)
        seconds = time.perf_counter() - start
        sampling.set()
        sampler.join()
        assert stats.completed == messages, stats
        peak_threads -= 1  # the sampler itself
        return {
            "kind": kind,
            "rate": messages / seconds,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak_threads": peak_threads,
        }


def run_consumers(messages: int, concurrency: int, io: float, turns: int) -> None:
    results: dict[str, list[dict[str, Any]]] = {"async": [], "threads": []}
    for turn in range(turns):
        order = ["async", "threads"] if turn % 2 == 0 else ["threads", "async"]
        for kind in order:
            argv = [
                sys.executable,
                __file__,
                "consumer-child",
                kind,
                str(messages),
                str(concurrency),
                str(io),
            ]
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            results[kind].append(result)
            print(
                f"  {kind:7}: {result['rate']:,.0f} msg/s, peak RSS "
                f"{result['peak_rss_mib']:.0f} MiB, peak threads {result['peak_threads']}",
                flush=True,
            )
    for kind, runs in results.items():
        print(
            f"{kind}: median {statistics.median(r['rate'] for r in runs):,.0f} msg/s, "
            f"peak RSS {statistics.median(r['peak_rss_mib'] for r in runs):.0f} MiB, "
            f"peak threads {max(r['peak_threads'] for r in runs)}"
        )
    ratio = statistics.median(r["rate"] for r in results["async"]) / statistics.median(
        r["rate"] for r in results["threads"]
    )
    print(f"AsyncConsumer / Consumer throughput: {ratio:.2f} ({concurrency} handlers, {io}s I/O)")


# -------------------------------------------------------------- (c) blocked


def run_blocked(kind: str, messages: int) -> None:
    with backend(kind) as options:
        opts = options(f"blocked-{uuid.uuid4().hex[:10]}")
        lease = 1.0 if kind == "sqlite" else float(opts.get("lock_duration", 1))
        print(f"{kind}: {messages} messages, each handler blocks the loop {3 * lease:g} s")
        print("  leasekit AsyncConsumer:", blocked_leasekit(opts, lease, messages))
        if kind == "servicebus":
            opts = options(f"blocked-{uuid.uuid4().hex[:10]}")
            print(
                "  azure.servicebus.aio AutoLockRenewer:", blocked_autolockrenewer(opts, messages)
            )


def blocked_leasekit(opts: dict[str, Any], lease: float, messages: int) -> dict[str, int]:
    queue = _open(opts) if "lock_duration" in opts else _open(opts, lease_duration=lease)
    queue.send_many([b"%d" % i for i in range(messages)])
    handled: Counter[bytes] = Counter()

    async def blocking(message: leasekit.Message) -> None:
        time.sleep(3 * lease)  # blocks the event loop
        handled[message.body] += 1

    async def main() -> leasekit.ConsumerStats:
        aqueue = leasekit.aio.AsyncQueue(queue)
        consumer = leasekit.aio.AsyncConsumer(
            aqueue,
            blocking,
            concurrency=messages,
            lease_duration=None if "lock_duration" in opts else lease,
            handle_signals=False,
        )
        return await consumer.run(until_idle=True)

    stats = asyncio.run(main())
    queue.delete_queue()
    queue.close()
    return {
        "completed": stats.completed,
        "lost": stats.lost + stats.stale_on_complete,
        "handled twice": sum(c - 1 for c in handled.values()),
    }


def blocked_autolockrenewer(opts: dict[str, Any], messages: int) -> dict[str, int]:
    from azure.servicebus import ServiceBusMessage
    from azure.servicebus.aio import AutoLockRenewer, ServiceBusClient
    from azure.servicebus.exceptions import MessageLockLostError

    lock = float(opts["lock_duration"])
    queue = _open(opts)  # creates the queue with the lock duration
    queue.close()

    async def main() -> dict[str, int]:
        lost_during: list[str] = []

        async def renewal_failed(message: Any, error: Exception | None) -> None:
            lost_during.append(str(message.message_id))  # the aio renewer awaits this

        async with ServiceBusClient.from_connection_string(opts["connection_string"]) as client:
            async with client.get_queue_sender(opts["queue"]) as sender:
                await sender.send_messages([ServiceBusMessage(b"%d" % i) for i in range(messages)])
            renewer = AutoLockRenewer(max_lock_renewal_duration=300)
            completed = lost = 0
            async with client.get_queue_receiver(opts["queue"], prefetch_count=0) as receiver:
                received = []
                while len(received) < messages:
                    received += await receiver.receive_messages(messages - len(received), 5)
                for message in received:
                    renewer.register(
                        receiver,
                        message,
                        on_lock_renew_failure=renewal_failed,
                    )
                for message in received:
                    time.sleep(3 * lock)  # the handler blocks the event loop
                    try:
                        await receiver.complete_message(message)
                        completed += 1
                    except MessageLockLostError:
                        lost += 1
            await renewer.close()
        return {"completed": completed, "lost": lost, "renewal failures": len(lost_during)}

    result = asyncio.run(main())
    cleanup = _open(opts)
    cleanup.delete_queue()
    cleanup.close()
    return result


# ------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    loop = sub.add_parser("loop")
    loop.add_argument("--backend", choices=["sqlite", "mns"], default="sqlite")
    loop.add_argument("--messages", type=int, default=2000)
    loop.add_argument("--turns", type=int, default=5)
    loop.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="mns: milliseconds added to each chunk each way by a proxy (a network stand-in)",
    )
    consumers = sub.add_parser("consumers")
    consumers.add_argument("--messages", type=int, default=2000)
    consumers.add_argument("--concurrency", type=int, default=200)
    consumers.add_argument("--io", type=float, default=0.05)
    consumers.add_argument("--turns", type=int, default=3)
    blocked = sub.add_parser("blocked")
    blocked.add_argument("--backend", choices=["sqlite", "mns", "servicebus"], default="sqlite")
    blocked.add_argument("--messages", type=int, default=5)
    child = sub.add_parser("consumer-child")
    child.add_argument("kind")
    child.add_argument("messages", type=int)
    child.add_argument("concurrency", type=int)
    child.add_argument("io", type=float)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONWARNINGS", "ignore::RuntimeWarning")
    if args.what == "loop":
        if args.latency_ms and args.backend != "mns":
            parser.error("--latency-ms is for --backend mns")
        run_loops(args.backend, args.messages, args.turns, args.latency_ms / 1000)
    elif args.what == "consumers":
        run_consumers(args.messages, args.concurrency, args.io, args.turns)
    elif args.what == "blocked":
        run_blocked(args.backend, args.messages)
    else:
        print(json.dumps(consumer_child(args.kind, args.messages, args.concurrency, args.io)))


if __name__ == "__main__":
    main()
