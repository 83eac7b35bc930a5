"""The Service Bus driver's receive links: several SDK receivers per queue, and turns on each.

azure-servicebus (7.15, pyamqp) gives every ``ServiceBusReceiver`` its own AMQP
connection (``ServiceBusClient`` shares none: ``_connection_sharing`` is off), with
one receive link and one management link on it. The SDK holds a connection's
socket lock through each blocking read, so the calls of one receiver take turns
(:class:`Gate`), while calls on different receivers run side by side. A message
is settled on the receiver that received it (Service Bus settles a delivery only
on its own link, or by lock token over the management link of the same
connection), so the driver remembers each message's :class:`ReceiveLink`.

:class:`ReceiveLinks` hands a receive the next link with nothing in progress and
nothing waiting, round robin, so consecutive receives land on different links
and the settles of one batch run beside the next receive. A link's SDK receiver
is made (and its connection opened) on the first receive that gets the link.
Nothing here calls the SDK: the driver does.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from leasekit.deadline import DeadlineExceeded

__all__ = [
    "Gate",
    "ReceiveLink",
    "ReceiveLinks",
    "_Held",
]


class Gate:
    """Turns on one receiver's connection: one SDK call at a time, settles and renewals first.

    Not for safety: the SDK's handlers take concurrent calls (its own
    ``AutoLockRenewer`` renews from a thread pool, and the service accepts the
    management transfers that come out of order then). For speed: the SDK holds
    its socket lock through each blocking read, so calls running side by side
    wait for each other's reads to time out, call after call (a Consumer
    completed 175 msg/s with 1 thread and 61 with 8 that way, against 1,522 and
    1,405 taking turns; see docs/benchmarks/azure_service_bus.md). Here they
    never overlap: a receive takes a short turn only when no settle or renewal
    waits, and a waiting one goes next.

    A turn's end wakes one thread, not all: the next waiting settle or renewal
    if there is one, else one receive waiting on ``pool`` (the condition of the
    :class:`ReceiveLinks` this gate belongs to, where receives wait for any link).
    """

    def __init__(self, pool: threading.Condition | None = None) -> None:
        self._lock = threading.Lock()
        self._settles = threading.Condition(self._lock)
        self._receives = pool or threading.Condition()
        self._busy = False
        self._waiting = 0

    @contextlib.contextmanager
    def priority(self, timeout: float | None) -> Iterator[None]:
        """Hold the connection for a settle or renewal (waits for a receive's turn to end).

        Waits at most ``timeout`` seconds (``None``: as long as it takes), then
        raises :class:`~leasekit.deadline.DeadlineExceeded`: a call that cannot
        get the connection in time fails on time instead of queueing behind a
        hung one.
        """
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._waiting += 1
            try:
                # The state is checked before the time: a wait that timed out
                # just as the turn ended (and its wake-up came) still goes.
                while self._busy:
                    remaining = None if end is None else end - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise DeadlineExceeded(
                            "azure-service-bus: the connection stayed busy with another call "
                            f"for {timeout:.2f} s"
                        )
                    self._settles.wait(remaining)
            finally:
                self._waiting -= 1
            self._busy = True
        try:
            yield
        finally:
            self.end_turn()

    def try_turn(self) -> bool:
        """Take the connection for a receive turn if nothing is in progress or waiting."""
        with self._lock:
            if self._busy or self._waiting:
                return False
            self._busy = True
            return True

    def take_turn(self, timeout: float) -> bool:
        """Hold the connection for one receive turn; ``False`` if none came within ``timeout``.

        For a gate of its own (no :class:`ReceiveLinks`): receives of a pool wait
        in :meth:`ReceiveLinks.take_turn`.
        """
        deadline = time.monotonic() + timeout
        with self._receives:
            while not self.try_turn():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._receives.wait(remaining)
            return True

    def end_turn(self) -> None:
        """Give the connection back: the next settle or renewal goes, else a receive."""
        with self._lock:
            self._busy = False
            settles = self._waiting > 0
            if settles:
                self._settles.notify()
        if not settles:
            # Outside the gate's lock: a receive scanning the pool holds the
            # pool's condition, then each gate's lock, in that order.
            with self._receives:
                self._receives.notify()


@dataclass
class ReceiveLink:
    """One SDK receiver (made on first use), its turns, and when its connection last answered."""

    index: int
    gate: Gate = field(default_factory=Gate)
    receiver: Any = None
    #: When this receiver's connection last answered (monotonic): a receive
    #: probes a connection that has been silent for a while (the driver's PROBE_AFTER).
    heard: float = field(default_factory=time.monotonic)


class ReceiveLinks:
    """``count`` receive links; each receive takes the next free one, round robin."""

    def __init__(self, count: int) -> None:
        self._cond = threading.Condition()
        self.links = [ReceiveLink(index, Gate(self._cond)) for index in range(count)]
        self._next = 0

    def __len__(self) -> int:
        return len(self.links)

    def take_turn(self, timeout: float) -> ReceiveLink | None:
        """The next link with no call in progress or waiting, held for one receive turn.

        Round robin from the link after the last one taken, so consecutive receives
        use different links. Waits at most ``timeout`` seconds for one to come free
        (``None`` returned then); end the turn with ``link.gate.end_turn()``.
        """
        deadline = time.monotonic() + timeout
        count = len(self.links)
        with self._cond:
            while True:
                # Links are scanned before the time is checked: a wait that timed
                # out just as a link came free (and its wake-up came) still goes.
                for step in range(count):
                    link = self.links[(self._next + step) % count]
                    if link.gate.try_turn():
                        self._next = (link.index + 1) % count
                        return link
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    @contextlib.contextmanager
    def all_held(self) -> Iterator[list[ReceiveLink]]:
        """Every link's connection held at once (in index order), for close()."""
        with contextlib.ExitStack() as stack:
            for link in self.links:
                stack.enter_context(link.gate.priority(None))
            yield self.links


@dataclass
class _Held:
    """A message this driver holds the lock of, and the receiver that must settle it.

    ``handler`` is the receiver's AMQP client (its connection and link) the message
    came on: once the SDK replaced it (a reconnect), that connection is gone and
    Service Bus cannot settle the message any more (``ServiceBusDriver._check_connection``).
    """

    message: Any
    receiver: Any
    locked_until: float
    handler: Any = None
    #: The handler's AMQP connection when the message came (pyamqp replaces it
    #: inside the same handler when a management request meets a reset socket).
    connection: Any = None
    #: The receive link the message came on: its settles and renewals take turns there.
    link: ReceiveLink = field(default_factory=lambda: ReceiveLink(-1))
