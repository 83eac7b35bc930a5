"""The Alibaba Cloud MNS backend, against leasekit's MNS emulator (``mns_server`` fixture).

The conformance suite covers the portable semantics; the tests here cover what
is MNS-specific: URLs and credentials, body and property encoding and their
interoperability with plain SDK producers and consumers, batch settlement with
per-handle errors, the client pool, and error classification (unit tests with
the SDK's own exception classes).
"""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from mns.account import Account
from mns.mns_exception import (
    MNSClientException,
    MNSClientNetworkException,
    MNSClientParameterException,
    MNSServerException,
)
from mns.queue import Message as SdkMessage

import leasekit
from leasekit import (
    AuthenticationFailed,
    BackendUnavailable,
    InvalidArgument,
    InvalidURL,
    LeaseLost,
    QueueNotFound,
)
from leasekit.backends.aliyun_mns import (
    MAX_BODY,
    AliyunMnsDriver,
    classify,
    decode_body,
    encode_body,
)
from leasekit.conformance import AsyncUrlHarness, ConformanceSuite, UrlHarness
from leasekit.emulators._process import free_port
from leasekit.queue import Queue
from leasekit.retry import RetryPolicy
from leasekit.spi import DriverError, ErrorCode, ParsedURL, QueueStats
from leasekit.url import parse_url

#: Options for a driver that is never used on the network.
DUMMY = {"endpoint": "http://127.0.0.1:1", "access_key_id": "i", "access_key_secret": "s"}

# --------------------------------------------------------------- conformance


class TestAliyunMnsConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, mns_server: Any) -> Iterator[UrlHarness]:
        harness = UrlHarness(
            "aliyun-mns",
            endpoint=mns_server.endpoint,
            access_key_id=mns_server.access_key_id,
            access_key_secret=mns_server.access_key_secret,
        )
        yield harness
        harness.close()


class TestAliyunMnsConformanceThroughAsyncio(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, mns_server: Any) -> Iterator[AsyncUrlHarness]:
        harness = AsyncUrlHarness(
            "aliyun-mns",
            endpoint=mns_server.endpoint,
            access_key_id=mns_server.access_key_id,
            access_key_secret=mns_server.access_key_secret,
        )
        yield harness
        harness.close()


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def options(mns_server: Any) -> dict[str, str]:
    return {
        "endpoint": mns_server.endpoint,
        "access_key_id": mns_server.access_key_id,
        "access_key_secret": mns_server.access_key_secret,
    }


@pytest.fixture
def queue(options: dict[str, str]) -> Iterator[Queue]:
    q = leasekit.open("aliyun-mns", queue=f"t-{uuid.uuid4().hex[:12]}", create=True, **options)
    try:
        yield q
    finally:
        q.delete_queue()
        q.close()


def sdk_queue(options: dict[str, str], name: str, *, encoding: bool = True) -> Any:
    account = Account(options["endpoint"], options["access_key_id"], options["access_key_secret"])
    q = account.get_queue(name)
    q.set_encoding(encoding)
    return q


# ---------------------------------------------------------------------- URLs


def test_url_form_names_endpoint_and_queue() -> None:
    opts = AliyunMnsDriver.options_from_url(parse_url("aliyun-mns://127.0.0.1:8080/jobs"))
    assert opts == {"endpoint": "http://127.0.0.1:8080", "queue": "jobs"}
    opts = AliyunMnsDriver.options_from_url(
        parse_url("aliyun-mns://123.mns.cn-hangzhou.aliyuncs.com/jobs?timeout=90")
    )
    assert opts == {
        "endpoint": "https://123.mns.cn-hangzhou.aliyuncs.com",
        "queue": "jobs",
        "timeout": "90",
    }
    opts = AliyunMnsDriver.options_from_url(parse_url("aliyun-mns://mns.internal:80/q?scheme=http"))
    assert opts["endpoint"] == "http://mns.internal:80"
    opts = AliyunMnsDriver.options_from_url(parse_url("aliyun-mns://[::1]:81/q"))
    assert opts["endpoint"] == "http://[::1]:81"


