"""Where leasekit's cost per message goes: a per-function profile of lease + complete.

    .venv/bin/python benchmarks/profile_cost.py --batch 10 --batch 100

Runs ``queue.lease(batch)`` + ``queue.complete_many(leases)`` over
``--messages`` messages of a fresh ``sqlite://`` queue in ``--dir`` (default
``/dev/shm``) under :mod:`cProfile`, and prints each function's own time per
message, grouped: the SQLite engine (``sqlite3`` calls), the driver
(``backends/sqlite/``), core (``core/``), and the rest (Python's library).
cProfile adds its own cost to every Python call (about 2-3× on small
functions), so the shares matter, not the absolute numbers; the plain CPU time
per message without the profiler is printed first.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time
from collections import defaultdict

import leasekit


def _fill(directory: str, name: str, messages: int) -> leasekit.Queue:
    queue = leasekit.open(f"sqlite:///{directory}/{name}.db?queue=q", create=True)
    queue.send_many([os.urandom(100) for _ in range(messages)])
    return queue


def _drain(queue: leasekit.Queue, batch: int) -> None:
    while leases := queue.lease(batch, duration=60):
        queue.complete_many(leases)


def _group(path: str) -> str:
    if "backends/sqlite/" in path:
        return "driver"
    if "/core/" in path or ("/leasekit/" in path and "/backends/" not in path):
        return "core"
    if path == "~":  # C functions: sqlite3 calls (and a few builtins)
        return "engine"
    return "other"


def profile(directory: str, batch: int, messages: int) -> None:
    queue = _fill(directory, f"plain-{batch}", messages)
    cpu = time.process_time()
    _drain(queue, batch)
    plain = (time.process_time() - cpu) / messages * 1e6
    queue.close()
    queue = _fill(directory, f"profiled-{batch}", messages)
    profiler = cProfile.Profile()
    profiler.runcall(_drain, queue, batch)
    queue.close()
    stats = pstats.Stats(profiler)
    rows: list[tuple[float, str, str]] = []
    groups: dict[str, float] = defaultdict(float)
    for (path, line, function), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        group = _group(path)
        per = own / messages * 1e6
        groups[group] += per
        where = f"{os.path.basename(path)}:{line}" if path != "~" else ""
        rows.append((per, group, f"{function} {where}".strip()))
    total = sum(groups.values())
    print(f"\n### batch {batch}: {plain:.1f} µs CPU per message without the profiler\n")
    print("| group | share of profiled time |")
    print("| --- | ---: |")
    for group in ("engine", "driver", "core", "other"):
        print(f"| {group} | {groups[group] / total:.0%} |")
    print("\n| function (group) | share |")
    print("| --- | ---: |")
    for per, group, name in sorted(rows, reverse=True)[:15]:
        print(f"| `{name}` ({group}) | {per / total:.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, action="append")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="leasekit-profile-", dir=args.dir)
    for batch in args.batch or [10, 100]:
        profile(directory, batch, args.messages)


if __name__ == "__main__":
    main()
