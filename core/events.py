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
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from .hookspecs import LISTENING

__all__ = ["Events"]

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
        """Whether a plugin listens to ``hook`` now (so a caller can skip building its event).

        An observer marked with :func:`~leasekit.hookspecs.listens_when` counts
        only while its predicate is true.
        """
        caller = getattr(self._relay, hook, None) if self._relay is not None else None
        if caller is None:
            return False
        return any(_listening(impl) for impl in caller.get_hookimpls())

    def bracket(
        self, name: str, after: Callable[[BaseException | None], Mapping[str, Any]], **before: Any
    ) -> AbstractContextManager[None]:
        """The ``leasekit_before_<name>``/``leasekit_after_<name>`` pair around a ``with`` block.

        ``before`` is emitted on entry, the after event on exit, with the
        arguments ``after(error)`` gives plus ``error`` (the block's exception,
        or ``None``); nothing is emitted, and ``after`` not called, when no
        plugin observes the pair.
        """
        hooks = _PAIRS.get(name)
        if hooks is None:
            hooks = _PAIRS.setdefault(name, (f"leasekit_before_{name}", f"leasekit_after_{name}"))
        if not (self.observed(hooks[0]) or self.observed(hooks[1])):
            return _UNOBSERVED
        return _Bracket(self, hooks, after, before)

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
            if not _listening(impl):
                continue
            try:
                impl.function(**{name: kwargs[name] for name in impl.argnames if name in kwargs})
            except Exception:
                _log.exception("leasekit plugin %r failed in %s", impl.plugin_name, hook)


def _listening(impl: Any) -> bool:
    """Whether a hook implementation wants events now (see ``listens_when``)."""
    predicate = getattr(impl.function, LISTENING, None)
    return predicate is None or bool(predicate())


#: ``before_``/``after_`` hook names by event name (``"send"``: ``leasekit_before_send``...).
_PAIRS: dict[str, tuple[str, str]] = {}


class _Bracket:
    """An observed ``before_``/``after_`` event pair around a ``with`` block."""

    __slots__ = ("_after", "_before", "_events", "_hooks")

    def __init__(
        self,
        events: Events,
        hooks: tuple[str, str],
        after: Callable[[BaseException | None], Mapping[str, Any]],
        before: Mapping[str, Any],
    ) -> None:
        self._events = events
        self._hooks = hooks
        self._before = before
        self._after = after

    def __enter__(self) -> None:
        self._events.emit(self._hooks[0], **self._before)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._events.emit(self._hooks[1], **self._after(exc), error=exc)


class _Unobserved:
    """A pair no plugin observes: the ``with`` block runs, nothing is emitted."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


_UNOBSERVED = _Unobserved()
