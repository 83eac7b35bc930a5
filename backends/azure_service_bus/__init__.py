"""The Azure Service Bus backend, on ``azure-servicebus`` (>= 7.15): queues, PeekLock.

URLs:
    ``azure-service-bus://NAMESPACE.servicebus.windows.net/QUEUE`` (a bare
    ``NAMESPACE`` gets ``.servicebus.windows.net`` added). Query options:
    ``lock_duration`` (seconds, see Limits), ``max_message_size``, ``max_wait``,
    ``retry_total``, ``sessions`` (``true`` for a ``RequiresSession`` queue: ordered
    groups, see :mod:`.azure_service_bus_sessions`), ``session`` (lease only this
    named session), ``read_timeout`` (seconds an
    operation may wait for the
    service's answer, default 10: the SDK's ``timeout`` and ``try_timeout``; a
    renewal is bounded tighter, by the time left on its lease), ``receivers``
    (receive links, default 1, at most 16; see Connections). The SDK opens
    connections with a fixed 1 s connect timeout. Credentials are keyword options
    only and are refused in a URL:
    ``connection_string=...`` (a namespace connection string, or one with
    ``EntityPath``) or ``credential=...`` (an ``azure-identity`` credential, an
    ``AzureNamedKeyCredential`` or ``AzureSasCredential``). Keyword form:
    ``leasekit.open("azure-service-bus", queue="orders", connection_string=...)``;
    with a connection string the namespace comes from its ``Endpoint``. The
    connection string never appears in a repr, a log line or an error message.
    Constructing the driver does no network I/O: one ``ServiceBusClient``, one
    sender and ``receivers`` PeekLock receivers (``prefetch_count=0``) are made on
    first use and reused; :meth:`ServiceBusDriver.close` closes them all, which
    stops the SDK's keep-alive threads and closes the sockets.

Delivery semantics:
    At least once. A lease is a PeekLock receive: the message is locked for the
    queue's **LockDuration**, a property of the entity that a receive cannot
    choose. So the capabilities declare ``fixed_lease`` (= ``min_lease`` =
    ``max_lease``): core refuses any other physical
    duration, and a longer hold is ``LeaseKeeper`` renewing the fixed lock in
    steps. The driver learns the LockDuration from the ``lock_duration`` option
    (default 60 s, the Service Bus default): capabilities must be known before
    the first call. A lease's expiry is always the broker's ``locked_until`` (also
    after renew), so a wrong option cannot make a lease look longer than it is;
    a first receive whose lock differs from the option by more than a second is
    logged as a warning. :meth:`ServiceBusDriver.create_queue` creates queues with
    that LockDuration, and refuses (real Service Bus) an existing queue whose
    LockDuration differs.

    The receipt is the lock token (a UUID string). Renew is ``renew_message_lock``
    (the token is unchanged, ``renew_rotates_receipt=False``); the keeper's batch
    renew sends several tokens in one ``com.microsoft:renew-lock`` management call
    (``max_renew_batch``), falling back to one call per token when one of them is
    lost, so each lease gets its own result. Complete, abandon and dead-letter are
    native settlements on the receive link that received the message (Service Bus
    settles a message only there), so the driver keeps a map lock token →
    (message, receiver) for the messages it holds; an entry leaves the map when it
    is settled or a second after its lock ended. A settle or renew of a token not
    in the map (completed, expired, or from another process) is ``LeaseLost``, and
    so is one of a message whose receiving connection is gone (a reset or a
    reconnect): Service Bus drops the locks of a broken connection, so such a
    message cannot be settled any more and comes back when its lock ends. An
    abandon cannot be delayed (``max_abandon_delay=0``): the message is available
    again at once, with its delivery count raised. ``delivery_count`` is 1 on first
    delivery: Service Bus sends the number of *failed* deliveries in the AMQP
    header and the Python SDK shows that raw value (0 first), so the driver adds 1
    (the .NET and Java SDKs do the same). An expired lock is not usable even if
    nobody re-received the message (the SDK refuses it before sending:
    ``expired_receipt_usable=False``). Stale tokens are refused by the service
    (``message-lock-lost``): ``detects_stale_receipts=True``.

    Dead-letter is native (``native_dead_letter=True``): the message moves to
    ``<queue>/$deadletterqueue`` with the reason as ``DeadLetterReason``; Service
    Bus also moves it there itself after the queue's ``MaxDeliveryCount``
    deliveries (reason ``MaxDeliveryCountExceeded``). ``peek_dead_letters`` peeks
    the sub-queue through a short-lived receiver (delivery counts unchanged).

    Time-to-live: Service Bus does not expire a message while it is locked, and
    renewing the lock past the TTL succeeds (documented: "the application might be
    in possession of a message that has expired"); the message expires once its
    lock ends. So, unlike DESIGN's rule 4, the TTL does not win over renew here.

    Two SDK behaviours worth knowing: (1) a receive that times out leaves its link
    credit outstanding, so a message sent afterwards is pushed to this idle
    receiver and locked to it; the SDK releases it (no delivery-count increase)
    when it next reads the socket outside a receive (its keep-alive, every 5 s), or
    the next receive returns it. A message returned after its lock already ended is
    dropped here (the service redelivers it). (2) The SDK takes concurrent calls on
    one handler (its own ``AutoLockRenewer`` renews from a thread pool), but it
    holds its socket lock through each blocking read, so calls side by side wait
    for each other's reads: the driver takes turns on each receiver's connection,
    one SDK call at a time, settles and renewals before receives, which is 9 to 23
    times faster under a Consumer (1 to 8 threads) than letting them overlap
    (measured in docs/benchmarks/azure_service_bus.md).

Connections:
    The SDK gives every receiver (and the sender) its own AMQP connection
    (``ServiceBusClient`` shares none), with one receive link and one management
    link on it; there is no public way to put two receive links on one
    connection, and they would share its socket lock anyway. With
    ``receivers=N`` the driver keeps N receivers, each made (and its connection
    opened) on the first receive that gets it: a receive takes the next receiver
    with no call in progress or waiting, round robin
    (``links``), so receives side by side run on different
    connections and the settles of one batch run on their receiver while the
    next receive runs on another. A message is settled and renewed only on the
    receiver that received it (each token's receiver is in the map above;
    renewals of several tokens go one ``renew-lock`` call per receiver). Each
    receiver probes its own connection (``PROBE_AFTER``), and a reset loses the
    locks of that connection only. Each extra receiver costs a connection, a
    socket, the SDK's keep-alive thread, a probe every ``PROBE_AFTER`` seconds
    while the queue is idle, and the first receive on it opens it; an idle
    receiver whose last receive left credit can hold a newly sent message until
    its next receive or the SDK's keep-alive release (at most 5 s), which more
    receivers make more likely on a quiet queue. What it brings is measured in
    docs/benchmarks.md ("Service Bus: several receive links").

    Creating and deleting queues: ``ServiceBusAdministrationClient`` (needs Manage
    rights), over HTTPS on Service Bus. With ``UseDevelopmentEmulator=true`` it is
    pointed at the emulator's HTTP port (option ``admin_port``, default 5300 as on
    Microsoft's emulator; leasekit's emulator serves the same API) and speaks plain
    HTTP (the Python SDK would use https).

Limits:
    Lease = the queue's LockDuration exactly (Service Bus allows 5 s – 5 min;
    leasekit's emulator also allows 1–4 s, for tests). 32 messages per receive
    (``MAX_RECEIVE``), 100 tokens per renew call (``MAX_RENEW``), 100 messages per
    send batch (split further by size), one settle per call. Bodies up to
    ``max_message_size`` (the entity's maximum message size, default 262144 bytes =
    Standard tier; Premium allows more) minus ``HEADER_ROOM`` (8192 bytes kept for
    the AMQP header and properties). Send delay (scheduled enqueue) up to 30 days,
    TTL up to 10 years (the queue's DefaultMessageTimeToLive caps it). Receives wait
    at most ``max_wait`` seconds per call (default 1; core loops for longer waits).

    Counts: ``Queue.stats()`` reads the queue's runtime properties through
    ``ServiceBusAdministrationClient.get_queue_runtime_properties`` (the management
    API, Manage rights; the emulator serves it too): ``ScheduledMessageCount`` as
    ``delayed``, ``DeadLetterMessageCount`` as ``dead_lettered``, and as ``total``
    ``MessageCount`` (every message of the entity) less the dead-letter and
    transfer sub-queues. ``visible`` and ``leased`` are ``None``: no API counts
    locked messages, and ``ActiveMessageCount`` ("ready for delivery", deferred
    ones included) is reported to count locked ones too (kedacore/keda#1214), so
    it cannot be split into the two. Microsoft calls reading the counters
    expensive for the broker: poll them at a measured pace.

Raw types:
    ``lease.raw`` is the SDK's ``azure.servicebus.ServiceBusReceivedMessage``; do
    not settle it yourself. SDK errors are ``azure.servicebus.exceptions.*``
    (subclasses of ``ServiceBusError``), ``azure.core.exceptions.*`` from the
    administration client, or :class:`leasekit.spi.DriverError` for a token the
    driver does not hold.

Errors:
    ``MessageLockLostError``, ``MessageAlreadySettled``, an unknown lock token, a
    settle on a receiver the SDK shut down → ``LeaseLost``;
    ``MessagingEntityNotFoundError`` (also a settle after the queue was deleted)
    → ``QueueNotFound``; ``ServiceBusAuthenticationError`` /
    ``ServiceBusAuthorizationError`` → ``AuthenticationFailed``;
    ``ServiceBusConnectionError``, ``ServiceBusCommunicationError``,
    ``OperationTimeoutError``, ``ServiceBusServerBusyError``,
    ``ServiceBusQuotaExceededError``, ``MessagingEntityDisabledError`` →
    ``BackendUnavailable``; ``MessageSizeExceededError`` → ``MessageTooLarge``.
    The SDK retries transient errors itself (``retry_total``), so core does not
    (``is_retryable`` is ``False``). The backend code kept on the leasekit error is
    the SDK error's class name (``MessageLockLostError``...).
"""

from __future__ import annotations

from leasekit.hookspecs import hookimpl
from leasekit.registry import BackendSpec

from .dead_letters import ServiceBusDeadLetters
from .driver import ServiceBusDriver
from .settings import HEADER_ROOM, MAX_RECEIVERS

__all__ = [
    "HEADER_ROOM",
    "MAX_RECEIVERS",
    "ServiceBusDeadLetters",
    "ServiceBusDriver",
    "leasekit_add_backends",
]


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``azure-service-bus``."""
    return [
        BackendSpec(
            name="azure-service-bus",
            driver="leasekit.backends.azure_service_bus:ServiceBusDriver",
            extra="azure-service-bus",
            description="Azure Service Bus queues (PeekLock, fixed lock renewed, native DLQ)",
        )
    ]
