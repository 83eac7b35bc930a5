"""Turn a driver's raw error into the leasekit error it means, once."""

from __future__ import annotations

from . import errors
from .deadline import DeadlineExceeded
from .redaction import redact
from .spi import Driver, ErrorCode

__all__ = ["ERROR_CLASSES", "wrap_error"]

#: The leasekit class for each driver error code.
ERROR_CLASSES: dict[ErrorCode, type[errors.LeaseError]] = {
    ErrorCode.LEASE_LOST: errors.LeaseLost,
    ErrorCode.QUEUE_NOT_FOUND: errors.QueueNotFound,
    ErrorCode.QUEUE_EXISTS: errors.QueueAlreadyExists,
    ErrorCode.TOO_LARGE: errors.MessageTooLarge,
    ErrorCode.INVALID_ARGUMENT: errors.InvalidArgument,
    ErrorCode.UNAVAILABLE: errors.BackendUnavailable,
    ErrorCode.UNAUTHENTICATED: errors.AuthenticationFailed,
    ErrorCode.UNSUPPORTED: errors.UnsupportedOperation,
    ErrorCode.UNKNOWN: errors.BackendError,
}


def wrap_error(driver: Driver, exc: BaseException, doing: str) -> errors.LeaseError:
    """The leasekit error for ``exc``, raised by ``driver`` while ``doing`` something.

    A leasekit error is returned as it is (never wrapped twice). The caller
    raises the result ``from exc`` so the SDK error stays reachable.
    """
    if isinstance(exc, errors.LeaseError):
        return exc
    if isinstance(exc, DeadlineExceeded):
        return errors.BackendUnavailable(f"{doing} failed: {exc}")
    if isinstance(exc, NotImplementedError):
        return errors.UnsupportedOperation(
            f"{driver.scheme or type(driver).__name__}: {doing} is not supported ({exc})"
        )
    try:
        code = driver.error_code(exc)
        backend_code = driver.backend_code(exc)
    except Exception:  # a classifier bug must not hide the real error
        code, backend_code = ErrorCode.UNKNOWN, None
    cls = ERROR_CLASSES[code]
    # SDK messages may quote a request URL with its SAS signature, or a header.
    detail = redact(_first_line(str(exc))) or type(exc).__name__
    label = f" [{backend_code}]" if backend_code else ""
    return cls(f"{doing} failed{label}: {detail}", backend_code=backend_code)


#: Longest SDK detail kept in a leasekit error message (the SDK error, whole,
#: stays reachable as ``__cause__``).
MAX_DETAIL = 300


def _first_line(text: str) -> str:
    """The first non-empty line of an SDK message, trimmed (SDKs append XML bodies)."""
    for line in text.strip().splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= MAX_DETAIL else line[: MAX_DETAIL - 1] + "…"
    return ""
