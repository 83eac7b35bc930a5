"""One boto3 SQS client, opened lazily, with every attempt bounded by core's deadline."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from leasekit.deadline import call_timeout, check_deadline
from leasekit.spi import (
    DriverError,
    ErrorCode,
)


class _Connection:
    """One boto3 client, created on first use and shared by a driver and its siblings."""

    def __init__(self, factory: Callable[[], Any], client: Any = None) -> None:
        self._factory = factory
        self._client = client
        self._owned = client is None
        self._lock = threading.Lock()
        self._users = 1

    def client(self) -> Any:
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._users <= 0:
                raise DriverError(ErrorCode.UNKNOWN, "aws-sqs: the driver is closed")
            if self._client is None:
                self._client = self._factory()
            return self._client

    def share(self) -> _Connection:
        with self._lock:
            self._users += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return
            client, self._client = self._client, None
        if client is not None and self._owned:
            close = getattr(client, "close", None)
            if close is not None:
                close()


#: The service's documented limits with the driver's default options (shown by
#: ``leasekit backends`` without credentials); options can change some per queue.


def _bound_attempt(request: Any, **kwargs: Any) -> None:
    """Botocore ``before-send`` hook: this attempt reads for no longer than core's deadline allows.

    botocore takes a per-request read timeout from ``request.context``; an
    attempt that would start after the deadline is not made.
    """
    check_deadline("aws-sqs request")
    left = call_timeout()
    context = getattr(request, "context", None)
    if left is not None and context is not None:
        context["read_timeout"] = left


def _bound_attempts(client: Any) -> None:
    """Bound every request ``client`` makes by core's deadline for the call (see above)."""
    client.meta.events.register("before-send.sqs", _bound_attempt, unique_id="leasekit-deadline")
