"""The cost of a checkpoint on each backend, next to a plain renewal.

    .venv/bin/python benchmarks/bench_checkpoint.py --repeat 200
    .venv/bin/python benchmarks/bench_checkpoint.py --backends memory,sqlite

For each backend one message is leased and then, ``--repeat`` times each,
renewed (``lease.renew()``) and checkpointed (``lease.checkpoint(64 bytes)``),
interleaved; reported: the backend calls one checkpoint makes (counted on the
driver), the median and p95 seconds of each, and the ratio. Backends that keep
checkpoints natively (memory, SQLite, Azure Storage Queue on Azurite) do it in
the one call that renews; the others (SQS on moto, MNS and Service Bus on
leasekit's emulators) renew, then write a :class:`leasekit.SqliteCheckpointStore`
in a local file. Emulators run on this machine: the figures compare leasekit's
paths, not the cloud services' latencies.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import leasekit
from leasekit.conformance import CountingDriver
from leasekit.emulators._process import ServerProcess, free_port, python_module

DATA = os.urandom(64)
ALL = ("memory", "sqlite", "azure-storage-queue", "aws-sqs", "aliyun-mns", "azure-service-bus")


@contextmanager
def opened(backend: str, tmp: Path) -> Iterator[leasekit.Queue]:
    """A fresh queue on ``backend`` (its emulator started here), deleted afterwards."""
    store = leasekit.SqliteCheckpointStore(str(tmp / f"{backend}-checkpoints.db"))
    name = f"bench-cp-{os.getpid()}"
    with _server(backend) as options:
        queue = leasekit.open(backend, queue=name, create=True, checkpoint_store=store, **options)
        try:
            yield queue
        finally:
            with suppress(leasekit.LeaseError):
                queue.delete_queue()
            queue.close()
            store.close()


@contextmanager
def _server(backend: str) -> Iterator[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-cp-"))
    if backend == "memory":
        yield {}
    elif backend == "sqlite":
        yield {"path": str(tmp / "queue.db")}
    elif backend == "azure-storage-queue":
        from bench_azure_storage_queue import start_azurite

        server, conn = start_azurite()
        with server:
            yield {"connection_string": conn}
    elif backend == "aws-sqs":
        port = free_port()
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        with ServerProcess(
            python_module("moto.server", "-H", "127.0.0.1", "-p", str(port)), port, env=env
        ):
            yield {
                "region": "us-east-1",
                "endpoint_url": f"http://127.0.0.1:{port}",
                "aws_access_key_id": "testing",
                "aws_secret_access_key": "testing",
            }
    elif backend == "aliyun-mns":
        port = free_port()
        env = {"LEASEKIT_MNS_ACCESS_KEY_ID": "k", "LEASEKIT_MNS_ACCESS_KEY_SECRET": "s"}
        argv = python_module(
            "leasekit.emulators.mns", "--port", str(port), "--log-level", "WARNING"
        )
        with ServerProcess(argv, port, env=env, name="mns-emulator"):
            yield {
                "endpoint": f"http://127.0.0.1:{port}",
                "access_key_id": "k",
                "access_key_secret": "s",
            }
    elif backend == "azure-service-bus":
        from bench_azure_service_bus import Emulator

        emulator = Emulator()
        try:
            yield {
                "connection_string": emulator.connection_string,
                "admin_port": emulator.http_port,
                "lock_duration": 30,
            }
        finally:
            emulator.close()
    else:
        raise SystemExit(f"unknown backend {backend!r}; choose from {', '.join(ALL)}")


def timed(call: Callable[[], None]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(queue: leasekit.Queue, repeat: int) -> dict[str, Any]:
    """Calls per checkpoint, and median/p95 seconds of renew and checkpoint, interleaved."""
    queue.send(b"work")
    [lease] = queue.lease(1, duration=queue.default_lease_duration, wait=10)
    counter = CountingDriver.install(queue.driver)
    lease.checkpoint(DATA)
    calls = list(counter.calls)
    counter.uninstall()
    renews: list[float] = []
    checkpoints: list[float] = []
    for _ in range(repeat):
        renews.append(timed(lease.renew))
        checkpoints.append(timed(lambda: lease.checkpoint(DATA)))
    lease.complete()

    def p95(values: list[float]) -> float:
        return sorted(values)[int(0.95 * (len(values) - 1))]

    return {
        "native": queue.capabilities.native_checkpoint,
        "calls": calls,
        "renew_p50": statistics.median(renews),
        "renew_p95": p95(renews),
        "checkpoint_p50": statistics.median(checkpoints),
        "checkpoint_p95": p95(checkpoints),
    }


def markdown(results: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| backend | checkpoint kept | backend calls per checkpoint | renew p50 (ms) "
        "| checkpoint p50 (ms) | checkpoint p95 (ms) | checkpoint / renew |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for backend, r in results.items():
        where = "natively" if r["native"] else "SqliteCheckpointStore"
        calls = ", ".join(r["calls"]) + (" + store write" if not r["native"] else "")
        rows.append(
            f"| {backend} | {where} | {len(r['calls'])} ({calls}) "
            f"| {r['renew_p50'] * 1e3:.2f} | {r['checkpoint_p50'] * 1e3:.2f} "
            f"| {r['checkpoint_p95'] * 1e3:.2f} | {r['checkpoint_p50'] / r['renew_p50']:.2f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--backends", default=",".join(ALL))
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cp-") as tmp:
        for backend in args.backends.split(","):
            with opened(backend, Path(tmp)) as queue:
                results[backend] = measure(queue, args.repeat)
    print(
        f"{args.repeat} renewals and {args.repeat} checkpoints of {len(DATA)} bytes each, "
        f"interleaved, one lease; Python {platform.python_version()}, {os.cpu_count()} CPUs\n"
    )
    print(markdown(results))


if __name__ == "__main__":
    main()
