"""CPU time per single-message ``lease(1)`` + ``complete()`` on memory:// and SQLite.

    .venv/bin/python benchmarks/bench_single_calls.py --messages 3000 --rounds 5

The per-call overhead of core, without batching: process CPU time (not wall
time, so other jobs on the machine matter less), median of ``--rounds``.
Run it under two checkouts' venvs, alternating, to compare commits.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import leasekit


def per_message(url: str, messages: int) -> float:
    """CPU µs per lease(1) + complete() over ``messages`` messages on ``url``."""
    queue = leasekit.open(url, create=True)
    queue.send_many([b"x" * 100] * messages)
    start = time.process_time()
    for _ in range(messages):
        [lease] = queue.lease(1, duration=30)
        lease.complete()
    cpu = (time.process_time() - start) / messages * 1e6
    queue.close()
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    folder = tempfile.mkdtemp()
    memory, sqlite = [], []
    for i in range(args.rounds):
        memory.append(per_message(f"memory://single-{i}", args.messages))
        sqlite.append(per_message(f"sqlite:///{folder}/single-{i}.db?queue=q", args.messages))
    print(
        f"lease(1)+complete() CPU per message: memory {statistics.median(memory):.1f} us, "
        f"sqlite {statistics.median(sqlite):.1f} us (median of {args.rounds})"
    )


if __name__ == "__main__":
    main()
