"""Many threads renew and settle through the Service Bus driver beside a waiting receive.

The driver's calls on one SDK receiver take turns (``links.Gate``), settles and
renewals before receives, so that none waits for a receive's long poll; the SDK
is not safe for two management requests in flight on one receiver (see
``tests/emulators/test_servicebus_sdk_agreement.py``), and they would wait on each
other's socket reads anyway.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import leasekit
from leasekit.queue import Queue

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton", reason="the Service Bus emulator needs python-qpid-proton")

# Not about expiry: 8 threads x 5 renewals take turns on one connection, and with
# 1 s locks four lapsed before their turn in a run beside a busy process.
LOCK = 3.0
THREADS = 8


@pytest.fixture
def queue(servicebus_server: Any) -> Iterator[Queue]:
    q = leasekit.open(
        "azure-service-bus",
        queue=servicebus_server.queue_name("c"),
        create=True,
        connection_string=servicebus_server.connection_string,
        lock_duration=LOCK,
        admin_port=servicebus_server.http_port,
    )
    try:
        yield q
    finally:
        q.delete_queue()
        q.close()


def test_renewals_and_settles_from_many_threads_beside_a_waiting_receive(queue: Queue) -> None:
    queue.send_many([b"m%d" % i for i in range(THREADS)])
    leases: list[leasekit.Lease] = []
    deadline = time.monotonic() + 10
    while len(leases) < THREADS and time.monotonic() < deadline:
        leases += queue.lease(THREADS - len(leases), wait=1)
    assert len(leases) == THREADS
    first_expiry = min(lease.expires_at for lease in leases)

    # One thread waits in a receive on the empty queue the whole time.
    waiting = threading.Thread(target=lambda: queue.lease(1, wait=2))
    waiting.start()
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)
    slowest = [0.0]

    def renew_then_complete(lease: leasekit.Lease) -> None:
        try:
            start.wait()
            for _ in range(5):
                began = time.monotonic()
                lease.renew()
                slowest[0] = max(slowest[0], time.monotonic() - began)
            lease.complete()
        except BaseException as exc:  # collected, asserted below
            errors.append(exc)

    workers = [threading.Thread(target=renew_then_complete, args=(x,)) for x in leases]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(10)
    waiting.join(10)
    assert errors == []
    assert all(lease.expires_at > first_expiry for lease in leases)
    # No renewal waited for the receive (a 2 s long poll): at most a socket read
    # (0.05 s) and the turns of the others, slow on a loaded machine.
    assert slowest[0] < 1.5
    assert queue.lease(1, wait=LOCK + 0.5) == []
