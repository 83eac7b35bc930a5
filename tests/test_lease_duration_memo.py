"""``Queue.lease`` remembers the last duration it checked (issue 37, item 5) and refuses as before.

A loop passes the same duration each time: the answer is remembered, but only
for a plain ``int`` or ``float`` equal to the last one, against the same
capabilities. Everything the check refuses is still refused, before any call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

import leasekit
from leasekit import errors
from leasekit.backends.memory import MemoryBroker, MemoryDriver
from leasekit.spi import RawMessage


class _Counting(MemoryDriver):
    def __init__(self) -> None:
        super().__init__(queue="memo", broker=MemoryBroker(clock=leasekit.ManualClock()))
        self.receives = 0

    def receive(self, max_messages: int, visibility: float, wait: float) -> Sequence[RawMessage]:
        self.receives += 1
        return super().receive(max_messages, visibility, wait)


def _queue() -> tuple[leasekit.Queue, _Counting]:
    driver = _Counting()
    queue = leasekit.Queue(driver)
    queue.create()
    queue.send_many([b"a", b"b", b"c", b"d"])
    return queue, driver


def test_a_repeated_duration_gives_the_checked_answer() -> None:
    queue, _ = _queue()
    resolution = queue.capabilities.lease_resolution
    odd = 10 + resolution / 3  # rounded up to the backend's resolution by the check
    first = queue.lease(1, duration=odd)[0]
    second = queue.lease(1, duration=odd)[0]
    assert first._record.duration == second._record.duration == queue.check_duration(odd)
    assert queue.lease(1, duration=10)[0]._record.duration == 10.0  # int: its own answer


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, True, "30", 10**400])
def test_after_a_good_duration_a_bad_one_is_still_refused_before_any_call(bad: object) -> None:
    queue, driver = _queue()
    queue.lease(1, duration=30)
    before = driver.receives
    with pytest.raises(errors.InvalidArgument):
        queue.lease(1, duration=bad)  # type: ignore[arg-type]
    assert driver.receives == before, "refused before any backend call"


def test_new_capabilities_check_the_duration_again() -> None:
    queue, driver = _queue()
    queue.lease(1, duration=30)
    driver.capabilities = driver.capabilities.replace(max_lease=20.0)
    with pytest.raises(errors.InvalidLeaseDuration):
        queue.lease(1, duration=30)
