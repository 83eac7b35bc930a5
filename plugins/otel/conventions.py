"""The names leasekit's telemetry uses: OpenTelemetry messaging conventions, and its own.

Attribute, span and metric names follow the OpenTelemetry semantic conventions
for messaging (spans and metrics, "Development" status, as of v1.3x: ``send``,
``receive``, ``process``, ``settle``; ``messaging.operation.name`` /
``messaging.operation.type``, ``messaging.client.*`` metrics). What only
leasekit knows (leases held, renewals, renewal lateness, ...) is named
``leasekit.*``. Importing this module imports no OpenTelemetry package.
"""

from __future__ import annotations

__all__ = [
    "DURATION_BUCKETS",
    "LATENESS_BUCKETS",
    "MESSAGING_SYSTEMS",
    "messaging_system",
]

# ------------------------------------------------------------------ attributes

MESSAGING_SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
OPERATION_NAME = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
BODY_SIZE = "messaging.message.body.size"
ERROR_TYPE = "error.type"
#: Service Bus's own delivery count and settlement (its conventions' names).
SERVICEBUS_DELIVERY_COUNT = "messaging.servicebus.message.delivery_count"
SERVICEBUS_DISPOSITION = "messaging.servicebus.disposition_status"
#: leasekit's own, on every backend.
DELIVERY_COUNT = "leasekit.message.delivery_count"
EXPIRES_AT = "leasekit.lease.expires_at"
LEASE_DURATION = "leasekit.lease.duration"

# ---------------------------------------------------------------- metric names

OPERATION_DURATION = "messaging.client.operation.duration"
PROCESS_DURATION = "messaging.process.duration"
SENT_MESSAGES = "messaging.client.sent.messages"
CONSUMED_MESSAGES = "messaging.client.consumed.messages"
LEASES_HELD = "leasekit.leases.held"
RENEWALS = "leasekit.lease.renewals"
RENEWAL_LATENESS = "leasekit.lease.renewal.lateness"
LEASES_LOST = "leasekit.leases.lost"
DEAD_LETTERED = "leasekit.messages.dead_lettered"
DUPLICATES_SUPPRESSED = "leasekit.messages.duplicates_suppressed"

#: The conventions' advice for ``messaging.*.duration`` histograms (seconds).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
#: Renewal lateness: a keeper on time is at 0; its own target is p99 <= 100 ms.
LATENESS_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# ---------------------------------------------------------- messaging.system

#: ``messaging.system`` per backend scheme. ``aws_sqs`` and ``servicebus`` are the
#: conventions' well-known values; the others are custom values (the
#: conventions allow one where no well-known value applies), documented in
#: ``docs/observability.md``. A third-party backend gets its scheme with ``-``
#: turned into ``_``.
MESSAGING_SYSTEMS: dict[str, str] = {
    "aliyun-mns": "alibaba_mns",
    "aws-sqs": "aws_sqs",
    "azure-service-bus": "servicebus",
    "azure-storage-queue": "azure_storage_queue",
    "memory": "memory",
    "postgresql": "postgresql",
    "sqlite": "sqlite",
}


def messaging_system(scheme: str) -> str:
    """The ``messaging.system`` value for a backend scheme."""
    return MESSAGING_SYSTEMS.get(scheme) or scheme.replace("-", "_")


def error_type(error: BaseException) -> str:
    """A low-cardinality ``error.type``: the exception's fully qualified class name."""
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
