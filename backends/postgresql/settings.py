"""PostgreSQL backend settings: batch sizes, timeouts and option names, each with its reason."""

from __future__ import annotations

DAY = 24 * 3600.0
#: Per-call batch limit: one receive, renew, delete or send of this many is one
#: transaction of a few statements; larger ones hold row locks longer.
BATCH = 500
#: How often (seconds) a driver deletes messages whose time-to-live passed.
PURGE_EVERY = 5.0
#: Most expired lease batches one receive gives back to the queue: bounds the
#: receive's work after a crash left many batches behind (the rest follow).
REAP_LIMIT = 200
#: A receive gives expired lease batches back at most this often (seconds), and
#: whenever it finds fewer messages than asked for: under load, an expired
#: message is back within this long, and a receive is one statement, not two.
REAP_EVERY = 0.1
#: A connection between two calls waits in the driver's own idle list, not the
#: pool (a pool round costs more client CPU than the statements' own work at
#: small batches); after this many seconds out of the pool it is given back at
#: the end of its next call, so the pool's lifetime and idle rules still apply.
KEEP_FOR = 60.0
#: Default connect timeout given to libpq (whole seconds; libpq's floor is 2).
CONNECT_TIMEOUT = 5
#: Seconds the pool keeps retrying one failed connection before it gives up and
#: lets the next call that needs one start afresh (see ``_Shared.get``).
RECONNECT_TIMEOUT = 3.0
#: After a connection was found cut, a call waiting for one does not wait for the
#: pool's reconnect schedule (1 s, then 2 s...: a short cut's end would be noticed
#: up to 2 s late): it has a connection made for it at once, and again this many
#: seconds after each failed attempt, until its deadline. Shorter notices a cut's
#: end sooner; each attempt in a refusing network is one failed connect.
REDIAL_EVERY = 0.1
#: How often (seconds) a call waiting for such a connection also asks the pool
#: (which may have reconnected first).
DIAL_POLL = 0.02
#: A call waiting for the pool (all its connections in use) looks this often
#: (seconds) whether a cut was found meanwhile, to stop waiting on the pool's schedule.
WAIT_SLICE = 0.5
#: Loggers of the SDK whose records are redacted.
SDK_LOGGERS = ("psycopg", "psycopg.pool")
#: Server-side statement timeouts are set in these steps (ms) rather than to
#: the exact deadline, so a connection is re-``SET`` only when the step changes;
#: the exact deadline is kept on the client (the socket is shut down at it).
TIMEOUT_STEPS_MS = (250, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000, 300_000, 3_600_000)
#: Grace (seconds) after a call's deadline before its connection is cut: lets the
#: server's own statement_timeout answer first when the network is fine.
CUT_GRACE = 0.05
#: libpq options a URL or keyword may carry that are credentials.
SECRET_OPTIONS = frozenset({"password", "sslpassword", "dsn"})
#: leasekit's own options (the others are libpq's).
OWN_OPTIONS = ("queue", "schema", "pool_size", "max_message_size", "prepared_statements", "dsn")
