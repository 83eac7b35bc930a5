"""MNS's error codes (data plane and OpenAPI) by what they mean to leasekit."""

from __future__ import annotations

from leasekit.spi import (
    DriverError,
    ErrorCode,
)

# MNS error codes (``MNSServerException.type``) by meaning.
_LEASE_LOST = frozenset({"MessageNotExist", "ReceiptHandleError"})
_QUEUE_NOT_FOUND = frozenset({"QueueNotExist"})
_QUEUE_EXISTS = frozenset({"QueueAlreadyExist"})
#: An ordered queue's send without ``MessageGroupId`` (leasekit refuses it before sending).
_MISSING_GROUP = frozenset({"FifoMissingMessageGroupId"})
_UNAUTHENTICATED = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "MissingAuthorizationHeader",
        "InvalidAuthorizationHeader",
        "TimeExpired",
        "SecurityTokenExpired",
        "InvalidSecurityToken",
    }
)
_UNAVAILABLE = frozenset(
    {"InternalError", "ServiceUnavailable", "ServerBusy", "QpsLimitExceeded", "Throttling"}
)
_INVALID = frozenset(
    {
        "InvalidArgument",
        "MalformedXML",
        "InvalidQueueName",
        "QueueNameLengthError",
        "InvalidDigest",
        "MissingReceiptHandle",
        "MissingVisibilityTimeout",
        "InvalidRequestURL",
        *_MISSING_GROUP,
    }
)


def _openapi_code(exc: BaseException) -> str | None:
    """MNS's error code on an OpenAPI SDK error (``AlibabaCloudException.code``)."""
    if type(exc).__module__.startswith(("alibabacloud_tea_openapi", "Tea", "darabonba")):
        code = getattr(exc, "code", None)
        return code if isinstance(code, str) and code and code != "None" else None
    return None


def _classify_code(code: str) -> ErrorCode | None:
    for codes, meaning in (
        (_LEASE_LOST, ErrorCode.LEASE_LOST),
        (_QUEUE_NOT_FOUND, ErrorCode.QUEUE_NOT_FOUND),
        (_QUEUE_EXISTS, ErrorCode.QUEUE_EXISTS),
        (_UNAUTHENTICATED, ErrorCode.UNAUTHENTICATED),
        (_UNAVAILABLE, ErrorCode.UNAVAILABLE),
        (_INVALID, ErrorCode.INVALID_ARGUMENT),
    ):
        if code in codes:
            return meaning
    return None


def _classify_openapi(exc: BaseException) -> ErrorCode | None:
    """Classify an OpenAPI SDK error (``None``: not one)."""
    module = type(exc).__module__
    if not module.startswith(("alibabacloud_tea_openapi", "Tea", "darabonba")):
        return None
    if type(exc).__name__ in ("UnretryableException", "RetryError", "ThrottlingException"):
        return ErrorCode.UNAVAILABLE  # network failure (wrapped by the SDK), or throttled
    code = _openapi_code(exc)
    meaning = _classify_code(code) if code is not None else None
    if meaning is not None:
        return meaning
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status >= 500:
        return ErrorCode.UNAVAILABLE
    return ErrorCode.UNKNOWN


def classify(exc: BaseException) -> ErrorCode:
    """The :class:`ErrorCode` an ``aliyun-mns-sdk`` (or MNS OpenAPI SDK) error means."""
    if isinstance(exc, DriverError):
        return exc.code
    openapi_meaning = _classify_openapi(exc)
    if openapi_meaning is not None:
        return openapi_meaning
    from mns.mns_exception import (
        MNSClientException,
        MNSClientNetworkException,
        MNSClientParameterException,
        MNSServerException,
    )

    if isinstance(exc, MNSServerException):
        return _classify_code(exc.type) or ErrorCode.UNKNOWN
    if isinstance(exc, MNSClientNetworkException):
        # Connection failures, and responses the SDK could not read (RespDataDamaged).
        return ErrorCode.UNAVAILABLE
    if isinstance(exc, MNSClientParameterException):
        return ErrorCode.INVALID_ARGUMENT
    if isinstance(exc, MNSClientException):
        return ErrorCode.UNKNOWN
    if isinstance(exc, ConnectionError | TimeoutError):
        return ErrorCode.UNAVAILABLE
    if isinstance(exc, ValueError | TypeError):
        return ErrorCode.INVALID_ARGUMENT
    return ErrorCode.UNKNOWN
