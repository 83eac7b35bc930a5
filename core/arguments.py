"""Checking a Queue call's arguments against the backend's capabilities, before any call.

Each function takes a backend's :class:`~leasekit.Capabilities` (and its scheme,
for the message) with the caller's value, and returns the value as the backend
will use it (a duration rounded up to its resolution, a body as ``bytes``), or
raises the typed error DESIGN.md promises for bad input:
:class:`~leasekit.InvalidArgument`, :class:`~leasekit.InvalidLeaseDuration`,
:class:`~leasekit.MessageTooLarge` or :class:`~leasekit.UnsupportedOperation`.
Nothing here calls a backend.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import errors
from .capabilities import Capabilities
from .options import check_text, is_number
from .spi import OutgoingMessage

if TYPE_CHECKING:
    from .lease import Lease

__all__ = [
    "MAX_GROUP",
    "MAX_REASON",
    "abandon_delay",
    "check_nul",
    "dead_letter_reason",
    "group_key",
    "lease_duration",
    "outgoing",
    "past_total_cap",
    "timeout",
    "wait",
]

#: Longest reason kept on a dead-lettered message (Service Bus allows 4096).
MAX_REASON = 4096
#: Longest group name or deduplication key: SQS FIFO's ``MessageGroupId`` and
#: ``MessageDeduplicationId`` limit, within Service Bus's 128-character session id.
MAX_GROUP = 128


def lease_duration(caps: Capabilities, scheme: str, duration: object) -> float:
    """``duration`` as the backend will use it: within its range, rounded up to its resolution.

    Raises:
        InvalidLeaseDuration: not a finite number, not the fixed lease, or out of range.
    """
    if not is_number(duration) or not math.isfinite(duration):  # type: ignore[arg-type]
        raise errors.InvalidLeaseDuration(
            f"lease duration must be a finite number of seconds, got {duration!r}"
        )
    value = float(duration)  # type: ignore[arg-type]
    if caps.fixed_lease is not None and value != caps.fixed_lease:
        raise errors.InvalidLeaseDuration(
            f"{scheme} locks a message for exactly {caps.fixed_lease:g} s "
            f"(a property of the queue), got {value:g} s; hold it longer with "
            "leasekit.LeaseKeeper, which renews in steps"
        )
    if not caps.min_lease <= value <= caps.max_lease:
        raise errors.InvalidLeaseDuration(
            f"{scheme} holds a lease for {caps.min_lease:g} to "
            f"{caps.max_lease:g} s, got {value:g} s"
        )
    resolution = caps.lease_resolution
    steps = math.ceil(value / resolution - 1e-9)
    return min(steps * resolution, caps.max_lease)


def past_total_cap(
    caps: Capabilities, scheme: str, lease: Lease, seconds: float
) -> errors.InvalidLeaseDuration | None:
    """The error for renewing ``lease`` by ``seconds`` past the backend's total cap (SQS)."""
    cap = caps.max_total_lease
    if cap is None:
        return None
    held = time.monotonic() - lease.received_at
    if held + seconds <= cap:
        return None
    return errors.InvalidLeaseDuration(
        f"{scheme} keeps a message invisible for at most {cap:g} s "
        f"in total since it was received; this lease has had {held:.0f} s, "
        f"so {seconds:g} s more is refused"
    )


