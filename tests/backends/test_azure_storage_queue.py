"""The Azure Storage Queue backend against Azurite (the real Microsoft emulator).

The conformance suite runs in full; the tests below it cover what is specific to
this backend: the message encoding and interop with other producers, URLs and
credential hygiene, the poison queue, and error classification (the last with
fake SDK errors where Azurite cannot produce the condition).
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from _fixtures.azurite import Azurite
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.queue import BinaryBase64DecodePolicy, BinaryBase64EncodePolicy, QueueClient

import leasekit
from leasekit.backends.azure_storage_queue import (
    MAX_BODY,
    MAX_TEXT,
    AzureStorageQueueDriver,
    decode_message,
    encode_message,
)
from leasekit.conformance import ConformanceSuite, UrlHarness
from leasekit.spi import DriverError, ErrorCode, ParsedURL

SCHEME = "azure-storage-queue"


class TestAzureStorageQueueConformance(ConformanceSuite):
    """The shared suite on Azurite."""

    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, azurite: Azurite) -> Iterator[UrlHarness]:
        harness = UrlHarness(SCHEME, connection_string=azurite.connection_string)
        yield harness
        harness.close()


# ----------------------------------------------------------------- fixtures


@pytest.fixture
def queue_name() -> str:
    return f"lk-az-{secrets.token_hex(4)}"


@pytest.fixture
def queue(azurite: Azurite, queue_name: str) -> Iterator[leasekit.Queue]:
    q = leasekit.open(
        SCHEME, queue=queue_name, connection_string=azurite.connection_string, create=True
    )
    try:
        yield q
    finally:
        q.delete_queue()
        q.close()


@pytest.fixture
def sdk(azurite: Azurite, queue_name: str) -> Iterator[QueueClient]:
    """A plain SDK client (no encoding policy) on the test's queue: another producer."""
    client = QueueClient.from_connection_string(azurite.connection_string, queue_name)
    yield client
    client.close()


# ------------------------------------------------------------ limits, sizes


def test_capabilities_state_the_service_limits(queue: leasekit.Queue) -> None:
    caps = queue.capabilities
    assert (caps.min_lease, caps.max_lease, caps.lease_resolution) == (1.0, 604800.0, 1.0)
    assert caps.max_receive_batch == 32
    assert (caps.max_delete_batch, caps.max_renew_batch, caps.max_send_batch) == (1, 1, 1)
    assert caps.renew_rotates_receipt and caps.detects_stale_receipts
    assert caps.expired_receipt_usable
    assert caps.max_abandon_delay == caps.max_send_delay == 604800.0
    assert caps.max_message_size == MAX_BODY == 49152
    assert caps.max_wait == 0.0  # no long poll
    assert not caps.native_dead_letter and caps.inspect_dead_letters


