"""Service Bus SDK errors by what they mean to leasekit."""

from __future__ import annotations

from leasekit.spi import (
    DriverError,
    ErrorCode,
)

_LOST = frozenset({"MessageLockLostError", "MessageAlreadySettled", "SessionLockLostError"})
_NOT_FOUND = frozenset({"MessagingEntityNotFoundError", "ResourceNotFoundError"})
_EXISTS = frozenset({"MessagingEntityAlreadyExistsError", "ResourceExistsError"})
_AUTH = frozenset(
    {
        "ServiceBusAuthenticationError",
        "ServiceBusAuthorizationError",
        "ClientAuthenticationError",
        "CredentialUnavailableError",
    }
)
_UNAVAILABLE = frozenset(
    {
        "ServiceBusConnectionError",
        "ServiceBusCommunicationError",
        "OperationTimeoutError",
        "ServiceBusServerBusyError",
        "ServiceBusQuotaExceededError",
        "MessagingEntityDisabledError",
        "ServiceRequestError",
        "ServiceResponseError",
        "ServiceRequestTimeoutError",
        "ServiceResponseTimeoutError",
        # pyamqp's own errors, where an SDK step raises them unconverted
        "AMQPConnectionError",
        "AMQPSessionError",
        "AMQPLinkError",
        "DeadlineExceeded",
    }
)
_TOO_LARGE = frozenset({"MessageSizeExceededError"})


def classify(exc: BaseException, *, entity_missing: bool) -> ErrorCode:
    """Classify an SDK error by its class (the SDK's exceptions name what happened).

    The SDK shuts a receiver down after an error, and then refuses to settle
    on it (``ValueError`` "...shutdown"): that lock is lost, unless the queue
    itself is gone (``entity_missing``).
    """
    if isinstance(exc, DriverError):
        return exc.code
    if isinstance(exc, ValueError) and "shutdown" in str(exc):
        return ErrorCode.QUEUE_NOT_FOUND if entity_missing else ErrorCode.LEASE_LOST
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _LOST:
        return ErrorCode.LEASE_LOST
    if names & _NOT_FOUND:
        return ErrorCode.QUEUE_NOT_FOUND
    if names & _AUTH:
        return ErrorCode.UNAUTHENTICATED
    if names & _TOO_LARGE:
        return ErrorCode.TOO_LARGE
    if names & _EXISTS:
        return ErrorCode.QUEUE_EXISTS
    if names & _UNAVAILABLE:
        return ErrorCode.UNAVAILABLE
    if "HttpResponseError" in names:
        status = getattr(exc, "status_code", None)
        if status in (401, 403):
            return ErrorCode.UNAUTHENTICATED
        if status == 429 or (isinstance(status, int) and status >= 500):
            return ErrorCode.UNAVAILABLE
    return ErrorCode.UNKNOWN


def sdk_code(exc: BaseException) -> str | None:
    """The SDK error's class name (``MessageLockLostError``...)."""
    if isinstance(exc, DriverError):
        return exc.backend_code
    module = type(exc).__module__
    if module.startswith(("azure.servicebus", "azure.core")):
        return type(exc).__name__
    return None
