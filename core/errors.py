"""Errors raised by leasekit.

Every error a backend can cause reaches you as one of these, with the SDK's own
exception chained as ``__cause__`` and the backend's error code (when it has one)
on ``.backend_code``. Grouped by what the caller does next::

    LeaseError                      every leasekit error
    ├── LeaseLost                   stale or expired receipt: someone else may hold it now
    ├── QueueNotFound               the queue does not exist (never a LeaseLost)
    ├── QueueAlreadyExists          create was asked for a queue that exists
    ├── QueueEmpty (TimeoutError)   lease_one waited and no message came
    ├── InvalidArgument (ValueError)        bad input, found before any network call
    │   ├── InvalidLeaseDuration            duration out of the backend's range
    │   ├── MessageTooLarge                 body above the backend's maximum
    │   └── InvalidURL                      a URL or option that cannot be used
    ├── BackendNotFound (LookupError)       no installed backend has that scheme
    ├── BackendNotInstalled (ImportError)   the backend's extra is not installed
    ├── SendIncomplete              send_many sent some messages, not all: id or error per message
    ├── BackendUnavailable          transient: network, throttling, 5xx; retry later
    ├── AuthenticationFailed        bad or missing credentials, access denied
    ├── UnsupportedOperation        the backend cannot do this (see its Capabilities)
    └── BackendError                any other backend failure

    LeaseStateError (RuntimeError)  misuse: a settled lease used again
"""

from __future__ import annotations

__all__ = [
    "AuthenticationFailed",
    "BackendError",
    "BackendNotFound",
    "BackendNotInstalled",
    "BackendUnavailable",
    "InvalidArgument",
    "InvalidLeaseDuration",
    "InvalidURL",
    "LeaseError",
    "LeaseLost",
    "LeaseStateError",
    "MessageTooLarge",
    "QueueAlreadyExists",
    "QueueEmpty",
    "QueueNotFound",
    "SendIncomplete",
    "UnsupportedOperation",
]


class LeaseError(Exception):
    """Raised when a backend or an input fails; the base class of every leasekit error.

    Parameters
    ----------
        message: what went wrong, for a person.
        backend_code: the backend's own error code (e.g. ``PopReceiptMismatch``).
    """

    def __init__(self, message: str = "", *, backend_code: str | None = None) -> None:
        super().__init__(message)
        self.backend_code = backend_code


class LeaseLost(LeaseError):
    """Raised when a receipt is stale or expired: the message may be held by someone else."""


class QueueNotFound(LeaseError):
    """Raised when the queue does not exist (open with ``create=True`` to make it)."""


class QueueAlreadyExists(LeaseError):
    """Raised when creating a queue that already exists with other settings."""


class QueueEmpty(LeaseError, TimeoutError):
    """Raised when ``Queue.lease_one(wait=...)`` waited and no message came."""


class InvalidArgument(LeaseError, ValueError):
    """Raised when an argument is invalid; found before any backend call."""


class InvalidLeaseDuration(InvalidArgument):
    """Raised when a lease duration is outside what the backend can hold."""


class MessageTooLarge(InvalidArgument):
    """Raised when a message body is larger than the backend accepts."""


class InvalidURL(InvalidArgument):
    """Raised when a queue URL or an ``open()`` option cannot be used."""


class BackendNotFound(LeaseError, LookupError):
    """Raised when no installed backend handles a URL scheme."""


class BackendNotInstalled(LeaseError, ImportError):
    """Raised when a backend's optional dependencies are not installed."""


class SendIncomplete(LeaseError):
    """Raised when ``send_many`` could not send every message; nothing sent is lost to the caller.

    ``results`` holds one entry per message, in the order given: the id it was
    sent with (a ``str``), or the :class:`LeaseError` it got (those after a call
    that failed as a whole get that call's error: they were not sent). Send the
    failed ones again, not the whole list.
    """

    def __init__(self, message: str, results: list[str | LeaseError]) -> None:
        first = next((r for r in results if isinstance(r, LeaseError)), None)
        super().__init__(message, backend_code=first.backend_code if first else None)
        self.results = results

    @property
    def sent(self) -> dict[int, str]:
        """Position -> id of every message that was sent."""
        return {i: r for i, r in enumerate(self.results) if isinstance(r, str)}

    @property
    def failed(self) -> dict[int, LeaseError]:
        """Position -> error of every message that was not sent."""
        return {i: r for i, r in enumerate(self.results) if isinstance(r, LeaseError)}


class BackendUnavailable(LeaseError):
    """Raised when a failure is transient (network, throttling, server error); retry later."""


class AuthenticationFailed(LeaseError):
    """Raised when the backend refuses the credentials or denies access."""


class UnsupportedOperation(LeaseError):
    """Raised when the backend cannot do what was asked; its Capabilities say so."""


class BackendError(LeaseError):
    """Raised when a backend fails in a way no other class describes."""


class LeaseStateError(RuntimeError):
    """Raised when a lease is used after it was settled (completed, abandoned, dead-lettered).

    This is a programming error, not a backend condition, so it is not a
    :class:`LeaseError`: ``except LeaseError`` will not hide it.
    """
