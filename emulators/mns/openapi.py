# House docstring style uses "Parameters:"/"Returns:"/"Raises:" sections (STYLE.md 14), which
# ruff's unconfigured pydocstyle misreads as numpy sections.
r"""MNS's control-plane OpenAPI (version ``2022-01-19``): the queue calls it has and XML lacks.

Only this API can create an *ordered* (FIFO) queue: its ``CreateQueue`` takes
``QueueType`` — "normal: standard queue. fifo: FIFO queue." (Alibaba's
``alibabacloud-mns-open20220119`` 1.4.1, ``models/_create_queue_request.py``;
the XML API's ``<Queue>`` body has no such element). The emulator serves these
actions, on its own port (the service answers them at
``mns-open.<region>.aliyuncs.com``; a request is told apart by its
``x-acs-action`` header):

- ``CreateQueue`` — ``QueueName`` (required), ``QueueType``, ``DelaySeconds``,
  ``MaximumMessageSize``, ``MessageRetentionPeriod``, ``VisibilityTimeout``,
  ``PollingWaitSeconds``, ``EnableLogging``; the same store and rules as the XML
  ``CreateQueue`` (identical queue: success; different one: ``QueueAlreadyExist``);
- ``GetQueueAttributes`` — ``QueueName``; ``Data`` holds the attributes, the
  message counts and ``QueueType``;
- ``DeleteQueue`` — ``QueueName``.

Requests are RPC style (``POST /`` with the parameters in the query string),
answered in JSON: ``{"RequestId", "Code": 200, "Status": "Success", "Message":
"operation success", "Success": true[, "Data"]}`` (the values of the reference's
examples); errors are ``{"RequestId", "HostId", "Code", "Message"}`` with the
HTTP status of the same MNS error code.

Signature: *V3 request structure and signature*
(https://www.alibabacloud.com/help/en/sdk/product-overview/v3-request-structure-and-signature)::

    Authorization    = "ACS3-HMAC-SHA256 Credential=" AccessKeyId
                       ",SignedHeaders=" names ",Signature=" hex(HMAC-SHA256(secret, StringToSign))
    StringToSign     = "ACS3-HMAC-SHA256\n" hex(SHA256(CanonicalRequest))
    CanonicalRequest = METHOD "\n" CanonicalURI "\n" CanonicalQueryString "\n"
                       CanonicalHeaders "\n" SignedHeaders "\n" HashedRequestPayload

``CanonicalQueryString`` is every parameter, name and value percent-encoded
(RFC 3986, ``-_.~`` kept), sorted, joined by ``&``; ``CanonicalHeaders`` is each
signed header as ``name:trimmed value\n``, names lower case and sorted;
``HashedRequestPayload`` is the hex SHA-256 of the body and must equal the
``x-acs-content-sha256`` header. ``host`` and every ``x-acs-*`` header must be
signed. Not checked, as on the XML side: ``x-acs-date``'s distance from the
server clock and STS tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

from .errors import MnsError, int_param
from .store import ATTRIBUTE_LIMITS, MnsStore, QueueInfo

__all__ = ["OPENAPI_VERSION", "check_acs3_signature", "dispatch", "error_json", "success_json"]

OPENAPI_VERSION = "2022-01-19"
_ALGORITHM = "ACS3-HMAC-SHA256"
_BOOLEANS = {"true": True, "false": False}


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def _query_pairs(raw_query: str) -> list[tuple[str, str]]:
    pairs = []
    for part in raw_query.split("&"):
        if part:
            key, _, value = part.partition("=")
            pairs.append((unquote(key), unquote(value)))
    return pairs


def canonical_request(
    method: str, path: str, raw_query: str, headers: Mapping[str, str], signed: list[str]
) -> str:
    """Build the V3 CanonicalRequest.

    Parameters:
        method: the HTTP method.
        path: the request path as sent.
        raw_query: the query string as sent (without ``?``).
        headers: request headers with lower-case names.
        signed: the signed header names, lower case, in the order given.
    """
    query = "&".join(
        f"{name}={value}"
        for name, value in sorted((_encode(k), _encode(v)) for k, v in _query_pairs(raw_query))
    )
    canonical_headers = "".join(f"{name}:{headers.get(name, '').strip()}\n" for name in signed)
    return "\n".join(
        [
            method,
            _encode(unquote(path)).replace("%2F", "/") or "/",
            query,
            canonical_headers,
            ";".join(signed),
            headers.get("x-acs-content-sha256", ""),
        ]
    )


def check_acs3_signature(
    method: str,
    headers: Mapping[str, str],
    path: str,
    raw_query: str,
    credentials: Mapping[str, str],
) -> str:
    """Authenticate an OpenAPI request from its request line and headers.

    Parameters:
        method: the HTTP method.
        headers: request headers with lower-case names.
        path: the request path as sent.
        raw_query: the query string as sent.
        credentials: AccessKeyId -> AccessKeySecret of the accepted keys.

    Returns:
        The AccessKeyId the request was signed with.

    Raises:
        MnsError: ``MissingAuthorizationHeader``/``InvalidAuthorizationHeader``
            (400), ``InvalidVersionHeader`` (400), ``InvalidAccessKeyId`` (403),
            ``SignatureDoesNotMatch`` (403).
    """
    authorization = headers.get("authorization")
    if not authorization:
        raise MnsError("MissingAuthorizationHeader", 400, "Authorization header is required.")
    algorithm, _, rest = authorization.partition(" ")
    fields: dict[str, str] = {}
    for item in rest.split(","):
        name, sep, value = item.strip().partition("=")
        if sep:
            fields[name] = value
    key_id = fields.get("Credential", "")
    signature = fields.get("Signature", "")
    signed = [name.strip().lower() for name in fields.get("SignedHeaders", "").split(";") if name]
    required = {"host", *(name for name in headers if name.startswith("x-acs-"))}
    if (
        algorithm != _ALGORITHM
        or not key_id
        or not signature
        or signed != sorted(signed)
        or not required.issubset(signed)
    ):
        raise MnsError(
            "InvalidAuthorizationHeader", 400, "The Authorization header format is invalid."
        )
    if headers.get("x-acs-version") != OPENAPI_VERSION:
        raise MnsError("InvalidVersionHeader", 400, "The x-acs-version header is invalid.")
    secret = credentials.get(key_id)
    if secret is None:
        raise MnsError("InvalidAccessKeyId", 403, "The AccessKey Id you provided is not exist.")
    canonical = canonical_request(method, path, raw_query, headers, signed)
    string_to_sign = f"{_ALGORITHM}\n{hashlib.sha256(canonical.encode('utf-8')).hexdigest()}"
    expected = hmac.new(
        secret.encode("utf-8"), string_to_sign.encode("utf-8"), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii", "replace")):
        raise MnsError(
            "SignatureDoesNotMatch",
            403,
            "The request signature we calculated does not match the signature you provided.",
        )
    return key_id


def check_payload(headers: Mapping[str, str], body: bytes) -> None:
    """Check the body against its signed ``x-acs-content-sha256`` header.

    Raises:
        MnsError: ``InvalidDigest`` (400).
    """
    if headers.get("x-acs-content-sha256") != hashlib.sha256(body).hexdigest():
        raise MnsError("InvalidDigest", 400, "The x-acs-content-sha256 you specified is invalid.")


def success_json(request_id: str, data: Any = None) -> bytes:
    """Build a successful answer (the reference's example values)."""
    answer: dict[str, Any] = {
        "RequestId": request_id,
        "Code": 200,
        "Status": "Success",
        "Message": "operation success",
        "Success": True,
    }
    if data is not None:
        answer["Data"] = data
    return json.dumps(answer).encode("utf-8")


def error_json(code: str, message: str, request_id: str, host_id: str) -> bytes:
    """Build an error answer."""
    return json.dumps(
        {"RequestId": request_id, "HostId": host_id, "Code": code, "Message": message}
    ).encode("utf-8")


def _queue_name(params: Mapping[str, str]) -> str:
    name = params.get("QueueName")
    if not name:
        raise MnsError.invalid_argument("QueueName is required.")
    return name


def _attributes_json(info: QueueInfo) -> dict[str, Any]:
    return {
        "QueueName": info.name,
        "QueueType": info.queue_type,
        "CreateTime": int(info.create_time),
        "LastModifyTime": int(info.last_modify_time),
        **{name: info.attributes[name] for name in sorted(ATTRIBUTE_LIMITS)},
        "ActiveMessages": info.active_messages,
        "InactiveMessages": info.inactive_messages,
        "DelayMessages": info.delay_messages,
        "LoggingEnabled": info.logging_enabled,
    }


def dispatch(store: MnsStore, action: str, raw_query: str, request_id: str) -> tuple[int, bytes]:
    """Carry out one OpenAPI action and return its status and JSON answer.

    Raises:
        MnsError: the error the action answers with.
    """
    params = dict(_query_pairs(raw_query))
    if action == "CreateQueue":
        attributes = {
            name: value
            for name in ATTRIBUTE_LIMITS
            if (value := int_param(params.get(name), name)) is not None
        }
        logging_text = params.get("EnableLogging")
        logging: bool | None = None
        if logging_text is not None:
            if logging_text.lower() not in _BOOLEANS:
                raise MnsError.invalid_argument("EnableLogging must be true or false.")
            logging = _BOOLEANS[logging_text.lower()]
        store.create_queue(
            _queue_name(params), attributes, logging, params.get("QueueType") or "normal"
        )
        return 200, success_json(request_id)
    if action == "GetQueueAttributes":
        info = store.get_queue(_queue_name(params))
        return 200, success_json(request_id, _attributes_json(info))
    if action == "DeleteQueue":
        store.delete_queue(_queue_name(params))
        return 200, success_json(request_id)
    # Alibaba's gateway answers an unknown action this way; the emulator has only three.
    raise MnsError("InvalidAction.NotFound", 404, "Specified api is not found.")
