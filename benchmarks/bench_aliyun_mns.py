"""Benchmark the Alibaba Cloud MNS backend against the raw aliyun-mns-sdk, on leasekit's emulator.

The MNS emulator (``python -m leasekit.emulators.mns``) is started by this
script on a free loopback port. Each scenario gets a fresh queue (created with
MNS's default 30 s visibility, which is also the lease asked for, so no
scenario pays a visibility change after receive), fills it with ``--messages``
messages through its own producer (timed: the send rate), then drains it
(timed: the consume rate, receive + delete of every message). Every scenario
runs ``--repeat`` times in rounds (the order rotating); the median rate is
reported with the median of the per-round ratios to the raw SDK loop (robust
to load that drifts between rounds), and the client's CPU time per consumed
message (robust to load from other processes).

Scenarios:
    raw SDK              ``batch_receive_message(16, wait 1 s)``, ``delete_message`` each;
                         sent with ``batch_send_message`` (16), the SDK's base64 encoding
    raw SDK, batched     the same receive, one ``batch_delete_message`` per batch
    leasekit             ``queue.lease(16, duration=30, wait=1)``, ``lease.complete()`` each;
                         sent with ``queue.send_many`` (batches of 16)
    leasekit.Consumer    ``leasekit.Consumer(queue, no-op handler, concurrency=N)``
    leasekit, N threads  the same loop in a ThreadPoolExecutor of N lease/complete
                         workers (:func:`leasekit_concurrent`), for comparison
    leasekit, N threads, the same workers settling each leased batch with one
      batched settle     ``Queue.complete_many`` (``BatchDeleteMessage``), for comparison

``--paired N`` then measures target (b) more finely: N rounds in which the raw
loop and the leasekit loop take turns (alternating who goes first) draining 96
messages each from two equal queues, so both see the same machine load from
moment to moment (see
:func:`paired_raw_vs_leasekit`).

Run (bounded: about a minute, plus about 10 s per paired round)::

    .venv/bin/python benchmarks/bench_aliyun_mns.py --messages 2000 --repeat 5 \
        --workers 8 --paired 5
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
from typing import Any

from _consumer import consume_with_consumer
from mns.account import Account
from mns.mns_exception import MNSServerException
from mns.queue import Message, QueueMeta

import leasekit
from leasekit.emulators._process import ServerProcess, free_port, python_module
from leasekit.queue import Queue

KEY_ID = "bench-key"  # the emulator's credentials for this run (not secret)
KEY_SECRET = "bench-secret"
BODY_SIZE = 256
BATCH = 16


def _name(prefix: str) -> str:
    return f"bench-{prefix}-{secrets.token_hex(3)}"


def _bodies(count: int) -> list[bytes]:
    return [os.urandom(BODY_SIZE // 2).hex().encode()[:BODY_SIZE] for _ in range(count)]


# ---------------------------------------------------------------- raw SDK


def raw_send(queue: Any, bodies: list[bytes]) -> None:
    """BatchSendMessage of 16 (the SDK base64-encodes a str body)."""
    for start in range(0, len(bodies), BATCH):
        queue.batch_send_message([Message(b.decode()) for b in bodies[start : start + BATCH]])


def raw_consume(queue: Any, total: int, *, batched: bool) -> int:
    """Receive 16 at a time and delete each (or the batch) until ``total`` are done."""
    done = 0
    while done < total:
        try:
            messages = queue.batch_receive_message(BATCH, 1)
        except MNSServerException as exc:
            if exc.type == "MessageNotExist":
                continue
            raise
        if batched:
            queue.batch_delete_message([m.receipt_handle for m in messages])
        else:
            for m in messages:
                queue.delete_message(m.receipt_handle)
        done += len(messages)
    return done


# ---------------------------------------------------------------- leasekit


def leasekit_consume(queue: Queue, total: int) -> int:
    """One thread: lease 16, complete each."""
    done = 0
    while done < total:
        for lease in queue.lease(BATCH, duration=30, wait=1):
            lease.complete()
            done += 1
    return done


def leasekit_concurrent(queue: Queue, total: int, workers: int, *, batched: bool = False) -> float:
    """``workers`` threads each running the lease/complete loop until ``total`` are done.

    A stand-in for ``leasekit.Consumer(queue, handler, concurrency=workers)``.
    Each worker leases a small batch so the messages spread over the workers.
    Returns the seconds until the last message was completed: workers still in
    an empty long poll then (at most ``wait=1`` s) are waited for, not timed.
    With ``batched``, each worker settles its leased batch with one
    ``Queue.complete_many`` (``BatchDeleteMessage``) instead of one ``complete()`` each.
    """
    lock = threading.Lock()
    done = 0
    finished = 0.0
    per_lease = max(1, min(BATCH, total // (workers * 2)))
    start = time.perf_counter()

    def work() -> None:
        nonlocal done, finished
        while True:
            with lock:
                if done >= total:
                    return
            leases = queue.lease(per_lease, duration=30, wait=1)
            if batched:
                queue.complete_many(leases)
            else:
                for lease in leases:
                    lease.complete()
            with lock:
                done += len(leases)
                if leases and done >= total:
                    finished = time.perf_counter()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(work) for _ in range(workers)]:
            future.result()
    return finished - start


# ------------------------------------------------------------------ runner


RAW = "raw SDK"


class Result:
    """Timings of one scenario in one round."""

    def __init__(self, messages: int, send_s: float, consume_s: float, cpu_s: float) -> None:
        self.consume = messages / consume_s
        self.send = messages / send_s
        self.cpu_us = cpu_s / messages * 1e6  # client CPU per consumed message


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _raw_scenario(account: Account, messages: int, *, batched: bool) -> Result:
    raw = account.get_queue(_name("raw"))
    raw.create(QueueMeta())
    try:
        send_s = _timed(lambda: raw_send(raw, _bodies(messages)))
        cpu = time.process_time()
        consume_s = _timed(lambda: raw_consume(raw, messages, batched=batched))
        return Result(messages, send_s, consume_s, time.process_time() - cpu)
    finally:
        raw.delete()


def _leasekit_scenario(
    options: dict[str, str],
    messages: int,
    threads: int,
    *,
    batched: bool = False,
    consumer: bool = False,
) -> Result:
    queue = leasekit.open("aliyun-mns", queue=_name("lk"), create=True, **options)
    try:
        send_s = _timed(lambda: queue.send_many(_bodies(messages)))
        cpu = time.process_time()
        if consumer:
            consume_s = consume_with_consumer(queue, messages, threads)
        elif threads == 1:
            consume_s = _timed(lambda: leasekit_consume(queue, messages))
        else:
            consume_s = leasekit_concurrent(queue, messages, threads, batched=batched)
        return Result(messages, send_s, consume_s, time.process_time() - cpu)
    finally:
        queue.delete_queue()
        queue.close()


def paired_raw_vs_leasekit(
    account: Account, options: dict[str, str], messages: int, chunk: int = 96
) -> tuple[float, float, float]:
    """Drain two equal queues, raw and leasekit taking turns of ``chunk`` messages.

    Returns:
        (raw msg/s, leasekit msg/s, leasekit / raw), each side timed over its own turns.
    """
    raw = account.get_queue(_name("pair-raw"))
    raw.create(QueueMeta())
    queue = leasekit.open("aliyun-mns", queue=_name("pair-lk"), create=True, **options)
    try:
        raw_send(raw, _bodies(messages))
        queue.send_many(_bodies(messages))
        raw_s = leasekit_s = 0.0
        for index, start in enumerate(range(0, messages, chunk)):
            turn = min(chunk, messages - start)
            if index % 2:  # alternate who goes first, so neither always follows the other
                leasekit_s += _timed(lambda turn=turn: leasekit_consume(queue, turn))
                raw_s += _timed(lambda turn=turn: raw_consume(raw, turn, batched=False))
            else:
                raw_s += _timed(lambda turn=turn: raw_consume(raw, turn, batched=False))
                leasekit_s += _timed(lambda turn=turn: leasekit_consume(queue, turn))
        return messages / raw_s, messages / leasekit_s, raw_s / leasekit_s
    finally:
        raw.delete()
        queue.delete_queue()
        queue.close()


def run(endpoint: str, messages: int, repeat: int, workers: int) -> dict[str, dict[str, float]]:
    """Run every scenario ``repeat`` times; the order rotates each round.

    The machine's load drifts between runs, so each scenario's ratio to the
    raw SDK is taken within a round (the two ran seconds apart) and the
    median of those ratios is reported, with the median rates.
    """
    account = Account(endpoint, KEY_ID, KEY_SECRET)
    options = {"endpoint": endpoint, "access_key_id": KEY_ID, "access_key_secret": KEY_SECRET}
    scenarios: list[tuple[str, Callable[[int], Result]]] = [
        (RAW, lambda n: _raw_scenario(account, n, batched=False)),
        ("raw SDK, batched delete", lambda n: _raw_scenario(account, n, batched=True)),
        ("leasekit", lambda n: _leasekit_scenario(options, n, 1)),
        (
            f"leasekit.Consumer, concurrency {workers}",
            lambda n: _leasekit_scenario(options, n, workers, consumer=True),
        ),
        (
            f"leasekit, {workers} threads (ThreadPoolExecutor)",
            lambda n: _leasekit_scenario(options, n, workers),
        ),
        (
            f"leasekit, {workers} threads, batched settle (Queue.complete_many)",
            lambda n: _leasekit_scenario(options, n, workers, batched=True),
        ),
    ]
    for _, scenario in scenarios:  # warm up: imports, connections, the emulator's code paths
        scenario(min(messages, 64))
    rounds: list[dict[str, Result]] = []
    for i in range(repeat):
        shift = i % len(scenarios)
        order = scenarios[shift:] + scenarios[:shift]
        rounds.append({label: scenario(messages) for label, scenario in order})
    summary: dict[str, dict[str, float]] = {}
    for label, _ in scenarios:
        per_round = [r[label] for r in rounds]
        summary[label] = {
            "consume": statistics.median(r.consume for r in per_round),
            "send": statistics.median(r.send for r in per_round),
            "cpu_us": statistics.median(r.cpu_us for r in per_round),
            "consume_ratio": statistics.median(r[label].consume / r[RAW].consume for r in rounds),
            "send_ratio": statistics.median(r[label].send / r[RAW].send for r in rounds),
        }
    return summary


def markdown(summary: dict[str, dict[str, float]]) -> str:
    lines = [
        "| scenario | consume msg/s | vs raw | client CPU µs/msg | send msg/s | vs raw |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, m in summary.items():
        lines.append(
            f"| {label} | {m['consume']:.0f} | {m['consume_ratio']:.2f} | {m['cpu_us']:.0f} "
            f"| {m['send']:.0f} | {m['send_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000, help="messages per run (bounded)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of every scenario")
    parser.add_argument("--workers", type=int, default=8, help="threads for the concurrent run")
    parser.add_argument(
        "--paired",
        type=int,
        default=0,
        help="rounds of raw and leasekit loops taking turns on equal queues (target b)",
    )
    args = parser.parse_args()
    if not 1 <= args.messages <= 10000:
        parser.error(
            "--messages must be between 1 and 10000 (the emulator sorts a queue per receive)"
        )
    if not 1 <= args.repeat <= 10 or not 2 <= args.workers <= 64 or not 0 <= args.paired <= 20:
        parser.error("--repeat must be 1-10, --workers 2-64 and --paired 0-20")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = ServerProcess(
        python_module("leasekit.emulators.mns", "--port", str(port), "--log-level", "WARNING"),
        port,
        env={"LEASEKIT_MNS_ACCESS_KEY_ID": KEY_ID, "LEASEKIT_MNS_ACCESS_KEY_SECRET": KEY_SECRET},
        name="mns-emulator",
    )
    paired: list[tuple[float, float, float]] = []
    with server:
        summary = run(endpoint, args.messages, args.repeat, args.workers)
        account = Account(endpoint, KEY_ID, KEY_SECRET)
        options = {"endpoint": endpoint, "access_key_id": KEY_ID, "access_key_secret": KEY_SECRET}
        for _ in range(args.paired):
            paired.append(paired_raw_vs_leasekit(account, options, args.messages))
    print(
        f"MNS emulator (leasekit.emulators.mns), {args.messages} messages of {BODY_SIZE} bytes, "
        f"median of {args.repeat} rounds (ratios: median of per-round ratios); "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}\n"
    )
    print(markdown(summary))
    if paired:
        print(
            f"\nPaired raw / leasekit loops, {args.messages} messages each, turns of 96, "
            f"{len(paired)} rounds:"
        )
        for raw_rate, lk_rate, ratio in paired:
            print(f"- raw {raw_rate:.0f} msg/s, leasekit {lk_rate:.0f} msg/s: {ratio:.3f}")
        ratios = [ratio for _, _, ratio in paired]
        print(
            f"- leasekit / raw: median {statistics.median(ratios):.3f} "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
