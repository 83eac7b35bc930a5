"""An Azure Service Bus emulator speaking AMQP 1.0, for tests without Docker.

Run it with ``python -m leasekit.emulators.servicebus --port 5672 --http-port 5300
[--config queues.json]`` and connect the real ``azure-servicebus`` SDK (sync or aio,
>= 7.15) with::

    Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=RootManageSharedAccessKey;
    SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true

Emulated, as Azure Service Bus documents and as the SDK's own samples and live
tests expect it (details in :mod:`.broker`, semantics, and :mod:`.amqp`, the wire):

* queues and their dead-letter sub-queues; PeekLock and ReceiveAndDelete; lock
  renew and expiry; complete, abandon, dead-letter, defer; MaxDeliveryCount; TTL
  (with DeadLetteringOnMessageExpiration); scheduled messages; peek; batches;
* management calls made concurrently on one link: like the service, the emulator
  takes each transfer's delivery-id as sent (see :mod:`.frames`), so the SDK's
  ``AutoLockRenewer`` and concurrent peeks or renewals work;
* application properties as the service keeps them (decimals re-encoded as
  ``System.Decimal``), the sender's delivery annotations passed on, and
  ``x-opt-lock-token`` in the delivery annotations of a locked message;
* a settle on a receive link that has detached changes nothing (the SDK then
  settles over ``$management``, which works while the lock lasts and the
  connection that received the message is open); once that connection is gone
  (closed or reset), settling by lock token gets ``com.microsoft:message-lock-lost``,
  as Service Bus drops the locks of a broken connection, while ``renew-lock`` still
  renews the lock and the message comes back when it ends;
* message sessions of ``RequiresSession`` queues (:mod:`.sessions`): the session
  filter on attach (a named session, or the next available one, waiting up to the
  link's operation timeout), the session lock and ``renew-session-lock``, session
  state, the session's messages in order to the one link holding it, the lock lost
  on expiry (``com.microsoft:session-lock-lost``); the SDK's own session samples
  run unchanged against it;
* entity management over HTTP with the real service's ATOM bodies, on a second
  port (``--http-port``, 5300 by default as on Microsoft's emulator), for
  ``ServiceBusAdministrationClient`` (:mod:`.admin`; :func:`admin_client` makes
  one that speaks plain HTTP to it).

Not emulated, each refused at once with a clear error, never emulated silently:

* ``get-message-sessions`` (listing sessions);
* topics and subscriptions: links to ``<topic>/Subscriptions/<name>`` and to a
  topic declared in the config get ``amqp:not-implemented``;
* duplicate detection and auto-forwarding: a queue that sets
  ``RequiresDuplicateDetection``, ``ForwardTo`` or ``ForwardDeadLetteredMessagesTo``
  refuses every link with ``amqp:not-implemented`` naming the property (and the
  config file's warning names it at startup);
* AMQP over WebSocket: an HTTP request on the AMQP port is answered
  ``501 Not Implemented`` saying so;
* TLS, authentication (any CBS token is accepted), transactions, rules, the
  Premium tier's per-entity ``MaxMessageSizeInKilobytes`` (the Standard tier's
  256 KB message limit and the 32 KB / 64 KB property-size quotas are enforced).

Deviations worth knowing:

* LockDuration may be shorter than Service Bus' 5 s minimum (e.g. ``PT1S``) so tests
  of lock expiry run fast;
* queues are not created on first use unless the config's ``AutoCreateQueues``
  says so (each one is then logged); the SDK sees a missing queue as
  ``MessagingEntityNotFoundError``, as on Service Bus;
* the header ``delivery-count`` is the number of failed deliveries so far, as the
  real service sends it: 0 on the first receive. The Python SDK shows that raw value
  as ``ServiceBusReceivedMessage.delivery_count`` (the .NET and Java SDKs add one).
"""

from typing import Any

from .broker import Broker, EntityNotFound, LockLost
from .config import EmulatorConfig, QueueProperties, load_config, parse_config

__all__ = [
    "Broker",
    "EmulatorConfig",
    "EntityNotFound",
    "LockLost",
    "QueueProperties",
    "admin_client",
    "connection_string",
    "load_config",
    "parse_config",
]


def connection_string(host: str, port: int) -> str:
    """The SDK connection string for an emulator on ``host:port``.

    Parameters:
        host: the emulator's address.
        port: its port.

    Returns:
        A connection string with ``UseDevelopmentEmulator=true``.
    """
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
    )


def admin_client(host: str, http_port: int) -> Any:
    """A ``ServiceBusAdministrationClient`` for the emulator's management port.

    azure-servicebus (7.15) builds ``https://`` URLs for management even with
    ``UseDevelopmentEmulator=true`` (only .NET's admin client speaks plain HTTP to
    an emulator), so the client gets a transport that sends them as ``http://``.

    Parameters:
        host: the emulator's address.
        http_port: its ``--http-port``.

    Returns:
        The client (a context manager).
    """
    from azure.core.pipeline.transport import RequestsTransport
    from azure.servicebus.management import ServiceBusAdministrationClient

    class PlainHttp(RequestsTransport):  # type: ignore[misc]
        def send(self, request: Any, **kwargs: Any) -> Any:
            if request.url.startswith("https://"):
                request.url = "http://" + request.url[len("https://") :]
            return super().send(request, **kwargs)

    return ServiceBusAdministrationClient.from_connection_string(
        connection_string(host, http_port), transport=PlainHttp()
    )
