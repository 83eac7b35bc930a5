"""Service Bus limits, timeouts and names: the numbers the driver works within, with reasons."""

from __future__ import annotations

import re

#: Messages per receive. Larger batches cost fewer calls, but every message's
#: lock starts on delivery, so a big batch held by a slow worker needs renewals sooner.
MAX_RECEIVE = 32
#: Lock tokens per renew-lock management call (Service Bus documents no limit;
#: 100 tokens is a 1.6 KB request and keeps one failed call cheap to redo per token).
MAX_RENEW = 100
#: Messages per send batch before the size split (the service caps a batch by bytes).
MAX_SEND = 100
#: Bytes of the entity's message size kept for the AMQP header, annotations and
#: properties; more room means smaller bodies, less means large property sets fail.
HEADER_ROOM = 8192
#: Service Bus Standard's maximum message size (Premium entities allow more).
DEFAULT_MAX_MESSAGE_SIZE = 262144
#: Service Bus Premium's largest maximum message size (100 MB).
MAX_MESSAGE_SIZE = 100 * 1024 * 1024
#: Longest ``max_wait`` option: one receive call longer than an hour only delays close().
MAX_WAIT_OPTION = 3600.0
#: The loggers of the SDKs this driver uses; core redacts their records (``leasekit.redaction``).
SDK_LOGGERS = ("azure.core", "azure.servicebus", "azure.identity", "msal", "uamqp", "pyamqp")
#: The Service Bus default LockDuration (PT1M).
DEFAULT_LOCK_DURATION = 60.0
#: Longest lock Service Bus allows (PT5M).
MAX_LOCK_DURATION = 300.0
#: Default longest wait of one receive call; longer waits are core's loop. Short
#: enough that close() and a stop are noticed quickly, long enough to cost few calls.
DEFAULT_MAX_WAIT = 1.0
#: One turn of a receive on the receiver's connection; a settle or renewal
#: waits at most about this long (plus the SDK's 0.2 s batch top-up after a
#: first message). Shorter turns cost more flow frames when idle.
RECEIVE_SLICE = 0.1
#: The receiver's socket read timeout (the SDK's ``socket_timeout``, 0.2 s by
#: default): a receive turn cannot end sooner than one read, and each wake-up
#: costs a little CPU while idle.
SOCKET_TIMEOUT = 0.05
#: Seconds an operation may wait for the service's answer (the SDK's own default
#: is 60); a renewal is bounded tighter, by the time left on its lease.
DEFAULT_READ_TIMEOUT = 10.0
#: Longest read_timeout accepted (an hour).
MAX_READ_TIMEOUT = 3600.0
#: The SDK refuses a zero wait; a "return at once" receive waits this long
#: (a message already pushed to the link is returned within a millisecond).
MIN_WAIT = 0.02
#: A map entry stays this long after its lock ended, so a late settle gets the
#: SDK's own lock-lost error, then it is dropped.
FORGET_AFTER = 1.0
#: Longest scheduled-enqueue delay and per-message TTL leasekit accepts.
MAX_SEND_DELAY = 30 * 86400.0
MAX_TTL = 10 * 365 * 86400.0
#: Tolerated difference between the lock_duration option and the broker's lock.
LOCK_SLACK = 1.0
#: Seconds past an open's deadline before its guard ends a connection still not
#: open (:class:`_OpenGuard`): the SDK's own deadline checks go first.
OPEN_GUARD_GRACE = 0.2
#: An emulator's management port (Microsoft's emulator serves HTTP on 5300).
DEFAULT_ADMIN_PORT = 5300
#: Seconds of empty receives, with nothing else heard from the service, after
#: which a receive probes the connection (a dead one returns empty receives too).
#: Shorter notices a partition sooner; each probe is one management request.
PROBE_AFTER = 2.0
#: Longest wait for the probe's answer: how long a partition may look like an
#: idle queue once a probe is due. Loopback answers in about a millisecond.
PROBE_TIMEOUT = 2.0
#: SDK receivers per queue by default (each its own connection and receive link);
#: see ``receive`` and docs/backends/azure_service_bus.md for what more cost and bring.
DEFAULT_RECEIVERS = 1
#: Most SDK receivers per queue: each is a connection, a socket and a keep-alive thread.
MAX_RECEIVERS = 16
#: The probe peeks from this sequence number: past any queue's end, so the
#: answer carries no message (Service Bus answers 204 No Content).
PROBE_SEQUENCE_NUMBER = 2**62

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,258}[A-Za-z0-9])?$")
_SECRET_OPTIONS = frozenset(
    {"connection_string", "credential", "shared_access_key", "shared_access_signature"}
)

#: Where Service Bus keeps the reason on a dead-lettered message (application
#: properties); shown as ``DeadLetter.reason``, not repeated in its properties.
_DEAD_LETTER_PROPERTIES = frozenset({"DeadLetterReason", "DeadLetterErrorDescription"})
