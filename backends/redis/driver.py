"""The Redis / Valkey Streams driver (see :mod:`leasekit.backends.redis` for the contract)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, ClassVar, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from leasekit import dead_letter_format as marks
from leasekit.capabilities import Capabilities
from leasekit.clock import to_datetime
from leasekit.deadline import call_timeout
from leasekit.errors import InvalidURL
from leasekit.options import as_float, as_int, as_text
from leasekit.redaction import install_log_redaction
from leasekit.spi import (
    CheckpointEntry,
    DeadLetter,
    Driver,
    DriverError,
    ErrorCode,
    OutgoingMessage,
    ParsedURL,
    QueueStats,
    RawMessage,
    Visibility,
    received,
)

from . import scripts

__all__ = ["CAPABILITIES", "RedisDeadLetters", "RedisDriver"]

T = TypeVar("T")
log = logging.getLogger("leasekit.backends.redis")

DAY = 24 * 3600.0
#: Per-call batch limit: one script runs a batch atomically and the server
#: serves nobody else meanwhile; renewing 500 fenced entries takes it 2–4 ms here.
BATCH = 500
#: The reclaim threshold (ms): an entry whose idle time reaches it is taken
#: back by the next receive. A lease of ``d`` sets the idle time to
#: ``THRESHOLD - d``, so the longest lease is the threshold itself.
THRESHOLD_MS = int(30 * DAY * 1000)
#: The consumer that holds abandoned messages until their delay ends (a name no
#: driver's own consumer has: those start with ``lk-``).
PARKED = "~abandoned"
#: The consumer group of every queue (and of its dead-letter stream).
GROUP = "leasekit"
#: Most delayed messages a receive moves into the stream, and most expired
#: ones it drops, per call: bounds one script's work after a backlog.
CHORES = 100
#: Socket timeouts (s) come in these steps: one client (and connection pool)
#: per step, so a call's timeout never needs a connection's timeout changed; a
#: call gets the largest step within its deadline (the smallest if none is).
TIMEOUT_STEPS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Longest a receive blocks (s) waiting for a send: a lapsed lease or an
#: abandoned message wakes nobody, so an idle receiver looks again this often
#: (4 script calls a second instead of core's 10-200 polls).
BLOCK_MAX = 0.25
#: A block ends this long (s) before the socket's timeout, so the reply beats it.
BLOCK_MARGIN = 0.05
#: Shorter blocks are not worth a round trip.
MIN_BLOCK = 0.01
#: Timeout (s) of a call core gave no deadline (admin calls).
DEFAULT_TIMEOUT = 30.0
#: Default connect timeout (s).
CONNECT_TIMEOUT = 5.0
#: Largest body Redis can hold in one string (512 MB).
MAX_STRING = 512 * 1024 * 1024
#: How often (ms) a receive whose batch new entries fill looks for lapsed leases
#: anyway (one that comes up short always looks): under load a lapsed lease is
#: back within this long, and a busy receive skips the pending-list scan.
RECLAIM_EVERY_MS = 100
#: A receipt: ``entry id/delivery count/consumer``.
_RECEIPT = re.compile(r"([0-9]{1,20}-[0-9]{1,20})/([0-9]{1,10})/(lk-[A-Za-z0-9_.-]{1,80})")
#: Receipts joined by newlines, checked in one match.
_RECEIPTS = re.compile(
    r"[0-9]{1,20}-[0-9]{1,20}/[0-9]{1,10}/lk-[A-Za-z0-9_.-]{1,80}"
    r"(?:\n[0-9]{1,20}-[0-9]{1,20}/[0-9]{1,10}/lk-[A-Za-z0-9_.-]{1,80})*"
)
#: Queue names: no braces (they would break the hash tag), no spaces or controls.
_QUEUE_NAME = re.compile(r"[^{}\s\x00-\x1f\x7f]{1,200}")
#: Errors a retry may cure (the server's own words, as the reply's first word).
_TRANSIENT = ("LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN", "NOREPLICAS")
#: Loggers of the SDK whose records are redacted.
SDK_LOGGERS = ("redis",)

#: The defaults (shown by ``leasekit backends``); ``max_message_size`` can change per queue.
CAPABILITIES = Capabilities(
    min_lease=0.01,
    max_lease=THRESHOLD_MS / 1000,
    lease_resolution=0.001,
    renew_rotates_receipt=False,
    detects_stale_receipts=True,
    expired_receipt_usable=True,
    max_receive_batch=BATCH,
    max_delete_batch=BATCH,
    max_renew_batch=BATCH,
    max_send_batch=BATCH,
    max_message_size=1024 * 1024,
    max_wait=1.0,
    max_abandon_delay=THRESHOLD_MS / 1000,
    max_send_delay=365 * DAY,
    max_ttl=3650 * DAY,
    ttl_ends_lease=True,
    supports_properties=True,
    native_dead_letter=True,
    delivery_count=True,
    queue_stats=True,
    counts=frozenset({"visible", "leased", "delayed", "dead_lettered"}),
    inspect_dead_letters=True,
    native_checkpoint=True,
    ordered=False,
)


def _lost(receipt: str) -> DriverError:
    return DriverError(
        ErrorCode.LEASE_LOST,
        f"receipt {receipt!r} is stale, or its message is settled or expired",
        backend_code="LeaseLost",
    )


def _parse(receipt: str) -> tuple[str, str, str] | None:
    """``(entry id, consumer, count)`` of a receipt; ``None`` if malformed (it reads as stale)."""
    match = _RECEIPT.fullmatch(receipt) if isinstance(receipt, str) else None
    if match is None:
        return None
    entry, count, owner = match.groups()
    return entry, owner, count


def _flag(value: bool | str, name: str) -> bool:
    """A yes/no option: a bool, or ``1``/``true``/``yes`` and ``0``/``false``/``no``."""
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no", ""):
        return False
    raise InvalidURL(f"redis: {name} must be 1 or 0 (true or false), got {value!r}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class _Server:
    """The connection settings, one client per timeout step, and what the server can do.

    Shared by a driver, its siblings and its dead-letter store; closed by the
    driver that made it.
    """

    def __init__(self, params: dict[str, Any], where: str, connect: float) -> None:
        self.params = params
        self.where = where
        self.connect = connect
        self._clients: dict[float, redis.Redis] = {}
        self._lock = threading.Lock()
        self._checked = False
        #: The server has XACKDEL (Redis >= 8.2, Valkey >= 9.2).
        self.ackdel = False
        self._shas: dict[str, str] = {}

    def client(self, timeout: float | None) -> redis.Redis:
        if timeout is None:
            timeout = DEFAULT_TIMEOUT
        step = TIMEOUT_STEPS[0]
        for candidate in TIMEOUT_STEPS:
            if candidate <= timeout:
                step = candidate
        client = self._clients.get(step)
        if client is None:
            with self._lock:
                client = self._clients.get(step)
                if client is None:
                    pool = redis.ConnectionPool(
                        **self.params,
                        socket_timeout=step,
                        socket_connect_timeout=min(step, self.connect),
                    )
                    client = redis.Redis(connection_pool=pool)
                    self._clients[step] = client
        return client

    def call(self, key: str, fn: Callable[[redis.Redis], T], timeout: float | None = None) -> T:
        """``fn(client)`` on the server that holds ``key``, within the call's deadline.

        A single server answering ``MOVED``/``ASK`` is a cluster node: refused
        with a hint (a cluster URL routes instead: :class:`.cluster.ClusterServer`).
        """
        client = self.client(call_timeout(DEFAULT_TIMEOUT) if timeout is None else timeout)
        try:
            return fn(client)
        except redis.exceptions.AskError as exc:  # MOVED too
            raise DriverError(
                ErrorCode.UNSUPPORTED,
                f"redis {self.where} is a Redis Cluster node that does not serve the key's "
                "slot: open the queue with ?cluster=1 (docs/backends/redis.md, Redis Cluster)",
                backend_code=_word(exc),
            ) from exc

    def run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run ``script`` on ``keys`` (one slot) within the call's deadline."""
        return self.call(keys[0], lambda client: self.eval(client, script, keys, args))

    def eval(
        self, client: redis.Redis, script: str, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        """EVALSHA; a server without the script loads it (``SCRIPT LOAD``) and runs it by sha.

        Not ``EVAL``: after a cluster's ``ASK`` only the next command is let in,
        and ``SCRIPT LOAD`` names no key, so the retried ``EVALSHA`` finds it.
        """
        self.check(client, keys[0])
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = hashlib.sha1(script.encode()).hexdigest()
        try:
            return client.evalsha(sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(script)
            return client.evalsha(sha, len(keys), *keys, *args)

    def check(self, client: redis.Redis, key: str) -> None:
        """On first use: warn if the server may evict keys, and see whether it has XACKDEL.

        ``key`` is a queue's stream (the probe names a key, so a cluster routes it).
        """
        if self._checked:
            return
        ackdel = client.eval(scripts.HAS_ACKDEL, 1, key, GROUP) == 1
        try:
            policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
        except redis.exceptions.ResponseError:  # CONFIG refused (a managed service): no check
            policy = None
        self.ackdel = ackdel
        self._checked = True
        if policy is not None and policy != "noeviction":
            log.warning(
                "redis %s: maxmemory-policy is %r, so the server may evict a queue's keys "
                "and lose messages; set it to noeviction (see docs/backends/redis.md)",
                self.where,
                policy,
            )

    @property
    def used(self) -> bool:
        """Whether any call was made (a client exists)."""
        return bool(self._clients)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.connection_pool.disconnect()
            client.close()


class RedisDriver(Driver):
    """Driver for one queue: a stream and its consumer group on a Redis or Valkey server.

    Parameters
    ----------
        queue: the queue name (no braces, spaces or control characters).
        host, port, db: the server (``localhost``, 6379, 0).
        username, password: credentials (keyword or URL; never shown).
        ssl: use TLS (``rediss://``).
        ssl_ca_certs: a CA file for TLS.
        prefix: the first part of every key (``leasekit``).
        max_message_size: the largest body in bytes.
        connect_timeout: seconds to wait for a connection.
        cluster: the server is a Redis Cluster node (the seed): route each queue's
            calls to the node serving its slot, following ``MOVED``/``ASK``.
    """

    scheme = "redis"
    capabilities = CAPABILITIES
    url_userinfo: ClassVar[bool] = True
    secret_options: ClassVar[frozenset[str]] = frozenset({"password"})
    credential_hint: ClassVar[str] = "pass password= as a keyword option"

    def __init__(
        self,
        queue: str,
        host: str = "localhost",
        port: int | str = 6379,
        db: int | str = 0,
        username: str | None = None,
        password: str | None = None,
        ssl: bool | str = False,
        ssl_ca_certs: str | None = None,
        prefix: str = "leasekit",
        max_message_size: int | str = 1024 * 1024,
        connect_timeout: float | str = CONNECT_TIMEOUT,
        cluster: bool | str = False,
        _server: _Server | None = None,
    ) -> None:
        if not isinstance(queue, str) or not queue:
            raise InvalidURL("redis: a queue name is required (?queue=NAME)")
        as_text(queue, "queue")
        if _QUEUE_NAME.fullmatch(queue) is None:
            raise InvalidURL(
                f"redis: queue name {queue!r} must be 1-200 characters without braces, "
                "spaces or control characters (a brace would break the key's hash tag)"
            )
        as_text(prefix, "prefix")
        if "{" in prefix or "}" in prefix:
            raise InvalidURL(f"redis: prefix {prefix!r} must not hold braces")
        size = as_int(max_message_size, "max_message_size", minimum=1, maximum=MAX_STRING)
        self.queue = queue
        self.prefix = prefix
        self.capabilities = CAPABILITIES.replace(max_message_size=size)
        base = f"{prefix}:{{{queue}}}"
        self._base = base
        self._keys = _keys(base, "")
        self._consumer = f"lk-{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(4)}"
        self._consumer = re.sub(r"[^A-Za-z0-9_.-]", "_", self._consumer)
        #: The fresh consumers this driver read new entries with (one per lease length).
        self._fresh: set[str] = set()
        self._owns_server = _server is None
        if _server is None:
            as_text(host, "host")
            number = as_int(port, "port", minimum=1, maximum=65535)
            database = as_int(db, "db", minimum=0, maximum=1 << 20)
            connect = as_float(connect_timeout, "connect_timeout", minimum=0.001, maximum=3600)
            use_ssl = _flag(ssl, "ssl")
            in_cluster = _flag(cluster, "cluster")
            if in_cluster and database != 0:
                raise InvalidURL(f"redis: a cluster has only database 0 (got db={database})")
            params: dict[str, Any] = {
                "host": host,
                "port": number,
                "db": database,
                "username": username,
                "password": password,
                "retry": Retry(NoBackoff(), 0),
            }
            if use_ssl:
                params["connection_class"] = redis.SSLConnection
                if ssl_ca_certs is not None:
                    params["ssl_ca_certs"] = as_text(ssl_ca_certs, "ssl_ca_certs")
            where = f"{'rediss' if use_ssl else 'redis'}://{host}:{number}/{database}"
            install_log_redaction(SDK_LOGGERS)
            if in_cluster:
                from .cluster import ClusterServer  # here: cluster.py subclasses _Server

                _server = ClusterServer(params, f"{where}?cluster=1", connect)
            else:
                _server = _Server(params, where, connect)
        self._server = _server

    @classmethod
    def options_from_url(cls, url: ParsedURL) -> dict[str, Any]:
        """``redis://user:pw@host:port/db?queue=q`` → host, port, db, username, password, ssl."""
        options: dict[str, Any] = dict(url.query)
        if url.host:
            options.setdefault("host", url.host)
        if url.port is not None:
            options.setdefault("port", url.port)
        path = url.path.strip("/")
        if path:
            if not path.isdigit():
                raise ValueError(
                    f"a redis URL's path is the database number (got {path!r}); "
                    "name the queue with ?queue=NAME"
                )
            options.setdefault("db", path)
        if url.username:
            options.setdefault("username", url.username)
        if url.password:
            options.setdefault("password", url.password)
        if url.scheme in ("rediss", "valkeys"):
            options.setdefault("ssl", True)
        return options

    def __repr__(self) -> str:
        return f"<RedisDriver {self._server.where} queue={self.queue!r}>"

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Append the messages (a delayed one to the delayed set) in one script."""
        args: list[Any] = [len(messages)]
        for m in messages:
            args += [
                _ms(m.delay),
                -1 if m.ttl is None else _ms(m.ttl),
                secrets.token_hex(12) if m.delay > 0 else "",
                m.body,
                json.dumps(dict(m.properties)) if m.properties else "",
            ]
        return [_text(i) for i in self._run(scripts.SEND, args)]

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """Take back lapsed leases, then read new entries; lease each for ``visibility``.

        With nothing to take and ``wait`` > 0: a blocking ``XREAD`` from the
        stream's last entry (outside the script: nothing is delivered by it)
        for at most :data:`BLOCK_MAX`, the time to the next delayed message and
        the call's deadline; a send wakes it, and the script runs once more.
        """
        rows = self._receive(max_messages, visibility)
        if isinstance(rows, list) or wait <= 0:
            return rows if isinstance(rows, list) else []
        last, _, due_in = rows.partition(" ")
        block = min(wait, BLOCK_MAX)
        if int(due_in) >= 0:
            block = min(block, int(due_in) / 1000)

        def wait_for_send(client: redis.Redis) -> bool:
            socket_timeout = client.connection_pool.connection_kwargs["socket_timeout"]
            most = min(block, socket_timeout - BLOCK_MARGIN)
            if most < MIN_BLOCK:
                return False
            return bool(client.xread({self._keys[0]: last}, count=1, block=round(most * 1000)))

        if not self._server.call(self._keys[0], wait_for_send):
            return []
        rows = self._receive(max_messages, visibility)
        return rows if isinstance(rows, list) else []

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """Set each held entry's idle time so its lease ends ``seconds`` from now."""
        until = to_datetime(time.time() + seconds)
        return self._fenced(
            scripts.RENEW,
            receipts,
            [THRESHOLD_MS - _ms(seconds)],
            lambda receipt: Visibility(receipt, until),
        )

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """Acknowledge and delete each held entry (and its checkpoint)."""
        flag = "1" if self._server.ackdel else "0"
        return self._fenced(scripts.COMPLETE, receipts, [flag], lambda receipt: None)

    # ------------------------------------------------------------------ admin

    def create_queue(self) -> None:
        """Create the stream and its group (and the dead-letter stream's); fine if they exist."""

        def create(client: redis.Redis) -> None:
            self._server.check(client, self._keys[0])
            for key in (self._keys[0], self._keys[6]):
                try:
                    client.xgroup_create(key, GROUP, id="0", mkstream=True)
                except redis.exceptions.ResponseError as exc:
                    if not str(exc).startswith("BUSYGROUP"):
                        raise

        self._server.call(self._keys[0], create)

    def delete_queue(self) -> None:
        """Delete every key of the queue (its messages, dead letters and checkpoints)."""
        keys = (*self._keys, *_keys(self._base, "dead-")[:6])
        self._server.call(self._keys[0], lambda client: client.delete(*keys))

    # --------------------------------------------------------------- messages

    def _run(self, script: str, args: Sequence[Any]) -> Any:
        return self._server.run(script, self._keys, args)

    def _receive(self, max_messages: int, visibility: float) -> list[RawMessage] | str:
        """The receive script: the messages, or (none) ``"last-id due-in-ms"``."""
        start = time.time()
        lease_ms = _ms(visibility)
        fresh = f"{self._consumer}.f{lease_ms}"
        self._fresh.add(fresh)
        reply: bytes | list[bytes] = self._run(
            scripts.RECEIVE,
            [
                GROUP,
                self._consumer,
                max_messages,
                THRESHOLD_MS - lease_ms,
                THRESHOLD_MS,
                CHORES,
                RECLAIM_EVERY_MS,
                fresh,
            ],
        )
        if isinstance(reply, bytes):  # b"!last-id due-in-ms": nothing to take
            return reply[1:].decode()
        until = to_datetime(start + visibility)
        owners = {"f": fresh, "b": self._consumer}
        return [self._message(row, until, owners[row[9]]) for row in _rows(reply)]

    def _message(self, row: _Row, until: datetime, owner: str) -> RawMessage:
        """One message from a row of the receive script's reply, held by ``owner``."""
        entry, count, message_id, sent, _dead_count, body, props, checkpoint, _reason, _ = row
        enqueued_ms = int(sent) if sent != "-" else int(entry.partition("-")[0])
        return received(
            entry if message_id == "-" else message_id,
            body,
            f"{entry}/{count}/{owner}",
            int(count),
            to_datetime(enqueued_ms / 1000),
            until,
            json.loads(props) if props else {},
            None,
            checkpoint,
            None,
        )

    def _fenced(
        self,
        script: str,
        receipts: Sequence[str],
        head: Sequence[Any],
        ok: Callable[[str], T],
    ) -> list[T | BaseException]:
        """Run a fenced script on the well-formed receipts (one text); ``ok(receipt)`` where done.

        A malformed receipt is lost without being sent; the batch's receipts go
        as one argument (one join and one regular-expression match when all are
        well formed), and the script answers one character per receipt sent.
        """
        try:
            text = "\n".join(receipts)
        except TypeError:
            text = ""
        if text.count("\n") == len(receipts) - 1 and _RECEIPTS.fullmatch(text) is not None:
            sent = receipts
        else:
            sent = [r for r in receipts if _parse(r) is not None]
            text = "\n".join(sent)
        flags = self._run(script, [GROUP, *head, text]) if sent else b""
        done = {r for r, flag in zip(sent, flags, strict=True) if flag == ord("1")}
        if len(done) == len(receipts):
            return [ok(r) for r in receipts]
        return [ok(r) if r in done else _lost(r) for r in receipts]

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        """Hand each held entry to the parked consumer, reclaimable after ``delay``."""
        return self._fenced(
            scripts.ABANDON, receipts, [PARKED, THRESHOLD_MS - _ms(delay)], lambda receipt: None
        )

    def checkpoint(
        self, entries: Sequence[CheckpointEntry], seconds: float
    ) -> list[Visibility | BaseException]:
        """Save each entry's data and renew its lease, fenced, in one script."""
        limit = self.capabilities.max_message_size
        until = to_datetime(time.time() + seconds)
        args: list[Any] = [GROUP, THRESHOLD_MS - _ms(seconds)]
        sent: list[bool] = []
        for entry in entries:
            p = _parse(entry.receipt)
            fits = len(entry.data) <= limit
            sent.append(p is not None and fits)
            if p is not None and fits:
                args += [*p, entry.data]
        done = iter(self._run(scripts.CHECKPOINT, args) if len(args) > 2 else [])
        results: list[Visibility | BaseException] = []
        for entry, went in zip(entries, sent, strict=True):
            if len(entry.data) > limit:
                results.append(
                    DriverError(
                        ErrorCode.TOO_LARGE,
                        f"a checkpoint of {len(entry.data)} bytes is over this queue's "
                        f"{limit}-byte limit",
                        backend_code="CheckpointTooLarge",
                    )
                )
            elif went and next(done) == 1:
                results.append(Visibility(entry.receipt, until))
            else:
                results.append(_lost(entry.receipt))
        return results

    def dead_letter(self, receipt: str, reason: str, message: RawMessage) -> None:
        """Move the held entry to the dead-letter stream with ``reason``, in one script."""
        p = _parse(receipt)
        if p is None or self._run(scripts.DEAD_LETTER, [GROUP, *p, reason]) != 1:
            raise _lost(receipt)

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        """The oldest ``limit`` dead letters, read without taking them."""

        def read(client: redis.Redis) -> Any:
            if client.type(self._keys[0]) != b"stream":
                return None
            return client.xrange(self._keys[6], count=limit)

        rows: list[Any] | None = self._server.call(self._keys[0], read)
        if rows is None:
            self._run(scripts.STATS, [GROUP, PARKED, THRESHOLD_MS])  # raises the typed error
        rows = rows or []
        return [_dead_letter(entry, dict(fields or {})) for entry, fields in rows]

    def dead_letter_store(self) -> RedisDeadLetters:
        """The dead-letter stream as a driver (leased and deleted like the queue), to re-drive."""
        store = RedisDeadLetters(queue=self.queue, prefix=self.prefix, _server=self._server)
        return store

    def stats(self) -> QueueStats:
        """Exact counts, from the stream, its pending list and the delayed set, in one script."""
        length, pending, lapsed, parked, parked_lapsed, delayed, dead = self._run(
            scripts.STATS, [GROUP, PARKED, THRESHOLD_MS]
        )
        held_parked = parked - parked_lapsed
        return QueueStats(
            visible=length - pending + lapsed,
            leased=pending - lapsed - held_parked,
            delayed=delayed + held_parked,
            dead_lettered=dead,
        )

    def sibling(self, queue: str) -> RedisDriver:
        """Another queue on the same server (sharing the connections)."""
        return RedisDriver(
            queue=queue,
            prefix=self.prefix,
            max_message_size=self.capabilities.max_message_size,
            _server=self._server,
        )

    # ----------------------------------------------------------------- errors

    def error_code(self, exc: BaseException) -> ErrorCode:
        """Classify redis-py's errors by type and by the reply's first word."""
        if _untrusted(exc):
            return ErrorCode.UNAUTHENTICATED
        if isinstance(
            exc, redis.exceptions.AuthenticationError | redis.exceptions.NoPermissionError
        ):
            return ErrorCode.UNAUTHENTICATED
        if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
            return ErrorCode.UNAVAILABLE
        if isinstance(exc, redis.exceptions.AskError):  # MOVED too: a cluster's redirection
            return ErrorCode.UNSUPPORTED  # (a cluster URL follows them: cluster.py)
        if isinstance(exc, redis.exceptions.ResponseError):
            word = _word(exc)
            if word in ("NOQUEUE", "NOGROUP"):
                return ErrorCode.QUEUE_NOT_FOUND
            if word == "WRONGTYPE":
                return ErrorCode.INVALID_ARGUMENT
            if word in ("NOAUTH", "WRONGPASS", "NOPERM"):
                return ErrorCode.UNAUTHENTICATED
            if word in ("READONLY", "OOM") or word in _TRANSIENT:
                return ErrorCode.UNAVAILABLE
        return super().error_code(exc)

    def backend_code(self, exc: BaseException) -> str | None:
        """The reply's first word (``NOGROUP``, ``READONLY``...) or the driver's own code."""
        if isinstance(exc, redis.exceptions.ResponseError):
            return _word(exc) or None
        return super().backend_code(exc)

    def is_retryable(self, exc: BaseException) -> bool:
        """A lost connection, a timeout or a busy / loading server is worth retrying."""
        if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
            return not isinstance(exc, redis.exceptions.AuthenticationError) and not _untrusted(exc)
        if isinstance(exc, redis.exceptions.ResponseError):
            return _word(exc) in _TRANSIENT
        # A cluster call redirected too often (resharding): cluster.py.
        return isinstance(exc, DriverError) and exc.code is ErrorCode.UNAVAILABLE

    def close(self) -> None:
        """Drop this driver's consumer from the group if it holds nothing; close connections."""
        if self._server.used:
            try:
                key, names = self._keys[0], (self._consumer, *self._fresh)
                self._server.call(
                    key, lambda client: client.eval(scripts.CLOSE, 1, key, GROUP, *names), 1.0
                )
            except (redis.exceptions.RedisError, DriverError):
                pass  # best effort: an empty consumer left behind costs a few bytes
        if self._owns_server:
            self._server.close()


class RedisDeadLetters(RedisDriver):
    """The dead letters of one queue, as a driver: receive leases, delete removes.

    What :meth:`RedisDriver.dead_letter_store` returns: the dead-letter stream
    with its own consumer group, leased and fenced exactly like the queue.
    Sending is refused.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._keys = _keys(self._base, "dead-")

    def __repr__(self) -> str:
        return f"<RedisDeadLetters {self._server.where} queue={self.queue!r}>"

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Refused: dead letters come from dead-lettering."""
        error = DriverError(ErrorCode.UNSUPPORTED, "redis: cannot send to a dead-letter store")
        return [error for _ in messages]

    def _message(self, row: _Row, until: datetime, owner: str) -> RawMessage:
        """A dead letter as a message: its own properties plus core's dead-letter marks."""
        message = super()._message(row, until, owner)
        entry, dead_count, reason = row[0], row[4], row[8]
        return received(
            message.id,
            message.body,
            message.receipt,
            message.delivery_count,
            to_datetime(int(entry.partition("-")[0]) / 1000),
            until,
            marks.marked(
                dict(message.properties),
                id=message.id,
                reason=reason,
                delivery_count=None if dead_count == "-" else int(dead_count),
            ),
        )

    def dead_letter(self, receipt: str, reason: str, message: RawMessage) -> None:
        """Refused: a dead letter has nowhere further to go."""
        raise DriverError(ErrorCode.UNSUPPORTED, "redis: a dead letter cannot be dead-lettered")


#: One message of the receive script's reply: entry id, delivery count, message
#: id and send time (``-``: the entry's own), a dead letter's delivery count
#: (``-``: none), body, properties, checkpoint and a dead letter's reason
#: (``None`` where missing), and who holds it (``f``: the fresh consumer, ``b``: the
#: driver's own).
_Row = tuple[str, str, str, str, str, bytes, bytes | None, bytes | None, str | None, str]


def _rows(reply: list[bytes]) -> list[_Row]:
    """The receive script's reply (see :data:`scripts.RECEIVE`) as rows."""
    words = reply[0].decode().split(" ")
    blob = reply[1]
    rows: list[_Row] = []
    pos = 0
    it = iter(words)
    for entry, count, mid, sent, dcount, nb, np, nc, nr, owner in zip(*[it] * 10, strict=True):
        end = pos + int(nb)
        body = blob[pos:end]
        pos = end
        if np == nc == nr == "-1":  # the common case: a body and nothing else
            rows.append((entry, count, mid, sent, dcount, body, None, None, None, owner))
            continue
        parts: list[bytes | None] = []
        for n in (np, nc, nr):
            size = int(n)
            if size < 0:
                parts.append(None)
            else:
                parts.append(blob[pos : pos + size])
                pos += size
        props, checkpoint, reason = parts
        rows.append(
            (
                entry,
                count,
                mid,
                sent,
                dcount,
                body,
                props,
                checkpoint,
                None if reason is None else reason.decode(),
                owner,
            )
        )
    return rows


def _keys(base: str, kind: str) -> tuple[str, ...]:
    """The seven keys of a queue (``kind=""``) or of its dead letters (``"dead-"``)."""
    names = ("messages", "delayed", "delayed-data", "checkpoints", "expiry", "cursor")
    return (*(f"{base}:{kind}{name}" for name in names), f"{base}:dead-messages")


def _dead_letter(entry: Any, fields: dict[Any, Any]) -> DeadLetter:
    """A dead-letter stream entry read back."""
    get = {_text(k): v for k, v in fields.items()}
    props = get.get("p")
    count = get.get("c")
    sent = get.get("r")
    return DeadLetter(
        id=_text(get.get("i", entry)),
        body=bytes(get.get("b", b"")),
        reason=None if sent is None else _text(sent),
        delivery_count=None if count is None else int(count),
        properties=json.loads(props) if props else {},
        enqueued_at=to_datetime(int(_text(entry).partition("-")[0]) / 1000),
    )


#: redis-py's classes for the error replies it strips the first word from.
_CLASS_WORDS: tuple[tuple[type[BaseException], str], ...] = (
    (redis.exceptions.ReadOnlyError, "READONLY"),
    (redis.exceptions.OutOfMemoryError, "OOM"),
    (redis.exceptions.BusyLoadingError, "LOADING"),
    (redis.exceptions.NoPermissionError, "NOPERM"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis.exceptions.MovedError, "MOVED"),
    (redis.exceptions.AskError, "ASK"),
)


def _untrusted(exc: BaseException) -> bool:
    """A TLS connection whose server certificate did not verify (retrying cannot help)."""
    if not isinstance(exc, redis.exceptions.ConnectionError):
        return False
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)


def _word(exc: BaseException) -> str:
    """The first word of a server error reply (a script's error keeps its reply's word)."""
    for cls, known in _CLASS_WORDS:
        if isinstance(exc, cls):
            return known
    text = str(exc)
    for word in (
        "NOQUEUE",
        "NOGROUP",
        "WRONGTYPE",
        "READONLY",
        "OOM",
        "NOAUTH",
        "WRONGPASS",
        "NOPERM",
        *_TRANSIENT,
    ):
        if text.startswith(word) or f" {word} " in text or f"-{word} " in text:
            return word
    return text.split(" ", 1)[0] if text else ""
