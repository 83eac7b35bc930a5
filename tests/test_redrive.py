"""Re-driving dead letters back to their queue, on every backend with dead letters.

SQLite and memory lease their native stores; Service Bus (its emulator) its
``$deadletterqueue`` sub-queue; SQS (moto), Azure Storage Queue (Azurite) and
MNS (its emulator) the dead-letter queue core copies to. A re-drive killed
midway and one interrupted by an exception lose nothing.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import leasekit
from leasekit import Queue
from leasekit.dead_letters import REDRIVEN_REASON
from leasekit.redrive import redrive

BACKENDS = [
    "sqlite",
    "memory",
    "aws-sqs",
    "azure-storage-queue",
    "aliyun-mns",
    "azure-service-bus",
    "gcp-pubsub",
]


def _open(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Queue:
    name = f"rd{secrets.token_hex(5)}"
    if backend == "sqlite":
        return leasekit.open(f"sqlite:///{tmp_path}/rd.db?queue={name}", create=True)
    if backend == "memory":
        return leasekit.open(f"memory://{name}", create=True)
    if backend == "aws-sqs":
        moto = request.getfixturevalue("moto_server")
        return leasekit.open(backend, queue=name, create=True, **moto.options)
    if backend == "azure-storage-queue":
        azurite = request.getfixturevalue("azurite")
        return leasekit.open(
            backend, queue=name, create=True, connection_string=azurite.connection_string
        )
    if backend == "aliyun-mns":
        mns = request.getfixturevalue("mns_server")
        return leasekit.open(
            backend,
            queue=name,
            create=True,
            endpoint=mns.endpoint,
            access_key_id=mns.access_key_id,
            access_key_secret=mns.access_key_secret,
        )
    if backend == "gcp-pubsub":
        pubsub = request.getfixturevalue("pubsub_server")
        return leasekit.open(
            backend,
            project=pubsub.project,
            queue=name,
            create=True,
            endpoint=pubsub.address,
            dead_letter_topic=f"{name}-dl",
        )
    server = request.getfixturevalue("servicebus_server")
    return leasekit.open(
        backend,
        queue=name,
        create=True,
        connection_string=server.connection_string,
        lock_duration=2.0,
        admin_port=server.http_port,
    )


@pytest.fixture(params=BACKENDS)
def queue(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Queue]:
    q = _open(request.param, request, tmp_path)
    try:
        yield q
    finally:
        q.delete_queue()
        q.close()


@pytest.fixture
def sqlite_queue(tmp_path: Path) -> Iterator[Queue]:
    with leasekit.open(f"sqlite:///{tmp_path}/rd.db?queue=jobs", create=True) as q:
        yield q


def _dead_letter(queue: Queue, bodies: list[bytes], reason: str = "bad") -> None:
    """Send ``bodies`` and dead-letter each (reason ``reason: <body>``)."""
    queue.send_many(bodies, properties={"kind": "order"})
    left = set(bodies)
    deadline = time.monotonic() + 30
    while left:
        assert time.monotonic() < deadline, f"never leased {left}"
        for lease in queue.lease(10, wait=1):
            lease.dead_letter(f"{reason}: {lease.message.body.decode()}")
            left.discard(lease.message.body)


def _drain(queue: Queue, expected: int, timeout: float = 30) -> list[leasekit.Lease]:
    """Lease (and complete) until ``expected`` messages came or the queue stays empty."""
    got: list[leasekit.Lease] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        for lease in queue.lease(10, wait=1):
            lease.complete()
            got.append(lease)
    return got


def test_redrive_moves_every_dead_letter_back_with_its_properties_and_reason(
    queue: Queue,
) -> None:
    bodies = [b"one", b"two", b"three"]
    _dead_letter(queue, bodies)
    assert queue.redrive() == 3
    back = _drain(queue, 3)
    assert sorted(lease.message.body for lease in back) == sorted(bodies)
    for lease in back:
        properties = lease.message.properties
        assert properties["kind"] == "order"
        assert properties[REDRIVEN_REASON] == f"bad: {lease.message.body.decode()}"
        assert lease.message.delivery_count == 1  # a new message: its deliveries start again
    assert queue.peek_dead_letters(10) == []
    assert queue.redrive() == 0


def test_redrive_with_no_dead_letters_moves_nothing(queue: Queue) -> None:
    assert queue.redrive() == 0


def test_limit_where_and_older_than_choose_which_and_leave_the_rest(sqlite_queue: Queue) -> None:
    bodies = [f"m{i}".encode() for i in range(6)]
    _dead_letter(sqlite_queue, bodies)
    assert sqlite_queue.redrive(older_than=timedelta(hours=1)) == 0  # all are seconds old
    assert sqlite_queue.redrive(where=lambda letter: letter.body in (b"m1", b"m4")) == 2
    assert sqlite_queue.redrive(limit=3, older_than=0) == 3
    left = [letter.body for letter in sqlite_queue.peek_dead_letters(10)]
    assert len(left) == 1  # the skipped ones were given back at once, not left hidden
    assert sqlite_queue.redrive() == 1
    assert sorted(lease.message.body for lease in _drain(sqlite_queue, 6)) == bodies


def test_bad_arguments_are_refused_before_anything_moves(sqlite_queue: Queue) -> None:
    _dead_letter(sqlite_queue, [b"x"])
    for kwargs in ({"limit": 0}, {"older_than": -1}, {"where": "body"}):
        with pytest.raises(leasekit.InvalidArgument):
            sqlite_queue.redrive(**kwargs)  # type: ignore[arg-type]
    assert len(sqlite_queue.peek_dead_letters()) == 1


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_an_exception_midway_loses_nothing_and_hides_nothing(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with _open(backend, request, tmp_path) as queue:
        bodies = [f"m{i}".encode() for i in range(8)]
        _dead_letter(queue, bodies)
        seen: list[bytes] = []

        def interrupt_at_the_fourth(letter: Any) -> bool:
            seen.append(letter.body)
            if len(seen) == 4:
                raise KeyboardInterrupt
            return True

        with pytest.raises(KeyboardInterrupt):
            redrive(queue, where=interrupt_at_the_fourth)
        moved = [lease.message.body for lease in _drain(queue, 3, timeout=5)]
        dead = [letter.body for letter in queue.peek_dead_letters(100)]
        assert len(moved) == 3 and sorted(moved + dead) == sorted(bodies)
        # What the interrupted pass held was given back: the next pass takes it now.
        assert queue.redrive() == 5


KILLED = """
import sys, leasekit
from leasekit.redrive import redrive