def test_exactly_the_maximum_body_is_sent_and_one_more_byte_is_what_the_service_refuses(
    queue: leasekit.Queue, sdk: QueueClient
) -> None:
    # The measurement behind max_message_size: 49,152 bytes fit; 49,153 do not,
    # and the service (not just core) says so.
    body = bytes(range(256)) * (MAX_BODY // 256)
    assert len(body) == MAX_BODY
    queue.send(body)
    [lease] = queue.lease(1, duration=30)
    assert lease.message.body == body
    lease.complete()
    with pytest.raises(HttpResponseError) as info:
        sdk.send_message(base64.b64encode(body + b"x").decode())
    assert info.value.status_code == 413
    with pytest.raises(leasekit.MessageTooLarge):
        queue.send(body + b"x")


def test_properties_that_push_the_encoding_over_64_kib_are_refused_before_sending(
    queue: leasekit.Queue,
) -> None:
    counting: list[str] = []
    original = queue.driver._client.send_message  # type: ignore[attr-defined]

    def spy(*args: Any, **kwargs: Any) -> Any:
        counting.append("send")
        return original(*args, **kwargs)

    queue.driver._client.send_message = spy  # type: ignore[attr-defined]
    with pytest.raises(leasekit.MessageTooLarge) as info:
        queue.send(b"x" * MAX_BODY, properties={"k": "v"})
    assert info.value.backend_code == "RequestBodyTooLarge"
    assert counting == []


def test_thirty_two_messages_come_in_one_receive(queue: leasekit.Queue) -> None:
    for i in range(33):
        queue.send(b"%d" % i)
    calls: list[int] = []
    driver = queue.driver
    original = driver.receive

    def spy(max_messages: int, visibility: float, wait: float) -> Any:
        calls.append(max_messages)
        return original(max_messages, visibility, wait)

    driver.receive = spy  # type: ignore[method-assign]
    leases = queue.lease(32, duration=30)
    assert len(leases) == 32
    assert calls == [32]
    for lease in leases:
        lease.complete()


def test_ttl_and_delay_reach_the_service(queue: leasekit.Queue, sdk: QueueClient) -> None:
    queue.send(b"t", ttl=3600.2, delay=1.5)
    assert queue.lease(1, duration=30) == []
    [peeked] = sdk.peek_messages() or [None]
    assert peeked is None  # delayed: not even peekable yet
    [lease] = queue.lease(1, duration=30, wait=10)
    raw = lease.raw
    assert round((raw.expires_on - raw.inserted_on).total_seconds()) == 3601
    lease.complete()


# ----------------------------------------------------------------- encoding


@pytest.mark.parametrize(
    ("body", "properties"),
    [
        (b"", {}),
        (b"\x00\xff", {}),
        (b"", {"a": "b"}),
        (b'\x00{"leasekit":1}', {"unicode": "ünï ☃", "ctl": "\x00\n<&>"}),
    ],
)
def test_encoding_round_trips(body: bytes, properties: dict[str, str]) -> None:
    text = encode_message(body, properties)
    assert text.isascii()
    assert decode_message(text) == (body, properties)


def test_plain_messages_are_standard_base64_and_envelopes_cannot_be_base64() -> None:
    assert encode_message(b"hello") == "aGVsbG8="
    assert encode_message(b"hello", {"k": "v"}).startswith("{")
    # no base64 alphabet character is "{"
    assert "{" not in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


@pytest.mark.parametrize(
    ("text", "body"),
    [
        ("hello world", b"hello world"),  # not base64 (space): the text itself
        ('{"order": 7}', b'{"order": 7}'),  # JSON from another producer
        ('{"leasekit":2,"body":""}', b'{"leasekit":2,"body":""}'),  # unknown envelope version
        (
            '{"leasekit":1,"properties":{},"body":"%%"}',
            b'{"leasekit":1,"properties":{},"body":"%%"}',
        ),
        ("héllo", "héllo".encode()),
        ("abc", b"abc"),  # bad padding
        ("aGVsbG8=", b"hello"),
        (None, b""),
    ],
)
def test_decoding_foreign_text(text: str | None, body: bytes) -> None:
    assert decode_message(text) == (body, {})


def test_messages_from_other_producers(queue: leasekit.Queue, sdk: QueueClient) -> None:
    sdk.send_message("plain text, not base64")
    sdk.send_message(base64.b64encode(b"\x01\x02 functions-style").decode())
    bodies = sorted(lease.message.body for lease in queue.lease(2, duration=30))
    assert bodies == [b"\x01\x02 functions-style", b"plain text, not base64"]


def test_base64_consumers_read_leasekit_messages(
    queue: leasekit.Queue, azurite: Azurite, queue_name: str
) -> None:
    queue.send(b"\xffbinary\x00")
    binary = QueueClient.from_connection_string(
        azurite.connection_string,
        queue_name,
        message_encode_policy=BinaryBase64EncodePolicy(),
        message_decode_policy=BinaryBase64DecodePolicy(),
    )
    with binary:
        [message] = binary.peek_messages()
        assert message.content == b"\xffbinary\x00"
        binary.send_message(b"\x00from the SDK\xff")
    bodies = {lease.message.body for lease in queue.lease(2, duration=30)}
    assert bodies == {b"\xffbinary\x00", b"\x00from the SDK\xff"}


# --------------------------------------------------------------- receipts


def test_receipt_is_message_id_and_pop_receipt(queue: leasekit.Queue) -> None:
    queue.send(b"r")
    [lease] = queue.lease(1, duration=30)
    message_id, _, pop = lease.receipt.partition(":")
    assert message_id == lease.message.id == lease.raw.id
    assert pop == lease.raw.pop_receipt
    lease.renew(5)
    assert lease.receipt.partition(":")[0] == message_id
    assert lease.receipt.partition(":")[2] != pop
    lease.complete()


def test_malformed_receipt_is_lease_lost() -> None:
    from leasekit.backends.azure_storage_queue import _receipt_parts

    with pytest.raises(DriverError) as info:
        _receipt_parts("no-separator")
    assert info.value.code is ErrorCode.LEASE_LOST


def test_abandon_sends_visibility_zero_explicitly(queue: leasekit.Queue) -> None:
    seen: list[Any] = []
    client = queue.driver._client  # type: ignore[attr-defined]
    original = client.update_message

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("visibility_timeout"))
        return original(*args, **kwargs)

    client.update_message = spy
    queue.send(b"a")
    [lease] = queue.lease(1, duration=60)
    lease.abandon()
    assert seen == [0]
    [again] = queue.lease(1, duration=60, wait=5)
    again.abandon(delay=2.2)
    assert seen == [0, 3]  # delays round up to whole seconds
    assert queue.lease(1, duration=60) == []


