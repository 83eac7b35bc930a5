"""Clocks: the wall clock, and a manual one that tests advance by hand."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock", "to_datetime"]


@runtime_checkable
class Clock(Protocol):
    """Something that tells the time in seconds since the epoch (UTC)."""

    def time(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    """The real wall clock (:func:`time.time`)."""

    def time(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that only moves when told to; thread-safe.

    Parameters
    ----------
        start: the initial time in seconds since the epoch.

    Backends that take a ``clock`` option (``memory``, ``sqlite``) use it for
    every expiry, so a test of lease expiry advances the clock instead of sleeping.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def time(self) -> float:
        """The current manual time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds`` (must not be negative); return the new time."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        with self._lock:
            self._now += seconds
            return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now!r})"


def to_datetime(seconds: float) -> datetime:
    """Seconds since the epoch as a timezone-aware UTC datetime."""
    return datetime.fromtimestamp(seconds, tz=UTC)
