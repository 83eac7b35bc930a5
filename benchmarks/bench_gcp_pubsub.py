"""Benchmark the gcp-pubsub backend against the raw google-cloud-pubsub client, on the emulator.

One emulator (``python -m leasekit.emulators.pubsub``) is started by this script
on a free loopback port. Each scenario gets a fresh topic and subscription and
moves ``--messages`` messages through it in rounds of ``--depth``: a round is
published (not timed), then drained (timed: pull + acknowledge of every
message). Client CPU time (this process; the emulator runs in its own) per
message shows each client's own overhead apart from the server's. Scenarios run
``--repeat`` times, interleaved; the median is reported with the ratio to the
raw loop.

Scenarios:
    raw client      ``SubscriberClient.pull(max_messages=100)``, one ``acknowledge``
                    of the batch's ack ids (the official client, as its
                    synchronous-pull sample does, with its default retry settings)
    leasekit        ``queue.lease(100, duration=60, wait=1)`` (60 s is the
                    subscription's deadline: no ModifyAckDeadline after the pull),
                    ``queue.complete_many`` (one Acknowledge)
    leasekit, 30 s  the same with ``duration=30``: one ModifyAckDeadline per pull

With ``--consumers``, a second table: ``leasekit.Consumer`` (no-op handler,
8 threads, ``lease_duration`` 60 s — the subscription's deadline, no
ModifyAckDeadline after a pull — and 30 s) against the client's own streaming subscriber
(``SubscriberClient.subscribe`` with a callback that only acks, default flow
control), each draining ``--messages`` already published; the clock stops when
the last message was handled (the Consumer completes each before counting it;
the streaming subscriber's acks are still in flight then, batched by its
dispatcher).

Run (about two minutes)::

    cd benchmarks && ../.venv/bin/python bench_gcp_pubsub.py --messages 3000 --repeat 5 --consumers
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
from typing import Any

import leasekit
from leasekit.emulators._process import ServerProcess, free_port, python_module

PROJECT = "bench"
BODY_SIZE = 256
BATCH = 100


class Scenario:
    """A named drain loop over a fresh subscription, and how to publish to it."""

    def __init__(self, name: str, address: str, drain: Callable[[Any, int], int]) -> None:
        from google.cloud import pubsub_v1

        self.name = name
        self.publisher = pubsub_v1.PublisherClient()
        self.subscriber = pubsub_v1.SubscriberClient()
        sub_id = f"bench-{secrets.token_hex(3)}"
        self.queue = leasekit.open(
            "gcp-pubsub", project=PROJECT, queue=sub_id, endpoint=address, create=True
        )
        self.topic = self.publisher.topic_path(PROJECT, sub_id)
        self.subscription = self.subscriber.subscription_path(PROJECT, sub_id)
        self.drain = drain

    def publish(self, count: int) -> None:
        body = os.urandom(BODY_SIZE)
        for start in range(0, count, 1000):
            self.publisher.api.publish(
                topic=self.topic,
                messages=[{"data": body} for _ in range(min(1000, count - start))],
            )

    def close(self) -> None:
        self.queue.delete_queue()
        self.queue.close()
        self.subscriber.close()


def raw_drain(scenario: Scenario, total: int) -> int:
    done = 0
    while done < total:
        response = scenario.subscriber.pull(subscription=scenario.subscription, max_messages=BATCH)
        ack_ids = [m.ack_id for m in response.received_messages]
        if ack_ids:
            scenario.subscriber.acknowledge(subscription=scenario.subscription, ack_ids=ack_ids)
        done += len(ack_ids)
    return done


def leasekit_drain(duration: float) -> Callable[[Scenario, int], int]:
    def drain(scenario: Scenario, total: int) -> int:
        done = 0
        queue = scenario.queue
        while done < total:
            leases = queue.lease(BATCH, duration=duration, wait=1)
            if leases:
                queue.complete_many(leases)
            done += len(leases)
        return done

    return drain


def measure(scenario: Scenario, messages: int, depth: int) -> dict[str, float]:
    wall = cpu = 0.0
    moved = 0
    while moved < messages:
        count = min(depth, messages - moved)
        scenario.publish(count)
        started, started_cpu = time.perf_counter(), time.process_time()
        moved += scenario.drain(scenario, count)
        wall += time.perf_counter() - started
        cpu += time.process_time() - started_cpu
    return {"rate": moved / wall, "cpu_us": cpu / moved * 1e6}


def streaming_drain(scenario: Scenario, total: int) -> float:
    """Seconds until the client's streaming subscriber has called back ``total`` times."""
    done = threading.Event()
    count = 0
    lock = threading.Lock()

    def callback(message: Any) -> None:
        nonlocal count
        message.ack()
        with lock:
            count += 1
            if count >= total:
                done.set()

    started = time.perf_counter()
    future = scenario.subscriber.subscribe(scenario.subscription, callback)
    try:
        if not done.wait(300):
            raise RuntimeError(f"the streaming subscriber handled {count} of {total} in time")
        return time.perf_counter() - started
    finally:
        future.cancel()
        future.result(timeout=30)


