"""The SQL the driver runs, one statement per operation (``{s}`` is the schema)."""

from __future__ import annotations

_QUEUE_ID = "(SELECT id FROM {s}.queues WHERE name = %(queue)s)"

#: Rows are inserted in the list's order (``ORDER BY r.n``), so ``seq`` is the
#: send order a group's messages are handed out in.
_SEND = (
    "INSERT INTO {s}.messages (queue_id, id, body, properties, enqueued_at, visible_at, "
    "discard_at, grp) "
    "SELECT q.id, r.id, r.body, r.props, now(), now() + make_interval(secs => r.delay), "
    "CASE WHEN r.ttl IS NULL THEN NULL ELSE now() + make_interval(secs => r.ttl) END, r.grp "
    "FROM {s}.queues q, unnest(%(ids)s::uuid[], %(bodies)s::bytea[], %(props)s::jsonb[], "
    "%(delays)s::float8[], %(ttls)s::float8[], %(groups)s::text[]) WITH ORDINALITY "
    "AS r(id, body, props, delay, ttl, grp, n) WHERE q.name = %(queue)s ORDER BY r.n"
)

#: Give the messages of expired lease batches back to the queue (visible since
#: their batch expired), deleting the batches; a renewal holding a batch's row
#: lock is skipped (and rechecked by the lock: a renewed batch is not expired).
_REAP = (
    "WITH expired AS (DELETE FROM {s}.leases WHERE id IN ("
    "SELECT id FROM {s}.leases WHERE queue_id = " + _QUEUE_ID + " AND expires_at <= now() "
    "ORDER BY expires_at LIMIT %(reap)s FOR UPDATE SKIP LOCKED) RETURNING id, expires_at) "
    "UPDATE {s}.messages m SET lease_id = NULL, visible_at = e.expires_at "
    "FROM expired e WHERE m.lease_id = e.id"
)

_PURGE = (
    "DELETE FROM {s}.messages WHERE queue_id = " + _QUEUE_ID + " AND discard_at IS NOT NULL "
    "AND discard_at <= now()"
)

#: One receive: pick visible messages (skipping rows other receivers hold),
#: make one lease batch for them, and point each at it with a fresh token.
#:
#: Ordered groups: a grouped row is picked only while it is its group's head —
#: no older live row (not past its TTL) of the group exists, leased or not — so
#: a leased or abandoned head holds its group and at most one row per group is
#: picked. The lock is taken on the head row itself: a receiver that finds the
#: head locked (another receive is taking it) skips it, and the group's next row
#: is not a head while that row exists; a head taken and committed meanwhile is
#: rechecked on its new version (``lease_id`` set) and dropped. A group moves
#: on only when its head row is deleted (completed, dead-lettered, purged) or
#: its TTL passed (then it can no longer be settled either).
_RECEIVE = (
    "WITH q AS " + _QUEUE_ID + ", "
    "picked AS (SELECT m.seq, m.visible_at AS was FROM {s}.messages m "
    "WHERE m.queue_id = (SELECT id FROM q) AND m.lease_id IS NULL AND m.visible_at <= now() "
    "AND (m.discard_at IS NULL OR m.discard_at > now()) "
    "AND (m.grp IS NULL OR NOT EXISTS (SELECT 1 FROM {s}.messages h "
    "WHERE h.queue_id = m.queue_id AND h.grp = m.grp AND h.seq < m.seq "
    "AND (h.discard_at IS NULL OR h.discard_at > now()))) "
    "ORDER BY m.visible_at, m.seq LIMIT %(limit)s FOR UPDATE OF m SKIP LOCKED), "
    "batch AS (INSERT INTO {s}.leases (queue_id, expires_at) "
    "SELECT (SELECT id FROM q), now() + make_interval(secs => %(seconds)s) "
    "WHERE EXISTS (SELECT 1 FROM picked) RETURNING id, expires_at), "
    "taken AS (UPDATE {s}.messages m SET lease_id = batch.id, visible_at = batch.expires_at, "
    "delivery_count = m.delivery_count + 1, "
    "token = floor(random() * 9007199254740991)::bigint + 1 "
    "FROM picked, batch WHERE m.seq = picked.seq "
    "RETURNING m.seq, m.id, m.body, m.properties, m.enqueued_at, m.delivery_count, m.token, "
    "batch.expires_at, picked.was, m.grp) "
    # In delivery order (visible since, then sent); the receipt made here, as text.
    "SELECT id::text, body, properties, enqueued_at, delivery_count, "
    "seq::text || '.' || token::text, expires_at, grp FROM taken ORDER BY was, seq"
)

