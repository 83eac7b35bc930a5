"""How the conformance suite gets fresh queues from a backend.

A vendor gives the suite a :class:`Harness`; most need nothing more than
:class:`UrlHarness`, which opens a fresh, uniquely named queue per test with
``leasekit.open(target, queue=NAME, create=True, **options)`` and deletes it
afterwards.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Callable
from typing import Any

import leasekit
from leasekit.queue import Queue
from leasekit.spi import Driver

__all__ = ["CountingDriver", "Harness", "UrlHarness"]


class Harness:
    """The vendor side of the suite: make queues, make a missing one, clean up.

    Subclasses implement :meth:`open_queue`; the rest has defaults.
    """

    def __init__(self) -> None:
        self._run = secrets.token_hex(3)
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._open: list[Queue] = []

    def queue_name(self) -> str:
        """A fresh queue name: lowercase letters, digits and hyphens, starting with a letter."""
        return f"lk-{self._run}-{next(self._counter)}"

    def open_queue(self, name: str, *, create: bool) -> Queue:
        """Open queue ``name`` (creating it if ``create``)."""
        raise NotImplementedError("Harness.open_queue must be implemented")

    def make_queue(self, test_name: str = "") -> Queue:
        """A new, empty queue for one test."""
        queue = self.open_queue(self.queue_name(), create=True)
        with self._lock:
            self._open.append(queue)
        return queue

    def make_missing_queue(self) -> Queue:
        """A queue object whose queue does not exist."""
        queue = self.open_queue(self.queue_name() + "-missing", create=False)
        with self._lock:
            self._open.append(queue)
        return queue

    def cleanup(self, queue: Queue) -> None:
        """Delete a queue made by :meth:`make_queue` and close it."""
        try:
            queue.delete_queue()
        finally:
            queue.close()
            with self._lock:
                if queue in self._open:
                    self._open.remove(queue)

    def short_lease(self, queue: Queue) -> float:
        """The lease the expiry tests use: the shortest the backend allows (within reason)."""
        caps = queue.capabilities
        if caps.fixed_lease is not None:
            return caps.fixed_lease
        # Sub-second backends get 0.25 s so the test can act inside the lease
        # on a loaded 2-core machine; network backends use their minimum.
        return max(caps.min_lease, 0.25)

    def long_lease(self, queue: Queue) -> float:
        """A lease long enough to outlast any single test step: 60 s within the backend's range."""
        caps = queue.capabilities
        if caps.fixed_lease is not None:
            return caps.fixed_lease
        return caps.clamp_lease(60.0)

    def close(self) -> None:
        """Close every queue still open."""
        with self._lock:
            queues, self._open = self._open, []
        for queue in queues:
            queue.close()


class UrlHarness(Harness):
    """A harness that opens queues with :func:`leasekit.open`.

    Parameters
    ----------
        target: a backend name (``"sqlite"``) or URL (``"sqlite:///x.db"``);
            the harness passes ``queue=NAME`` so a queue in the URL is replaced.
        opener: the function that opens queues (``leasekit.open`` by default).
        **options: backend options (credentials, paths).
    """

    def __init__(
        self, target: str, *, opener: Callable[..., Queue] | None = None, **options: Any
    ) -> None:
        super().__init__()
        self.target = target
        self.options = options
        self._opener = opener or leasekit.open

    def __repr__(self) -> str:
        return f"<UrlHarness {self.target!r}>"

    def open_queue(self, name: str, *, create: bool) -> Queue:
        """``leasekit.open(target, queue=name, create=create, **options)``."""
        return self._opener(self.target, queue=name, create=create, **self.options)


#: The driver methods that reach the backend (``validate`` and the error
#: classifiers make no call, by the SPI's contract).
BACKEND_CALLS = (
    "send",
    "receive",
    "change_visibility",
    "checkpoint",
    "delete",
    "abandon",
    "dead_letter",
    "dead_letter_queue",
    "dead_letters",
    "peek",
    "stats",
    "sibling",
    "create_queue",
    "delete_queue",
)


class CountingDriver:
    """Counts the backend calls made to a driver: a transparent proxy, or installed in place.

    The suite installs one on a queue's driver (:meth:`install`) to prove that
    bad input is refused before any backend call, and removes it after
    (:meth:`uninstall`); as a proxy (``CountingDriver(driver)``) it counts the
    calls made through it.
    """

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self.calls: list[str] = []
        self._installed: list[str] = []

    @classmethod
    def install(cls, driver: Driver) -> CountingDriver:
        """Count the backend calls ``driver`` gets from now on, until :meth:`uninstall`."""
        counter = cls(driver)
        for name in BACKEND_CALLS:
            original = getattr(driver, name, None)
            if original is not None:
                setattr(driver, name, counter._counted(name, original))
                counter._installed.append(name)
        return counter

    def uninstall(self) -> None:
        """Stop counting: the driver's own methods again."""
        for name in self._installed:
            delattr(self._driver, name)
        self._installed.clear()

    def _counted(self, name: str, value: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return value(*args, **kwargs)

        return counted

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._driver, name)
        if name in BACKEND_CALLS:
            return self._counted(name, value)
        return value
