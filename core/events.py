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

__all__ = ["Events", "count_changes"]

_log = logging.getLogger("leasekit")


#: Each counted hook relay and its change count (see :func:`count_changes`), by
#: ``id`` of the relay (pluggy's relay takes no attribute of ours and no weak
#: reference; the relay is kept so its ``id`` is never another's; a plugin
#: manager lives as long as its registry, usually the process).
_CHANGES: dict[int, tuple[Any, list[int]]] = {}


def count_changes(relay: Any) -> list[int]:
    """A new change count for a plugin manager's hook relay: a one-item list its manager bumps.

    The manager calls this once, when made, and increments ``[0]`` on every
    change of who implements what; :class:`Events` over that relay caches its
    listeners until the count moves.
    """
    box = [0]
    _CHANGES[id(relay)] = (relay, box)
    return box


class Events:
    """The event hooks of one plugin manager's relay (``registry.hook``), or none.

    Who implements each hook is looked up once and cached until the plugin
    manager changes (a registration counts, see ``registry._PluginManager``), so
    asking whether an event is observed costs a dictionary lookup; the
    predicates of observers marked with
    :func:`~leasekit.hookspecs.listens_when` are asked each time.

    Parameters
    ----------
        relay: pluggy's hook relay, or ``None`` for a queue without plugins.
    """

    __slots__ = ("_any", "_cache", "_changes", "_relay")

    def __init__(self, relay: Any = None) -> None:
        self._relay = relay
        #: The manager's change count (a one-item list), where it keeps one.
        counted = _CHANGES.get(id(relay)) if relay is not None else None
        self._changes: list[int] | None = counted[1] if counted else None
        self._cache: dict[str, _Listeners] = {}
        #: :meth:`observed_any`'s answers: (version, always, predicates) by hook set.
        self._any: dict[
            tuple[str, ...], tuple[int | None, bool, tuple[Callable[[], bool], ...]]
        ] = {}

    def _listeners(self, hook: str) -> _Listeners | None:
        """Who implements ``hook`` (cached while the plugin manager is unchanged)."""
        relay = self._relay
        if relay is None:
            return None
        changes = self._changes
        if changes is not None:
            cached = self._cache.get(hook)
            if cached is not None and cached.version == changes[0]:
                return cached
        caller = getattr(relay, hook, None)
        if caller is None:
            return None
        version = changes[0] if changes is not None else -1
        listeners = _Listeners(version, caller.get_hookimpls())
        if changes is not None:
            self._cache[hook] = listeners
        return listeners

    def observed(self, hook: str) -> bool:
        """Whether a plugin listens to ``hook`` now (so a caller can skip building its event).

        An observer marked with :func:`~leasekit.hookspecs.listens_when` counts
        only while its predicate is true.
        """
        listeners = self._listeners(hook)
        if listeners is None:
            return False
        if listeners.always:
            return True
        for predicate in listeners.predicates:  # noqa: SIM110 (a generator costs more per call)
            if predicate():
                return True
        return False

    def observed_any(self, hooks: tuple[str, ...]) -> bool:
        """Whether a plugin listens to any of ``hooks`` now (see :meth:`observed`).

        Who listens to the set is cached like one hook's listeners, and a
        ``listens_when`` predicate shared by several of them is asked once.
        """
        changes = self._changes
        version = changes[0] if changes is not None else None
        cached = self._any.get(hooks)
        if cached is None or version is None or cached[0] != version:
            always = False
            predicates: list[Callable[[], bool]] = []
            for hook in hooks:
                listeners = self._listeners(hook)
                if listeners is None:
                    continue
                always = always or listeners.always
                predicates.extend(p for p in listeners.predicates if p not in predicates)
            cached = (version, always, tuple(predicates))
            if version is not None:
                self._any[hooks] = cached
        if cached[1]:
            return True
        for predicate in cached[2]:  # noqa: SIM110 (a generator costs more per call)
            if predicate():
                return True
        return False

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
        listeners = self._listeners(hook)
        if listeners is None or not listeners.entries:
            return
        entries = listeners.entries
        ordered = reversed(entries) if "_after_" in hook else entries
        for impl, predicate in ordered:
            if predicate is not None and not predicate():
                continue
            try:
                impl.function(**{name: kwargs[name] for name in impl.argnames if name in kwargs})
            except Exception:
                _log.exception("leasekit plugin %r failed in %s", impl.plugin_name, hook)


class _Listeners:
    """The implementations of one hook at one version of the plugin manager."""

    __slots__ = ("always", "entries", "predicates", "version")

    def __init__(self, version: int, impls: list[Any]) -> None:
        self.version = version
        #: Each implementation with its ``listens_when`` predicate (``None``: always).
        self.entries = [(impl, getattr(impl.function, LISTENING, None)) for impl in impls]
        #: An implementation listens whatever happens (no ``listens_when``).
        self.always = any(predicate is None for _, predicate in self.entries)
        self.predicates = [predicate for _, predicate in self.entries if predicate is not None]


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