# ---------------------------------------------------------------- poison


def test_dead_letter_goes_to_the_poison_queue_with_reason_and_properties(
    queue: leasekit.Queue, azurite: Azurite, queue_name: str
) -> None:
    message_id = queue.send(b"bad", properties={"tenant": "t1"})
    [lease] = queue.lease(1, duration=30)
    lease.dead_letter("cannot parse")
    poison = QueueClient.from_connection_string(azurite.connection_string, queue_name + "-poison")
    with poison:
        [raw] = poison.peek_messages()
        body, properties = decode_message(raw.content)
    assert body == b"bad"
    assert properties == {
        "tenant": "t1",
        "leasekit-dead-letter-reason": "cannot parse",
        "leasekit-original-id": message_id,
        "leasekit-delivery-count": "1",
    }
    [letter] = queue.peek_dead_letters()
    assert (letter.id, letter.body, letter.reason, letter.delivery_count) == (
        message_id,
        b"bad",
        "cannot parse",
        1,
    )
    assert letter.properties == {"tenant": "t1"}


def test_poison_messages_from_azure_functions_are_readable(
    queue: leasekit.Queue, azurite: Azurite, queue_name: str
) -> None:
    # Functions moves a poison message to <queue>-poison as it is.
    poison = QueueClient.from_connection_string(azurite.connection_string, queue_name + "-poison")
    with poison:
        poison.create_queue()
        sent = poison.send_message(base64.b64encode(b"from functions").decode())
    letters = queue.peek_dead_letters(100)  # more than 32: capped, not an error
    assert [(x.id, x.body, x.reason, x.delivery_count) for x in letters] == [
        (sent.id, b"from functions", None, None)
    ]


def test_deleting_the_queue_deletes_its_poison_queue(azurite: Azurite, queue_name: str) -> None:
    q = leasekit.open(
        SCHEME, queue=queue_name, connection_string=azurite.connection_string, create=True
    )
    with q:
        q.send(b"p")
        q.lease(1, duration=30)[0].dead_letter("x")
        q.delete_queue()
    poison = QueueClient.from_connection_string(azurite.connection_string, queue_name + "-poison")
    with poison, pytest.raises(ResourceNotFoundError):
        poison.get_queue_properties()


# ------------------------------------------------------------ URLs, options


def _parsed(url: str) -> ParsedURL:
    from leasekit.url import parse_url

    return parse_url(url)


