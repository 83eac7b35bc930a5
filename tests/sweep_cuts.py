"""The survivable-cut rule, measured: leases kept through cuts of each length and start.

Not part of the suite (its name does not match ``test_*.py``): a measurement
that ``tools/cut_sweep.py`` runs and turns into docs/reliability.md's table,

    .venv/bin/python tools/cut_sweep.py [-k aliyun-mns] [--runs N]

Each cell holds ``LEASES`` leases of ``LEASE`` seconds with a LeaseKeeper, cuts
the network (every connection reset, new ones too) from ``start`` to
``start + length`` seconds after the lease, and counts the leases still held
one second past their first expiry. What is asserted is the promise that holds
whatever the cut: a lease is kept or reported lost, never handed to a rival
while it reads held, and every kept one completes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from _fixtures.fault_targets import FaultTarget

import leasekit
from leasekit import LeaseKeeper, LeaseState

#: The lease in every cell, as in docs/reliability.md's short-cut rows.
LEASE = 6.0
LEASES = 5
#: When the cut starts (seconds after the lease) and how long it lasts.
STARTS = (1.0, 3.5)
LENGTHS = (0.5, 1.0, 1.6, 2.0, 2.4, 3.0)

RecordProperty = Callable[[str, object], None]


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.005)


@pytest.mark.parametrize("length", LENGTHS, ids=[f"cut{x:g}s" for x in LENGTHS])
@pytest.mark.parametrize("start", STARTS, ids=[f"at{x:g}s" for x in STARTS])
def test_cut(
    fault_target: FaultTarget, start: float, length: float, record_property: RecordProperty
) -> None:
    proxied, direct = fault_target.queues(lease=LEASE)
    direct.send_many([b"%d" % i for i in range(LEASES)])
    leases: list[leasekit.Lease] = []
    deadline = time.monotonic() + 10
    while len(leases) < LEASES and time.monotonic() < deadline:
        leases += proxied.lease(LEASES - len(leases), duration=LEASE, wait=1)
    assert len(leases) == LEASES
    began = time.monotonic() - (LEASE - min(lz.time_left for lz in leases))
    with LeaseKeeper() as keeper:
        keeper.add_many(leases)
        _wait_until(lambda: time.monotonic() >= began + start, LEASE, "the cut's start")
        fault_target.proxy.drop()
        _wait_until(lambda: time.monotonic() >= began + start + length, LEASE, "the cut's end")
        fault_target.proxy.pass_()
        _wait_until(lambda: time.monotonic() >= began + LEASE + 1.0, LEASE + 2, "the expiry")
        kept = [lz for lz in leases if lz.state is LeaseState.HELD]
        record_property("cut_end_before_expiry_s", round(LEASE - start - length, 1))
        record_property("kept", len(kept))
        held_ids = {lz.message.id for lz in kept}
        rival = direct.lease(LEASES, wait=0)
        assert not held_ids & {r.message.id for r in rival}, "a held lease's message was handed out"
        direct.abandon_many(rival)
        assert proxied.complete_many(kept) == [None] * len(kept)
