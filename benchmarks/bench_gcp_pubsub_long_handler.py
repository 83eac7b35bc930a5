"""Handlers longer than the lease extension limit: duplicates, the client vs leasekit.

    cd benchmarks && ../.venv/bin/python bench_gcp_pubsub_long_handler.py --messages 6 --handle 30

The client's streaming subscriber stops extending a message's lease after
``FlowControl.max_lease_duration`` (1 hour by default); a handler that runs
longer loses the message to another worker, which runs it again. Here the
limit is scaled down to ``--limit`` seconds (15) and the handler sleeps
``--handle`` seconds (30): two subscriber clients on one subscription (no
exactly-once, ack deadline 10 s, as most are) handle ``--messages`` messages,
and every handler run of a message already run is a duplicate. leasekit's
side: two ``Consumer`` loops on an identical subscription with 10 s leases and
no ``max_lifetime`` (its default: renew while the handler runs). Both sides run
for ``2 * handle + 15`` seconds on leasekit's emulator.
"""

from __future__ import annotations

import argparse
import os
import secrets
import threading
import time
from collections import Counter
from typing import Any

import leasekit
from leasekit.emulators._process import ServerProcess, free_port, python_module

PROJECT = "bench"


def client_side(
    address: str, messages: int, handle: float, limit: float, run: float
) -> Counter[str]:
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient()
    admin = pubsub_v1.SubscriberClient()
    name = f"long-{secrets.token_hex(3)}"
    topic, sub = publisher.topic_path(PROJECT, name), admin.subscription_path(PROJECT, name)
    publisher.create_topic(name=topic)
    admin.create_subscription(request={"name": sub, "topic": topic, "ack_deadline_seconds": 10})
    for n in range(messages):
        publisher.publish(topic, b"%d" % n).result()
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    def callback(message: Any) -> None:
        with lock:
            runs[message.message_id] += 1
        time.sleep(handle)  # the work
        message.ack()

    flow = pubsub_v1.types.FlowControl(max_messages=messages, max_lease_duration=limit)
    clients = [pubsub_v1.SubscriberClient() for _ in range(2)]
    futures = [c.subscribe(sub, callback, flow_control=flow) for c in clients]
    time.sleep(run)  # both workers run for the same time as leasekit's
    for future in futures:
        future.cancel()
    for future in futures:
        future.result(timeout=handle + 30)
    admin.delete_subscription(request={"subscription": sub})
    return runs


def leasekit_side(address: str, messages: int, handle: float, run: float) -> Counter[str]:
    name = f"long-{secrets.token_hex(3)}"
    options = {"project": PROJECT, "endpoint": address, "exactly_once": False, "ack_deadline": 10}
    queue = leasekit.open("gcp-pubsub", queue=name, create=True, **options)
    queue.send_many([b"%d" % n for n in range(messages)])
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(message: leasekit.Message) -> None:
        with lock:
            runs[message.id] += 1
        time.sleep(handle)

    queues = [leasekit.open("gcp-pubsub", queue=name, **options) for _ in range(2)]
    consumers = [
        leasekit.Consumer(q, handler, concurrency=messages, lease_duration=10, handle_signals=False)
        for q in queues
    ]
    threads = [threading.Thread(target=c.run) for c in consumers]
    for thread in threads:
        thread.start()
    time.sleep(run)
    for consumer in consumers:
        consumer.stop()
    for thread in threads:
        thread.join()
    for q in queues:
        q.close()
    queue.delete_queue()
    queue.close()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=6)
    parser.add_argument("--handle", type=float, default=30.0)
    parser.add_argument("--limit", type=float, default=15.0)
    args = parser.parse_args()
    run = 2 * args.handle + 15
    port = free_port()
    server = ServerProcess(
        python_module("leasekit.emulators.pubsub", "--port", str(port), "--log-level", "WARNING"),
        port,
        name="pubsub-emulator",
    )
    address = f"127.0.0.1:{port}"
    os.environ["PUBSUB_EMULATOR_HOST"] = address
    with server:
        sides = {
            f"client's subscriber (max_lease_duration={args.limit:g} s)": client_side(
                address, args.messages, args.handle, args.limit, run
            ),
            "leasekit.Consumer (10 s leases, kept while the handler runs)": leasekit_side(
                address, args.messages, args.handle, run
            ),
        }
    print(f"{args.messages} messages, handler {args.handle:g} s, two workers, {run:g} s each side")
    print("| side | handler runs | messages | duplicates |")
    print("| --- | ---: | ---: | ---: |")
    for name, runs in sides.items():
        total = sum(runs.values())
        print(f"| {name} | {total} | {len(runs)} | {total - len(runs)} |")


if __name__ == "__main__":
    main()
