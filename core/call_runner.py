"""How a queue calls its driver: core's retries within the deadline, errors wrapped once.

One :class:`CallRunner` per :class:`~leasekit.Queue`, shared by the queue and
the parts it delegates to (:class:`~leasekit.lease_operations.LeaseOperations`,
:class:`~leasekit.dead_letters.DeadLetters`), so that none of them calls back
into its owner for its plumbing: each is given the runner, and the runner knows
only the driver, the retry policy and the call timeout.

The deadline itself is the caller's (:func:`leasekit.deadline.deadline` around
the call); the runner retries what the driver calls retryable while that
deadline leaves time, and maps whatever escapes to the most specific leasekit
error with the driver's error chained (:func:`leasekit.error_mapping.wrap_error`).
Events are the caller's too: an operation reports what it did, not each try.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from . import errors
from .capabilities import Capabilities
from .error_mapping import wrap_error
from .retry import RetryPolicy
from .spi import Driver

__all__ = ["CallRunner"]

T = TypeVar("T")


class CallRunner:
    """Runs one queue's driver calls.

    Parameters
    ----------
        driver: the queue's driver.
        retry: core's retry policy (within each call's deadline).
        call_timeout: the longest one backend call may take when nothing tighter bounds it.
    """

    __slots__ = ("call_timeout", "driver", "retry")

    def __init__(self, driver: Driver, retry: RetryPolicy, call_timeout: float) -> None:
        self.driver = driver
        self.retry = retry
        self.call_timeout = call_timeout

    @property
    def name(self) -> str:
        """The queue's name (in every error message)."""
        return self.driver.queue

    @property
    def capabilities(self) -> Capabilities:
        """The driver's capabilities, read each time (a driver may change them when it opens)."""
        return self.driver.capabilities

    def call(self, doing: str, fn: Callable[[], T]) -> T:
        """Call the driver with core's retries (within the deadline); wrap its error once.

        ``doing`` names the operation in the error ("renew", "dead-letter (send the copy)").
        """
        try:
            return self.retry.call(fn, self.driver.is_retryable)
        except Exception as exc:
            error = wrap_error(self.driver, exc, f"{doing} on {self.name!r}")
            if error is exc:
                raise
            raise error from exc

    def entry_error(self, result: BaseException, action: str) -> errors.LeaseError:
        """The leasekit error for one entry's raw ``result`` of a batch, with it as the cause."""
        error = wrap_error(self.driver, result, f"{action} on {self.name!r}")
        if error is not result:
            error.__cause__ = result
        return error