_EXISTS = "SELECT 1 FROM {s}.queues WHERE name = %(queue)s"

#: The receipts of a call, given as one text parameter (``"seq.token,seq.token"``,
#: checked by :data:`_RECEIPTS` first) and split by the server: one parameter to
#: send instead of two arrays built and quoted element by element in Python.
_PAIRS = (
    "(SELECT split_part(x, '.', 1)::bigint AS seq, split_part(x, '.', 2)::bigint AS token "
    "FROM unnest(string_to_array(%(receipts)s, ',')) AS x) AS r"
)

#: Message numbers given as one text parameter (``"seq,seq"``), split by the server.
_SEQS = "string_to_array(%(seqs)s, ',')::bigint[]"

#: Lock the lease batches of the given messages, in id order (no deadlock between
#: two renewals): a receive's reaping skips them, a concurrent renewal waits.
_LOCK_BATCHES = (
    "SELECT l.id FROM {s}.leases l WHERE l.id IN ("
    "SELECT lease_id FROM {s}.messages WHERE seq = ANY(" + _SEQS + ")) "
    "ORDER BY l.id FOR UPDATE OF l"
)

#: After the lock: each message's token, batch, time-to-live, and how many
#: messages its batch holds (a batch renewed as a whole needs all of them).
_RENEW_STATE = (
    "WITH mine AS (SELECT seq, token, lease_id, "
    "(discard_at IS NOT NULL AND discard_at <= now()) AS dead FROM {s}.messages "
    "WHERE seq = ANY(" + _SEQS + ") AND queue_id = " + _QUEUE_ID + "), "
    "members AS (SELECT lease_id, count(*) AS n FROM {s}.messages "
    "WHERE lease_id IN (SELECT lease_id FROM mine) GROUP BY lease_id) "
    "SELECT mine.seq, mine.token, mine.lease_id, mine.dead, members.n "
    "FROM mine LEFT JOIN members USING (lease_id)"
)

_RENEW_BATCHES = (
    "UPDATE {s}.leases SET expires_at = now() + make_interval(secs => %(seconds)s) "
    "WHERE id = ANY(%(batches)s) RETURNING id, expires_at"
)

#: Some messages of a batch (or messages whose expired batch was given back and
#: nobody re-leased): a new batch for them, fenced by each token.
_RENEW_MOVE = (
    "WITH batch AS (INSERT INTO {s}.leases (queue_id, expires_at) "
    "SELECT " + _QUEUE_ID + ", now() + make_interval(secs => %(seconds)s) RETURNING id, "
    "expires_at) "
    "UPDATE {s}.messages m SET lease_id = batch.id, visible_at = batch.expires_at "
    "FROM batch, " + _PAIRS + " "
    "WHERE m.seq = r.seq AND m.token = r.token "
    "AND (m.discard_at IS NULL OR m.discard_at > now()) "
    "RETURNING m.seq, batch.expires_at"
)

_HELD = (
    "FROM " + _PAIRS + " "
    "WHERE m.seq = r.seq AND m.token = r.token AND m.queue_id = " + _QUEUE_ID + " "
    "AND (m.discard_at IS NULL OR m.discard_at > now())"
)

#: A settle answers with one row: how many it settled and, only when that is
#: fewer than it was given, which (``seq.token``: a stale receipt of a message
#: settled by its current one in the same call is told apart), so a full batch
#: decodes one number, not a row per message.
_SETTLED = (
    "SELECT count(*)::int, CASE WHEN count(*) < %(n)s "
    "THEN array_agg(seq::text || '.' || token::text) END FROM done"
)

_DELETE = (
    "WITH done AS (DELETE FROM {s}.messages m USING "
    + _HELD[5:]
    + " RETURNING m.seq, r.token) "
    + _SETTLED
)

_ABANDON = (
    "WITH done AS (UPDATE {s}.messages m SET lease_id = NULL, token = NULL, "
    "visible_at = now() + make_interval(secs => %(delay)s) "
    + _HELD
    + " RETURNING m.seq, r.token) "
    + _SETTLED
)

