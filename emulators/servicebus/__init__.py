"""An Azure Service Bus emulator speaking AMQP 1.0, for tests without Docker.

Run it with ``python -m leasekit.emulators.servicebus --port 5672 [--config queues.json]``
and connect the real ``azure-servicebus`` SDK (sync or aio, >= 7.15) with::

    Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=RootManageSharedAccessKey;
    SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true

What is emulated (queues, PeekLock and ReceiveAndDelete, lock renew and expiry,
abandon, dead-letter queue, defer, TTL, scheduled messages, peek) and what is not
(TLS, authentication, sessions, topics, transactions, duplicate detection) is listed
in :mod:`.broker` (semantics) and :mod:`.amqp` (wire protocol). Deviations from the
real service worth knowing:

* LockDuration may be shorter than Service Bus' 5 s minimum (e.g. ``PT1S``) so tests
  of lock expiry run fast;
* queues are created on first use unless the config says otherwise, and can be
  created at run time with the emulator-only ``leasekit:create-queue`` operation on
  the ``$management`` node (see :func:`leasekit.emulators.servicebus.admin.create_queue`);
* the header ``delivery-count`` is the number of failed deliveries so far, as the
  real service sends it: 0 on the first receive. The Python SDK shows that raw value
  as ``ServiceBusReceivedMessage.delivery_count`` (the .NET and Java SDKs add one).
"""

from .broker import Broker, EntityNotFound, LockLost
from .config import EmulatorConfig, QueueProperties, load_config, parse_config

__all__ = [
    "Broker",
    "EmulatorConfig",
    "EntityNotFound",
    "LockLost",
    "QueueProperties",
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
