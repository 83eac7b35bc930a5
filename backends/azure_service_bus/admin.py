"""The management plane: creating the queue, its counts, peeking its dead letters."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable
from typing import Any

from leasekit.spi import (
    DeadLetter,
    DriverError,
    ErrorCode,
    QueueStats,
)

from .connection import _open_handler, _plain_http_transport, _with_endpoint
from .settings import _DEAD_LETTER_PROPERTIES
from .wire import _body, _properties


def admin_client(
    *, emulator: bool, namespace: str, admin_port: int, secret: Any, uses_connection_string: bool
) -> Any:
    """The administration client; for an emulator, on its HTTP port in plain HTTP."""
    from azure.servicebus.management import ServiceBusAdministrationClient

    if emulator:
        host = namespace.rpartition(":")[0] or namespace
        return ServiceBusAdministrationClient.from_connection_string(
            _with_endpoint(secret, f"sb://{host}:{admin_port}"),
            transport=_plain_http_transport(),
        )
    if uses_connection_string:
        return ServiceBusAdministrationClient.from_connection_string(secret)
    return ServiceBusAdministrationClient(namespace, secret)


def ensure_queue(admin: Any, queue: str, lock_duration: float, sessions: bool) -> None:
    """Create ``queue`` with LockDuration ``lock_duration``; an existing one must match.

    ``ServiceBusAdministrationClient.create_queue``; an existing queue with another
    LockDuration (or RequiresSession) is refused: its leases would not match the
    capabilities.
    """
    from azure.core.exceptions import ResourceExistsError

    try:
        admin.create_queue(
            queue,
            lock_duration=datetime.timedelta(seconds=lock_duration),
            requires_session=sessions,
        )
    except ResourceExistsError:
        properties = admin.get_queue(queue)
        if bool(properties.requires_session) != sessions:
            raise DriverError(
                ErrorCode.INVALID_ARGUMENT,
                f"azure-service-bus: queue {queue!r} exists with RequiresSession="
                f"{bool(properties.requires_session)}; open it with "
                f"sessions={str(bool(properties.requires_session)).lower()}",
            ) from None
        existing = properties.lock_duration
        seconds = existing.total_seconds() if existing is not None else None
        if seconds is not None and abs(seconds - lock_duration) > 1e-3:
            raise DriverError(
                ErrorCode.INVALID_ARGUMENT,
                f"azure-service-bus: queue {queue!r} exists with LockDuration "
                f"{seconds:g} s; open it with lock_duration={seconds:g}",
            ) from None


def queue_stats(admin: Any, queue: str, left: float) -> QueueStats:
    """The queue's runtime properties (``get_queue_runtime_properties``) as counts.

    ``ScheduledMessageCount`` is ``delayed``, ``DeadLetterMessageCount``
    ``dead_lettered``, and ``MessageCount`` less the dead-letter and transfer
    sub-queues ``total``. ``visible`` and ``leased`` stay ``None``: nothing
    counts locked messages, and ``ActiveMessageCount`` is reported to include
    them (see Limits), so it cannot be split into the two.
    """
    runtime = admin.get_queue_runtime_properties(queue, connection_timeout=left, read_timeout=left)
    parts = (
        runtime.total_message_count,
        runtime.dead_letter_message_count,
        runtime.transfer_dead_letter_message_count,
        runtime.transfer_message_count,
    )
    total = None
    if all(isinstance(part, int) for part in parts):
        everything, dead, transfer_dead, transfer = parts
        total = everything - dead - transfer_dead - transfer
    return QueueStats(
        delayed=runtime.scheduled_message_count,
        dead_lettered=runtime.dead_letter_message_count,
        total=total,
    )


def peek_dead_letters(
    client: Any, queue: str, limit: int, left: Callable[[], float]
) -> list[DeadLetter]:
    """Peek up to ``limit`` messages of ``<queue>/$deadletterqueue`` (nothing is settled)."""
    from azure.servicebus import ServiceBusSubQueue

    # prefetch 1 and keep_alive 0: a peek needs no PeekLock link, and then the
    # SDK starts no keep-alive thread (closing it is instant).
    receiver = client.get_queue_receiver(
        queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, prefetch_count=1, keep_alive=0
    )
    letters: list[DeadLetter] = []
    with contextlib.closing(receiver):
        _open_handler(receiver, left())
        while len(letters) < limit:
            peeked = receiver.peek_messages(max_message_count=limit - len(letters), timeout=left())
            if not peeked:
                break
            for message in peeked:
                letters.append(
                    DeadLetter(
                        id=str(message.message_id),
                        body=_body(message),
                        reason=message.dead_letter_reason,
                        delivery_count=int(message.delivery_count or 0) + 1,
                        properties={
                            k: v
                            for k, v in _properties(message).items()
                            if k not in _DEAD_LETTER_PROPERTIES
                        },
                        enqueued_at=message.enqueued_time_utc,
                    )
                )
    return letters[:limit]
