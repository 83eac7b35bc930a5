"""Retrying transient backend failures, written once for every driver."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .deadline import time_left
from .errors import InvalidArgument
from .options import is_number

__all__ = ["RetryPolicy"]

T = TypeVar("T")

#: Longest backoff ceiling accepted (a day): beyond it a retry is not a retry.
MAX_BACKOFF = 86400.0


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter for errors the driver calls retryable.

    Parameters
    ----------
        attempts: total tries, including the first (1 disables retrying).
        base: the first backoff ceiling in seconds.
        cap: the largest backoff ceiling in seconds.
    """

    attempts: int = 3
    base: float = 0.1
    cap: float = 2.0

    def __post_init__(self) -> None:
        attempts = self.attempts
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
            raise InvalidArgument(f"RetryPolicy.attempts must be an int >= 1, got {attempts!r}")
        for name in ("base", "cap"):
            value = getattr(self, name)
            if not is_number(value) or not 0 <= value <= MAX_BACKOFF:
                raise InvalidArgument(
                    f"RetryPolicy.{name} must be a number of seconds from 0 to {MAX_BACKOFF:g}, "
                    f"got {value!r}"
                )

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based), with full jitter."""
        # The exponent is bounded so a long run of attempts cannot overflow a float.
        ceiling: float = min(self.cap, self.base * 2.0 ** min(attempt - 1, 64))
        return random.uniform(0, ceiling)

    def call(
        self,
        fn: Callable[[], T],
        is_retryable: Callable[[BaseException], bool],
        sleep: Callable[[float], None] = time.sleep,
    ) -> T:
        """Call ``fn``; on an error ``is_retryable`` accepts, wait and try again.

        Within the current call deadline (:mod:`leasekit.deadline`): no retry
        starts once the backoff would run past it.
        """
        attempt = 1
        while True:
            try:
                return fn()
            except Exception as exc:
                if attempt >= self.attempts or not is_retryable(exc):
                    raise
                pause = self.backoff(attempt)
                left = time_left()
                if left is not None and left <= pause:
                    raise
                sleep(pause)
                attempt += 1