@pytest.mark.parametrize(
    ("url", "account_url", "queue"),
    [
        ("azure-storage-queue://myacct/jobs", "https://myacct.queue.core.windows.net", "jobs"),
        (
            "azure-storage-queue://127.0.0.1:10001/devstoreaccount1/jobs",
            "http://127.0.0.1:10001/devstoreaccount1",
            "jobs",
        ),
        (
            "azure-storage-queue://localhost:10001/devstoreaccount1/jobs",
            "http://localhost:10001/devstoreaccount1",
            "jobs",
        ),
        (
            "azure-storage-queue://myacct.queue.core.windows.net/jobs",
            "https://myacct.queue.core.windows.net",
            "jobs",
        ),
        (
            "azure-storage-queue://10.0.0.5:8080/acct/jobs?protocol=http",
            "http://10.0.0.5:8080/acct",
            "jobs",
        ),
        (
            "azure-storage-queue://127.0.0.1:10001/acct/jobs?protocol=https",
            "https://127.0.0.1:10001/acct",
            "jobs",
        ),
    ],
)
def test_urls(url: str, account_url: str, queue: str) -> None:
    options = AzureStorageQueueDriver.options_from_url(_parsed(url))
    assert options == {"account_url": account_url, "queue": queue}


@pytest.mark.parametrize(
    "url",
    [
        "azure-storage-queue://user:pass@myacct/jobs",
        "azure-storage-queue://myacct/jobs?sig=abc&sv=2020",
        "azure-storage-queue://myacct/jobs?connection_string=x",
        "azure-storage-queue://myacct/jobs?account_key=x",
        "azure-storage-queue://myacct/a/b",
        "azure-storage-queue://MyAcct_/jobs",
        "azure-storage-queue://127.0.0.1:1/a/b/c",
        "azure-storage-queue://myacct/jobs?protocol=ftp",
    ],
)
def test_bad_urls_are_refused_without_echoing_secrets(url: str) -> None:
    with pytest.raises(leasekit.InvalidURL) as info:
        leasekit.open(url)
    assert "pass" not in str(info.value).replace("pass connection_string", "")
    assert "abc" not in str(info.value)


def test_url_form_with_a_keyword_credential(azurite: Azurite, queue: leasekit.Queue) -> None:
    url = f"azure-storage-queue://127.0.0.1:{azurite.port}/{azurite.account_name}/{queue.name}"
    credential = {"account_name": azurite.account_name, "account_key": azurite.account_key}
    with leasekit.open(url, credential=credential) as q:
        q.send(b"via url")
        [lease] = queue.lease(1, duration=30, wait=5)
        assert lease.message.body == b"via url"
        lease.complete()


def test_unknown_options_and_bad_queue_names_are_refused(azurite: Azurite) -> None:
    cs = azurite.connection_string
    with pytest.raises(leasekit.InvalidURL, match="unknown option"):
        leasekit.open(SCHEME, queue="jobs", connection_string=cs, colour="blue")
    for name in ("ab", "Jobs", "a--b", "-ab", "ab-", "a" * 64, "a_b"):
        with pytest.raises(leasekit.InvalidURL, match="queue name") as info:
            leasekit.open(SCHEME, queue=name, connection_string=cs)
        assert azurite.account_key not in str(info.value)
    with pytest.raises(leasekit.InvalidURL, match="exactly one"):
        leasekit.open(SCHEME, queue="jobs")
    with pytest.raises(leasekit.InvalidURL, match="exactly one"):
        leasekit.open(SCHEME, queue="jobs", connection_string=cs, account_url="http://x")


def test_connection_string_never_shows(azurite: Azurite, queue: leasekit.Queue) -> None:
    key = azurite.account_key
    assert key not in repr(queue) and key not in repr(queue.driver)
    bad = azurite.connection_string.replace("AccountKey=", "AccountKey=broken")
    with pytest.raises(leasekit.InvalidURL) as info:
        leasekit.open(SCHEME, queue="jobs", connection_string="AccountName=x;garbage" + key)
    assert key not in str(info.value)
    with pytest.raises(leasekit.LeaseError) as err:
        leasekit.open(SCHEME, queue=queue.name, connection_string=bad).lease()
    assert key not in str(err.value) and "broken" not in str(err.value)


# ----------------------------------------------------------- errors, live


def test_wrong_key_is_authentication_failed(azurite: Azurite, queue: leasekit.Queue) -> None:
    wrong = base64.b64encode(b"k" * 64).decode()
    cs = azurite.connection_string.replace(azurite.account_key, wrong)
    with (
        leasekit.open(SCHEME, queue=queue.name, connection_string=cs) as q,
        pytest.raises(leasekit.AuthenticationFailed) as info,
    ):
        q.send(b"x")
    assert info.value.backend_code == "AuthenticationFailed"
    assert wrong not in str(info.value)