with leasekit.open(sys.argv[1]) as queue:
    redrive(queue, progress=lambda letter: print(letter.body.decode(), flush=True),
            lease_duration=1)
"""


def test_a_redrive_killed_midway_leaves_every_message_in_one_place_or_both(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/kill.db?queue=jobs"
    bodies = {f"m{i:03}".encode() for i in range(300)}
    with leasekit.open(url, create=True) as queue:
        _dead_letter(queue, sorted(bodies))
    (tmp_path / "killed.py").write_text(textwrap.dedent(KILLED))
    process = subprocess.Popen(
        [sys.executable, str(tmp_path / "killed.py"), url], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    try:
        moved_before_kill = [process.stdout.readline() for _ in range(40)]
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert all(moved_before_kill)
    with leasekit.open(url) as queue:
        in_queue = [lease.message.body for lease in _drain(queue, 300, timeout=3)]
        dead = [letter.body for letter in queue.peek_dead_letters(1000)]
        assert 40 <= len(in_queue) < 300
        assert set(in_queue) | set(dead) == bodies  # none in neither place
        assert len(in_queue) + len(dead) - len(bodies) <= 1  # at most the one in flight twice
        # The dead letters the killed pass held come back after its 1 s lease.
        deadline = time.monotonic() + 20
        again = 0
        while again < len(dead) and time.monotonic() < deadline:
            again += queue.redrive()
        assert again == len(dead)
        assert {lease.message.body for lease in _drain(queue, len(dead))} == set(dead)


@pytest.mark.parametrize("backend", ["sqlite", "memory", "azure-service-bus"])
def test_a_native_dead_letter_store_leases_renews_abandons_and_completes(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """What the re-drive relies on, on each native store (Service Bus: its $deadletterqueue)."""
    queue = _open(backend, request, tmp_path)
    try:
        _dead_letter(queue, [b"dl"])
        with Queue(queue.driver.dead_letter_store()) as store:
            [first] = store.lease(wait=1)
            assert first.message.body == b"dl"
            assert first.message.properties["leasekit-dead-letter-reason"] == "bad: dl"
            first.renew()
            assert store.lease(wait=0) == []  # hidden while leased
            first.abandon()
            [again] = store.lease(wait=1)  # given back: visible at once
            assert again.message.body == b"dl"
            again.complete()
        assert queue.peek_dead_letters(10) == []
    finally:
        queue.delete_queue()
        queue.close()
