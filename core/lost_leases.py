"""Leases a driver learns are lost without being asked: core marks them, at once.

Some backends tie a lease to the connection that received it: Service Bus drops
the locks (and releases the sessions) of an AMQP connection that is gone, so a
rival may be handed the message, or the whole session, while the holder's next
renewal is still seconds away. A driver that can tell (it watches its
connections) sets :attr:`Driver.reports_lost_leases <leasekit.spi.Driver.reports_lost_leases>`
and calls :attr:`Driver.leases_lost <leasekit.spi.Driver.leases_lost>` with the
receipts of those leases. The driver writes no lease state: this module finds
each receipt's lease and marks it lost through its record (the event,
``on_lost`` callbacks and the ``leasekit_lease_lost`` hook fire as for any loss),
so the holder learns of the loss when the driver does, not at its next renewal.

Only for such drivers: :func:`watch` (called with each receive's leases) does
nothing else for the others. Leases are held weakly, by the receipt they were
received with; a lease settled or lost already is left as it is.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import errors
from .error_mapping import wrap_error
from .message import LeaseState

if TYPE_CHECKING:
    from .lease import Lease
    from .spi import Driver

__all__ = ["LostLeases", "watch"]

_log = logging.getLogger("leasekit")


class LostLeases:
    """The leases of one driver by receipt, for the driver's reports of lost ones.

    Parameters
    ----------
        driver: the driver whose reports these are (its errors are classified by it).
    """

    def __init__(self, driver: Driver) -> None:
        self._driver = weakref.ref(driver)
        self._lock = threading.Lock()
        self._leases: weakref.WeakValueDictionary[str, Lease] = weakref.WeakValueDictionary()

    def add(self, leases: Sequence[Lease]) -> None:
        """Remember ``leases`` (weakly) by the receipt each was received with."""
        with self._lock:
            for lease in leases:
                self._leases[lease.receipt] = lease

    def report(self, receipts: Sequence[str], error: BaseException) -> None:
        """Mark the held leases of ``receipts`` lost, because of ``error`` (the driver's).

        Called by the driver from any thread; never raises. ``error`` is classified
        like any driver error; what is not a lost lease still loses it (the driver
        says so), as a :class:`~leasekit.LeaseLost` with ``error`` chained.
        """
        with self._lock:
            found = [(r, self._leases.pop(r, None)) for r in receipts]
        driver = self._driver()
        for receipt, lease in found:
            if lease is None or lease.state is not LeaseState.HELD or lease.receipt != receipt:
                continue
            doing = f"holding message {lease.message.id!r} on {lease.queue.name!r}"
            lost: errors.LeaseError = (
                wrap_error(driver, error, doing)
                if driver is not None
                else errors.LeaseLost(f"{doing} failed: {error}")
            )
            if not isinstance(lost, errors.LeaseLost):
                lost = errors.LeaseLost(f"{doing} failed: {error}", backend_code=lost.backend_code)
            lost.__cause__ = error
            try:
                lease._record.lose(lease, lost)
            except Exception:  # a report must not kill the driver's thread
                _log.exception("marking %r lost failed", lease)


def watch(leases: list[Lease]) -> list[Lease]:
    """Register a receive's ``leases`` where their driver reports lost leases; return them.

    One attribute read per receive for drivers that do not report.
    """
    if not leases:
        return leases
    driver = leases[0].queue.driver
    if not driver.reports_lost_leases:
        return leases
    registry = driver.leases_lost
    owner = getattr(registry, "__self__", None)
    if not isinstance(owner, LostLeases):
        owner = LostLeases(driver)
        driver.leases_lost = owner.report
    owner.add(leases)
    return leases