def test_nothing_listening_is_backend_unavailable() -> None:
    from leasekit.emulators._process import free_port

    with (
        leasekit.open(
            SCHEME,
            queue="jobs",
            account_url=f"http://127.0.0.1:{free_port()}/devstoreaccount1",
            credential="c2VjcmV0",
            retry_total=0,
            connection_timeout=2,
        ) as q,
        pytest.raises(leasekit.BackendUnavailable) as info,
    ):
        q.lease()
    assert "c2VjcmV0" not in str(info.value)


def test_missing_queue_and_stale_receipt_are_told_apart(
    queue: leasekit.Queue, azurite: Azurite
) -> None:
    queue.send(b"m")
    [lease] = queue.lease(1, duration=30)
    old = lease.receipt
    lease.renew()
    [mismatch] = queue.driver.delete([old])
    assert isinstance(mismatch, HttpResponseError)
    assert queue.driver.error_code(mismatch) is ErrorCode.LEASE_LOST
    assert queue.driver.backend_code(mismatch) == "PopReceiptMismatch"
    lease.complete()
    [gone] = queue.driver.delete([lease.receipt])
    assert isinstance(gone, ResourceNotFoundError)
    assert queue.driver.backend_code(gone) == "MessageNotFound"
    assert queue.driver.error_code(gone) is ErrorCode.LEASE_LOST
    missing = leasekit.open(
        SCHEME, queue="no-such-queue", connection_string=azurite.connection_string
    )
    with missing:
        [nf] = missing.driver.delete([lease.receipt])
    assert isinstance(nf, ResourceNotFoundError)
    assert missing.driver.error_code(nf) is ErrorCode.QUEUE_NOT_FOUND


def test_create_and_delete_are_idempotent(azurite: Azurite, queue_name: str) -> None:
    q = leasekit.open(SCHEME, queue=queue_name, connection_string=azurite.connection_string)
    with q:
        q.create()
        q.create()
        q.delete_queue()
        q.delete_queue()


# ------------------------------------------------------- errors, classified


def _http(cls: type[HttpResponseError], status: int, code: str | None) -> HttpResponseError:
    exc = cls(message=f"status {status}")
    exc.status_code = status
    exc.error_code = code
    return exc


DRIVER = AzureStorageQueueDriver.__new__(AzureStorageQueueDriver)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (_http(HttpResponseError, 400, "PopReceiptMismatch"), ErrorCode.LEASE_LOST),
        (_http(ResourceNotFoundError, 404, "MessageNotFound"), ErrorCode.LEASE_LOST),
        (_http(ResourceNotFoundError, 404, "QueueNotFound"), ErrorCode.QUEUE_NOT_FOUND),
        (_http(ResourceNotFoundError, 404, None), ErrorCode.UNKNOWN),  # never guessed
        (_http(ResourceExistsError, 409, "QueueAlreadyExists"), ErrorCode.QUEUE_EXISTS),
        (_http(ResourceExistsError, 409, "QueueBeingDeleted"), ErrorCode.UNAVAILABLE),
        (_http(HttpResponseError, 413, "RequestBodyTooLarge"), ErrorCode.TOO_LARGE),
        (_http(HttpResponseError, 413, None), ErrorCode.TOO_LARGE),
        (_http(ClientAuthenticationError, 403, "AuthenticationFailed"), ErrorCode.UNAUTHENTICATED),
        (
            _http(HttpResponseError, 403, "AuthorizationPermissionMismatch"),
            ErrorCode.UNAUTHENTICATED,
        ),
        (_http(HttpResponseError, 401, None), ErrorCode.UNAUTHENTICATED),
        (_http(HttpResponseError, 503, "ServerBusy"), ErrorCode.UNAVAILABLE),
        (_http(HttpResponseError, 500, "InternalError"), ErrorCode.UNAVAILABLE),
        (_http(HttpResponseError, 502, None), ErrorCode.UNAVAILABLE),
        (_http(HttpResponseError, 408, None), ErrorCode.UNAVAILABLE),
        (
            _http(HttpResponseError, 400, "OutOfRangeQueryParameterValue"),
            ErrorCode.INVALID_ARGUMENT,
        ),
        (ServiceRequestError("connection refused"), ErrorCode.UNAVAILABLE),
        (ServiceResponseError("connection reset"), ErrorCode.UNAVAILABLE),
        (ConnectionResetError(), ErrorCode.UNAVAILABLE),
        (ValueError("bad"), ErrorCode.INVALID_ARGUMENT),
        (DriverError(ErrorCode.TOO_LARGE, "x", backend_code="B"), ErrorCode.TOO_LARGE),
        (RuntimeError("?"), ErrorCode.UNKNOWN),
    ],
    ids=lambda v: v.value if isinstance(v, ErrorCode) else type(v).__name__,
)
def test_error_classification(exc: BaseException, code: ErrorCode) -> None:
    assert DRIVER.error_code(exc) is code


