"""LeaseKeeper at scale vs a naive threading.Timer per lease, in one script.

    .venv/bin/python benchmarks/bench_keeper.py --leases 100000 --lease 2 --seconds 60
    .venv/bin/python benchmarks/bench_keeper.py --leases 2000 --lease 2 --seconds 20 --naive

Holds N leases on ``memory://`` with a short physical lease for a while and
reports: leases lost, renewal lateness (p50/p99/max, seconds after the planned
renewal point), renewals made, and process CPU seconds. The naive renewer is
what many tutorials show: a ``threading.Timer`` per message that renews at 70 %
of the lease and re-arms itself. Both run in this process, one after the other,
on the same backend; the ratio rows compare CPU per renewal and p99 lateness.
"""

from __future__ import annotations

import argparse
import resource
import threading
import time
import warnings

import leasekit
from leasekit.lease import Lease
from leasekit.queue import Queue

warnings.simplefilter("ignore", RuntimeWarning)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def lease_all(
    queue: Queue, n: int, duration: float, keeper: leasekit.LeaseKeeper | None = None
) -> list[Lease]:
    """Send ``n`` messages and lease them all, 1000 at a time.

    With ``keeper``, each batch is given to it as soon as it is received, as an
    application would: sending and leasing 100,000 takes about 2.4 s here, longer
    than a 2 s lease, so leases added only after the last receive could lapse
    before the keeper ever saw them.
    """
    for start in range(0, n, 1000):
        queue.send_many([b"x"] * min(1000, n - start))
    leases: list[Lease] = []
    while len(leases) < n:
        batch = queue.lease(min(1000, n - len(leases)), duration=duration)
        if keeper is not None:
            for lease in batch:
                keeper.add(lease)
        leases.extend(batch)
    return leases


def check_none_came_back(queue: Queue) -> int:
    """Messages visible again = leases that lapsed."""
    stats = queue.stats()
    return int(stats.visible or 0)


def run_keeper(n: int, duration: float, seconds: float) -> dict[str, float]:
    queue = leasekit.open("memory", queue=f"keeper-{time.monotonic_ns()}", create=True)
    keeper = leasekit.LeaseKeeper()
    leases = lease_all(queue, n, duration, keeper)
    start_cpu, start = cpu(), time.monotonic()
    # The hold is measured from here: renewals made while leasing are not in its CPU.
    renewed_before, calls_before = keeper.stats.renewed, keeper.stats.renew_calls
    lapsed = 0
    while time.monotonic() - start < seconds:
        time.sleep(1.0)  # sampling interval of the check below
        lapsed = max(lapsed, check_none_came_back(queue))
    used = cpu() - start_cpu
    stats = keeper.stats
    keeper.stop()
    # Each lost lease once: the keeper's count and the leases' flags name the same leases.
    lost = max(stats.lost, sum(1 for lease in leases if lease.lost.is_set()))
    renewed = stats.renewed - renewed_before
    result = {
        "leases": n,
        "lost": lost,
        "lapsed_visible": lapsed,
        "renewals": renewed,
        "renew_calls": stats.renew_calls - calls_before,
        "p50": stats.lateness_percentile(0.50),
        "p99": stats.lateness_percentile(0.99),
        "max": stats.lateness_percentile(1.0),
        "cpu_s": used,
        "cpu_per_renewal_us": used / max(renewed, 1) * 1e6,
    }
    queue.complete_many(leases)
    queue.delete_queue()
    return result


def run_naive(n: int, duration: float, seconds: float) -> dict[str, float]:
    """A threading.Timer per lease, renewing at 70 % of the lease."""
    queue = leasekit.open("memory", queue=f"naive-{time.monotonic_ns()}", create=True)
    leases = lease_all(queue, n, duration)
    lateness: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()
    renewals = lost = 0
    started = 0

    def arm(lease: Lease) -> None:
        nonlocal started
        planned = time.monotonic() + duration * 0.7

        def fire() -> None:
            nonlocal renewals, lost
            if stop.is_set():
                return
            with lock:
                lateness.append(max(0.0, time.monotonic() - planned))
            try:
                lease.renew()
                with lock:
                    renewals += 1
                arm(lease)
            except leasekit.LeaseError:
                with lock:
                    lost += 1

        timer = threading.Timer(duration * 0.7, fire)
        timer.daemon = True
        timer.start()
        started += 1

    start_cpu, start = cpu(), time.monotonic()
    failed_to_start = ""
    try:
        for lease in leases:
            arm(lease)
    except RuntimeError as exc:  # "can't start new thread"
        failed_to_start = f"{exc} after {started} timers"
    lapsed = 0
    while time.monotonic() - start < seconds:
        time.sleep(1.0)
        lapsed = max(lapsed, check_none_came_back(queue))
    stop.set()
    used = cpu() - start_cpu
    ordered = sorted(lateness) or [0.0]
    result = {
        "leases": n,
        "lost": lost,
        "lapsed_visible": lapsed,
        "renewals": renewals,
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "max": ordered[-1],
        "cpu_s": used,
        "cpu_per_renewal_us": used / max(renewals, 1) * 1e6,
        "error": failed_to_start,
    }
    queue.delete_queue()
    return result


def show(name: str, r: dict[str, float]) -> None:
    print(
        f"{name:>8}: leases={r['leases']:,} lost={r['lost']} lapsed={r['lapsed_visible']} "
        f"renewals={r['renewals']:,} lateness p50={r['p50'] * 1000:.1f} ms "
        f"p99={r['p99'] * 1000:.1f} ms max={r['max'] * 1000:.1f} ms "
        f"cpu={r['cpu_s']:.1f} s ({r['cpu_per_renewal_us']:.1f} us/renewal)"
        + (f" error={r['error']}" if r.get("error") else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--leases", type=int, default=100_000)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--naive", action="store_true", help="also run the Timer-per-lease renewer")
    parser.add_argument("--naive-leases", type=int, default=None)
    args = parser.parse_args()
    keeper = run_keeper(args.leases, args.lease, args.seconds)
    show("keeper", keeper)
    if args.naive:
        naive = run_naive(args.naive_leases or args.leases, args.lease, args.seconds)
        show("naive", naive)
        print(
            f"naive/keeper: cpu per renewal "
            f"{naive['cpu_per_renewal_us'] / keeper['cpu_per_renewal_us']:.1f}x; "
            f"p99 lateness {naive['p99'] * 1000:.0f} ms vs {keeper['p99'] * 1000:.1f} ms; "
            f"lapsed {naive['lapsed_visible']} vs {keeper['lapsed_visible']}"
        )


if __name__ == "__main__":
    main()
