"""A queue's dead-letter sub-queue as a driver, for re-driving."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from leasekit.spi import (
    DriverError,
    ErrorCode,
    OutgoingMessage,
    RawMessage,
)

from .driver import ServiceBusDriver
from .settings import _DEAD_LETTER_PROPERTIES, SOCKET_TIMEOUT


class ServiceBusDeadLetters(ServiceBusDriver):
    """A queue's dead-letter sub-queue (``<queue>/$deadletterqueue``) as a driver.

    What :meth:`ServiceBusDriver.dead_letter_store` returns: a PeekLock receiver on
    the sub-queue (Service Bus lets a dead letter be received, its lock renewed
    and completed like any message; it cannot be sent to or dead-lettered again).
    Each message carries its ``DeadLetterReason`` as leasekit's dead-letter marks.
    """

    def __repr__(self) -> str:
        return f"<ServiceBusDeadLetters queue={self.queue!r} namespace={self.namespace!r}>"

    def _new_receiver(self) -> Any:
        """A PeekLock SDK receiver on the dead-letter sub-queue (not opened)."""
        from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue

        return self._get_client().get_queue_receiver(
            self.queue,
            sub_queue=ServiceBusSubQueue.DEAD_LETTER,
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
            prefetch_count=0,
            socket_timeout=SOCKET_TIMEOUT,
        )

    def _raw(self, message: Any, token: str, locked_until: float) -> RawMessage:
        import dataclasses

        from leasekit.dead_letter_format import marked

        raw = super()._raw(message, token, locked_until)
        own = {k: v for k, v in raw.properties.items() if k not in _DEAD_LETTER_PROPERTIES}
        reason = message.dead_letter_reason
        return dataclasses.replace(
            raw,
            properties=marked(
                own,
                id=raw.id,
                reason=str(reason) if reason is not None else None,
                delivery_count=raw.delivery_count,
            ),
        )

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Refused: Service Bus does not take messages sent to a dead-letter sub-queue."""
        error = DriverError(
            ErrorCode.UNSUPPORTED, "azure-service-bus: cannot send to a dead-letter sub-queue"
        )
        return [error for _ in messages]


ServiceBusDriver.dead_letter_driver = ServiceBusDeadLetters
