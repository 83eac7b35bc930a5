"""What keeping N leases costs Python's garbage collector, on Redis or Valkey.

    .venv/bin/python benchmarks/gc_keeper.py --server redis --leases 100000 --seconds 60

Takes N leases (10 s physical) from a server it starts (as ``bench_redis.py``
does), hands each receive's leases to a :class:`leasekit.LeaseKeeper`, and
reports:

* GC-tracked objects per kept lease (``gc.get_objects()`` before and after);
* over ``--seconds`` of keeping them (after one ``gc.collect()``, so what is
  counted is the hold's own): the collections of each generation, and the
  objects in the young generations each time a middle-generation collection
  starts, by type — those still alive are promoted to the old generation, and
  Python 3.11 runs a full collection once the promoted exceed a quarter of the
  long-lived objects;
* how long a full collection takes in that process (``gc.collect()``, 5 times).

The collector is left as Python sets it; ``gc.collect()`` is called only to
start the count from zero and to time a collection. To compare commits, run
it from each checkout.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import uuid
from collections import Counter
from typing import Any

import leasekit
from leasekit.emulators.redis import LocalRedis


def _kind(obj: object) -> str:
    if type(obj) is tuple:  # by what it holds: a tuple of a lease is not a tuple of ints
        return "tuple(" + ", ".join(type(item).__name__ for item in obj[:3]) + ")"
    return type(obj).__name__


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--server", choices=("redis", "valkey"), default="redis")
    parser.add_argument("--leases", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    n = args.leases
    with LocalRedis(args.server) as server:
        url = f"{server.url()}?queue=gc-{uuid.uuid4().hex[:8]}"
        with leasekit.open(url, create=True) as queue, leasekit.LeaseKeeper() as keeper:
            for start in range(0, n, 500):
                queue.send_many([b"x"] * min(500, n - start))
            gc.collect()
            before = len(gc.get_objects())
            leases: list[Any] = []
            while len(leases) < n:
                batch = queue.lease(min(500, n - len(leases)), duration=10)
                keeper.add_many(batch)
                leases.extend(batch)
            gc.collect()
            tracked = len(gc.get_objects())
            print(
                f"{args.server}: {n:,} kept leases, {(tracked - before) / n:.2f} GC-tracked "
                f"objects each, {tracked:,} in the process"
            )
            collections = [0, 0, 0]
            young: Counter[str] = Counter()

            def watch(phase: str, info: dict[str, int]) -> None:
                if phase != "start":
                    return
                collections[info["generation"]] += 1
                if info["generation"] == 1:
                    for obj in gc.get_objects(0) + gc.get_objects(1):
                        young[_kind(obj)] += 1

            renewed = keeper.stats.renewed
            gc.collect()
            gc.callbacks.append(watch)
            until = time.monotonic() + args.seconds
            while time.monotonic() < until:
                time.sleep(0.5)  # the keeper renews on its own threads meanwhile
            gc.callbacks.remove(watch)
            renewals = keeper.stats.renewed - renewed
            print(
                f"  {args.seconds:.0f} s kept: {renewals:,} renewals, lost "
                f"{keeper.stats.lost}; collections by generation (young, middle, full) "
                f"{collections}"
            )
            total = sum(young.values())
            print(
                f"  in the young generations when a middle one started (promoted if alive): "
                f"{total:,} ({total / max(renewals, 1):.4f} a renewal); the most:"
            )
            for kind, count in young.most_common(6):
                print(f"    {kind}: {count:,}")
            pauses = []
            for _ in range(5):
                began = time.perf_counter()
                gc.collect()
                pauses.append((time.perf_counter() - began) * 1000)
            print(
                f"  a full collection: {min(pauses):.0f}-{max(pauses):.0f} ms "
                f"(median {statistics.median(pauses):.0f})"
            )
            keeper.stop()
            queue.complete_many(leases)
            queue.delete_queue()


if __name__ == "__main__":
    main()
