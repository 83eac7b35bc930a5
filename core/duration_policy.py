"""How long a consumer's physical leases are: fixed, or adapted to observed processing times."""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import Protocol, runtime_checkable

__all__ = ["AdaptiveLeaseDuration", "FixedLeaseDuration", "LeaseDurationPolicy"]


@runtime_checkable
class LeaseDurationPolicy(Protocol):
    """Chooses the physical lease duration for the next lease."""

    def current(self) -> float:
        """The duration to use now, in seconds."""
        ...

    def observe(self, seconds: float) -> None:
        """Record one handler's processing time."""
        ...

    def stale(self) -> None:
        """Record that a completion found its receipt stale (the lease was too short)."""
        ...

    def figures(self) -> dict[str, float]:
        """Numbers for ``consumer.stats``."""
        ...


class FixedLeaseDuration:
    """Always the same duration (the default)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)

    def current(self) -> float:
        """The fixed duration."""
        return self.seconds

    def observe(self, seconds: float) -> None:
        """Ignored."""

    def stale(self) -> None:
        """Ignored."""

    def figures(self) -> dict[str, float]:
        """The duration."""
        return {"lease_duration": self.seconds}


class AdaptiveLeaseDuration:
    """The p99 of recent processing times, bounded by ``minimum`` and ``maximum``.

    As Google's Pub/Sub client picks its ack deadline: the lease covers almost
    every handler run without renewal, and the keeper covers the rest. Each
    stale receipt seen on completion doubles a floor under the result (the
    lease was evidently too short for this workload), up to ``maximum``.

    Parameters:
        minimum: the shortest lease to pick.
        maximum: the longest lease to pick.
        percentile: which quantile of processing times to cover (0.99).
        window: how many recent samples to keep.
        headroom: multiply the quantile by this before bounding it.
    """

    def __init__(
        self,
        minimum: float = 10.0,
        maximum: float = 600.0,
        *,
        percentile: float = 0.99,
        window: int = 1000,
        headroom: float = 1.2,
    ) -> None:
        if not 0 < minimum <= maximum:
            raise ValueError("need 0 < minimum <= maximum")
        if not 0 < percentile <= 1:
            raise ValueError("percentile must be in (0, 1]")
        self.minimum = float(minimum)
        self.maximum = float(maximum)
        self.percentile = percentile
        self.headroom = headroom
        self._samples: deque[float] = deque(maxlen=window)
        self._floor = self.minimum
        self._stale = 0
        self._lock = threading.Lock()

    def current(self) -> float:
        """The bounded quantile of recent processing times."""
        with self._lock:
            if not self._samples:
                return self._floor
            ordered = sorted(self._samples)
            index = min(len(ordered) - 1, math.ceil(self.percentile * len(ordered)) - 1)
            wanted = ordered[max(index, 0)] * self.headroom
            return min(self.maximum, max(self._floor, wanted))

    def observe(self, seconds: float) -> None:
        """Record one processing time."""
        with self._lock:
            self._samples.append(max(0.0, seconds))

    def stale(self) -> None:
        """Lengthen: double the floor (bounded by ``maximum``)."""
        with self._lock:
            self._stale += 1
            self._floor = min(self.maximum, self._floor * 2)

    def figures(self) -> dict[str, float]:
        """Current duration, floor, sample count and stale count."""
        current = self.current()
        with self._lock:
            return {
                "lease_duration": current,
                "floor": self._floor,
                "samples": float(len(self._samples)),
                "stale_seen": float(self._stale),
            }
