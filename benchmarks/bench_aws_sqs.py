"""Benchmark the AWS SQS backend against raw boto3 and kombu's SQS transport, on moto.

One moto server (``python -m moto.server``) is started by this script on a free
loopback port. Each scenario gets a fresh queue and moves ``--messages``
messages through it in rounds of ``--depth``: its own producer sends a round
(timed: the send rate), its consumer drains it (timed: the consume rate,
receive + delete of every message). Rounds keep the queue shallow, because
moto's receive cost grows with the queue's depth. Client CPU time (this
process; moto runs in its own) per consumed message shows each client's own
overhead apart from the server's. Every scenario runs ``--repeat`` times,
interleaved; the median is reported, with the ratio to the raw boto3 loop.

Scenarios:
    raw boto3            receive 10 (long poll 1 s), ``delete_message`` each
    raw boto3, batched   receive 10, one ``delete_message_batch``
    leasekit             ``queue.lease(10, wait=1)``, ``lease.complete()`` each
    leasekit, batched    ``queue.lease(10, wait=1)``, one ``DeleteMessageBatch``
                         through ``Queue.complete_many`` (the Consumer's batch path)
    leasekit, N threads  the same loop in a ThreadPoolExecutor of N lease/complete
                         workers (:func:`leasekit_concurrent`; to be replaced by
                         ``leasekit.Consumer`` when it lands)
    kombu                ``SimpleQueue.put`` / ``get`` + ``ack`` over kombu's SQS
                         transport (long poll 1 s, no polling interval)

Run (bounded: about a minute)::

    .venv/bin/python benchmarks/bench_aws_sqs.py --messages 500 --repeat 3 --workers 8 --depth 100
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import boto3
from _consumer import consume_with_consumer
from kombu import Connection

import leasekit
from leasekit.emulators._process import ServerProcess, free_port, python_module
from leasekit.queue import Queue

REGION = "us-east-1"
KEY = "testing"  # moto's dummy credentials
BODY_SIZE = 256


def _name(prefix: str) -> str:
    return f"bench-{prefix}-{secrets.token_hex(3)}"


def _bodies(count: int) -> list[bytes]:
    return [os.urandom(BODY_SIZE // 2).hex().encode()[:BODY_SIZE] for _ in range(count)]


# -------------------------------------------------------------- raw boto3


def raw_send(client: Any, url: str, bodies: list[bytes]) -> None:
    """SendMessageBatch of 10 (text bodies: raw SQS cannot carry bytes)."""
    for start in range(0, len(bodies), 10):
        chunk = bodies[start : start + 10]
        entries = [{"Id": str(i), "MessageBody": b.decode()} for i, b in enumerate(chunk)]
        client.send_message_batch(QueueUrl=url, Entries=entries)


def raw_consume(client: Any, url: str, total: int, *, batched: bool) -> int:
    """Receive 10 at a time and delete each (or the batch) until ``total`` are done."""
    done = 0
    while done < total:
        response = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30, WaitTimeSeconds=1
        )
        messages = response.get("Messages", [])
        if batched and messages:
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ]
            client.delete_message_batch(QueueUrl=url, Entries=entries)
        else:
            for m in messages:
                client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        done += len(messages)
    return done


# ---------------------------------------------------------------- leasekit


def leasekit_consume(queue: Queue, total: int) -> int:
    """One thread: lease 10, complete each."""
    done = 0
    while done < total:
        for lease in queue.lease(10, duration=30, wait=1):
            lease.complete()
            done += 1
    return done


def leasekit_consume_batched(queue: Queue, total: int) -> int:
    """One thread: lease 10, complete them in one ``DeleteMessageBatch``.

    Uses ``Queue.complete_many``, the batch path the Consumer and the Spark source use.
    """
    done = 0
    while done < total:
        leases = queue.lease(10, duration=30, wait=1)
        if leases:
            errors = [e for e in queue.complete_many(leases) if e is not None]
            assert not errors, errors
        done += len(leases)
    return done


def leasekit_concurrent(queue: Queue, total: int, workers: int) -> int:
    """``workers`` threads each running the lease/complete loop until ``total`` are done.

    A stand-in for ``leasekit.Consumer(queue, handler, concurrency=workers)``.
    Workers short-poll (``wait=0``) and pace themselves 10 ms after an empty
    receive: with a long poll, the workers left idle at the end of a round
    would each wait out moto's 1 s poll (moto wakes a poll only on a new send).
    """
    lock = threading.Lock()
    done = 0

    def work() -> None:
        nonlocal done
        while True:
            with lock:
                if done >= total:
                    return
            leases = queue.lease(10, duration=30, wait=0)
            for lease in leases:
                lease.complete()
            with lock:
                done += len(leases)
            if not leases:
                time.sleep(0.01)  # pacing an idle worker, not synchronisation

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(work) for _ in range(workers)]:
            future.result()
    return done


# ------------------------------------------------------------------- kombu


def kombu_connection(endpoint: str) -> Connection:
    host_port = endpoint.removeprefix("http://")
    return Connection(
        f"sqs://{KEY}:{KEY}@{host_port}",
        transport_options={
            "region": REGION,
            "is_secure": False,
            "wait_time_seconds": 1,
            "polling_interval": 0,
            "visibility_timeout": 30,
        },
    )


def kombu_send(simple: Any, bodies: list[bytes]) -> None:
    for body in bodies:
        simple.put(body.decode())


def kombu_consume(simple: Any, total: int) -> int:
    done = 0
    while done < total:
        message = simple.get(block=True, timeout=5)
        message.ack()
        done += 1
    return done


# ------------------------------------------------------------------ runner


class Scenario:
    """A producer and a consumer on a fresh queue; ``close`` deletes the queue.

    ``consume(n)`` returns a count, or a float: the seconds it took to drain,
    when the call also spends time shutting something down afterwards.
    """

    def __init__(
        self,
        label: str,
        send: Callable[[list[bytes]], Any],
        consume: Callable[[int], Any],
        close: Callable[[], Any],
    ) -> None:
        self.label, self.send, self.consume, self.close = label, send, consume, close


def scenarios(endpoint: str, workers: int) -> list[Callable[[], Scenario]]:
    """Factories, one per scenario, each making a fresh queue."""
    client = boto3.client(
        "sqs",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=KEY,
    )
    options = {
        "region": REGION,
        "endpoint_url": endpoint,
        "aws_access_key_id": KEY,
        "aws_secret_access_key": KEY,
    }

    def raw(batched: bool) -> Scenario:
        url = client.create_queue(QueueName=_name("raw"))["QueueUrl"]
        return Scenario(
            "raw boto3, batched delete" if batched else "raw boto3",
            lambda bodies: raw_send(client, url, bodies),
            lambda n: raw_consume(client, url, n, batched=batched),
            lambda: client.delete_queue(QueueUrl=url),
        )

    def lk(threads: int) -> Scenario:
        queue = leasekit.open("aws-sqs", queue=_name("lk"), create=True, **options)

        def close() -> None:
            queue.delete_queue()
            queue.close()

        if threads == 1:
            return Scenario(
                "leasekit", queue.send_many, lambda n: leasekit_consume(queue, n), close
            )
        if threads == 0:
            return Scenario(
                "leasekit, batched complete (Queue.complete_many)",
                queue.send_many,
                lambda n: leasekit_consume_batched(queue, n),
                close,
            )
        if threads < 0:
            return Scenario(
                f"leasekit.Consumer, concurrency {-threads}",
                queue.send_many,
                lambda n: consume_with_consumer(queue, n, -threads),
                close,
            )
        return Scenario(
            f"leasekit, {threads} threads (ThreadPoolExecutor)",
            queue.send_many,
            lambda n: leasekit_concurrent(queue, n, threads),
            close,
        )

    def kombu() -> Scenario:
        conn = kombu_connection(endpoint)
        name = _name("kombu")
        producer = conn.SimpleQueue(name)
        consumer = conn.SimpleQueue(name)

        def close() -> None:
            producer.close()
            consumer.close()
            conn.close()
            client.delete_queue(QueueUrl=client.get_queue_url(QueueName=name)["QueueUrl"])

        return Scenario(
            "kombu SQS transport",
            lambda bodies: kombu_send(producer, bodies),
            lambda n: kombu_consume(consumer, n),
            close,
        )

    return [
        lambda: raw(False),
        lambda: raw(True),
        lambda: lk(1),
        lambda: lk(0),
        lambda: lk(workers),
        lambda: lk(-workers),
        kombu,
    ]


def measure(factory: Callable[[], Scenario], messages: int, depth: int) -> dict[str, float]:
    """Send and drain ``messages`` in rounds of ``depth``: wall and client CPU time of each."""
    scenario = factory()
    wall = {"send": 0.0, "consume": 0.0}
    cpu = {"send": 0.0, "consume": 0.0}
    try:
        done = 0
        while done < messages:
            n = min(depth, messages - done)
            bodies = _bodies(n)
            for kind, call in (
                ("send", partial(scenario.send, bodies)),
                ("consume", partial(scenario.consume, n)),
            ):
                c0, w0 = time.process_time(), time.perf_counter()
                result = call()
                elapsed = time.perf_counter() - w0
                # consume_with_consumer returns the seconds until the last message was
                # completed: stopping the Consumer afterwards (its loop may be in a
                # 1 s long poll that moto ends only on a new send) is not drain time.
                wall[kind] += result if isinstance(result, float) else elapsed
                cpu[kind] += time.process_time() - c0
            done += n
    finally:
        scenario.close()
    return {
        "label": scenario.label,  # type: ignore[dict-item]
        "send": messages / wall["send"],
        "consume": messages / wall["consume"],
        "consume_cpu_ms": 1000 * cpu["consume"] / messages,
        "send_cpu_ms": 1000 * cpu["send"] / messages,
    }


def run(
    endpoint: str, messages: int, repeat: int, workers: int, depth: int
) -> dict[str, dict[str, float]]:
    """Every scenario ``repeat`` times, interleaved so load changes hit all alike; medians."""
    results: dict[str, list[dict[str, float]]] = {}
    factories = scenarios(endpoint, workers)
    for _ in range(repeat):
        for factory in factories:
            row = measure(factory, messages, depth)
            results.setdefault(str(row.pop("label")), []).append(row)
    return {
        label: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for label, rows in results.items()
    }


def markdown(medians: dict[str, dict[str, float]]) -> str:
    base = medians["raw boto3"]
    lines = [
        "| scenario | consume msg/s | vs raw | client CPU ms/msg | send msg/s | vs raw |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, m in medians.items():
        lines.append(
            f"| {label} | {m['consume']:.0f} | {m['consume'] / base['consume']:.2f} "
            f"| {m['consume_cpu_ms']:.2f} | {m['send']:.0f} | {m['send'] / base['send']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500, help="messages per run (bounded)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per scenario; median kept")
    parser.add_argument("--workers", type=int, default=8, help="threads for the concurrent run")
    parser.add_argument(
        "--depth", type=int, default=100, help="messages per send/drain round (queue depth)"
    )
    args = parser.parse_args()
    if not 1 <= args.messages <= 5000:
        parser.error("--messages must be between 1 and 5000 (moto slows as queues grow)")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": KEY, "AWS_DEFAULT_REGION": REGION}
    server = ServerProcess(
        python_module("moto.server", "-H", "127.0.0.1", "-p", str(port)),
        port,
        env=env,
        name="moto-server",
    )
    with server:
        medians = run(endpoint, args.messages, args.repeat, args.workers, args.depth)
    print(
        f"moto server, {args.messages} messages of {BODY_SIZE} bytes in rounds of "
        f"{args.depth} (send {args.depth}, drain {args.depth}), median of {args.repeat} runs; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs\n"
    )
    print(markdown(medians))


if __name__ == "__main__":
    main()