_DEAD_LETTER = (
    "WITH gone AS (DELETE FROM {s}.messages m USING " + _HELD[5:] + " "
    "RETURNING m.queue_id, m.id, m.body, m.properties, m.enqueued_at, m.delivery_count, "
    "m.grp) "
    "INSERT INTO {s}.dead_letters (queue_id, id, body, properties, enqueued_at, "
    "delivery_count, reason, grp) SELECT queue_id, id, body, properties, enqueued_at, "
    "delivery_count, %(reason)s, grp FROM gone RETURNING seq"
)

_DEAD_LETTERS = (
    "SELECT id, body, reason, delivery_count, properties, grp FROM {s}.dead_letters "
    "WHERE queue_id = " + _QUEUE_ID + " ORDER BY seq LIMIT %(limit)s"
)

#: Where a page of dead letters starts: the seq of the one the last page ended with.
_DEAD_LETTER_SEQ = (
    "SELECT min(seq) FROM {s}.dead_letters WHERE queue_id = " + _QUEUE_ID + " AND id = %(id)s"
)
#: The page after it, in the same order as ``_DEAD_LETTERS``.
_DEAD_LETTERS_AFTER = (
    "SELECT id, body, reason, delivery_count, properties, grp FROM {s}.dead_letters "
    "WHERE queue_id = " + _QUEUE_ID + " AND seq > %(seq)s ORDER BY seq LIMIT %(limit)s"
)

_PEEK = (
    "SELECT m.seq, m.id, m.body, m.properties, m.enqueued_at, m.delivery_count, m.visible_at "
    "FROM {s}.messages m LEFT JOIN {s}.leases l ON l.id = m.lease_id "
    "WHERE m.queue_id = " + _QUEUE_ID + " AND (m.discard_at IS NULL OR m.discard_at > now()) "
    "AND ((m.lease_id IS NULL AND m.visible_at <= now()) OR l.expires_at <= now()) "
    "ORDER BY m.visible_at, m.seq LIMIT %(limit)s"
)

_STATS = (
    "SELECT "
    "count(*) FILTER (WHERE (m.lease_id IS NULL AND m.visible_at <= now()) "
    "OR l.expires_at <= now()), "
    "count(*) FILTER (WHERE l.expires_at > now()), "
    "count(*) FILTER (WHERE m.lease_id IS NULL AND m.visible_at > now()), "
    "(SELECT count(*) FROM {s}.dead_letters d WHERE d.queue_id = q.id), "
    "extract(epoch FROM now() - min(m.enqueued_at)) "
    "FROM {s}.queues q LEFT JOIN {s}.messages m ON m.queue_id = q.id "
    "AND (m.discard_at IS NULL OR m.discard_at > now()) "
    "LEFT JOIN {s}.leases l ON l.id = m.lease_id "
    "WHERE q.name = %(queue)s GROUP BY q.id"
)


#: Lease up to ``limit`` free dead letters of the queue, oldest first: each gets a
#: new token (its receipt ``seq.token``) and is hidden until the lease ends.
_RECEIVE_DEAD = (
    "WITH picked AS (SELECT d.seq FROM {s}.dead_letters d WHERE d.queue_id = " + _QUEUE_ID + " "
    "AND (d.visible_at IS NULL OR d.visible_at <= now()) ORDER BY d.seq "
    "LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
    "UPDATE {s}.dead_letters d SET visible_at = now() + make_interval(secs => %(seconds)s), "
    "token = floor(random() * 9007199254740991)::bigint + 1 FROM picked WHERE d.seq = picked.seq "
    "RETURNING d.seq, d.id::text, d.body, d.properties, d.delivery_count, d.reason, "
    "d.dead_lettered_at, d.seq::text || '.' || d.token::text, d.visible_at, d.grp"
)

_HELD_DEAD = (
    "FROM " + _PAIRS + " WHERE d.seq = r.seq AND d.token = r.token AND d.queue_id = " + _QUEUE_ID
)

_RENEW_DEAD = (
    "UPDATE {s}.dead_letters d SET visible_at = now() + make_interval(secs => %(seconds)s) "
    + _HELD_DEAD
    + " RETURNING d.seq::text || '.' || d.token::text, d.visible_at"
)

_DELETE_DEAD = (
    "DELETE FROM {s}.dead_letters d USING "
    + _HELD_DEAD[5:]
    + " RETURNING d.seq::text || '.' || d.token::text"
)

_ABANDON_DEAD = (
    "UPDATE {s}.dead_letters d SET visible_at = now() + make_interval(secs => %(delay)s), "
    "token = NULL " + _HELD_DEAD + " RETURNING d.seq::text || '.' || r.token::text"
)
