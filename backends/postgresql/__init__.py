"""The PostgreSQL backend: leased queues in the database people already run.

URLs:
    ``postgresql://[user@]host[:port]/dbname?queue=NAME`` (alias ``postgres://``).
    Every query parameter other than leasekit's own (``queue``, ``schema``,
    ``pool_size``, ``max_message_size``, ``prepared_statements``) is libpq's, so
    ``postgresql://postgres@/postgres?host=/run/pg&queue=jobs`` (a socket
    directory) and ``?sslmode=verify-full`` work. Keyword form:
    ``leasekit.open("postgresql", queue="jobs", dsn=os.environ["DATABASE_URL"])``,
    where ``dsn`` is any libpq connection string or URI, and any other keyword is
    a libpq parameter (``host=``, ``sslmode=``...). A password comes from the
    keyword ``password=``, the ``dsn``, libpq's environment (``PGPASSWORD``) or
    ``.pgpass``, or the URL's ``user:password@`` (percent-decoded as libpq does:
    ``%40`` for ``@``...); it never appears in a repr, an error, a log line or
    CLI output. libpq checks every parameter's value when the queue is opened,
    connecting nowhere (``sslmode=bogus`` is ``InvalidURL`` from ``open()``).
    ``schema`` (default ``leasekit``) names the schema that holds the tables;
    ``pool_size`` the most connections (default 10).

Delivery semantics:
    At least once, across any number of processes and machines. A receive takes
    messages with ``FOR UPDATE SKIP LOCKED`` (no two receivers wait on each other
    or get the same message) and makes one *lease batch* row holding the batch's
    expiry (expired batches are given back to the queue by receives, at most every
    100 ms and whenever a receive comes up short); each message points at its
    batch and carries its own random token, so a receipt (``seq.token``) is
    valid for that delivery only. Renewing every message of a batch rewrites one
    row, not one per message; renewing some of them moves those into a new
    batch (see ``docs/backends/postgresql.md``).
    Settling checks the token: a stale receipt is refused (``LeaseLost``) and
    changes nothing. A receipt whose lease expired but whose message nobody
    re-leased still works. Renew keeps the receipt. Delivery order: by
    visibility time, then send order. Ordered groups (``send(..., group=...)``,
    ``ordered=True``): a grouped row is eligible only while it is its group's
    oldest live row (the head) and visible, and the receive locks that head row,
    so a leased or abandoned head holds its group, comes back first, and one
    message per group goes per receive (``docs/ordering.md``). No deduplication
    (``deduplicates=False``). Dead letters go to a table of their own, with
    their group, and are re-driven from it (each leased in its row).
    Times are the server's clock.

Limits:
    Leases 0.01 s – 30 days at millisecond resolution; 500 messages per receive,
    delete, renew and send call; bodies up to ``max_message_size`` (1 MiB by
    default; PostgreSQL's own limit is 1 GB). No long poll: core polls with
    backoff (5–100 ms). ``Queue.stats()`` counts are exact: visible, leased,
    delayed, dead-lettered. Any PostgreSQL ≥ 13, no extension.

Raw types:
    ``lease.raw`` is ``None``. SDK errors are :class:`psycopg.Error` (and
    :class:`psycopg_pool.PoolTimeout`).

Errors:
    Missing queue, schema or database → ``QueueNotFound``; stale or malformed
    receipt, completed or TTL-expired message → ``LeaseLost``; a lost
    connection, a server restarting, a pool with no free connection in time, a
    serialization failure or deadlock → ``BackendUnavailable`` (retried by
    core); a refused password or role → ``AuthenticationFailed``; a value the
    server cannot store (class 22, a NUL) or a setting it refuses →
    ``InvalidArgument``. What no retry mends is never retried. After a cut, a
    waiting call has a connection made at once rather than waiting for the
    pool's reconnect schedule (see :meth:`_Shared._wait_for_one`). Every call
    is bounded by core's deadline: the server's ``statement_timeout`` and, for
    a hung network, the connection's socket being shut down when the deadline
    passes.
"""

from __future__ import annotations

from leasekit.hookspecs import hookimpl
from leasekit.registry import BackendSpec

from .dead_letters import PostgresqlDeadLetters
from .driver import PostgresqlDriver
from .schema import MIGRATIONS, SCHEMA_VERSION

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "PostgresqlDeadLetters",
    "PostgresqlDriver",
    "leasekit_add_backends",
]


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``postgresql`` and its alias ``postgres``."""
    driver = "leasekit.backends.postgresql:PostgresqlDriver"
    return [
        BackendSpec(
            name="postgres", driver=driver, extra="postgresql", description="alias of postgresql"
        ),
        BackendSpec(
            name="postgresql",
            driver=driver,
            extra="postgresql",
            description="queues in PostgreSQL ≥ 13 (SKIP LOCKED, batch-renewed leases), "
            "one machine or many",
        ),
    ]


#: The defaults (shown by ``leasekit backends``); ``max_message_size`` can change per queue.
