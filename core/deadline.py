"""Deadlines for backend calls: how long one driver call may block, set by core.

Core runs every driver call under a deadline (``with deadline(seconds): ...``): a
renewal's is the time left on the lease it renews, a settle's is bounded by it
too, a receive's is its long poll plus the queue's ``call_timeout``, anything
else gets ``call_timeout``. A driver reads the time left with
:func:`call_timeout` and applies it to its SDK's per-call timeouts (socket read
and connect timeouts, a per-operation timeout), so a hung network call fails
on time instead of holding a thread, a lease or a shutdown. The deadline is a
context variable: it follows the calling thread (and asyncio task), so a driver
must read it in the thread that makes the call.
"""

from __future__ import annotations

import contextvars
import time

__all__ = [
    "MIN_TIMEOUT",
    "DeadlineExceeded",
    "call_timeout",
    "check_deadline",
    "deadline",
    "time_left",
]

#: The smallest timeout :func:`call_timeout` hands out: an exhausted deadline
#: still gives the SDK a positive value, so its socket fails at once instead of
#: treating 0 as "no timeout" (several do).
MIN_TIMEOUT = 0.001


class DeadlineExceeded(TimeoutError):
    """Raised by a driver (or a hook it put into its SDK) when core's deadline for the call passed.

    Core reports it as :class:`~leasekit.BackendUnavailable`.
    """


_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "leasekit_deadline", default=None
)


def time_left() -> float | None:
    """Seconds the current backend call may still take (may be negative); ``None``: no deadline."""
    end = _DEADLINE.get()
    return None if end is None else end - time.monotonic()


def call_timeout(cap: float | None = None) -> float | None:
    """The timeout a driver should give its SDK for the call it is making now.

    The time left before core's deadline, at most ``cap`` (the driver's own
    configured timeout) and at least :data:`MIN_TIMEOUT`; ``cap`` when core set
    no deadline (``None`` if neither is set).
    """
    left = time_left()
    if left is None:
        return cap
    if cap is not None:
        left = min(left, cap)
    return max(left, MIN_TIMEOUT)


def check_deadline(doing: str = "the call") -> None:
    """Raise :class:`DeadlineExceeded` if core's deadline for the current call has passed.

    For a driver's SDK hook that runs before each attempt of a retrying SDK:
    no new attempt starts once the time is up.
    """
    left = time_left()
    if left is not None and left <= 0:
        raise DeadlineExceeded(f"{doing}: leasekit's deadline passed {-left:.2f} s ago")


def deadline(seconds: float | None) -> _Deadline:
    """Run the block under a deadline ``seconds`` from now (``None``: keep the enclosing one).

    A nested deadline never extends an enclosing one. (A small class rather than
    a generator: core enters several for every batch it leases or settles.)
    """
    return _Deadline(seconds)


class _Deadline:
    """The context manager :func:`deadline` returns."""

    __slots__ = ("_seconds", "_token")

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._token: contextvars.Token[float | None] | None = None

    def __enter__(self) -> None:
        seconds = self._seconds
        if seconds is None:
            return
        end = time.monotonic() + seconds
        outer = _DEADLINE.get()
        if outer is not None and outer < end:
            end = outer
        self._token = _DEADLINE.set(end)

    def __exit__(self, *exc_info: object) -> None:
        token = self._token
        if token is not None:
            self._token = None
            _DEADLINE.reset(token)