def timeout(value: object, what: str = "timeout") -> float | None:
    """``value`` as a number of seconds > 0, or ``None`` if it is ``None``."""
    if value is None:
        return None
    if not is_number(value) or not math.isfinite(value) or value <= 0:  # type: ignore[operator, arg-type]
        raise errors.InvalidArgument(f"{what} must be a number of seconds > 0, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def wait(value: object) -> float:
    """``value`` as a number of seconds >= 0 (a long poll's wait)."""
    if not is_number(value) or not math.isfinite(value) or value < 0:  # type: ignore[operator, arg-type]
        raise errors.InvalidArgument(f"wait must be a number of seconds >= 0, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def abandon_delay(caps: Capabilities, scheme: str, delay: object) -> float:
    """An abandon's ``delay`` as the backend will use it: rounded up, at least its minimum.

    Raises:
        InvalidArgument: not a number of seconds >= 0, or longer than the backend allows.
        UnsupportedOperation: a delay on a backend that cannot delay an abandon.
    """
    if not is_number(delay) or not math.isfinite(delay) or delay < 0:  # type: ignore[operator, arg-type]
        raise errors.InvalidArgument(f"delay must be a number of seconds >= 0, got {delay!r}")
    value = float(delay)  # type: ignore[arg-type]
    limit = caps.max_abandon_delay
    if value > 0 and limit <= 0:
        raise errors.UnsupportedOperation(
            f"{scheme} cannot delay an abandoned message; abandon with delay=0"
        )
    if value > limit:
        raise errors.InvalidArgument(
            f"{scheme} delays an abandoned message by at most {limit:g} s, got {value:g} s"
        )
    if value > 0:
        value = math.ceil(value / caps.lease_resolution - 1e-9) * caps.lease_resolution
    return max(value, caps.min_abandon_delay)


def dead_letter_reason(reason: object, caps: Capabilities | None = None, scheme: str = "") -> str:
    """``reason`` as a non-empty str, cut to :data:`MAX_REASON` characters.

    With ``caps``, a NUL is refused where the backend cannot store one.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise errors.InvalidArgument(
            f"a dead-letter reason must be a non-empty str, got {reason!r}"
        )
    text = check_text(reason, "a dead-letter reason")
    if caps is not None:
        check_nul(caps, scheme, text, "a dead-letter reason")
    return text[:MAX_REASON]


def check_nul(caps: Capabilities, scheme: str, text: str, what: str) -> str:
    """``text``, unless it holds a NUL the backend cannot store (``properties_hold_nul``).

    PostgreSQL's text type cannot hold U+0000: without this a NUL failed there
    only after a round trip, as a ``BackendError``.
    """
    if not caps.properties_hold_nul and "\x00" in text:
        raise errors.InvalidArgument(
            f"{what} must not hold a NUL character (U+0000) on {scheme}, which cannot "
            f"store it (capabilities.properties_hold_nul is False); it has one at "
            f"position {text.index(chr(0))}"
        )
    return text


def outgoing(
    caps: Capabilities,
    scheme: str,
    body: object,
    delay: object,
    ttl: object,
    properties: Mapping[str, str] | None,
    group: object = None,
    dedup_key: object = None,
) -> OutgoingMessage:
    """The message to send, checked against ``caps`` (the driver's own checks come after).

    Raises:
        InvalidArgument: a non-bytes body, or a bad delay, ttl, properties, group or
            dedup_key; a delay on a message of a group.
        MessageTooLarge: the body is over ``max_message_size``.
        UnsupportedOperation: a delay, ttl, properties, group or dedup_key the
            backend cannot carry.
    """
    group_s = None if group is None else group_key(caps, scheme, group)
    dedup_s = None if dedup_key is None else _dedup_key(caps, scheme, dedup_key)
    if isinstance(body, str):
        raise errors.InvalidArgument(
            "a message body must be bytes, got str; encode it first, e.g. body.encode()"
        )
    if not isinstance(body, bytes | bytearray | memoryview):
        raise errors.InvalidArgument(f"a message body must be bytes, got {type(body).__name__}")
    data = bytes(body)
    if len(data) > caps.max_message_size:
        raise errors.MessageTooLarge(
            f"{scheme} accepts bodies of at most {caps.max_message_size} bytes, got {len(data)}"
        )
    if not is_number(delay) or not math.isfinite(delay) or delay < 0:  # type: ignore[operator, arg-type]
        raise errors.InvalidArgument(f"delay must be a number of seconds >= 0, got {delay!r}")
    delay_s = float(delay)  # type: ignore[arg-type]
    if group_s is not None and delay_s > 0:
        raise errors.InvalidArgument(
            f"a message of group {group_s!r} cannot be delayed (delay={delay_s:g}): "
            "it would hold up the messages sent after it in its group"
        )
    if delay_s > 0 and caps.max_send_delay <= 0:
        raise errors.UnsupportedOperation(f"{scheme} cannot delay a sent message")
    if delay_s > caps.max_send_delay:
        raise errors.InvalidArgument(
            f"{scheme} delays a message by at most {caps.max_send_delay:g} s, got {delay_s:g}"
        )
    ttl_s: float | None = None
    if ttl is not None:
        if not is_number(ttl) or not math.isfinite(ttl) or ttl <= 0:  # type: ignore[operator, arg-type]
            raise errors.InvalidArgument(f"ttl must be a number of seconds > 0, got {ttl!r}")
        ttl_s = float(ttl)  # type: ignore[arg-type]
        if caps.max_ttl is None:
            raise errors.UnsupportedOperation(f"{scheme} cannot set a time-to-live per message")
        if ttl_s > caps.max_ttl:
            raise errors.InvalidArgument(
                f"{scheme} keeps a message for at most {caps.max_ttl:g} s, got ttl={ttl_s:g}"
            )
    if ttl_s is not None and delay_s >= ttl_s:
        raise errors.InvalidArgument(
            f"delay ({delay_s:g} s) must be shorter than ttl ({ttl_s:g} s): the message "
            "would expire before it becomes visible"
        )
    props: dict[str, str] = {}
    if properties is not None and not isinstance(properties, Mapping):
        raise errors.InvalidArgument("properties must be a mapping of str to str")
    if properties:
        if not caps.supports_properties:
            raise errors.UnsupportedOperation(f"{scheme} cannot carry message properties")
        for key, value in properties.items():
            if not isinstance(key, str) or not isinstance(value, str) or not key:
                raise errors.InvalidArgument(
                    f"properties must map non-empty str to str, got {key!r}: {value!r}"
                )
            name = check_nul(caps, scheme, check_text(key, "a property name"), "a property name")
            props[name] = check_nul(
                caps, scheme, check_text(value, "a property value"), "a property value"
            )
    return OutgoingMessage(
        body=data, delay=delay_s, ttl=ttl_s, properties=props, group=group_s, dedup_key=dedup_s
    )


def _identifier(value: object, what: str) -> str:
    """``value`` as 1 to :data:`MAX_GROUP` printable ASCII characters, no space (SQS's set)."""
    if not isinstance(value, str):
        raise errors.InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    if not 1 <= len(value) <= MAX_GROUP:
        raise errors.InvalidArgument(
            f"{what} must be 1 to {MAX_GROUP} characters, got {len(value)}"
        )
    if not all("!" <= ch <= "~" for ch in value):
        raise errors.InvalidArgument(
            f"{what} may hold only letters, digits and ASCII punctuation "
            f"(no spaces or other characters), got {value!r}"
        )
    return value


def group_key(caps: Capabilities, scheme: str, group: object) -> str:
    """``group`` as an ordered group's name, on a backend that has groups.

    Raises:
        UnsupportedOperation: the backend (or this queue) is not ordered.
        InvalidArgument: not 1 to 128 letters, digits and ASCII punctuation.
    """
    if not caps.ordered:
        raise errors.UnsupportedOperation(
            f"{scheme} cannot keep messages in ordered groups on this queue "
            "(capabilities.ordered is False); send without group="
        )
    return _identifier(group, "group")


def _dedup_key(caps: Capabilities, scheme: str, key: object) -> str:
    if not caps.deduplicates:
        raise errors.UnsupportedOperation(
            f"{scheme} does not deduplicate messages on this queue "
            "(capabilities.deduplicates is False); send without dedup_key="
        )
    return _identifier(key, "dedup_key")
