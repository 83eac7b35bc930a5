"""Benchmark the Azure Service Bus backend against the raw azure-servicebus SDK, on the emulator.

One leasekit Service Bus emulator (``python -m leasekit.emulators.servicebus``)
is started by this script on a free loopback port. Client CPU (this process;
the emulator runs in its own) is reported apart from wall time, so the client
libraries' own overhead shows apart from the emulator's.

Throughput scenarios (each on a fresh queue, ``--messages`` messages of 256
bytes sent in batches, then drained; run ``--repeat`` times interleaved, medians):

    raw SDK          ``receive_messages(32, max_wait_time=1)`` on a PeekLock receiver
                     (prefetch 0), ``complete_message`` each; sends with
                     ``ServiceBusMessageBatch``
    leasekit         ``queue.lease(32, wait=1)``, ``lease.complete()`` each;
                     ``queue.send_many``
    Consumer         ``leasekit.Consumer(queue, no-op, concurrency=N).run(until_idle=True)``
                     (keeper, worker threads, complete per message)

Lock-holding scenario: ``--locks`` messages are received and their locks held
for ``--hold`` seconds on a queue with a ``--lock`` second LockDuration, then
completed:

    AutoLockRenewer  the SDK's ``AutoLockRenewer`` with every message registered
                     (one ``renew_message_lock`` call per message per renewal)
    LeaseKeeper      leasekit's ``LeaseKeeper`` holding every lease (renewals
                     batched, up to 100 lock tokens per management call)

For each: client CPU seconds during the hold, renew calls, and locks lost
(renewal failures reported, plus completes refused at the end).

Run (about 3 minutes here)::

    .venv/bin/python benchmarks/bench_azure_service_bus.py --messages 1000 --repeat 3 \
        --concurrency 8 --locks 200 --hold 20 --lock 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import secrets
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from azure.servicebus import (
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
)
from azure.servicebus import __version__ as sdk_version

import leasekit
from leasekit.emulators._process import LOOPBACK, ServerProcess, free_port, python_module
from leasekit.emulators.servicebus import admin_client, connection_string

BODY = b"x" * 256
BATCH = 32


class Emulator:
    def __init__(self) -> None:
        self.port = free_port()
        self.http_port = free_port()
        config = {
            "UserConfig": {"Namespaces": [{"Name": "bench", "Queues": [], "Topics": []}]},
            "Emulator": {"AutoCreateQueues": False},
        }
        self._dir = tempfile.TemporaryDirectory()
        path = Path(self._dir.name) / "config.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        argv = python_module(
            "leasekit.emulators.servicebus",
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--http-port",
            str(self.http_port),
            "--config",
            str(path),
            "--log-level",
            "WARNING",
        )
        self.process = ServerProcess(argv, self.port, name="servicebus-emulator").start()
        self.connection_string = connection_string(LOOPBACK, self.port)

    def queue(self, lock: float) -> str:
        name = f"bench-{secrets.token_hex(4)}"
        with admin_client(LOOPBACK, self.http_port) as admin:
            admin.create_queue(name, lock_duration=datetime.timedelta(seconds=lock))
        return name

    def drop(self, name: str) -> None:
        with admin_client(LOOPBACK, self.http_port) as admin:
            admin.delete_queue(name)

    def close(self) -> None:
        self.process.stop()
        self._dir.cleanup()


class Timer:
    """Wall and process-CPU time of a block."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


# ---------------------------------------------------------------- throughput


def raw_sdk(
    emu: Emulator, messages: int, lock: float, socket_timeout: float | None = None
) -> dict[str, float]:
    name = emu.queue(lock)
    try:
        with ServiceBusClient.from_connection_string(emu.connection_string) as client:
            with client.get_queue_sender(name, keep_alive=0) as sender, Timer() as send:
                for start in range(0, messages, 100):
                    batch = sender.create_message_batch()
                    for _ in range(min(100, messages - start)):
                        batch.add_message(ServiceBusMessage(BODY))
                    sender.send_messages(batch)
            receiver = client.get_queue_receiver(
                name,
                receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                prefetch_count=0,
                socket_timeout=socket_timeout,
            )
            with receiver:
                done = 0
                with Timer() as consume:
                    while done < messages:
                        for message in receiver.receive_messages(
                            max_message_count=BATCH, max_wait_time=1
                        ):
                            receiver.complete_message(message)
                            done += 1
    finally:
        emu.drop(name)
    return _rates(messages, send, consume)