@pytest.mark.parametrize(
    "url",
    [
        "aliyun-mns://key:secret@127.0.0.1:8080/jobs",
        "aliyun-mns://127.0.0.1:8080/jobs?access_key_secret=s3cr3t",
        "aliyun-mns://127.0.0.1:8080/jobs?access_key_id=id",
        "aliyun-mns://127.0.0.1:8080/jobs?security_token=s3cr3t",
        "aliyun-mns://127.0.0.1:8080/jobs?scheme=ftp",
        "aliyun-mns://127.0.0.1:8080/a/b",
        "aliyun-mns://127.0.0.1:8080/",
        "aliyun-mns://127.0.0.1:8080/jobs?endpoint=http://x",
    ],
)
def test_bad_urls_are_refused_without_repeating_secrets(url: str) -> None:
    with pytest.raises(InvalidURL) as info:
        leasekit.open(url, access_key_id="id", access_key_secret="k")
    assert "s3cr3t" not in str(info.value)
    assert "secret@" not in str(info.value)


def test_url_opens_a_working_queue(mns_server: Any) -> None:
    port = mns_server.endpoint.rsplit(":", 1)[1]
    name = f"t-{uuid.uuid4().hex[:12]}"
    with leasekit.open(
        f"aliyun-mns://127.0.0.1:{port}/{name}?scheme=http",
        create=True,
        access_key_id=mns_server.access_key_id,
        access_key_secret=mns_server.access_key_secret,
    ) as q:
        q.send(b"via url")
        [lease] = q.lease(1, wait=5)
        assert lease.message.body == b"via url"
        lease.complete()
        q.delete_queue()


def test_credentials_come_from_the_environment(
    mns_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", mns_server.access_key_id)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", mns_server.access_key_secret)
    name = f"t-{uuid.uuid4().hex[:12]}"
    with leasekit.open("aliyun-mns", queue=name, endpoint=mns_server.endpoint, create=True) as q:
        q.send(b"env")
        q.delete_queue()


def test_missing_credentials_and_bad_options_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", raising=False)
    with pytest.raises(InvalidURL, match="no credentials"):
        leasekit.open("aliyun-mns", queue="q", endpoint="http://127.0.0.1:1")
    with pytest.raises(InvalidURL, match="endpoint"):
        leasekit.open("aliyun-mns", queue="q", access_key_id="i", access_key_secret="s")
    with pytest.raises(InvalidURL, match="option endpoint carries credentials") as info:
        leasekit.open(
            "aliyun-mns",
            queue="q",
            endpoint="http://user:s3cr3t@127.0.0.1:1",
            access_key_id="i",
            access_key_secret="s",
        )
    assert "s3cr3t" not in str(info.value)
    dummy = DUMMY
    with pytest.raises(InvalidURL, match="queue name"):
        leasekit.open("aliyun-mns", queue="bad_name", **dummy)
    for option in ("timeout", "read_timeout", "connect_timeout"):
        with pytest.raises(InvalidURL, match=option):
            leasekit.open("aliyun-mns", queue="q", **{option: 0}, **dummy)


def test_secrets_never_appear_in_repr_or_errors(options: dict[str, str]) -> None:
    wrong = {**options, "access_key_secret": "wrong-s3cr3t-value"}
    with leasekit.open("aliyun-mns", queue="nowhere", **wrong) as q:
        assert "s3cr3t" not in repr(q) + repr(q.driver)
        assert options["access_key_secret"] not in repr(q.driver)
        with pytest.raises(AuthenticationFailed) as info:
            q.send(b"x")
        assert info.value.backend_code == "SignatureDoesNotMatch"
        assert "s3cr3t" not in str(info.value)
        assert "s3cr3t" not in str(info.value.__cause__)


def test_unknown_access_key_is_authentication_failed(options: dict[str, str]) -> None:
    with leasekit.open("aliyun-mns", queue="q", **{**options, "access_key_id": "nobody"}) as q:
        with pytest.raises(AuthenticationFailed) as info:
            q.lease(1)
        assert info.value.backend_code == "InvalidAccessKeyId"


