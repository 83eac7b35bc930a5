"""PostgreSQL across processes: three competing consumers, one SIGKILLed, nothing lost.

Each consumer is a separate Python process (``subprocess`` running a small
script) sharing only the server. They start together on a line written to their
stdin and report each message as they finish it, as JSON lines on stdout;
nothing here sleeps to synchronise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from typing import IO

import pytest

import leasekit
from leasekit.emulators.postgres import LocalPostgres

#: Every process run here must finish within this many seconds.
DEADLINE = 90.0
MESSAGES = 600
#: The consumers' physical lease: the killed one's messages come back after it.
LEASE = 2.0

CONSUMER = textwrap.dedent(
    """
    import json, sys, time
    import leasekit

    url, name, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
    q = leasekit.open(url, queue=name)
    print(json.dumps(["ready"]), flush=True)
    sys.stdin.readline()
    with leasekit.LeaseKeeper() as keeper:
        while True:
            batch = q.lease(20, duration=lease, wait=0.5)
            if not batch:
                stats = q.stats()
                if stats.visible == stats.leased == 0:
                    break  # nothing left, and nothing held by anyone that could come back
                continue
            keeper.add_many(batch)
            for lz in batch:
                time.sleep(0.002)  # the work
                print(json.dumps(["start", lz.message.id]), flush=True)
                lz.complete()
                print(json.dumps(["done", lz.message.id, lz.message.delivery_count]), flush=True)
    q.close()
    print(json.dumps(["end"]), flush=True)
    """
)


def _spawn(url: str, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CONSUMER, url, name, str(LEASE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def _line(stream: IO[str] | None) -> list[object]:
    assert stream is not None
    line = stream.readline()
    return json.loads(line) if line else []


@pytest.mark.slow
def test_three_competing_processes_with_one_killed_lose_nothing(
    postgres_server: LocalPostgres,
) -> None:
    name = f"procs-{uuid.uuid4().hex[:8]}"
    url = postgres_server.url()
    with leasekit.open(url, queue=name, create=True) as queue:
        ids = set(queue.send_many([b"m%d" % i for i in range(MESSAGES)]))
    procs = [_spawn(url, name) for _ in range(3)]
    victim = procs[0]
    try:
        for proc in procs:
            assert _line(proc.stdout) == ["ready"], proc.stderr and proc.stderr.read()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        # Read the victim until it finished 50 messages, then kill it mid-work.
        victim_done: list[str] = []
        victim_started: list[str] = []
        while len(victim_done) < 50:
            event = _line(victim.stdout)
            assert event, victim.stderr and victim.stderr.read()
            if event[0] == "start":
                victim_started.append(str(event[1]))
            elif event[0] == "done":
                victim_done.append(str(event[1]))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=DEADLINE)
        rest = victim.stdout.read() if victim.stdout else ""
        for line in rest.splitlines():
            event = json.loads(line)
            if event[0] == "done":
                victim_done.append(str(event[1]))
            elif event[0] == "start":
                victim_started.append(str(event[1]))
        survivors: list[tuple[str, int]] = []
        per_survivor: list[int] = []
        for proc in procs[1:]:
            out, err = proc.communicate(timeout=DEADLINE)
            assert proc.returncode == 0, err
            events = [json.loads(line) for line in out.splitlines()]
            assert events[-1] == ["end"]
            finished = [(str(e[1]), int(e[2])) for e in events if e[0] == "done"]
            per_survivor.append(len(finished))
            survivors += finished
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert victim.returncode == -signal.SIGKILL
    done = Counter(message_id for message_id, _ in survivors) + Counter(victim_done)
    # A completion the victim began but did not report either committed (the message
    # is gone) or did not (another consumer completed it): never both, never neither.
    in_doubt = set(victim_started) - set(victim_done)
    assert len(in_doubt) <= 1
    missing = ids - set(done) - in_doubt
    assert not missing, f"{len(missing)} messages were never completed"
    assert set(done) <= ids
    twice = [m for m, n in done.items() if n > 1]
    assert not twice, f"messages completed twice: {twice[:5]}"
    # The victim's held messages came back, after its lease, to the survivors.
    redelivered = [m for m, count in survivors if count == 2]
    assert redelivered, "the killed consumer held nothing that came back"
    assert all(per_survivor), f"a surviving consumer did no work: {per_survivor}"
    with leasekit.open(url, queue=name) as queue:
        stats = queue.stats()
        assert (stats.visible, stats.leased, stats.delayed) == (0, 0, 0)
        queue.delete_queue()
