"""Events: what a queue, its leases and the workers on it tell plugins.

A queue's :attr:`~leasekit.Queue.events` calls the ``leasekit_*`` event hooks
(``core/hookspecs.py``) of the registered plugins: lease events
(``leasekit_lease_acquired``, ``…_renewed``, ``…_completed``, ``…_lost``…) from
the queue and the keeper, worker events (``leasekit_before_process``,
``leasekit_after_process``, ``leasekit_worker_event``) from the Consumer.
Observers are called in registration order, ``after_`` hooks in reverse (like
middleware); an observer's error is logged, never raised into the work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

__all__ = ["Bracket", "Events"]

_log = logging.getLogger("leasekit")


class Events:
    """The event hooks of one plugin manager's relay (``registry.hook``), or none.

    Parameters
    ----------
        relay: pluggy's hook relay, or ``None`` for a queue without plugins.
    """

    __slots__ = ("_relay",)

    def __init__(self, relay: Any = None) -> None:
        self._relay = relay

    def observed(self, hook: str) -> bool:
        """Whether any plugin implements ``hook`` (so a caller can skip building its event)."""
        caller = getattr(self._relay, hook, None) if self._relay is not None else None
        return bool(caller is not None and caller.get_hookimpls())

    def bracket(
        self, name: str, after: Callable[[BaseException | None], Mapping[str, Any]], **before: Any
    ) -> Bracket:
        """The ``leasekit_before_<name>``/``leasekit_after_<name>`` pair around a ``with`` block.

        ``before`` is emitted on entry, the after event on exit, with the
        arguments ``after(error)`` gives plus ``error`` (the block's exception,
        or ``None``); neither is built when no plugin observes the pair.
        """
        return Bracket(self, name, after, before)

    def emit(self, hook: str, **kwargs: Any) -> None:
        """Call ``hook``'s observers with the arguments each accepts; log their errors."""
        if self._relay is None:
            return
        caller = getattr(self._relay, hook, None)
        if caller is None:
            return
        impls = caller.get_hookimpls()
        if not impls:
            return
        ordered = reversed(impls) if "_after_" in hook else impls
        for impl in ordered:
            try:
                impl.function(**{name: kwargs[name] for name in impl.argnames if name in kwargs})
            except Exception:
                _log.exception("leasekit plugin %r failed in %s", impl.plugin_name, hook)


class Bracket:
    """A ``before_``/``after_`` event pair around a ``with`` block (see :meth:`Events.bracket`)."""

    __slots__ = ("_after", "_after_hook", "_before", "_before_hook", "_events", "observed")

    def __init__(
        self,
        events: Events,
        name: str,
        after: Callable[[BaseException | None], Mapping[str, Any]],
        before: Mapping[str, Any],
    ) -> None:
        self._events = events
        self._before_hook = f"leasekit_before_{name}"
        self._after_hook = f"leasekit_after_{name}"
        self._before = before
        self._after = after
        #: Whether a plugin implements either hook (else nothing is emitted).
        self.observed = events.observed(self._before_hook) or events.observed(self._after_hook)

    def __enter__(self) -> Bracket:
        if self.observed:
            self._events.emit(self._before_hook, **self._before)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.observed:
            self._events.emit(self._after_hook, **self._after(exc), error=exc)