def test_unreachable_endpoint_is_backend_unavailable_after_retries() -> None:
    port = free_port()  # nothing listens there
    q = leasekit.open(
        "aliyun-mns",
        queue="q",
        endpoint=f"http://127.0.0.1:{port}",
        access_key_id="i",
        access_key_secret="s",
        retry=RetryPolicy(attempts=2, base=0.01, cap=0.01),
    )
    with q, pytest.raises(BackendUnavailable) as info:
        q.send(b"x")
    assert isinstance(info.value.__cause__, MNSClientNetworkException)


def test_import_leasekit_imports_no_sdk() -> None:
    code = (
        "import sys, leasekit; leasekit.default_registry().specs(); "
        "import leasekit.backends.aliyun_mns; "
        "print(sorted(m for m in sys.modules if m == 'mns' or m.startswith('mns.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------- bodies, properties


@pytest.mark.parametrize(
    "body", [b"", b"x", bytes(range(256)), "ünï".encode(), b"=", b"\xff" * MAX_BODY]
)
def test_body_encoding_round_trips(body: bytes) -> None:
    text = encode_body(body)
    assert text  # MNS refuses an empty body text
    assert len(text) <= 65536
    assert decode_body(text) == body


def test_foreign_plain_text_bodies_are_read_as_utf8() -> None:
    assert decode_body("héllo <not base64>") == "héllo <not base64>".encode()
    assert decode_body(b"already decoded") == b"already decoded"


def test_leasekit_and_sdk_default_producers_and_consumers_interoperate(
    queue: Queue, options: dict[str, str]
) -> None:
    plain = sdk_queue(options, queue.name)  # the SDK's default: base64 on
    queue.send(b"from leasekit \xff")
    queue.send(b"")
    got = [plain.receive_message(3) for _ in range(2)]
    assert sorted(m.message_body for m in got) == [b"", b"from leasekit \xff"]
    for m in got:
        plain.delete_message(m.receipt_handle)

    plain.send_message(SdkMessage("from the SDK ✓"))
    raw = sdk_queue(options, queue.name, encoding=False)
    raw.send_message(SdkMessage("plain text, encoding off"))
    leases = queue.lease(2, wait=5)
    while len(leases) < 2:
        leases += queue.lease(1, wait=5)
    assert sorted(lz.message.body for lz in leases) == sorted(
        ["from the SDK ✓".encode(), b"plain text, encoding off"]
    )
    for lz in leases:
        lz.complete()


def test_properties_with_control_characters_round_trip_as_binary(
    queue: Queue, options: dict[str, str]
) -> None:
    props = {"plain": "text ü", "crlf": "a\r\nb", "nul": "x\x00y", "tab": "\tz"}
    queue.send(b"p", properties=props)
    [lease] = queue.lease(1, wait=5)
    assert dict(lease.message.properties) == props
    native = lease.raw.get_user_properties()
    assert native["plain"].get_data_type() == "STRING"
    assert native["crlf"].get_data_type() == "BINARY"
    lease.complete()


def test_empty_property_value_is_refused_before_sending(queue: Queue) -> None:
    with pytest.raises(InvalidArgument, match="empty property value"):
        queue.send(b"p", properties={"k": ""})
    assert queue.lease(1, wait=0) == []


def test_maximum_body_is_49152_bytes(queue: Queue) -> None:
    assert queue.capabilities.max_message_size == 49152
    queue.send(b"\x00" * 49152)
    [lease] = queue.lease(1, wait=5)
    assert lease.message.body == b"\x00" * 49152
    lease.complete()


# ------------------------------------------------------- leasing semantics


def test_lease_of_the_queue_visibility_needs_no_visibility_change(queue: Queue) -> None:
    queue.send(b"a")
    calls: list[str] = []
    driver = queue.driver
    original = driver.change_visibility

    def counting(receipt: str, seconds: float) -> Any:
        calls.append("change_visibility")
        return original(receipt, seconds)

    driver.change_visibility = counting  # type: ignore[method-assign]
    [lease] = queue.lease(1, duration=30, wait=5)  # the queue's VisibilityTimeout
    assert calls == []
    receipt = lease.receipt
    queue.send(b"b")
    [other] = queue.lease(1, duration=90, wait=5)
    assert calls == ["change_visibility"]
    assert other.expires_at.timestamp() > time.time() + 80
    assert other.receipt != other.raw.receipt_handle  # rotated by the change
    lease.complete()
    other.complete()
    assert receipt


def test_abandon_makes_the_message_visible_after_one_second(queue: Queue) -> None:
    queue.send(b"back")
    [lease] = queue.lease(1, duration=60, wait=5)
    start = time.monotonic()
    lease.abandon()
    [again] = queue.lease(1, duration=60, wait=5)
    elapsed = time.monotonic() - start
    assert again.message.id == lease.message.id
    assert 0.5 <= elapsed < 4.5
    again.complete()


def test_batch_settle_reports_each_stale_handle(queue: Queue) -> None:
    queue.send_many([b"1", b"2", b"3"])
    leases = queue.lease(3, duration=60, wait=5)
    assert len(leases) == 3
    stale = leases[1]
    old_receipt = stale.receipt
    stale.renew()  # rotates the handle; give core the old one back
    stale._record.receipt = old_receipt
    results = queue.complete_many(leases)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], LeaseLost)
    assert results[1].backend_code == "MessageNotExist"
    assert stale.lost.is_set()
    # The renewed message is still held (by its new handle), the others are gone.
    assert queue.lease(1, duration=60, wait=1) == []


