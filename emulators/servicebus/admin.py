"""Create and delete queues on a running emulator (an emulator-only operation).

Real Service Bus manages entities over HTTPS (``ServiceBusAdministrationClient``);
this emulator does not serve that API. Instead it answers the request/response
operations ``leasekit:create-queue`` and ``leasekit:delete-queue`` on its
``$management`` node, which this module calls with proton's blocking client.
"""

from __future__ import annotations

import uuid
from typing import Any

from proton import Message
from proton.utils import BlockingConnection

__all__ = ["AdminError", "create_queue", "delete_queue"]


class AdminError(RuntimeError):
    """The emulator refused an admin request."""


def _request(host: str, port: int, operation: str, body: dict[str, Any], timeout: float) -> Any:
    conn = BlockingConnection(f"{host}:{port}", timeout=timeout, allowed_mechs="ANONYMOUS")
    try:
        reply_to = f"leasekit-admin-{uuid.uuid4()}"
        receiver = conn.create_receiver("$management", name=reply_to, credit=1)
        sender = conn.create_sender("$management")
        request = Message(
            id=str(uuid.uuid4()),
            reply_to="$management",
            properties={"operation": operation},
            body=body,
        )
        sender.send(request)
        reply = receiver.receive(timeout=timeout)
        props: dict[str, Any] = dict(reply.properties or {})
        status = int(props.get("statusCode", 0))
        if not 200 <= status < 300:
            raise AdminError(f"{operation} failed with {status}: {props.get('statusDescription')}")
        return reply.body
    finally:
        conn.close()


def create_queue(
    host: str, port: int, name: str, properties: dict[str, Any] | None = None, timeout: float = 10
) -> None:
    """Create a queue, or replace the properties of an existing one.

    Parameters:
        host: the emulator's address.
        port: its port.
        name: the queue name.
        properties: Config.json-style properties, e.g. ``{"LockDuration": "PT2S",
            "MaxDeliveryCount": 3}``; unset ones take the emulator's defaults.
        timeout: seconds to wait for the emulator.

    Raises:
        AdminError: the emulator refused (e.g. an invalid property value).
    """
    _request(
        host, port, "leasekit:create-queue", {"name": name, "properties": properties or {}}, timeout
    )


def delete_queue(host: str, port: int, name: str, timeout: float = 10) -> None:
    """Delete a queue and its messages.

    Parameters:
        host: the emulator's address.
        port: its port.
        name: the queue name.
        timeout: seconds to wait for the emulator.

    Raises:
        AdminError: no such queue.
    """
    _request(host, port, "leasekit:delete-queue", {"name": name}, timeout)
