"""SQLite across processes: no message handed to two holders, and sends survive SIGKILL.

Each worker is a separate Python process (``subprocess`` running a small script
that uses the real clock), so the only thing they share is the database file.
Workers start together on a line written to their stdin, and report what they
did as JSON on stdout; nothing here sleeps to synchronise.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import IO, Any

import pytest

import leasekit

#: Every process run here must finish within this many seconds.
DEADLINE = 60.0
#: Longer than any test: no lease expires, so no legitimate redelivery happens.
LONG_LEASE = 600.0
CONSUMERS = 4
PRESENT = 5000
PRODUCED = 2500

CONSUMER = textwrap.dedent(
    """
    import json, random, sys, time
    import leasekit

    path, seed, duration = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rng = random.Random(seed)
    q = leasekit.open("sqlite", path=path, queue="jobs")
    print("ready", flush=True)
    sys.stdin.readline()
    held = []  # [message id, receipt, body, leased at, completed at, delivery count]
    stop = False
    while not stop:
        batch = q.lease(rng.randint(1, 40), duration=duration, wait=5)
        leased_at = time.time()
        work = []
        for lease in batch:
            if lease.message.body == b"STOP":
                if stop:
                    lease.abandon()  # another consumer needs this one
                else:
                    stop = True
                    lease.complete()
                continue
            if rng.random() < 0.2:
                lease.renew(duration)
            work.append(lease)
        if rng.random() < 0.5:
            results = q.complete_many(work)
            assert all(r is None for r in results), results
        else:
            for lease in work:
                lease.complete()
        done_at = time.time()
        for lease in work:
            held.append(
                [lease.message.id, lease.receipt, lease.message.body.decode(),
                 leased_at, done_at, lease.message.delivery_count]
            )
    q.close()
    print(json.dumps(held), flush=True)
    """
)

PRODUCER = textwrap.dedent(
    """
    import json, random, sys
    import leasekit

    path, count, consumers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(count)
    q = leasekit.open("sqlite", path=path, queue="jobs")
    print("ready", flush=True)
    sys.stdin.readline()
    sent = {}
    while len(sent) < count:
        bodies = [f"p{len(sent) + i}" for i in range(min(rng.randint(1, 20), count - len(sent)))]
        ids = q.send_many([b.encode() for b in bodies]) if len(bodies) > 1 else [
            q.send(bodies[0].encode())
        ]
        sent.update(zip(ids, bodies))
    for _ in range(consumers):
        q.send(b"STOP")
    q.close()
    print(json.dumps(sent), flush=True)
    """
)

SENDER = textwrap.dedent(
    """
    import json, sys
    import leasekit

    q = leasekit.open("sqlite", path=sys.argv[1], queue="jobs")
    for i in range(10):
        q.send(f"held{i}".encode())
    leased = q.lease(10, duration=float(sys.argv[2]))
    print(json.dumps([lz.message.id for lz in leased]), flush=True)
    i = 0
    while True:  # until the test kills this process
        print(json.dumps([i, q.send(f"m{i}".encode())]), flush=True)
        i += 1
    """
)


def _spawn(script: str, *args: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _readline(stream: IO[str] | None) -> str:
    assert stream is not None
    return stream.readline()


def _finish(proc: subprocess.Popen[str]) -> Any:
    try:
        out, err = proc.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"worker {proc.args!r} did not finish within {DEADLINE} s:\n{err}")
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _open(path: Path) -> leasekit.Queue:
    return leasekit.open("sqlite", path=str(path), queue="jobs", create=True)


@pytest.mark.slow
def test_concurrent_processes_never_share_a_message(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    bodies: dict[str, str] = {}
    with _open(path) as queue:
        names = [f"s{i}" for i in range(PRESENT)]
        bodies.update(zip(queue.send_many([n.encode() for n in names]), names, strict=True))

    procs = [_spawn(CONSUMER, path, seed, LONG_LEASE) for seed in range(CONSUMERS)]
    procs.append(_spawn(PRODUCER, path, PRODUCED, CONSUMERS))
    try:
        for proc in procs:
            assert _readline(proc.stdout) == "ready\n", proc.stderr and proc.stderr.read()
        for proc in procs:  # start every worker at (nearly) the same moment
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        held_by = [_finish(proc) for proc in procs[:-1]]
        produced: dict[str, str] = _finish(procs[-1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    bodies.update(produced)
    assert len(bodies) == PRESENT + PRODUCED
    holds = [(worker, *row) for worker, rows in enumerate(held_by) for row in rows]
    counts = Counter(message_id for _, message_id, *_ in holds)
    twice = {m: n for m, n in counts.items() if n > 1}
    assert not twice, f"messages handed out more than once: {twice}"
    assert set(counts) == set(bodies), "a message was never leased, or an unknown one was"
    receipts = [receipt for _, _, receipt, *_ in holds]
    assert len(set(receipts)) == len(receipts)
    intervals: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for worker, message_id, _, body, leased_at, done_at, delivery_count in holds:
        assert body == bodies[message_id]
        assert delivery_count == 1, "a long lease expired: the test was too slow"
        intervals[message_id].append((leased_at, done_at, worker))
    for message_id, spans in intervals.items():
        spans.sort()
        for (_, end, a), (start, _, b) in itertools.pairwise(spans):
            assert start >= end or a == b, f"{message_id} held by {a} and {b} at once"
    assert all(held_by), "some consumer got no message: the load was not shared"
    with _open(path) as queue:
        stats = queue.stats()
        assert (stats.visible, stats.leased, stats.delayed) == (0, 0, 0)


@pytest.mark.slow
def test_sent_messages_survive_sigkill_of_the_sender(tmp_path: Path) -> None:
    path = tmp_path / "durable.db"
    with _open(path):
        pass
    lease_seconds = 1.0
    sender = _spawn(SENDER, path, lease_seconds)
    acknowledged: dict[int, str] = {}
    try:
        leased_by_sender = set(json.loads(_readline(sender.stdout)))
        while len(acknowledged) < 300:
            line = _readline(sender.stdout)
            assert line, sender.stderr and sender.stderr.read()
            number, message_id = json.loads(line)
            acknowledged[number] = message_id
        sender.send_signal(signal.SIGKILL)
        sender.wait(timeout=DEADLINE)
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
    assert sender.returncode == -signal.SIGKILL
    assert len(leased_by_sender) == 10

    got: dict[str, leasekit.Lease] = {}
    deadline = time.monotonic() + 15
    with _open(path) as queue:
        assert queue.driver._connection().execute("PRAGMA integrity_check").fetchone() == ("ok",)  # type: ignore[attr-defined]
        while time.monotonic() < deadline:
            # Poll (with a deadline) until the dead sender's leases run out, then drain.
            waiting = not leased_by_sender <= got.keys()
            batch = queue.lease(100, duration=LONG_LEASE, wait=5 if waiting else 0)
            if not batch and not waiting:
                break
            for lease in batch:
                assert lease.message.id not in got
                got[lease.message.id] = lease
        assert leased_by_sender <= got.keys(), "the dead sender's leases never expired"
        # The messages the dead process had leased came back after its lease ran out.
        for message_id in leased_by_sender:
            assert got[message_id].message.delivery_count == 2
            assert got[message_id].message.body.startswith(b"held")
        # Every acknowledged send is there; the file holds an unbroken prefix m0, m1, ...
        numbers = sorted(
            int(lease.message.body[1:])
            for lease in got.values()
            if lease.message.body.startswith(b"m")
        )
        assert numbers == list(range(len(numbers)))
        assert len(numbers) >= len(acknowledged)
        for number, message_id in acknowledged.items():
            assert got[message_id].message.body == f"m{number}".encode()
            assert got[message_id].message.delivery_count == 1
        results = queue.complete_many(list(got.values()))
        assert all(result is None for result in results)
        assert queue.lease(1) == []