def test_delete_batch_of_a_missing_queue_raises_queue_not_found(queue: Queue) -> None:
    queue.send_many([b"1", b"2"])
    leases = queue.lease(2, duration=60, wait=5)
    while len(leases) < 2:
        leases += queue.lease(1, duration=60, wait=5)
    queue.driver.delete_queue()
    with pytest.raises(QueueNotFound):
        queue.complete_many(leases)


def test_long_poll_returns_when_a_message_arrives(queue: Queue) -> None:
    timer = threading.Timer(0.5, queue.send, args=(b"late",))
    start = time.monotonic()
    timer.start()
    try:
        [lease] = queue.lease(1, wait=10)
    finally:
        timer.join()
    assert time.monotonic() - start < 5
    lease.complete()


def test_threads_borrow_separate_connections(queue: Queue) -> None:
    queue.send_many([b"%d" % i for i in range(32)])
    got: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            while True:
                leases = queue.lease(4, duration=60, wait=1)
                if not leases:
                    return
                for lz in leases:
                    lz.complete()
                with lock:
                    got.extend(lz.message.id for lz in leases)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert len(got) == len(set(got)) == 32
    pool = queue.driver._clients  # type: ignore[attr-defined]
    assert 1 <= len(pool._idle) <= 6  # at most one client per concurrent caller


def test_pool_lends_a_client_to_one_caller_at_a_time(options: dict[str, str]) -> None:
    driver = AliyunMnsDriver(queue="q", **options)
    pool = driver._clients
    with pool.queue("a") as first, pool.queue("b") as second:
        assert first.mns_client is not second.mns_client  # both busy: two connections
        assert first.encoding is False and second.encoding is False
    with pool.queue("a") as again:
        assert again.mns_client in (first.mns_client, second.mns_client)  # reused
    assert len(pool._idle) == 2
    driver.close()
    assert pool._idle == []
    with pool.queue("a") as late:  # a call racing close() still works, then closes
        assert late.mns_client.http.conn is not None
    assert pool._idle == []


def test_poison_sibling_shares_the_connection_pool(queue: Queue) -> None:
    queue.send(b"poison")
    [lease] = queue.lease(1, wait=5)
    lease.dead_letter("bad input")
    poison = queue._dead_letters.target
    assert poison is not None
    assert poison._clients is queue.driver._clients  # type: ignore[attr-defined]
    [letter] = queue.peek_dead_letters()
    assert (letter.body, letter.reason, letter.delivery_count) == (b"poison", "bad input", 1)
    assert letter.id == lease.message.id


