"""Hook specifications for leasekit plugins (pluggy, project name ``leasekit``).

Plugins are found through two entry-point groups: ``leasekit.backends`` (backends)
and ``leasekit.plugins`` (observers, integrations). An entry point names a module
or object holding ``@leasekit.hookimpl`` functions. Implementations may accept
fewer arguments than a spec lists; call hooks with keyword arguments only.
Registration hooks return lazy strings, so discovery imports no SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .errors import LeaseLost
    from .lease import Lease
    from .registry import BackendSpec

__all__ = ["hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("leasekit")
hookimpl = pluggy.HookimplMarker("leasekit")


# -------------------------------------------------------------------------
# Registration hooks
# -------------------------------------------------------------------------


@hookspec
def leasekit_add_backends() -> list[BackendSpec]:  # type: ignore[empty-body]
    """Return the backends this plugin provides, as :class:`leasekit.BackendSpec` values.

    Each spec names its driver class as a ``"package.module:Class"`` string that
    is imported only when a queue of that scheme is opened.
    """


# -------------------------------------------------------------------------
# Lease events (observers: an exception here is logged, never raised)
# -------------------------------------------------------------------------


@hookspec
def leasekit_lease_acquired(lease: Lease) -> None:
    """Called after a message was leased."""


@hookspec
def leasekit_lease_renewed(lease: Lease) -> None:
    """Called after a lease was renewed (``lease.expires_at`` is the new expiry)."""


@hookspec
def leasekit_lease_lost(lease: Lease, error: LeaseLost) -> None:
    """Called once when a lease is found lost (stale or expired receipt)."""


@hookspec
def leasekit_lease_completed(lease: Lease) -> None:
    """Called after a lease was completed (the message deleted)."""


@hookspec
def leasekit_lease_abandoned(lease: Lease, delay: float) -> None:
    """Called after a lease was abandoned (visible again after ``delay`` seconds)."""


@hookspec
def leasekit_lease_dead_lettered(lease: Lease, reason: str) -> None:
    """Called after a lease was dead-lettered with ``reason``."""


# -------------------------------------------------------------------------
# Worker events (Consumer): before_ hooks run in registration order, after_ in reverse
# -------------------------------------------------------------------------


@hookspec
def leasekit_before_process(lease: Lease) -> None:
    """Called in the worker before the handler runs on a message."""


@hookspec
def leasekit_after_process(lease: Lease, error: BaseException | None, outcome: str) -> None:
    """Called after the handler ran and the lease was settled; ``outcome`` says how.

    Outcomes: ``completed``, ``stale`` (handled, but the receipt was stale on
    complete), ``abandoned`` (the handler raised; ``error`` is its exception),
    ``dead_lettered`` (poison), ``duplicate`` (idempotency store), ``lost``,
    ``error`` (settling failed), ``abandoned_at_shutdown``. On one worker thread
    the hooks nest: ``before(a)``, ``after(a)``, ``before(b)``, ...
    """


@hookspec
def leasekit_worker_event(name: str, details: dict[str, Any]) -> None:
    """Called for other worker events (``started``, ``stopping``, ``stopped``, ...)."""