def _open(emu: Emulator, name: str, lock: float) -> leasekit.Queue:
    return leasekit.open(
        "azure-service-bus",
        queue=name,
        connection_string=emu.connection_string,
        lock_duration=lock,
        admin_port=emu.http_port,
    )


def _warm(queue: leasekit.Queue) -> None:
    """Open the sender and receiver links first, as the raw loop does before its timers."""
    queue.send(b"warm-up")
    for lease in queue.lease(1, wait=5):
        lease.complete()


def leasekit_loop(emu: Emulator, messages: int, lock: float) -> dict[str, float]:
    name = emu.queue(lock)
    try:
        with _open(emu, name, lock) as queue:
            _warm(queue)
            with Timer() as send:
                queue.send_many([BODY] * messages)
            done = 0
            with Timer() as consume:
                while done < messages:
                    for lease in queue.lease(BATCH, wait=1):
                        lease.complete()
                        done += 1
    finally:
        emu.drop(name)
    return _rates(messages, send, consume)


def consumer(
    emu: Emulator, messages: int, lock: float, concurrency: int, receivers: int = 1
) -> dict[str, float]:
    name = emu.queue(lock)
    try:
        with _open(emu, name, lock) as queue:
            _warm(queue)
            with Timer() as send:
                queue.send_many([BODY] * messages)
            worker = leasekit.Consumer(
                queue,
                lambda message: None,
                concurrency=concurrency,
                receivers=receivers,
                handle_signals=False,
            )
            runner = threading.Thread(target=worker.run)
            with Timer() as consume:
                runner.start()
                # Timed to the last completion (run(until_idle=True) would add
                # the consumer's final 1 s empty poll to the time).
                while worker.stats.completed < messages:
                    time.sleep(0.002)  # polling the consumer's counters
            worker.stop()
            runner.join()
            assert worker.stats.completed == messages, worker.stats
    finally:
        emu.drop(name)
    return _rates(messages, send, consume)


def _rates(messages: int, send: Timer, consume: Timer) -> dict[str, float]:
    return {
        "send": messages / send.wall,
        "consume": messages / consume.wall,
        "cpu_ms": consume.cpu / messages * 1000,
    }


# ---------------------------------------------------------------- lock holding


def hold_auto_lock_renewer(
    emu: Emulator, locks: int, hold: float, lock: float, workers: int | None
) -> dict[str, Any]:
    name = emu.queue(lock)
    failures: list[BaseException | None] = []
    renewer = AutoLockRenewer(
        max_lock_renewal_duration=hold + 30,
        on_lock_renew_failure=lambda renewable, error: failures.append(error),
        max_workers=workers,
    )
    try:
        with ServiceBusClient.from_connection_string(emu.connection_string) as client:
            with client.get_queue_sender(name, keep_alive=0) as sender:
                for start in range(0, locks, 100):
                    batch = sender.create_message_batch()
                    for _ in range(min(100, locks - start)):
                        batch.add_message(ServiceBusMessage(BODY))
                    sender.send_messages(batch)
            receiver = client.get_queue_receiver(name, prefetch_count=0)
            with receiver:
                calls = _count(receiver, "_renew_locks")
                held: list[Any] = []
                while len(held) < locks:
                    for message in receiver.receive_messages(
                        max_message_count=min(BATCH, locks - len(held)), max_wait_time=1
                    ):
                        renewer.register(receiver, message, max_lock_renewal_duration=hold + 30)
                        held.append(message)
                with Timer() as timer:
                    time.sleep(hold)  # the work: nothing but keeping the locks
                # Stop renewing first (as the keeper run does): a renewal racing
                # a complete would be reported as a failure that is not one.
                renewer.close()
                refused = 0
                for message in held:
                    try:
                        receiver.complete_message(message)
                    except Exception:
                        refused += 1
    finally:
        emu.drop(name)
    kinds = sorted({type(getattr(e, "inner_exception", None) or e).__name__ for e in failures})
    return {
        "cpu_s": timer.cpu,
        "renew_calls": calls[0],
        "renew_failures": len(failures),
        "lost": refused,
        "errors": ", ".join(kinds),
    }


