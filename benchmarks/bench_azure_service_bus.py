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
    raw SDK, N links the same loop on N receivers (each its own connection and
                     link, as the SDK makes them), one thread each (``--links``)
    leasekit         ``queue.lease(32, wait=1)``, ``lease.complete()`` each;
                     ``queue.send_many``
    Consumer         ``leasekit.Consumer(queue, no-op, concurrency=N).run(until_idle=True)``
                     (keeper, worker threads, complete per message); with
                     ``--links N`` also on a queue opened with ``receivers=N``
                     (the driver's N receive links)

Each row also gives the emulator's CPU time per message while consuming (its
process's utime + stime from ``/proc``), and each ratio is taken within a round
(the rows run in turn, A, B, C, A, B, C...): the median of the rounds' ratios
and their range.

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

Receive links (multi-link rows only, about 7 minutes)::

    .venv/bin/python benchmarks/bench_azure_service_bus.py --messages 2000 --repeat 9 \
        --concurrency 2 8 --links 2 4 --locks 0 --only-links

``--latency-ms X`` puts the AMQP connections (raw and leasekit alike; the
management API stays direct) behind the tests' fault proxy, run in a child
process, delaying every chunk X ms each way: a service some distance away, where
round trips rather than CPU bound one link.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
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
from bench_asyncio import latency_proxy

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


def process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) a process has used, from ``/proc/PID/stat``; 0 if unknown."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    # utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Timer:
    """Wall and process-CPU time of a block, and the CPU time the emulator used meanwhile."""

    emulator_pid: int | None = None

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        self.emulator = process_cpu(self.emulator_pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu
        self.emulator = process_cpu(self.emulator_pid) - self.emulator


# ---------------------------------------------------------------- throughput


def raw_sdk(
    emu: Emulator,
    messages: int,
    lock: float,
    socket_timeout: float | None = None,
    links: int = 1,
) -> dict[str, float]:
    """The SDK's own loop; with ``links`` > 1, that many receivers, one thread each."""
    if links > 1:
        return raw_sdk_links(emu, messages, lock, links)
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


def raw_sdk_links(emu: Emulator, messages: int, lock: float, links: int) -> dict[str, float]:
    """``links`` PeekLock receivers (each its own connection), each looping on its own thread.

    The same loop as :func:`raw_sdk` per receiver; the receivers are opened
    before the timer, and the clock stops when the last thread has completed
    its last message (together they complete exactly ``messages``).
    """
    name = emu.queue(lock)
    done = 0
    count = threading.Lock()
    errors: list[BaseException] = []

    def loop(receiver: Any) -> None:
        nonlocal done
        try:
            while True:
                with count:
                    if done >= messages:
                        return
                for message in receiver.receive_messages(
                    max_message_count=BATCH, max_wait_time=0.2
                ):
                    receiver.complete_message(message)
                    with count:
                        done += 1
        except BaseException as exc:
            errors.append(exc)

    try:
        with ServiceBusClient.from_connection_string(emu.connection_string) as client:
            with client.get_queue_sender(name, keep_alive=0) as sender, Timer() as send:
                for start in range(0, messages, 100):
                    batch = sender.create_message_batch()
                    for _ in range(min(100, messages - start)):
                        batch.add_message(ServiceBusMessage(BODY))
                    sender.send_messages(batch)
            receivers = [
                client.get_queue_receiver(
                    name, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0
                )
                for _ in range(links)
            ]
            for receiver in receivers:
                receiver.__enter__()
            try:
                threads = [threading.Thread(target=loop, args=(r,)) for r in receivers]
                with Timer() as consume:
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join()
            finally:
                for receiver in receivers:
                    receiver.close()
    finally:
        emu.drop(name)
    if errors:
        raise errors[0]
    assert done == messages, done
    return _rates(messages, send, consume)


def _open(emu: Emulator, name: str, lock: float, **options: Any) -> leasekit.Queue:
    return leasekit.open(
        "azure-service-bus",
        queue=name,
        connection_string=emu.connection_string,
        lock_duration=lock,
        admin_port=emu.http_port,
        **options,
    )


def _warm(queue: leasekit.Queue, links: int = 1) -> None:
    """Open the sender and every receive link first, as the raw loop does before its timers.

    Receives take the links round robin, so ``links`` receives open them all.
    """
    queue.send(b"warm-up")
    for lease in queue.lease(1, wait=5):
        lease.complete()
    for _ in range(links):
        queue.lease(1, wait=0)


def leasekit_loop(emu: Emulator, messages: int, lock: float, links: int = 1) -> dict[str, float]:
    """One thread: lease a batch, complete each; ``links`` is the driver's ``receivers``."""
    name = emu.queue(lock)
    try:
        with _open(emu, name, lock, receivers=links) as queue:
            _warm(queue, links)
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
    emu: Emulator,
    messages: int,
    lock: float,
    concurrency: int,
    receivers: int = 1,
    links: int = 1,
) -> dict[str, float]:
    """A Consumer with a no-op handler; ``links`` is the driver's ``receivers`` option."""
    name = emu.queue(lock)
    try:
        with _open(emu, name, lock, receivers=links) as queue:
            _warm(queue, links)
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
                # Polled every 10 ms, as benchmarks/_consumer.py does: each
                # poll copies the stats under the consumer's lock, and polling
                # every 2 ms cost about a tenth of the client's CPU (py-spy).
                while worker.stats.completed < messages:
                    time.sleep(0.01)
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
        "emulator_ms": consume.emulator / messages * 1000,
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


