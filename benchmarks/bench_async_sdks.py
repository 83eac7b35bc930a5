"""Would a native async driver beat a sync driver on threads? The raw SDKs measured both ways.

    .venv/bin/python benchmarks/bench_async_sdks.py azure --concurrency 8 32 --turns 3
    .venv/bin/python benchmarks/bench_async_sdks.py servicebus --turns 5
    # aiobotocore pins an older botocore than boto3 here: measure SQS in a venv of its own
    python3 -m venv /tmp/aiosqs
    /tmp/aiosqs/bin/pip install -q aiobotocore boto3 'moto[server]'
    /tmp/aiosqs/bin/python benchmarks/bench_async_sdks.py sqs --concurrency 8 32 --turns 3

For each service (on its local stand-in: Azurite, leasekit's Service Bus
emulator, moto), an asyncio program drains the same queue two ways, with
``concurrency`` consumers each looping receive-a-batch, delete-each (Service
Bus: one consumer, as one receiver link serves one caller at a time — the
async SDK's receiver fails when coroutines share it, and the sync one makes
them take turns):

``threads``  the SDK's sync client, each call run on a ThreadPoolExecutor of 8
             threads (``loop.run_in_executor``): what ``leasekit.aio`` does with
             every backend's sync driver;
``native``   the SDK's own async client (``azure.storage.queue.aio``,
             ``azure.servicebus.aio``, ``aiobotocore``), ``concurrency`` coroutines.

Turns alternate (who goes first too); the queue is refilled before each drain.
Reports messages/s (median of the turns) and the ratio native / threads: what a
native async driver could gain at most, before any leasekit code.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # leasekit's emulators, if importable

THREADS = 8
BATCH = 10


async def drain(total: int, concurrency: int, take: Callable[[], Awaitable[int]]) -> float:
    """Seconds for ``concurrency`` consumers calling ``take`` (returns how many it settled)."""
    done = 0
    start = time.perf_counter()

    async def consumer() -> None:
        nonlocal done
        idle = 0
        while done < total and idle < 20:
            got = await take()
            done += got
            idle = 0 if got else idle + 1

    await asyncio.gather(*(consumer() for _ in range(concurrency)))
    if done < total:
        raise RuntimeError(f"drained {done} of {total}")
    return time.perf_counter() - start


# ------------------------------------------------------------------- Azurite


def azure(messages: int, concurrencies: list[int], turns: int) -> None:
    from azure.core.exceptions import ResourceNotFoundError
    from azure.storage.queue import QueueClient
    from azure.storage.queue.aio import QueueClient as AsyncQueueClient

    from leasekit.emulators._process import ServerProcess, free_port
    from tests._fixtures.azurite import Azurite, azurite_argv

    port = free_port()
    with ServerProcess(azurite_argv(port), port, name="azurite"):
        conn = Azurite(host="127.0.0.1", port=port).connection_string
        name = f"bench{uuid.uuid4().hex[:10]}"
        sync = QueueClient.from_connection_string(conn, name)
        sync.create_queue()

        def fill() -> None:
            for i in range(messages):
                sync.send_message(f"m{i}")

        # A delete the service answers "not found" (Azurite, rarely, under load: a
        # message handed to two receivers) is counted, not fatal; none is expected.
        missing = [0]

        def sync_take() -> int:
            got = list(sync.receive_messages(messages_per_page=BATCH, max_messages=BATCH))
            for m in got:
                try:
                    sync.delete_message(m)
                except ResourceNotFoundError:
                    missing[0] += 1
            return len(got)

        async def native_drain(concurrency: int) -> float:
            async with AsyncQueueClient.from_connection_string(conn, name) as client:

                async def take() -> int:
                    pages = client.receive_messages(messages_per_page=BATCH, max_messages=BATCH)
                    got = [m async for m in pages]
                    for m in got:
                        try:
                            await client.delete_message(m)
                        except ResourceNotFoundError:
                            missing[0] += 1
                    return len(got)

                return await drain(messages, concurrency, take)

        compare(
            "azure-storage-queue", messages, concurrencies, turns, fill, sync_take, native_drain
        )
        sync.delete_queue()
        if missing[0]:
            print(f"azure-storage-queue: {missing[0]} deletes answered 'not found'")


# ----------------------------------------------------------------- Service Bus


def servicebus(messages: int, concurrencies: list[int], turns: int) -> None:
    from azure.servicebus import ServiceBusClient, ServiceBusMessage
    from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

    from leasekit.emulators._process import ServerProcess, free_port, python_module
    from leasekit.emulators.servicebus import admin_client, connection_string

    port, http_port = free_port(), free_port()
    argv = python_module(
        "leasekit.emulators.servicebus", "--port", str(port), "--http-port", str(http_port)
    )
    with ServerProcess(argv, port, name="servicebus-emulator"):
        conn = connection_string("127.0.0.1", port)
        name = f"bench{uuid.uuid4().hex[:10]}"
        admin_client("127.0.0.1", http_port).create_queue(name)
        client = ServiceBusClient.from_connection_string(conn)
        sender = client.get_queue_sender(name)
        # As leasekit's driver: a short socket timeout, so a receive returns once it has
        # what is there (the SDK's 0.2 s default makes each sync receive wait that long).
        receiver = client.get_queue_receiver(name, prefetch_count=0, socket_timeout=0.05)

        def fill() -> None:
            for start in range(0, messages, 100):
                sender.send_messages(
                    [ServiceBusMessage(f"m{i}") for i in range(start, min(messages, start + 100))]
                )

        def sync_take() -> int:
            got = receiver.receive_messages(max_message_count=BATCH, max_wait_time=1)
            for m in got:
                receiver.complete_message(m)
            return len(got)

        async def native_drain(concurrency: int) -> float:
            async with (
                AsyncServiceBusClient.from_connection_string(conn) as aclient,
                aclient.get_queue_receiver(
                    name, prefetch_count=0, socket_timeout=0.05
                ) as areceiver,
            ):

                async def take() -> int:
                    got = await areceiver.receive_messages(max_message_count=BATCH, max_wait_time=1)
                    for m in got:
                        await areceiver.complete_message(m)
                    return len(got)

                return await drain(messages, concurrency, take)

        compare("azure-service-bus", messages, concurrencies, turns, fill, sync_take, native_drain)
        receiver.close()
        sender.close()
        client.close()


# ----------------------------------------------------------------------- SQS


def sqs(messages: int, concurrencies: list[int], turns: int) -> None:
    import subprocess
    import urllib.request

    import boto3
    from aiobotocore.session import get_session

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    options = {
        "region_name": "us-east-1",
        "endpoint_url": endpoint,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    try:
        _wait_http(urllib.request, endpoint)
        sync = boto3.client("sqs", **options)
        url = sync.create_queue(QueueName=f"bench{uuid.uuid4().hex[:10]}")["QueueUrl"]

        def fill() -> None:
            for start in range(0, messages, 10):
                entries = [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)]
                sync.send_message_batch(QueueUrl=url, Entries=entries[: messages - start])

        def sync_take() -> int:
            got = sync.receive_message(QueueUrl=url, MaxNumberOfMessages=BATCH).get("Messages", [])
            for m in got:
                sync.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            return len(got)

        async def native_drain(concurrency: int) -> float:
            async with get_session().create_client("sqs", **options) as client:

                async def take() -> int:
                    response = await client.receive_message(QueueUrl=url, MaxNumberOfMessages=BATCH)
                    got = response.get("Messages", [])
                    for m in got:
                        await client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                    return len(got)

                return await drain(messages, concurrency, take)

        compare("aws-sqs", messages, concurrencies, turns, fill, sync_take, native_drain)
    finally:
        server.terminate()
        server.wait(10)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(urllib_request: Any, url: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib_request.urlopen(url, timeout=1)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# --------------------------------------------------------------------- compare


def compare(
    service: str,
    messages: int,
    concurrencies: list[int],
    turns: int,
    fill: Callable[[], None],
    sync_take: Callable[[], int],
    native_drain: Callable[[int], Awaitable[float]],
) -> None:
    executor = ThreadPoolExecutor(THREADS)

    async def threaded_drain(concurrency: int) -> float:
        loop = asyncio.get_running_loop()

        async def take() -> int:
            return await loop.run_in_executor(executor, sync_take)

        return await drain(messages, concurrency, take)

    for concurrency in concurrencies:
        rates: dict[str, list[float]] = {"threads": [], "native": []}
        for turn in range(turns):
            order = ["threads", "native"] if turn % 2 == 0 else ["native", "threads"]
            for side in order:
                fill()
                make = threaded_drain if side == "threads" else native_drain
                seconds = asyncio.run(make(concurrency))
                rates[side].append(messages / seconds)
        threads, native = (statistics.median(rates[k]) for k in ("threads", "native"))
        print(
            f"{service}, {concurrency} consumers: sync SDK on {THREADS} threads "
            f"{threads:,.0f} msg/s ({min(rates['threads']):,.0f}-{max(rates['threads']):,.0f}), "
            f"native async {native:,.0f} msg/s ({min(rates['native']):,.0f}-"
            f"{max(rates['native']):,.0f}); native/threads {native / threads:.2f} ({turns} turns)",
            flush=True,
        )
    executor.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("service", choices=["azure", "servicebus", "sqs"])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    if args.service == "servicebus" and args.concurrency != [1]:
        # one receiver link serves one caller at a time: the async receiver fails
        # ("'NoneType' object has no attribute 'create_receiver_link'") when shared
        print("servicebus: one consumer (a receiver cannot be shared by coroutines)")
        args.concurrency = [1]
    {"azure": azure, "servicebus": servicebus, "sqs": sqs}[args.service](
        args.messages, args.concurrency, args.turns
    )


if __name__ == "__main__":
    main()