def hold_lease_keeper(emu: Emulator, locks: int, hold: float, lock: float) -> dict[str, Any]:
    name = emu.queue(lock)
    try:
        with _open(emu, name, lock) as queue:
            queue.send_many([BODY] * locks)
            keeper = leasekit.LeaseKeeper()
            with keeper:
                held: list[leasekit.Lease] = []
                while len(held) < locks:
                    for lease in queue.lease(min(BATCH, locks - len(held)), wait=1):
                        keeper.add(lease)
                        held.append(lease)
                with Timer() as timer:
                    time.sleep(hold)  # the work: nothing but keeping the locks
                for lease in held:
                    keeper.discard(lease)
                results = queue.complete_many(held)
                stats = keeper.stats
    finally:
        emu.drop(name)
    return {
        "cpu_s": timer.cpu,
        "renew_calls": stats.renew_calls,
        "renew_failures": stats.lost,
        "lost": sum(1 for r in results if r is not None),
        "lateness_p99_ms": stats.lateness_percentile(0.99) * 1000,
    }


def _count(target: Any, method: str) -> list[int]:
    """Count calls of one method of a real SDK object (a wrapper, not a mock)."""
    counter = [0]
    real = getattr(target, method)
    lock = threading.Lock()

    def counted(*args: Any, **kwargs: Any) -> Any:
        with lock:
            counter[0] += 1
        return real(*args, **kwargs)

    setattr(target, method, counted)
    return counter


# ---------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[8], help="Consumer threads, one row each"
    )
    parser.add_argument("--receivers", type=int, default=1, help="Consumer receive loops")
    parser.add_argument("--locks", type=int, default=200, help="0 skips the lock-holding part")
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--lock", type=float, default=2.0, help="LockDuration of the hold queues")
    args = parser.parse_args()

    emu = Emulator()
    try:
        scenarios: dict[str, Callable[[], dict[str, float]]] = {
            "raw SDK": lambda: raw_sdk(emu, args.messages, 30),
            "raw SDK, receiver socket_timeout=0.05": lambda: raw_sdk(
                emu, args.messages, 30, socket_timeout=0.05
            ),
            "leasekit": lambda: leasekit_loop(emu, args.messages, 30),
        }
        for threads in args.concurrency:
            label = f"leasekit.Consumer, concurrency {threads}"
            if args.receivers != 1:
                label += f", receivers {args.receivers}"
            scenarios[label] = lambda threads=threads: consumer(  # type: ignore[misc]
                emu, args.messages, 30, threads, args.receivers
            )
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in scenarios}
        for _ in range(args.repeat if args.messages else 0):
            for name, scenario in scenarios.items():
                runs[name].append(scenario())
        print(
            f"Python {platform.python_version()}, azure-servicebus {sdk_version}, "
            f"{args.messages} messages x {args.repeat} runs (medians)"
        )
        if not args.messages:
            scenarios = {}
        print("| scenario | consume msg/s | vs raw | client CPU ms/msg | send msg/s | vs raw |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        base = {
            k: statistics.median(r[k] for r in runs["raw SDK"]) if runs["raw SDK"] else 1.0
            for k in ("send", "consume")
        }
        for name, results in runs.items():
            if not results:
                continue
            med = {k: statistics.median(r[k] for r in results) for k in results[0]}
            print(
                f"| {name} | {med['consume']:.0f} | {med['consume'] / base['consume']:.2f} | "
                f"{med['cpu_ms']:.2f} | {med['send']:.0f} | {med['send'] / base['send']:.2f} |"
            )
        if not args.locks:
            return
        print()
        print(f"{args.locks} locks held {args.hold:g} s with a {args.lock:g} s LockDuration")
        print("| holder | client CPU s | renew calls | renewal failures | locks lost |")
        print("| --- | ---: | ---: | ---: | ---: |")
        holders: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            (
                "azure.servicebus.AutoLockRenewer(max_workers=1)",
                lambda: hold_auto_lock_renewer(emu, args.locks, args.hold, args.lock, 1),
            ),
            (
                "azure.servicebus.AutoLockRenewer() (default workers)",
                lambda: hold_auto_lock_renewer(emu, args.locks, args.hold, args.lock, None),
            ),
            (
                "leasekit.LeaseKeeper()",
                lambda: hold_lease_keeper(emu, args.locks, args.hold, args.lock),
            ),
        ]
        for name, hold in holders:
            result = hold()
            extra = (
                f" (p99 lateness {result['lateness_p99_ms']:.0f} ms)"
                if "lateness_p99_ms" in result
                else ""
            )
            if result.get("errors"):
                extra += f" ({result['errors']})"
            print(
                f"| {name} | {result['cpu_s']:.2f} | {result['renew_calls']} | "
                f"{result['renew_failures']} | {result['lost']}{extra} |"
            )
    finally:
        emu.close()


if __name__ == "__main__":
    main()