def _spread(values: list[float], digits: int = 0) -> str:
    """``median (min–max)`` of ``values``."""
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}–{max(values):.{digits}f})"
    )


def _ratios(runs: dict[str, list[dict[str, float]]], row: str, base: str, key: str) -> str:
    """The row's ``key`` over the base row's, round by round: median (range)."""
    pairs = zip(runs[row], runs[base], strict=True)
    return _spread([a[key] / b[key] for a, b in pairs], 2)


def _throughput_table(runs: dict[str, list[dict[str, float]]], raw_of: dict[str, str]) -> None:
    print(
        "| scenario | consume msg/s | vs raw SDK (1 link) | vs raw SDK, same links | "
        "client CPU ms/msg | emulator CPU ms/msg | send vs raw |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, results in runs.items():
        raw = raw_of.get(name)
        same = _ratios(runs, name, raw, "consume") if raw and raw != "raw SDK" else ""
        print(
            f"| {name} | {_spread([r['consume'] for r in results])} | "
            f"{_ratios(runs, name, 'raw SDK', 'consume')} | {same} | "
            f"{statistics.median(r['cpu_ms'] for r in results):.2f} | "
            f"{_spread([r['emulator_ms'] for r in results], 2)} | "
            f"{_ratios(runs, name, 'raw SDK', 'send'):s} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[8], help="Consumer threads, one row each"
    )
    parser.add_argument("--receivers", type=int, default=1, help="Consumer receive loops")
    parser.add_argument(
        "--links",
        type=int,
        nargs="*",
        default=[],
        help="receive links: a raw N-receiver row and Consumer rows with receivers=N each",
    )
    parser.add_argument(
        "--only-links",
        action="store_true",
        help="skip the socket_timeout and leasekit-loop rows (the link rows and raw SDK only)",
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="delay each AMQP chunk this long each way (a proxy in between)",
    )
    parser.add_argument("--locks", type=int, default=200, help="0 skips the lock-holding part")
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--lock", type=float, default=2.0, help="LockDuration of the hold queues")
    args = parser.parse_args()

    emu = Emulator()
    Timer.emulator_pid = emu.process.pid
    delayed = contextlib.ExitStack()
    if args.latency_ms:
        proxy_port = delayed.enter_context(latency_proxy(emu.port, args.latency_ms / 1000))
        emu.connection_string = connection_string(LOOPBACK, proxy_port)
    try:
        scenarios: dict[str, Callable[[], dict[str, float]]] = {
            "raw SDK": lambda: raw_sdk(emu, args.messages, 30),
        }
        if not args.only_links:
            scenarios["raw SDK, receiver socket_timeout=0.05"] = lambda: raw_sdk(
                emu, args.messages, 30, socket_timeout=0.05
            )
            scenarios["leasekit"] = lambda: leasekit_loop(emu, args.messages, 30)
        #: For each row, the raw row it is also compared with (the same number of links).
        raw_of: dict[str, str] = {}
        for links in [1, *args.links]:
            raw = "raw SDK" if links == 1 else f"raw SDK, {links} links"
            if links > 1:
                scenarios[raw] = lambda links=links: raw_sdk(  # type: ignore[misc]
                    emu, args.messages, 30, links=links
                )
                if not args.only_links:
                    scenarios[f"leasekit, receivers={links} links"] = lambda links=links: (
                        leasekit_loop(  # type: ignore[misc]
                            emu, args.messages, 30, links
                        )
                    )
            for threads in args.concurrency:
                label = f"leasekit.Consumer, concurrency {threads}"
                if args.receivers != 1:
                    label += f", Consumer receivers {args.receivers}"
                if links > 1:
                    label += f", receivers={links} links"
                scenarios[label] = lambda threads=threads, links=links: consumer(  # type: ignore[misc]
                    emu, args.messages, 30, threads, args.receivers, links
                )
                raw_of[label] = raw
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in scenarios}
        for _ in range(args.repeat if args.messages else 0):
            for name, scenario in scenarios.items():
                runs[name].append(scenario())
        print(
            f"Python {platform.python_version()}, azure-servicebus {sdk_version}, "
            f"{args.messages} messages x {args.repeat} rounds (medians, range in brackets; "
            f"ratios within a round), {args.latency_ms:g} ms added each way"
        )
        if args.messages:
            _throughput_table(runs, raw_of)
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
        delayed.close()
        emu.close()


if __name__ == "__main__":
    main()
