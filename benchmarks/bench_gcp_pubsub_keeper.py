"""LeaseKeeper holding many Pub/Sub leases on the emulator: lost leases, batching, redeliveries.

    cd benchmarks && ../.venv/bin/python bench_gcp_pubsub_keeper.py --leases 100000 --seconds 60

Starts leasekit's Pub/Sub emulator, publishes ``--leases`` messages to an
exactly-once subscription, leases them all (1,000 per pull) into one
``LeaseKeeper`` with ``--lease``-second leases, and holds them ``--seconds``.
Reports the leases the keeper lost, its renewal calls (``ModifyAckDeadline``
batches) and ack ids renewed, renewal lateness, CPU, and how many messages a
rival pulling the same subscription every second got (a lapsed lease shows
there as a redelivery). At the end every lease is completed in batches.
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import time

import leasekit
from leasekit.emulators._process import ServerProcess, free_port, python_module


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=100_000)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    port = free_port()
    server = ServerProcess(
        python_module("leasekit.emulators.pubsub", "--port", str(port), "--log-level", "WARNING"),
        port,
        name="pubsub-emulator",
    )
    with server:
        options = {"project": "bench", "endpoint": f"127.0.0.1:{port}"}
        name = f"keeper-{secrets.token_hex(3)}"
        queue = leasekit.open("gcp-pubsub", queue=name, create=True, **options)
        rival = leasekit.open("gcp-pubsub", queue=name, **options)
        body = os.urandom(64)
        for start in range(0, args.leases, 1000):
            queue.send_many([body] * min(1000, args.leases - start))
        calls: list[int] = []
        driver = queue.driver
        renew = driver.change_visibility

        def counted(receipts: list[str], seconds: float) -> object:
            calls.append(len(receipts))
            return renew(receipts, seconds)

        driver.change_visibility = counted  # type: ignore[method-assign]
        keeper = leasekit.LeaseKeeper()
        leases = []
        started = time.monotonic()
        while len(leases) < args.leases and time.monotonic() < started + 300:
            batch = queue.lease(1000, duration=args.lease, wait=1)
            keeper.add_many(batch)
            leases += batch
        leased_in = time.monotonic() - started
        calls.clear()
        cpu0, hold_start = cpu(), time.monotonic()
        stolen = 0
        while time.monotonic() < hold_start + args.seconds:
            got = rival.lease(100, duration=60, wait=0)
            stolen += len(got)
            time.sleep(1.0)  # a rival's pace; what it gets is what lapsed
        held_cpu = cpu() - cpu0
        stats = keeper.stats
        keeper.stop()
        settled = queue.complete_many(leases)
        failed = sum(1 for r in settled if r is not None)
        print(
            f"leases={len(leases):,} (leased in {leased_in:.1f} s) lease={args.lease:g} s "
            f"held={args.seconds:g} s lost={stats.lost} redelivered_to_rival={stolen} "
            f"renew_calls={len(calls):,} ack_ids_renewed={sum(calls):,} "
            f"largest_batch={max(calls, default=0)} cpu={held_cpu:.1f} s "
            f"complete_failures={failed}"
        )
        rival.close()
        queue.delete_queue()
        queue.close()


if __name__ == "__main__":
    main()
