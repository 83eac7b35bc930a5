"""Log every lease and worker event (registered by default through ``leasekit.plugins``).

Logger ``leasekit.events``: acquired/completed/abandoned at DEBUG (those events
are built only while that level is enabled: ``listens_when``; renewals are not
logged: a keeper makes thousands a second; count them with a plugin instead),
dead-lettered and lost at WARNING, worker start/stop at INFO. Receipts are not
logged (they are capabilities to settle someone's message); message ids are.
"""

from __future__ import annotations

import logging
from typing import Any

from leasekit.errors import LeaseLost
from leasekit.hookspecs import hookimpl, listens_when
from leasekit.lease import Lease

log = logging.getLogger("leasekit.events")


def _debug() -> bool:
    """Whether debug lines are logged (else the per-lease events are not built for us)."""
    return log.isEnabledFor(logging.DEBUG)


@hookimpl
@listens_when(_debug)
def leasekit_lease_acquired(lease: Lease) -> None:
    """Log an acquired lease."""
    log.debug(
        "leased %s from %s (delivery %d, until %s)",
        lease.message.id,
        lease.queue.name,
        lease.message.delivery_count,
        lease.expires_at.isoformat(),
    )


@hookimpl
@listens_when(_debug)
def leasekit_lease_completed(lease: Lease) -> None:
    """Log a completion."""
    log.debug("completed %s", lease.message.id)


@hookimpl
@listens_when(_debug)
def leasekit_lease_abandoned(lease: Lease, delay: float) -> None:
    """Log an abandon."""
    log.debug("abandoned %s (visible again in %.1f s)", lease.message.id, delay)


@hookimpl
def leasekit_lease_dead_lettered(lease: Lease, reason: str) -> None:
    """Log a dead-lettered message."""
    log.warning("dead-lettered %s: %s", lease.message.id, reason)


@hookimpl
def leasekit_lease_lost(lease: Lease, error: LeaseLost) -> None:
    """Log a lost lease."""
    log.warning("lease on %s lost: %s", lease.message.id, error)


@hookimpl
def leasekit_worker_event(name: str, details: dict[str, Any]) -> None:
    """Log worker lifecycle events."""
    log.info("consumer %s: %s", name, details)