def test_stats_read_the_counts_without_the_sdks_deprecation_warnings(
    queue: Queue, options: dict[str, str]
) -> None:
    queue.send(b"now")
    queue.send(b"later", delay=60)
    queue.lease(1, duration=30, wait=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stats = queue.stats()
        assert [w for w in caught if issubclass(w.category, DeprecationWarning)] == []
        # What the driver avoids: the SDK's own accessor warns on each call.
        sdk_queue(options, queue.name).get_attributes()
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert stats == QueueStats(visible=0, leased=1, delayed=1, dead_lettered=0, total=2)


def test_send_options_ttl_is_unsupported(queue: Queue) -> None:
    with pytest.raises(leasekit.UnsupportedOperation):
        queue.send(b"x", ttl=60)


# ------------------------------------------------------- error classification


def server(code: str) -> MNSServerException:
    return MNSServerException(code, "message", "REQ", "http://host")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (server("MessageNotExist"), ErrorCode.LEASE_LOST),
        (server("ReceiptHandleError"), ErrorCode.LEASE_LOST),
        (server("QueueNotExist"), ErrorCode.QUEUE_NOT_FOUND),
        (server("QueueAlreadyExist"), ErrorCode.QUEUE_EXISTS),
        (server("SignatureDoesNotMatch"), ErrorCode.UNAUTHENTICATED),
        (server("AccessDenied"), ErrorCode.UNAUTHENTICATED),
        (server("InvalidAccessKeyId"), ErrorCode.UNAUTHENTICATED),
        (server("TimeExpired"), ErrorCode.UNAUTHENTICATED),
        (server("InternalError"), ErrorCode.UNAVAILABLE),
        (server("QpsLimitExceeded"), ErrorCode.UNAVAILABLE),
        (server("InvalidArgument"), ErrorCode.INVALID_ARGUMENT),
        (server("MalformedXML"), ErrorCode.INVALID_ARGUMENT),
        (server("SomethingNew"), ErrorCode.UNKNOWN),
        (MNSClientNetworkException("NetWorkException", "refused"), ErrorCode.UNAVAILABLE),
        (MNSClientNetworkException("RespDataDamaged", "<html>"), ErrorCode.UNAVAILABLE),
        (MNSClientParameterException("TypeInvalid", "bad"), ErrorCode.INVALID_ARGUMENT),
        (MNSClientException("InvalidPropertyValue", "bad"), ErrorCode.UNKNOWN),
        (DriverError(ErrorCode.LEASE_LOST, "x"), ErrorCode.LEASE_LOST),
        (ConnectionResetError(), ErrorCode.UNAVAILABLE),
        (ValueError("x"), ErrorCode.INVALID_ARGUMENT),
        (RuntimeError("x"), ErrorCode.UNKNOWN),
    ],
)
def test_error_classification(exc: BaseException, expected: ErrorCode) -> None:
    assert classify(exc) is expected


def test_backend_code_and_retryability() -> None:
    driver = AliyunMnsDriver(queue="q", **DUMMY)
    assert driver.backend_code(server("QueueNotExist")) == "QueueNotExist"
    assert driver.backend_code(RuntimeError()) is None
    assert driver.is_retryable(MNSClientNetworkException("NetWorkException", "x"))
    assert driver.is_retryable(server("InternalError"))
    assert not driver.is_retryable(server("MessageNotExist"))
    assert not driver.is_retryable(server("QueueNotExist"))
    driver.close()
    driver.close()  # idempotent


def test_missing_sdk_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mns.auth", None)
    with pytest.raises(leasekit.BackendNotInstalled, match=r"leasekit\[aliyun-mns\]"):
        AliyunMnsDriver(queue="q", **DUMMY)


def test_parsed_url_without_host_is_refused() -> None:
    with pytest.raises(InvalidURL):
        AliyunMnsDriver.options_from_url(
            ParsedURL(scheme="aliyun-mns", host="", port=None, path="/q", query={})
        )


def test_base64_helper_matches_the_sdk_encoding() -> None:
    assert encode_body(b"abc") == base64.b64encode(b"abc").decode()


def test_send_many_of_large_bodies_stays_within_the_batch_limit(queue: Queue) -> None:
    # BatchSendMessage takes 64 KiB of body text in all: four 30,000-byte bodies
    # (40,000 characters of base64 each) need four calls, and all arrive.
    bodies = [bytes([i]) * 30_000 for i in range(4)]
    ids = queue.send_many(bodies)
    assert len(set(ids)) == 4
    got: list[Any] = []
    while len(got) < 4:
        got += queue.lease(4, duration=60, wait=5)
    assert sorted(lz.message.body for lz in got) == sorted(bodies)
    assert queue.complete_many(got) == [None] * 4