def consumer_drain(lease: float) -> Callable[[Scenario, int], float]:
    def drain(scenario: Scenario, total: int) -> float:
        """Seconds until ``leasekit.Consumer`` (8 threads, no-op handler) completed ``total``."""
        consumer = leasekit.Consumer(
            scenario.queue,
            lambda message: None,
            concurrency=8,
            lease_duration=lease,
            handle_signals=False,
        )
        runner = threading.Thread(target=consumer.run, name="bench-consumer")
        start = time.perf_counter()
        runner.start()
        while consumer.stats.completed < total and time.perf_counter() < start + 300:
            time.sleep(0.01)  # sampling the counter; the work happens in the consumer
        finished = time.perf_counter()
        consumer.stop()
        runner.join()
        if consumer.stats.completed < total:
            raise RuntimeError(f"consumer completed {consumer.stats.completed} of {total}")
        return finished - start

    return drain


def compare_consumers(address: str, messages: int, repeat: int) -> None:
    kinds = {
        "client's streaming subscriber": streaming_drain,
        "leasekit.Consumer, 60 s leases": consumer_drain(60),
        "leasekit.Consumer, 30 s leases": consumer_drain(30),
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in kinds}
    for _ in range(repeat):
        for name, drain in kinds.items():
            scenario = Scenario(name, address, raw_drain)
            try:
                scenario.publish(messages)
                cpu = time.process_time()
                seconds = drain(scenario, messages)
                runs[name].append((messages / seconds, (time.process_time() - cpu) / messages))
            finally:
                scenario.close()
    base = statistics.median(r[0] for r in runs["client's streaming subscriber"])
    print()
    print("| consumer | messages/s | ratio to streaming | client CPU µs/message |")
    print("| --- | ---: | ---: | ---: |")
    for name, results in runs.items():
        rate = statistics.median(r[0] for r in results)
        cpu = statistics.median(r[1] for r in results) * 1e6
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f} | {cpu:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--depth", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--consumers", action="store_true", help="also Consumer vs streaming")
    args = parser.parse_args()
    port = free_port()
    server = ServerProcess(
        python_module("leasekit.emulators.pubsub", "--port", str(port), "--log-level", "WARNING"),
        port,
        name="pubsub-emulator",
    )
    address = f"127.0.0.1:{port}"
    os.environ["PUBSUB_EMULATOR_HOST"] = address
    kinds: dict[str, Callable[[Scenario, int], int]] = {
        "raw client": raw_drain,
        "leasekit": leasekit_drain(60),
        "leasekit, 30 s": leasekit_drain(30),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in kinds}
    with server:
        for _ in range(args.repeat):
            for name, drain in kinds.items():
                scenario = Scenario(name, address, drain)
                try:
                    results[name].append(measure(scenario, args.messages, args.depth))
                finally:
                    scenario.close()
        raw = statistics.median(r["rate"] for r in results["raw client"])
        print(
            f"{platform.python_implementation()} {platform.python_version()}, "
            f"{args.messages} messages in rounds of {args.depth}, median of {args.repeat}"
        )
        print("| scenario | messages/s | ratio to raw | client CPU µs/message |")
        print("| --- | ---: | ---: | ---: |")
        for name, runs in results.items():
            rate = statistics.median(r["rate"] for r in runs)
            cpu = statistics.median(r["cpu_us"] for r in runs)
            print(f"| {name} | {rate:,.0f} | {rate / raw:.2f} | {cpu:,.0f} |")
        if args.consumers:
            compare_consumers(address, args.messages, args.repeat)


if __name__ == "__main__":
    main()
