"""PostgreSQL errors (SQLSTATE, or libpq's words where it gives none) by what they mean."""

from __future__ import annotations

from typing import TYPE_CHECKING

from leasekit.spi import (
    ErrorCode,
)

if TYPE_CHECKING:
    import psycopg


#: SQLSTATE classes and codes that mean "try again": connection exceptions (08),
#: insufficient resources (53), operator intervention (57: admin shutdown,
#: crash shutdown, cannot connect now; not 57014, a cancelled statement),
#: serialization failure and deadlock (40001, 40P01).
_RETRYABLE_STATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "55P03"})
_RETRYABLE_CLASSES = ("08", "53")


#: What a failed connection's message (libpq gives it no SQLSTATE) says that no
#: retry mends, and what it means: libpq refusing a parameter, the server
#: refusing the database, role, password or a setting. English server messages
#: only (``lc_messages``): a server speaking another language still reads as
#: unreachable, and is retried.
_CONNECT_FAILURES: tuple[tuple[tuple[str, ...], ErrorCode], ...] = (
    (("connection is bad: ",), ErrorCode.INVALID_ARGUMENT),  # libpq refused a parameter
    (("FATAL:  database ", "does not exist"), ErrorCode.QUEUE_NOT_FOUND),  # 3D000
    (("password authentication failed",), ErrorCode.UNAUTHENTICATED),  # 28P01
    (("no password supplied",), ErrorCode.UNAUTHENTICATED),
    (("no pg_hba.conf entry",), ErrorCode.UNAUTHENTICATED),  # 28000
    (("FATAL:  role ", "does not exist"), ErrorCode.UNAUTHENTICATED),  # 28000
    (("is not permitted to log in",), ErrorCode.UNAUTHENTICATED),  # 28000
    (("permission denied for database",), ErrorCode.UNAUTHENTICATED),  # 42501
    (("FATAL:  unrecognized configuration parameter",), ErrorCode.INVALID_ARGUMENT),  # 42704
    (("FATAL:  invalid value for parameter",), ErrorCode.INVALID_ARGUMENT),  # 22023
    (("SSL was required",), ErrorCode.INVALID_ARGUMENT),  # the server has no SSL
)

#: SQLSTATEs (and classes) of errors no retry mends, where psycopg has one.
_FINAL_STATES: dict[str, ErrorCode] = {
    "3D000": ErrorCode.QUEUE_NOT_FOUND,  # invalid_catalog_name: no such database
    "3F000": ErrorCode.QUEUE_NOT_FOUND,  # invalid_schema_name
    "42P01": ErrorCode.QUEUE_NOT_FOUND,  # undefined_table: a table was dropped
    "42501": ErrorCode.UNAUTHENTICATED,  # insufficient_privilege
    "42704": ErrorCode.INVALID_ARGUMENT,  # undefined_object (a setting)
    "22023": ErrorCode.INVALID_ARGUMENT,  # invalid_parameter_value
    "54000": ErrorCode.TOO_LARGE,  # program_limit_exceeded (a field over 1 GB)
}


def _connect_failure(exc: BaseException) -> ErrorCode | None:
    """What a failed connection (no SQLSTATE) means when no retry mends it; else ``None``."""
    text = str(exc)
    for fragments, code in _CONNECT_FAILURES:
        if all(words in text for words in fragments):
            return code
    return None


def _retryable(exc: psycopg.Error) -> bool:
    state = exc.sqlstate or ""
    return state in _RETRYABLE_STATES or state[:2] in _RETRYABLE_CLASSES
