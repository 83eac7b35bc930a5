# House docstring style uses "Parameters:"/"Returns:"/"Raises:" sections (STYLE.md 14), which
# ruff's unconfigured pydocstyle misreads as numpy sections.
r"""MNS request signing, checked the way the MNS service checks it.

A request carries ``Authorization: MNS <AccessKeyId>:<Signature>`` where::

    Signature    = base64(HMAC-SHA1(AccessKeySecret, StringToSign))
    StringToSign = METHOD "\\n" Content-MD5 "\\n" Content-Type "\\n" Date "\\n"
                   CanonicalizedMNSHeaders CanonicalizedResource

``CanonicalizedMNSHeaders`` is every ``x-mns-*`` header, lower-cased, sorted by
name, each as ``name:value\\n``; ``CanonicalizedResource`` is the request URI as
sent, query string included and not re-encoded. Missing Content-MD5 or
Content-Type count as empty strings. Content-MD5, when present, is the base64 of
the *hex* MD5 digest of the body (what every MNS SDK sends) and must match it.

Not checked: the Date header's format (``InvalidDateHeader``) and its distance
from the server clock (``TimeExpired``), and STS security tokens (the
``security-token`` header is accepted and ignored).
Secrets are never logged or put into error messages.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

from .errors import MnsError

__all__ = ["MNS_VERSION", "check_digest", "check_signature", "sign"]

MNS_VERSION = "2015-06-06"


def string_to_sign(method: str, headers: Mapping[str, str], resource: str) -> str:
    """Build MNS's StringToSign.

    Parameters:
        method: the HTTP method, upper case.
        headers: request headers with lower-case names.
        resource: the raw request URI (path and query) as sent.

    Returns:
        The string the signature is computed over.
    """
    mns_headers = "".join(
        f"{name}:{headers[name]}\n" for name in sorted(headers) if name.startswith("x-mns-")
    )
    return "\n".join(
        [
            method,
            headers.get("content-md5", ""),
            headers.get("content-type", ""),
            headers.get("date", ""),
            mns_headers + resource,
        ]
    )


def sign(secret: str, method: str, headers: Mapping[str, str], resource: str) -> str:
    """Return the base64 HMAC-SHA1 signature of a request.

    Parameters:
        secret: the AccessKey secret.
        method: the HTTP method.
        headers: request headers with lower-case names.
        resource: the raw request URI.
    """
    digest = hmac.new(
        secret.encode("utf-8"),
        string_to_sign(method, headers, resource).encode("utf-8"),
        hashlib.sha1,
    ).digest()
    return base64.b64encode(digest).decode("ascii")


def check_signature(
    method: str,
    headers: Mapping[str, str],
    resource: str,
    credentials: Mapping[str, str],
) -> str:
    """Authenticate a request from its request line and headers, before its body is read.

    The signature covers the method, the Content-MD5, Content-Type and Date headers,
    the ``x-mns-*`` headers and the URI, not the body: a request can be refused
    before a byte of its body is read. :func:`check_digest` checks the body later.

    Parameters:
        method: the HTTP method.
        headers: request headers with lower-case names.
        resource: the raw request URI.
        credentials: AccessKeyId -> AccessKeySecret of the accepted keys.

    Returns:
        The AccessKeyId the request was signed with.

    Raises:
        MnsError: ``MissingAuthorizationHeader``/``InvalidAuthorizationHeader``
            (400), ``MissingDateHeader`` (400), ``MissingVersionHeader``/
            ``InvalidVersionHeader`` (400), ``InvalidAccessKeyId`` (403),
            ``SignatureDoesNotMatch`` (403).
    """
    authorization = headers.get("authorization")
    if not authorization:
        raise MnsError("MissingAuthorizationHeader", 400, "Authorization header is required.")
    scheme, _, credential = authorization.partition(" ")
    access_key_id, sep, signature = credential.strip().partition(":")
    if scheme != "MNS" or not sep or not access_key_id or not signature:
        raise MnsError(
            "InvalidAuthorizationHeader", 400, "The Authorization header format is invalid."
        )
    if not headers.get("date"):
        raise MnsError("MissingDateHeader", 400, "Date header is required.")
    version = headers.get("x-mns-version")
    if not version:
        raise MnsError("MissingVersionHeader", 400, "x-mns-version header is required.")
    if version != MNS_VERSION:
        raise MnsError("InvalidVersionHeader", 400, "The x-mns-version header is invalid.")
    secret = credentials.get(access_key_id)
    if secret is None:
        raise MnsError("InvalidAccessKeyId", 403, "The AccessKey Id you provided is not exist.")
    expected = sign(secret, method, headers, resource)
    if not hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii", "replace")):
        raise MnsError(
            "SignatureDoesNotMatch",
            403,
            "The request signature we calculated does not match the signature you provided.",
        )
    return access_key_id


def check_digest(headers: Mapping[str, str], body: bytes) -> None:
    """Check the body against its signed ``Content-MD5`` header, if the request has one.

    Parameters:
        headers: request headers with lower-case names.
        body: the request body.

    Raises:
        MnsError: ``InvalidDigest`` (400).
    """
    content_md5 = headers.get("content-md5")
    if content_md5 is not None:
        hex_md5 = hashlib.md5(body, usedforsecurity=False).hexdigest()
        if content_md5 != base64.b64encode(hex_md5.encode("ascii")).decode("ascii"):
            raise MnsError("InvalidDigest", 400, "The Content-MD5 you specified is invalid.")
