"""Hook specifications for leasekit plugins (pluggy, project name ``leasekit``).

Plugins are found through two entry-point groups: ``leasekit.backends`` (backends)
and ``leasekit.plugins`` (observers, integrations). An entry point names a module
or object holding ``@leasekit.hookimpl`` functions. Implementations may accept
fewer arguments than a spec lists; call hooks with keyword arguments only.
Registration hooks return lazy strings, so discovery imports no SDK.

An observer that only sometimes wants an event (a logger below its level) says
so with :func:`listens_when`: while its predicate is false the event is not
built for it, and an event nobody listens to costs a check per batch, not a
call per message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .errors import LeaseLost
    from .lease import Lease
    from .queue import Queue
    from .registry import BackendSpec
    from .spi import OutgoingMessage

__all__ = ["LISTENING", "hookimpl", "hookspec", "listens_when"]

hookspec = pluggy.HookspecMarker("leasekit")
hookimpl = pluggy.HookimplMarker("leasekit")

#: The attribute :func:`listens_when` sets on an observer function.
LISTENING = "leasekit_listening"

F = TypeVar("F", bound=Callable[..., Any])


def listens_when(predicate: Callable[[], bool]) -> Callable[[F], F]:
    """Mark an event observer as listening only while ``predicate()`` is true.

    For observers that drop most events (``log.debug`` below the logger's
    level): core skips building per-lease events no observer listens to. The
    predicate is called once per batch of events and must be cheap::

        @hookimpl
        @listens_when(lambda: log.isEnabledFor(logging.DEBUG))
        def leasekit_lease_completed(lease): log.debug("completed %s", lease.message.id)
    """

    def mark(function: F) -> F:
        setattr(function, LISTENING, predicate)
        return function

    return mark


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
def leasekit_lease_renewed(lease: Lease, lateness: float | None) -> None:
    """Called after a lease was renewed (``lease.expires_at`` is the new expiry).

    ``lateness``: for a renewal made by a :class:`~leasekit.LeaseKeeper`, how many
    seconds after its planned point the renewal call started (queueing
    included); ``None`` for other renewals.
    """


@hookspec
def leasekit_lease_checkpointed(lease: Lease, size: int) -> None:
    """Called after a checkpoint of ``size`` bytes was saved for the lease's message.

    The lease was renewed by it too (``lease.expires_at`` is the new expiry).
    """


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
# Queue calls: before_/after_ pairs around one backend operation, emitted on the
# calling thread (observers; an exception here is logged, never raised). Core
# builds them only when some plugin implements one of the pair, and every
# before_ is followed by its after_, also when the call raises.
# -------------------------------------------------------------------------


@hookspec
def leasekit_before_send(
    queue: Queue, messages: Sequence[OutgoingMessage], properties: dict[str, str]
) -> None:
    """Called before ``Queue.send`` / ``send_many`` sends ``messages`` (already validated).

    ``properties`` is a fresh, empty dict that implementations may fill with
    string properties to add to every message of this call (trace context, e.g.
    W3C ``traceparent``). Core adds them only where the backend carries
    properties, never over a property the caller set, and only to a message
    that still passes the backend's limits with them: a message they would push
    over a size or count limit is sent without them. The caller's own mapping
    is never changed.
    """


@hookspec
def leasekit_after_send(
    queue: Queue,
    messages: Sequence[OutgoingMessage],
    results: Sequence[str | BaseException],
    error: BaseException | None,
) -> None:
    """Called after a send: per message (as sent) its id or its error; ``error`` if it raised."""


@hookspec
def leasekit_before_receive(queue: Queue, max_messages: int) -> None:
    """Called when ``Queue.lease`` starts (once per call, however many receives it makes)."""


@hookspec
def leasekit_after_receive(
    queue: Queue, leases: Sequence[Lease], error: BaseException | None
) -> None:
    """Called when ``Queue.lease`` returns ``leases`` (possibly none) or raises ``error``.

    Called after each lease's ``leasekit_lease_acquired``.
    """


@hookspec
def leasekit_before_settle(queue: Queue, leases: Sequence[Lease], action: str) -> None:
    """Called before ``leases`` are settled by ``action`` (complete, abandon, dead_letter)."""


@hookspec
def leasekit_after_settle(
    queue: Queue,
    leases: Sequence[Lease],
    action: str,
    results: Sequence[BaseException | None],
    error: BaseException | None,
) -> None:
    """Called after a settle: per lease ``None`` (settled) or its error; ``error`` if it raised.

    When the call raised, ``error`` is its exception and every lease it did not
    settle has ``error`` as its result.
    """


@hookspec
def leasekit_before_renew(queue: Queue, leases: Sequence[Lease]) -> None:
    """Called before ``leases`` are renewed (``Lease.renew``, ``renew_many``, a keeper)."""


@hookspec
def leasekit_after_renew(
    queue: Queue,
    leases: Sequence[Lease],
    results: Sequence[BaseException | None],
    error: BaseException | None,
) -> None:
    """Called after a renewal: per lease ``None`` (renewed, see ``lease.expires_at``) or its error.

    When the call raised, ``error`` is its exception and every lease it did not
    renew has ``error`` as its result.
    """


# -------------------------------------------------------------------------
# Worker events (Consumer): before_ hooks run in registration order, after_ in reverse
# -------------------------------------------------------------------------


@hookspec
def leasekit_before_handle(lease: Lease) -> None:
    """Called in the worker right before the handler is called on a message.

    With :func:`leasekit_after_handle` it brackets exactly the handler call, on
    the worker's thread (or task), and the pair always nests — the place for
    what must be current while the handler runs (a tracing span). Unlike the
    ``process`` pair, a plugin of this pair leaves the worker's batching alone.
    """


@hookspec
def leasekit_after_handle(lease: Lease, error: BaseException | None) -> None:
    """Called right after the handler returned (``error`` is ``None``) or raised (its exception).

    The message is not settled yet: settling follows, reported by the settle events.
    """


@hookspec
def leasekit_before_process(lease: Lease) -> None:
    """Called in the worker before the handler runs on a message."""


@hookspec
def leasekit_after_process(lease: Lease, error: BaseException | None, outcome: str) -> None:
    """Called after the handler ran and the lease was settled; ``outcome`` says how.

    Outcomes: ``completed``, ``stale`` (handled, but the receipt was stale on
    complete), ``abandoned`` (the handler raised; ``error`` is its exception),
    ``dead_lettered`` (poison), ``duplicate`` (idempotency store), ``lost``,
    ``error`` (settling failed), ``abandoned_at_shutdown``, and on the asyncio
    face ``cancelled_on_loss`` (the handler's task was cancelled because its
    lease was found lost; ``error`` is the ``LeaseLost``). On one worker thread
    the hooks nest: ``before(a)``, ``after(a)``, ``before(b)``, ...
    """


@hookspec
def leasekit_worker_event(name: str, details: dict[str, Any]) -> None:
    """Called for other worker events (``started``, ``stopping``, ``stopped``, ...)."""
