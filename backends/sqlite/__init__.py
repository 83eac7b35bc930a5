"""The embedded SQLite backend: leasekit's durable default, one file, no server.

URLs:
    ``sqlite:///orders.db?queue=orders`` (three slashes: a path relative to the
    working directory; four: absolute, ``sqlite:////var/lib/app/q.db?queue=jobs``).
    Keyword form: ``leasekit.open("sqlite", path="orders.db", queue="orders")``.
    Options: ``clock`` (keyword only), ``busy_timeout`` (s), ``synchronous``
    (``NORMAL`` or ``FULL``), ``max_message_size`` (bytes).

Delivery semantics:
    At least once. Several threads and several processes may lease from the same
    file at once: a receive is one write transaction, so a message is never
    handed to two holders. Each delivery gets a fresh receipt (``seq.token``),
    so a stale receipt is refused (``LeaseLost``); a receipt whose lease expired
    but whose message nobody re-leased still works. Renew keeps the receipt.
    Checkpoints are native: a column of the message's row (up to
    ``max_message_size`` bytes), written in the same statement as the renewal
    and only while the receipt is current; deleted with the message.
    Delivery order: by visibility time, then send order. Ordered groups
    (``send(..., group=...)``): a grouped row is eligible only while it is its
    group's oldest live row (the head) and visible, so a leased or abandoned head
    holds its group, comes back first, and one message per group goes per
    receive; the rule holds across processes, as a receive is one transaction.
    A receive scans the visible rows in delivery order, so a deep group whose
    head is leased costs a scan of its rows per poll. Dead letters go to a
    table in the same file. The file uses WAL; with ``synchronous=NORMAL`` (the
    default) a power loss can lose the last transactions but never corrupts the
    file, and a process crash loses nothing; ``FULL`` syncs every commit.

Limits:
    Leases 0.01 s – 30 days at millisecond resolution; 500 messages per receive,
    delete, renew and send call; bodies up to ``max_message_size`` (1 MiB by
    default). No native long poll: core polls with backoff (5–100 ms).
    ``Queue.stats()`` counts are exact (one read): visible, leased, delayed (sent
    with a delay, or abandoned with one), dead-lettered, and their total.

Raw types:
    ``lease.raw`` is ``None``. SDK errors are :class:`sqlite3.Error`.

Errors:
    Missing queue → ``QueueNotFound``; stale or malformed receipt, completed or
    TTL-expired message → ``LeaseLost``; ``database is locked`` beyond the busy
    timeout → ``BackendUnavailable`` (retried by core).
"""

from __future__ import annotations

from leasekit.hookspecs import hookimpl
from leasekit.registry import BackendSpec

from .dead_letters import SqliteDeadLetters
from .driver import SqliteDriver

__all__ = [
    "SqliteDeadLetters",
    "SqliteDriver",
    "leasekit_add_backends",
]


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``sqlite``."""
    return [
        BackendSpec(
            name="sqlite",
            driver="leasekit.backends.sqlite:SqliteDriver",
            description="durable queues in one SQLite file, safe across processes (the default)",
        )
    ]
