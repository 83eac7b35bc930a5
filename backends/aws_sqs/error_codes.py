"""SQS's error codes (query and JSON protocols, botocore's own) by what they mean to leasekit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from leasekit.spi import (
    DriverError,
    ErrorCode,
)

from .wire import _XML_CODE, _XML_MESSAGE

_LOST_CODES = frozenset(
    {
        "ReceiptHandleIsInvalid",
        "AWS.SimpleQueueService.ReceiptHandleIsInvalid",
        "MessageNotInflight",
        "AWS.SimpleQueueService.MessageNotInflight",
    }
)
_NOT_FOUND_CODES = frozenset({"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"})
_EXISTS_CODES = frozenset({"QueueAlreadyExists", "QueueNameExists"})
_AUTH_CODES = frozenset(
    {
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidSecurity",
        "MissingAuthenticationToken",
        "IncompleteSignature",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "AuthFailure",
        "InvalidAccessKeyId",
        "NotAuthorized",
        "OptInRequired",
        "KMS.AccessDeniedException",
    }
)
_UNAVAILABLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "OverLimit",
        "AWS.SimpleQueueService.OverLimit",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "RequestTimeout",
        "RequestTimeoutException",
        "KmsThrottled",
        "KMS.ThrottlingException",
    }
)
_TOO_LARGE_CODES = frozenset({"BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong"})
_UNSUPPORTED_CODES = frozenset(
    {"UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation"}
)
_INVALID_CODES = frozenset(
    {
        "InvalidParameterValue",
        "InvalidParameterCombination",
        "MissingParameter",
        "InvalidAttributeName",
        "InvalidAttributeValue",
        "InvalidMessageContents",
        "InvalidBatchEntryId",
        "AWS.SimpleQueueService.InvalidBatchEntryId",
        "TooManyEntriesInBatchRequest",
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        "EmptyBatchRequest",
        "AWS.SimpleQueueService.EmptyBatchRequest",
        "BatchEntryIdsNotDistinct",
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        "InvalidIdFormat",
        "InvalidAddress",
        "ValidationError",
        "InvalidQueryParameter",
        "MalformedQueryString",
    }
)
#: boto3/botocore failures raised before or instead of a service answer.
_NETWORK_ERRORS = (
    "ConnectionError",  # botocore's base of EndpointConnectionError, timeouts, proxy errors
    "HTTPClientError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "EndpointConnectionError",
)
_CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError")
#: Option names that are credentials: accepted as keywords only, never in a URL.


def _client_error_parts(exc: BaseException) -> tuple[str | None, str | None, str, int | None]:
    """(code, query code, message, HTTP status) of a botocore ClientError; code None otherwise."""
    response = getattr(exc, "response", None)
    if not isinstance(response, Mapping):
        return None, None, "", None
    error = response.get("Error") or {}
    code = error.get("Code")
    if not code:
        return None, None, "", None
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    message = str(error.get("Message") or "")
    if str(code).isdigit():
        # An XML error body a JSON-protocol client could not parse (moto's auth
        # errors): botocore puts the HTTP status in Code and the XML in Message.
        found = _XML_CODE.search(message)
        if found:
            code = found.group(1)
            inner = _XML_MESSAGE.search(message)
            message = inner.group(1) if inner else message
    return str(code), error.get("QueryErrorCode"), message, status


def _classify(code: str, query_code: str | None, message: str, status: int | None) -> ErrorCode:
    codes = {code, query_code} - {None}
    lowered = message.lower()
    if codes & _LOST_CODES:
        return ErrorCode.LEASE_LOST
    if codes & _NOT_FOUND_CODES:
        return ErrorCode.QUEUE_NOT_FOUND
    if codes & _AUTH_CODES:
        return ErrorCode.UNAUTHENTICATED
    if codes & _UNAVAILABLE_CODES or (status is not None and status >= 500):
        return ErrorCode.UNAVAILABLE
    if codes & _EXISTS_CODES:
        return ErrorCode.QUEUE_EXISTS
    if codes & _TOO_LARGE_CODES:
        return ErrorCode.TOO_LARGE
    if codes & _UNSUPPORTED_CODES:
        return ErrorCode.UNSUPPORTED
    if "InvalidParameterValue" in codes:
        # SQS reports an expired or not-in-flight receipt handle this way, e.g.
        # "Value ... for parameter ReceiptHandle is invalid. Reason: The receipt
        # handle has expired."
        if "receipthandle" in lowered or "receipt handle" in lowered:
            return ErrorCode.LEASE_LOST
        if "message does not exist" in lowered or "not available for visibility" in lowered:
            return ErrorCode.LEASE_LOST
        if "shorter than" in lowered or "too long" in lowered:
            return ErrorCode.TOO_LARGE
    if codes & _INVALID_CODES:
        return ErrorCode.INVALID_ARGUMENT
    if status == 403:
        return ErrorCode.UNAUTHENTICATED
    if status == 429:
        return ErrorCode.UNAVAILABLE
    return ErrorCode.UNKNOWN


def _entry_error(failed: Mapping[str, Any]) -> DriverError:
    """The error for one failed batch entry, classified like a whole-call error."""
    code = str(failed.get("Code") or "UnknownError")
    message = str(failed.get("Message") or code)
    classified = _classify(code, None, message, None)
    if classified is ErrorCode.UNKNOWN and not failed.get("SenderFault", True):
        classified = ErrorCode.UNAVAILABLE  # a server-side fault on this entry
    return DriverError(classified, f"{code}: {message}", backend_code=code)