def test_error_code_enum_values_are_normalised() -> None:
    from azure.storage.queue._shared.models import StorageErrorCode

    exc = _http(HttpResponseError, 400, StorageErrorCode.POP_RECEIPT_MISMATCH)
    assert DRIVER.backend_code(exc) == "PopReceiptMismatch"
    assert DRIVER.error_code(exc) is ErrorCode.LEASE_LOST


def test_transient_errors_are_retried_by_core_unless_the_sdk_retries_itself() -> None:
    # Core retries within each call's deadline, so the SDK's own retries (15 s+
    # backoff) are off by default; with retry_total > 0 the SDK retries them instead.
    dev = "UseDevelopmentStorage=true"
    core_retries = AzureStorageQueueDriver(queue="jobs", connection_string=dev)
    sdk_retries = AzureStorageQueueDriver(queue="jobs", connection_string=dev, retry_total=3)
    being_deleted = _http(ResourceExistsError, 409, "QueueBeingDeleted")
    transient = (_http(HttpResponseError, 503, "ServerBusy"), ServiceRequestError("refused"))
    stale = _http(HttpResponseError, 400, "PopReceiptMismatch")
    assert core_retries.is_retryable(being_deleted) and sdk_retries.is_retryable(being_deleted)
    for exc in transient:
        assert core_retries.is_retryable(exc)
        assert not sdk_retries.is_retryable(exc)
    assert not core_retries.is_retryable(stale) and not sdk_retries.is_retryable(stale)


def test_sdk_error_is_chained_with_its_code(queue: leasekit.Queue) -> None:
    queue.send(b"c")
    [lease] = queue.lease(1, duration=30)
    twin_receipt = lease.receipt
    lease.renew()
    lease._record.receipt = twin_receipt  # the stale receipt
    with pytest.raises(leasekit.LeaseLost) as info:
        lease.complete()
    assert info.value.backend_code == "PopReceiptMismatch"
    assert isinstance(info.value.__cause__, HttpResponseError)


def test_importing_the_backend_entry_point_imports_no_sdk() -> None:
    import subprocess
    import sys

    code = (
        "import sys, leasekit, leasekit.backends.azure_storage_queue as m; "
        "m.leasekit_add_backends(); "
        "print(any(k.startswith('azure') for k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_text_limit_constant_matches_the_service() -> None:
    assert MAX_TEXT == 65536


def test_the_fixture_says_to_run_npm_ci_when_azurite_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import _fixtures.azurite as fixture

    monkeypatch.setattr(fixture, "AZURITE_QUEUE", tmp_path / "azurite-queue")
    with pytest.raises(FileNotFoundError, match="run `npm ci`"):
        fixture.azurite_argv(1234)


def test_max_connections_keeps_every_connection_of_many_threads(
    azurite: Azurite, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import threading

    q = leasekit.open(
        SCHEME,
        queue=queue_name,
        connection_string=azurite.connection_string,
        create=True,
        max_connections=16,
        connection_timeout=5,
    )
    with q:
        q.send_many([b"%d" % i for i in range(32)])
        start = threading.Barrier(16)

        def work() -> None:
            start.wait()
            for lease in q.lease(2, duration=30):
                lease.complete()

        with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
            threads = [threading.Thread(target=work) for _ in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert "Connection pool is full" not in caplog.text
        q.delete_queue()
