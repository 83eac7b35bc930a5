"""Consumer throughput when receive latency, not CPU, is the bound: 1 vs N receivers.

A ``memory://`` queue whose receive takes ``--rtt`` seconds (a sleep standing in
for the round trip to a distant region) and returns at most ``--batch``
messages (10, as SQS). A no-op handler, ``--concurrency`` workers. With one
receiver the Consumer can lease at most ``batch`` messages per round trip;
``receivers=N`` keeps N receive calls in flight. Every configuration drains the
same number of messages in one process, one after the other; rates are
reported with their ratio to one receiver.

Run (bounded: about 20 s)::

    .venv/bin/python benchmarks/bench_consumer_receivers.py --messages 3000 --rtt 0.02
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

from _consumer import consume_with_consumer

import leasekit
from leasekit.queue import Queue


def _queue(name: str, messages: int, batch: int, rtt: float) -> Queue:
    queue = leasekit.open("memory", queue=name, create=True)
    driver = queue.driver
    driver.capabilities = driver.capabilities.replace(max_receive_batch=batch)
    real = driver.receive

    def receive(max_messages: int, visibility: float, wait: float) -> Any:
        time.sleep(rtt)  # the round trip
        return real(max_messages, visibility, wait)

    driver.receive = receive  # type: ignore[method-assign]
    queue.send_many([b"x" * 256] * messages)
    return queue


def drain(
    messages: int, batch: int, rtt: float, concurrency: int, receivers: int, prefetch: int | None
) -> float:
    """Messages per second for one Consumer draining ``messages``."""
    queue = _queue(f"receivers-{receivers}-{time.monotonic_ns()}", messages, batch, rtt)
    try:
        seconds = consume_with_consumer(
            queue, messages, concurrency, receivers=receivers, prefetch=prefetch
        )
    finally:
        queue.delete_queue()
        queue.close()
    return messages / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rtt", type=float, default=0.02, help="seconds per receive call")
    parser.add_argument("--batch", type=int, default=10, help="most messages per receive")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--receivers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--prefetch", type=int, default=None, help="Consumer prefetch (default: its own)"
    )
    args = parser.parse_args()
    if not 1 <= args.messages <= 100_000 or not 0 < args.rtt <= 1 or args.batch < 1:
        parser.error("--messages 1-100000, --rtt in (0, 1] s, --batch >= 1")
    print(
        f"memory:// with a {args.rtt * 1000:.0f} ms receive and at most {args.batch} per "
        f"receive, {args.messages} messages, concurrency {args.concurrency}, prefetch "
        f"{args.prefetch or 'default'}, no-op handler; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs\n"
    )
    print("| receivers | msg/s | vs 1 receiver | bound: receivers x batch / rtt |")
    print("| ---: | ---: | ---: | ---: |")
    base = None
    for receivers in args.receivers:
        rate = drain(
            args.messages, args.batch, args.rtt, args.concurrency, receivers, args.prefetch
        )
        base = base or rate
        bound = receivers * args.batch / args.rtt
        print(f"| {receivers} | {rate:.0f} | {rate / base:.2f} | {bound:.0f} |")


if __name__ == "__main__":
    main()
