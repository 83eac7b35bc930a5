"""The Redis / Valkey Streams backend: fenced, renewable leases where Python queues already are.

URLs:
    ``redis://[user[:password]@]host[:port][/db]?queue=NAME``, ``rediss://`` for
    TLS, and the aliases ``valkey://`` / ``valkeys://``; a Redis Cluster with
    ``?cluster=1`` (the host is any node: the seed; database 0 only). Keyword form:
    ``leasekit.open("redis", queue="jobs", host="localhost", port=6379, password=...)``.
    Options: ``db``, ``username``, ``password`` (never shown), ``prefix`` (of every
    key, default ``leasekit``), ``max_message_size`` (bytes), ``connect_timeout``
    (s), ``ssl_ca_certs`` (a CA file for ``rediss://``), ``cluster`` (``1``: the
    server is a cluster node).

Delivery semantics:
    At least once. One stream and one consumer group per queue; every key of a
    queue shares one ``{hash tag}`` (``leasekit:{jobs}:messages`` ...), so a
    cluster keeps it on one slot and each script touches one node. With
    ``cluster=1`` each call goes to the master serving the queue's slot (the map
    read with ``CLUSTER SLOTS``), following ``MOVED`` and ``ASK`` within the
    call's deadline (:mod:`.cluster`); without it a redirection is refused.
    A lease is the entry's idle time in the group's pending list: a receive
    reads new entries as a fresh consumer named for the lease
    (``consumer.fMS``), so their idle time is the lease with nothing set per
    entry; a renew, or a receive taking an entry back, sets it to
    ``threshold - duration`` (``XCLAIM ... IDLE ... JUSTID``, which counts no
    delivery) for the driver's own consumer. The next receive takes a lapsed
    entry back (``XAUTOCLAIM`` past the threshold; a fresh consumer's oldest
    entries past its MS), counting a delivery. A receipt names the entry, the consumer
    and the delivery count; every settling operation (renew, complete, abandon,
    dead-letter, checkpoint) is one Lua script per batch that checks both with
    ``XPENDING`` before it acts, so a stale receipt is refused (``LeaseLost``)
    and changes nothing — a bare ``XACK`` would not be refused. A receipt whose
    lease lapsed but whose message nobody took back still works. Delayed sends
    wait in a sorted set that receives move into the stream; a time-to-live is
    a second sorted set, checked by the fence and purged by receives. Checkpoints
    are native (a hash by entry id, written by the fenced script). Dead letters
    go, in one script, to a stream of their own with the reason and delivery
    count. No ordered groups (``ordered=False``). See ``docs/backends/redis.md``.

Limits:
    Leases 0.01 s – 30 days at millisecond resolution; 500 messages per receive,
    renew, delete and send call; bodies up to ``max_message_size`` (1 MiB by
    default; Redis's limit is 512 MB). Long poll: a receive that finds nothing
    blocks in ``XREAD`` (woken by a send) for at most 250 ms at a time.
    ``Queue.stats()`` counts are exact: visible, leased, delayed, dead-lettered.

Raw types:
    ``lease.raw`` is ``None``. SDK errors are :class:`redis.exceptions.RedisError`.

Errors:
    No stream or no group → ``QueueNotFound``; a key that is not a stream →
    ``InvalidArgument`` naming it; stale or malformed receipt, settled or
    expired message → ``LeaseLost``; lost connection, timeout, ``LOADING``,
    ``BUSY``, ``TRYAGAIN``, ``CLUSTERDOWN`` → ``BackendUnavailable`` (retried by
    core); ``MOVED``/``ASK`` without ``cluster=1`` → ``UnsupportedOperation``
    naming the option; ``cluster=1`` on a server that is not a cluster node →
    ``InvalidArgument``; a read-only replica (``READONLY``) or a full server
    (``OOM``) → ``BackendUnavailable``, not retried; a refused password →
    ``AuthenticationFailed``. A server whose
    ``maxmemory-policy`` evicts keys is logged as a warning on first use.
"""

from __future__ import annotations

from leasekit.hookspecs import hookimpl
from leasekit.registry import BackendSpec

__all__ = ["leasekit_add_backends"]

_DRIVER = "leasekit.backends.redis.driver:RedisDriver"


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``redis`` and ``rediss``, and ``valkey`` / ``valkeys`` as their aliases."""
    about = "Redis / Valkey Streams: fenced, renewable leases in Lua, one stream per queue"
    return [
        BackendSpec(name="redis", driver=_DRIVER, extra="redis", description=about),
        BackendSpec(name="rediss", driver=_DRIVER, extra="redis", description="redis over TLS"),
        BackendSpec(name="valkey", driver=_DRIVER, extra="redis", description="alias of redis"),
        BackendSpec(name="valkeys", driver=_DRIVER, extra="redis", description="alias of rediss"),
    ]
