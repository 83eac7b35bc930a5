"""leasekit: safe, portable leased queue messages.

One :class:`Queue` / :class:`Lease` API over every backend, opened by URL::

    import leasekit

    with leasekit.open("sqlite:///orders.db?queue=orders", create=True) as q:
        q.send(b"hello")
        for lease in q.lease(max_messages=10, duration=30, wait=5):
            handle(lease.message.body)
            lease.complete()

Errors are in :mod:`leasekit.errors` (all re-exported here); the backend SPI
for vendors is :mod:`leasekit.spi`.
"""

from __future__ import annotations

from .capabilities import Capabilities
from .checkpoints import CheckpointStore, MemoryCheckpointStore, SqliteCheckpointStore
from .clock import Clock, ManualClock, SystemClock
from .consumer import Consumer, ConsumerStats
from .duration_policy import AdaptiveLeaseDuration, FixedLeaseDuration, LeaseDurationPolicy
from .errors import (
    AuthenticationFailed,
    BackendError,
    BackendNotFound,
    BackendNotInstalled,
    BackendUnavailable,
    InvalidArgument,
    InvalidLeaseDuration,
    InvalidURL,
    LeaseError,
    LeaseLost,
    LeaseStateError,
    MessageTooLarge,
    QueueAlreadyExists,
    QueueEmpty,
    QueueNotFound,
    SendIncomplete,
    UnsupportedOperation,
)
from .health import Health, HealthLimits, HealthServer
from .hookspecs import hookimpl, listens_when
from .idempotency import IdempotencyStore, MemoryIdempotencyStore, SqliteIdempotencyStore
from .keeper import KeeperProgress, KeeperStats, LeaseKeeper
from .lease import Lease
from .message import LeaseState, Message
from .queue import Queue
from .registry import BackendRegistry, BackendSpec, default_registry, open
from .retry import RetryPolicy
from .spi import DeadLetter, QueueStats

__version__ = "0.1.0"

__all__ = [
    "AdaptiveLeaseDuration",
    "AuthenticationFailed",
    "BackendError",
    "BackendNotFound",
    "BackendNotInstalled",
    "BackendRegistry",
    "BackendSpec",
    "BackendUnavailable",
    "Capabilities",
    "CheckpointStore",
    "Clock",
    "Consumer",
    "ConsumerStats",
    "DeadLetter",
    "FixedLeaseDuration",
    "Health",
    "HealthLimits",
    "HealthServer",
    "IdempotencyStore",
    "InvalidArgument",
    "InvalidLeaseDuration",
    "InvalidURL",
    "KeeperProgress",
    "KeeperStats",
    "Lease",
    "LeaseDurationPolicy",
    "LeaseError",
    "LeaseKeeper",
    "LeaseLost",
    "LeaseState",
    "LeaseStateError",
    "ManualClock",
    "MemoryCheckpointStore",
    "MemoryIdempotencyStore",
    "Message",
    "MessageTooLarge",
    "Queue",
    "QueueAlreadyExists",
    "QueueEmpty",
    "QueueNotFound",
    "QueueStats",
    "RetryPolicy",
    "SendIncomplete",
    "SqliteCheckpointStore",
    "SqliteIdempotencyStore",
    "SystemClock",
    "UnsupportedOperation",
    "__version__",
    "default_registry",
    "hookimpl",
    "listens_when",
    "open",
]
