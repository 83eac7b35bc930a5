"""The AWS SQS backend against moto's server, plus error-mapping unit tests.

Everything except the error-mapping unit tests at the end talks to a real
``python -m moto.server`` (the session fixture ``moto_server``); calls are
counted with botocore's own event hooks on the real client, not with mocks.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import leasekit
from leasekit import (
    AuthenticationFailed,
    BackendUnavailable,
    InvalidArgument,
    InvalidLeaseDuration,
    InvalidURL,
    LeaseLost,
    MessageTooLarge,
    QueueNotFound,
)
from leasekit.conformance import ConformanceSuite, UrlHarness, conformance_property
from leasekit.emulators._process import ServerProcess, free_port, python_module
from leasekit.error_mapping import wrap_error
from leasekit.queue import Queue
from leasekit.spi import DriverError, ErrorCode, QueueStats, Visibility

botocore_exceptions = pytest.importorskip("botocore.exceptions")

from leasekit.backends.aws_sqs import (  # noqa: E402 - after the importorskip
    ATTRIBUTE_ROOM,
    PACKED,
    SqsDriver,
)
from leasekit.backends.aws_sqs.error_codes import _entry_error  # noqa: E402


class TestSqsConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, moto_server: Any) -> Iterator[UrlHarness]:
        harness = UrlHarness("aws-sqs", **moto_server.options)
        yield harness
        harness.close()

    @conformance_property("declared capabilities are true")
    def test_declared_maximum_lease_is_accepted(self, queue: Queue) -> None:
        # Replaces the suite's version, which renews by max_lease right after the
        # receive: with SQS's 12 h total cap (max_total_lease == max_lease) core
        # refuses that before any call, as moto and SQS would ("Total
        # VisibilityTimeout for the message is beyond the limit"). Drop this
        # override once the suite renews within max_total_lease.
        caps = queue.capabilities
        queue.send(b"max")
        lease = queue.lease(1, duration=caps.max_lease, wait=5)[0]
        assert lease.expires_at.timestamp() > time.time() + caps.max_lease * 0.9
        with pytest.raises(InvalidLeaseDuration):
            lease.renew(caps.max_lease)
        lease.renew(caps.max_lease - 60)
        assert lease.expires_at.timestamp() > time.time() + (caps.max_lease - 60) * 0.9
        lease.abandon()


# ------------------------------------------------------------------ helpers


def _name(prefix: str = "t") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


@pytest.fixture
def queue(moto_server: Any) -> Iterator[Queue]:
    q = leasekit.open("aws-sqs", queue=_name(), create=True, **moto_server.options)
    try:
        yield q
    finally:
        q.delete_queue()
        q.close()


def _driver(q: Queue) -> SqsDriver:
    driver = q.driver
    assert isinstance(driver, SqsDriver)
    return driver


class Calls:
    """Counts SQS operations made by a real boto3 client (botocore event hooks)."""

    def __init__(self, client: Any) -> None:
        self.made: list[tuple[str, dict[str, Any]]] = []
        client.meta.events.register("provide-client-params.sqs", self._record)

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.made.append((model.name, dict(params)))

    def names(self) -> list[str]:
        return [name for name, _ in self.made]


# ------------------------------------------------------- URLs and options


def test_url_names_region_queue_and_endpoint_without_any_network() -> None:
    port = free_port()  # nothing listens there: opening must not connect
    q = leasekit.open(f"aws-sqs://eu-west-1/orders?endpoint_url=http://127.0.0.1:{port}")
    driver = _driver(q)
    assert (driver.region, driver.queue, driver.endpoint_url) == (
        "eu-west-1",
        "orders",
        f"http://127.0.0.1:{port}",
    )
    assert driver._connection._client is None, "the boto3 client must be created lazily"
    q.close()


def test_url_with_account_and_queue_url_keyword() -> None:
    q = leasekit.open("aws-sqs://eu-west-1/123456789012/orders")
    assert (_driver(q).account, _driver(q).queue) == ("123456789012", "orders")
    q.close()
    url = "https://sqs.eu-west-2.amazonaws.com/123456789012/jobs"
    q = leasekit.open("aws-sqs", queue=url)
    assert (_driver(q).region, _driver(q).queue, _driver(q)._url()) == ("eu-west-2", "jobs", url)
    q.close()


@pytest.mark.parametrize(
    "url",
    [
        "aws-sqs://us-east-1/q?aws_secret_access_key=hunter2-secret",
        "aws-sqs://AKIDEXAMPLE:hunter2-secret@us-east-1/q",
        "aws-sqs://us-east-1/q?colour=red",
        "aws-sqs://us-east-1/q?client=x",
        "aws-sqs://us-east-1/q?_connection=x",
        "aws-sqs://us-east-1/orders.fif",
        "aws-sqs://us-east-1/a/b/c",
        "aws-sqs://us-east-1:4566/q",
    ],
)
def test_bad_urls_are_refused_without_echoing_secrets(url: str) -> None:
    with pytest.raises(InvalidURL) as caught:
        leasekit.open(url)
    assert "hunter2" not in str(caught.value)


def test_import_and_open_load_no_sdk() -> None:
    code = (
        "import sys, leasekit\n"
        "q = leasekit.open('aws-sqs://us-east-1/q')\n"
        "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules, 'SDK imported'\n"
    )
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, timeout=60)


def test_credentials_stay_out_of_reprs(moto_server: Any) -> None:
    options = {**moto_server.options, "aws_secret_access_key": "hunter2-secret-value"}
    q = leasekit.open("aws-sqs", queue=_name(), create=True, **options)
    try:
        driver = _driver(q)
        for text in (repr(q), repr(driver), repr(vars(driver)), repr(driver._connection)):
            assert "hunter2" not in text
    finally:
        q.delete_queue()
        q.close()


def test_sibling_shares_the_client_and_closing_one_keeps_the_other(queue: Queue) -> None:
    driver = _driver(queue)
    sibling = driver.sibling(queue.name + "-other")
    assert sibling.client is driver.client
    sibling.close()
    sibling.close()  # closing twice is harmless
    queue.send(b"still works")
    assert queue.lease(1, wait=5)[0].message.body == b"still works"


# ---------------------------------------------------------- bodies and size


def test_capabilities_state_the_real_maximum_raw_body() -> None:
    q = leasekit.open("aws-sqs://us-east-1/q")
    assert q.capabilities.max_message_size == (262144 - ATTRIBUTE_ROOM) // 4 * 3 == 190464
    q.close()
    q = leasekit.open("aws-sqs://us-east-1/q?maximum_message_size=1048576")
    assert q.capabilities.max_message_size == (1048576 - ATTRIBUTE_ROOM) // 4 * 3
    q.close()


def test_maximum_body_with_properties_in_the_reserved_room_is_accepted(queue: Queue) -> None:
    body = os.urandom(queue.capabilities.max_message_size)
    properties = {f"p{i}": "v" * 700 for i in range(10)}  # ~7 KB of attributes
    queue.send(body, properties=properties)
    lease = queue.lease(1, duration=30, wait=5)[0]
    assert lease.message.body == body
    assert dict(lease.message.properties) == properties
    lease.complete()


def test_body_plus_properties_over_the_limit_is_refused_before_any_call(
    moto_server: Any,
) -> None:
    q = leasekit.open("aws-sqs", queue=_name(), **moto_server.options)  # never created
    body = b"x" * q.capabilities.max_message_size
    with pytest.raises(MessageTooLarge):
        q.send(body, properties={"big": "v" * ATTRIBUTE_ROOM})
    with pytest.raises(MessageTooLarge):
        q.send_many([body, b"ok"], properties={"big": "v" * ATTRIBUTE_ROOM})
    assert _driver(q)._connection._client is None, "a call was made"
    q.close()


def test_a_body_another_producer_sent_as_text_reads_as_utf8(queue: Queue) -> None:
    driver = _driver(queue)
    driver.client.send_message(QueueUrl=driver._url(), MessageBody="plain text, ünïcode!")
    lease = queue.lease(1, wait=5)[0]
    assert lease.message.body == "plain text, ünïcode!".encode()
    assert lease.raw["Body"] == "plain text, ünïcode!"
    lease.complete()


def test_send_many_splits_batches_by_size_and_by_ten(queue: Queue) -> None:
    calls = Calls(_driver(queue).client)
    big = queue.capabilities.max_message_size
    bodies = [os.urandom(big), os.urandom(big), b"a", b"b"]
    ids = queue.send_many(bodies + [b"%d" % i for i in range(10)])
    assert len(set(ids)) == 14
    batches = [p["Entries"] for n, p in calls.made if n == "SendMessageBatch"]
    assert all(len(entries) <= 10 for entries in batches)
    for entries in batches:
        assert sum(len(e["MessageBody"]) for e in entries) <= 262144
    got = {}
    while len(got) < 14:
        for lease in queue.lease(10, duration=30, wait=5):
            got[lease.message.id] = lease.message.body
            lease.complete()
    assert sorted(got.values()) == sorted(bodies + [b"%d" % i for i in range(10)])


# ---------------------------------------------------------------- properties


def test_up_to_ten_valid_properties_are_one_string_attribute_each(queue: Queue) -> None:
    properties = {f"key-{i}": f"välue {i}" for i in range(10)}
    queue.send(b"p", properties=properties)
    lease = queue.lease(1, wait=5)[0]
    assert dict(lease.message.properties) == properties
    assert set(lease.raw["MessageAttributes"]) == set(properties)
    assert {a["DataType"] for a in lease.raw["MessageAttributes"].values()} == {"String"}
    lease.complete()


def test_properties_sqs_cannot_carry_one_to_one_travel_packed_and_round_trip(
    queue: Queue,
) -> None:
    properties = {f"k{i}": str(i) for i in range(12)}  # more than SQS's 10
    properties.update({"a name with spaces": "x", "AWS.reserved": "y", "empty": ""})
    properties["control"] = "\x00\x01 not SQS text"
    queue.send(b"p", properties=properties)
    lease = queue.lease(1, wait=5)[0]
    assert dict(lease.message.properties) == properties
    assert set(lease.raw["MessageAttributes"]) == {PACKED}
    lease.complete()


# -------------------------------------------------------- batches, receipts


def test_delete_batch_maps_each_entry(queue: Queue) -> None:
    queue.send_many([b"1", b"2", b"3"])
    leases: list[Any] = []
    while len(leases) < 3:
        leases.extend(queue.lease(3 - len(leases), duration=60, wait=5))
    leases[1]._record.receipt = "not-a-receipt-handle"
    calls = Calls(_driver(queue).client)
    results = queue.complete_many(leases)
    assert calls.names() == ["DeleteMessageBatch"]
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], LeaseLost)
    assert results[1].backend_code == "ReceiptHandleIsInvalid"
    assert leases[1].lost.is_set()
    assert [lz.state.value for lz in leases] == ["completed", "lost", "completed"]


def test_keeper_batch_renew_maps_each_entry(queue: Queue) -> None:
    queue.send_many([b"1", b"2", b"3"])
    leases: list[Any] = []
    while len(leases) < 3:
        leases.extend(queue.lease(3 - len(leases), duration=30, wait=5))
    leases[2]._record.receipt = "garbage"
    calls = Calls(_driver(queue).client)
    results = queue.renew_many(leases, 90)
    assert calls.names() == ["ChangeMessageVisibilityBatch"]
    assert calls.made[0][1]["Entries"][0]["VisibilityTimeout"] == 90
    assert results[:2] == [None, None] and isinstance(results[2], LeaseLost)
    assert leases[2].lost.is_set()
    assert leases[0].expires_at.timestamp() > time.time() + 80
    assert queue.complete_many(leases[:2]) == [None, None]


def test_change_visibility_batch_maps_each_entry(queue: Queue) -> None:
    queue.send(b"v")
    lease = queue.lease(1, duration=60, wait=5)[0]
    results = _driver(queue).change_visibility([lease.receipt, "garbage"], 5)
    assert isinstance(results[0], Visibility) and results[0].receipt == lease.receipt
    assert isinstance(results[1], DriverError) and results[1].code is ErrorCode.LEASE_LOST
    lease.complete()


def test_garbage_receipt_is_lease_lost_never_queue_not_found(queue: Queue) -> None:
    queue.send(b"g")
    lease = queue.lease(1, duration=60, wait=5)[0]
    good = lease.receipt
    lease._record.receipt = "garbage"
    with pytest.raises(LeaseLost):
        lease.renew()
    assert lease.lost.is_set()
    _driver(queue).delete([good])


def test_limits_moto_does_not_enforce_are_enforced_before_any_call(queue: Queue) -> None:
    queue.send_many([b"%d" % i for i in range(12)])
    calls = Calls(_driver(queue).client)
    got: list[Any] = []
    while len(got) < 12:
        got.extend(queue.lease(12, duration=43200, wait=5))
    receives = [p["MaxNumberOfMessages"] for n, p in calls.made if n == "ReceiveMessage"]
    assert receives and max(receives) <= 10  # moto would take 11
    calls.made.clear()
    with pytest.raises(InvalidLeaseDuration):
        got[0].renew(43200)  # past the 12-hour total since receive
    with pytest.raises(InvalidLeaseDuration):
        got[0].renew(-1)  # moto accepts -1
    with pytest.raises(InvalidArgument):
        got[0].abandon(-1)
    with pytest.raises(InvalidArgument):
        got[0].abandon(43201)
    assert calls.made == []
    got[0].renew(60)  # within the cap: fine
    assert queue.complete_many(got) == [None] * 12
    assert max(len(p["Entries"]) for _, p in calls.made if "Entries" in p) <= 10


def test_short_wait_with_a_fraction_is_spent_not_busy_polled(queue: Queue) -> None:
    calls = Calls(_driver(queue).client)
    start = time.monotonic()
    assert queue.lease(1, wait=1.5) == []
    assert 1.4 <= time.monotonic() - start < 3.0
    assert len(calls.made) <= 3


# ---------------------------------------------------------------- dead-letter


def test_dead_letter_uses_the_redrive_policy_target(queue: Queue, moto_server: Any) -> None:
    client = _driver(queue).client
    dlq_name = _name("dlq")
    dlq_url = client.create_queue(QueueName=dlq_name)["QueueUrl"]
    arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])
    policy = {"deadLetterTargetArn": arn["Attributes"]["QueueArn"], "maxReceiveCount": "5"}
    name = _name()
    client.create_queue(QueueName=name, Attributes={"RedrivePolicy": json.dumps(policy)})
    q = leasekit.open("aws-sqs", queue=name, **moto_server.options)
    try:
        message_id = q.send(b"\xffpoison", properties={"kind": "order"})
        lease = q.lease(1, duration=30, wait=5)[0]
        lease.dead_letter("handler gave up")
        assert q.lease(1, duration=30, wait=1) == []
        letters = q.peek_dead_letters()
        assert [(d.id, d.body, d.reason, d.delivery_count) for d in letters] == [
            (message_id, b"\xffpoison", "handler gave up", 1)
        ]
        assert dict(letters[0].properties) == {"kind": "order"}
        with pytest.raises(botocore_exceptions.ClientError):
            client.get_queue_url(QueueName=name + "-poison")
        q.delete_queue()
        # The redrive DLQ is the user's (maybe shared): Queue.delete_queue() keeps it.
        raw = client.receive_message(QueueUrl=dlq_url, MessageAttributeNames=["All"])
        message = raw["Messages"][0]
        assert message["MessageAttributes"]["leasekit-dead-letter-reason"]["StringValue"] == (
            "handler gave up"
        )
    finally:
        q.close()
        client.delete_queue(QueueUrl=dlq_url)


def test_dead_letter_without_redrive_goes_to_poison_queue_deleted_with_the_queue(
    moto_server: Any,
) -> None:
    q = leasekit.open("aws-sqs", queue=_name(), create=True, **moto_server.options)
    try:
        properties = {f"p{i}": "v" for i in range(9)}  # 9 + 3 leasekit keys > 10
        q.send(b"nine", properties=properties)
        q.lease(1, wait=5)[0].dead_letter("too many tries")
        client = _driver(q).client
        poison_url = client.get_queue_url(QueueName=q.name + "-poison")["QueueUrl"]
        (letter,) = q.peek_dead_letters(10)
        assert (letter.body, letter.reason, dict(letter.properties)) == (
            b"nine",
            "too many tries",
            properties,
        )
        # Peeking released the letter again.
        assert len(q.peek_dead_letters(10)) == 1
        q.delete_queue()
        with pytest.raises(botocore_exceptions.ClientError):
            client.get_queue_url(QueueName=q.name + "-poison")
        del poison_url
    finally:
        q.close()


def test_a_reason_that_does_not_fit_is_shortened(queue: Queue) -> None:
    body = os.urandom(queue.capabilities.max_message_size)
    properties = {f"p{i}": "v" * 700 for i in range(9)}
    queue.send(body, properties=properties)
    lease = queue.lease(1, wait=5)[0]
    lease.dead_letter("é" * 4096)
    (letter,) = queue.peek_dead_letters(1)
    assert letter.body == body and dict(letter.properties) == properties
    assert letter.reason is not None
    assert letter.reason.startswith("éé") and letter.reason.endswith("…")
    assert len(letter.reason) < 4096


def test_consumer_completes_good_messages_and_dead_letters_poison(queue: Queue) -> None:
    queue.send_many([b"ok%d" % i for i in range(12)] + [b"poison"])
    handled: list[bytes] = []

    def handler(message: Any) -> None:
        if message.body == b"poison":
            raise RuntimeError("cannot handle")
        handled.append(message.body)

    consumer = leasekit.Consumer(
        queue,
        handler,
        concurrency=4,
        lease_duration=10,
        max_deliveries=2,
        backoff_base=0,
        handle_signals=False,
    )
    # Not run(until_idle=True): moto's 1 s long poll does not see a message made
    # visible again (the abandoned poison) during the poll, so "idle" comes early.
    runner = threading.Thread(target=consumer.run)
    runner.start()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            stats = consumer.stats
            if stats.completed == 12 and stats.dead_lettered == 1:
                break
            time.sleep(0.05)  # polling the consumer's counters, with a deadline
    finally:
        consumer.stop()
        runner.join(timeout=60)
    stats = consumer.stats
    assert sorted(handled) == sorted(b"ok%d" % i for i in range(12))
    assert (stats.completed, stats.dead_lettered) == (12, 1)
    (letter,) = queue.peek_dead_letters(5)
    assert letter.body == b"poison" and letter.delivery_count == 3
    assert letter.reason is not None and "max_deliveries" in letter.reason


# -------------------------------------------------------------------- stats


def test_stats_report_sqs_approximate_counts(queue: Queue) -> None:
    queue.send_many([b"1", b"2", b"3"])
    queue.send(b"later", delay=60)
    lease = queue.lease(1, duration=60, wait=5)[0]
    stats = queue.stats()
    assert stats == QueueStats(visible=2, leased=1, delayed=1, dead_lettered=0, total=4)
    lease.complete()


def test_stats_count_every_letter_in_the_redrive_dlq(queue: Queue, moto_server: Any) -> None:
    client = _driver(queue).client
    dlq_url = client.create_queue(QueueName=_name("dlq"))["QueueUrl"]
    arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])
    policy = {"deadLetterTargetArn": arn["Attributes"]["QueueArn"], "maxReceiveCount": "1"}
    name = _name()
    client.create_queue(QueueName=name, Attributes={"RedrivePolicy": json.dumps(policy)})
    q = leasekit.open("aws-sqs", queue=name, **moto_server.options)
    try:
        q.send_many([b"given up", b"redriven"])
        assert q.stats().dead_lettered == 0
        first, second = q.lease(2, duration=1, wait=5)
        first.dead_letter("handler gave up")  # leasekit's copy to the DLQ
        assert q.stats().dead_lettered == 1
        # SQS's own redrive: past maxReceiveCount, a receive moves the message to the DLQ.
        deadline = time.monotonic() + 10
        while q.stats().dead_lettered != 2 and time.monotonic() < deadline:
            assert q.lease(1, duration=30, wait=0.2) == []
        assert q.stats() == QueueStats(visible=0, leased=0, delayed=0, dead_lettered=2, total=0)
        assert len(q.peek_dead_letters()) == 2  # hidden while read: still counted
        assert q.stats().dead_lettered == 2
        del second
    finally:
        q.delete_queue()
        q.close()
        client.delete_queue(QueueUrl=dlq_url)


# ------------------------------------------------------------ real errors


def test_unreachable_endpoint_is_backend_unavailable() -> None:
    q = leasekit.open(
        "aws-sqs",
        queue="q",
        region="us-east-1",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        max_attempts=1,
    )
    with pytest.raises(BackendUnavailable) as caught:
        q.lease(1)
    assert caught.value.backend_code == "EndpointConnectionError"
    cause = caught.value.__cause__
    assert isinstance(cause, Exception)
    # One boto3 attempt per call: core retries it, within the call's deadline.
    assert q.driver.is_retryable(cause)
    q.close()
    with leasekit.open(
        "aws-sqs", queue="q", region="us-east-1", endpoint_url="http://127.0.0.1:1", max_attempts=3
    ) as retried_by_boto3:
        assert not retried_by_boto3.driver.is_retryable(cause)


@pytest.fixture(scope="module")
def moto_with_auth() -> Iterator[str]:
    """A second moto server that checks credentials (INITIAL_NO_AUTH_ACTION_COUNT=0)."""
    port = free_port()
    process = ServerProcess(
        python_module("moto.server", "-H", "127.0.0.1", "-p", str(port)),
        port,
        env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"},
        name="moto-auth",
    )
    with process:
        yield f"http://127.0.0.1:{port}"


def test_refused_credentials_are_authentication_failed_without_the_secret(
    moto_with_auth: str,
) -> None:
    q = leasekit.open(
        "aws-sqs",
        queue="q",
        region="us-east-1",
        endpoint_url=moto_with_auth,
        aws_access_key_id="AKIAUNKNOWNKEY",
        aws_secret_access_key="hunter2-secret-value",
    )
    with pytest.raises(AuthenticationFailed) as caught:
        q.send(b"x")
    assert caught.value.backend_code == "InvalidClientTokenId"
    assert "hunter2" not in str(caught.value) and "hunter2" not in repr(caught.value)
    q.close()


def test_deleted_queue_is_queue_not_found_for_every_call(moto_server: Any) -> None:
    q = leasekit.open("aws-sqs", queue=_name(), create=True, **moto_server.options)
    q.send(b"x")
    lease = q.lease(1, duration=60, wait=5)[0]
    q.delete_queue()
    for action in (lambda: q.send(b"y"), lambda: q.lease(1), lease.renew, lease.complete):
        with pytest.raises(QueueNotFound):
            action()
    assert not lease.lost.is_set()
    q.delete_queue()  # deleting a missing queue is fine
    q.close()


# ------------------------------------------------- error mapping (unit, mocks)


def _client_error(code: str, message: str = "", status: int = 400, query: str = "") -> Any:
    error: dict[str, Any] = {"Code": code, "Message": message}
    if query:
        error["QueryErrorCode"] = query
    response = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore_exceptions.ClientError(response, "Operation")  # type: ignore[arg-type]


_EXPIRED = (
    "Value AQEB for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired."
)
_XML_403 = (
    '<?xml version="1.0" encoding="utf-8"?>\n<ErrorResponse><Errors><Error><Code>'
    "InvalidClientTokenId</Code><Message>The security token included in the request is "
    "invalid.</Message><Type>Sender</Type></Error></Errors></ErrorResponse>"
)


@pytest.mark.parametrize(
    ("exc", "code", "cls"),
    [
        (_client_error("ReceiptHandleIsInvalid"), ErrorCode.LEASE_LOST, LeaseLost),
        (_client_error("InvalidParameterValue", _EXPIRED), ErrorCode.LEASE_LOST, LeaseLost),
        (_client_error("MessageNotInflight"), ErrorCode.LEASE_LOST, LeaseLost),
        (
            _client_error("AWS.SimpleQueueService.MessageNotInflight"),
            ErrorCode.LEASE_LOST,
            LeaseLost,
        ),
        (
            _client_error("AWS.SimpleQueueService.NonExistentQueue", query="QueueDoesNotExist"),
            ErrorCode.QUEUE_NOT_FOUND,
            QueueNotFound,
        ),
        (_client_error("QueueDoesNotExist"), ErrorCode.QUEUE_NOT_FOUND, QueueNotFound),
        (_client_error("InvalidClientTokenId", status=403), ErrorCode.UNAUTHENTICATED, None),
        (_client_error("SignatureDoesNotMatch", status=403), ErrorCode.UNAUTHENTICATED, None),
        (_client_error("AccessDenied", status=403), ErrorCode.UNAUTHENTICATED, None),
        (_client_error("403", _XML_403, status=403), ErrorCode.UNAUTHENTICATED, None),
        (_client_error("ThrottlingException"), ErrorCode.UNAVAILABLE, BackendUnavailable),
        (_client_error("RequestThrottled", status=403), ErrorCode.UNAVAILABLE, None),
        (_client_error("OverLimit", status=403), ErrorCode.UNAVAILABLE, None),
        (_client_error("InternalError", status=500), ErrorCode.UNAVAILABLE, None),
        (_client_error("Whatever", status=503), ErrorCode.UNAVAILABLE, None),
        (
            _client_error("InvalidParameterValue", "Value 43201 for parameter VisibilityTimeout"),
            ErrorCode.INVALID_ARGUMENT,
            InvalidArgument,
        ),
        (
            _client_error("InvalidParameterValue", "Message must be shorter than 262144 bytes."),
            ErrorCode.TOO_LARGE,
            MessageTooLarge,
        ),
        (
            _client_error(
                "InvalidParameterValue",
                "Value AQEB for parameter ReceiptHandle is invalid. Reason: Message does not "
                "exist or is not available for visibility timeout change.",
            ),
            ErrorCode.LEASE_LOST,
            LeaseLost,
        ),
        (
            _client_error(
                "InvalidParameterValue",
                "Value 43200 for parameter VisibilityTimeout is invalid. Reason: Total "
                "VisibilityTimeout for the message is beyond the limit [43200 seconds]",
            ),
            ErrorCode.INVALID_ARGUMENT,
            InvalidArgument,
        ),
        (_client_error("SomethingNew"), ErrorCode.UNKNOWN, None),
        (
            botocore_exceptions.EndpointConnectionError(endpoint_url="http://x"),
            ErrorCode.UNAVAILABLE,
            BackendUnavailable,
        ),
        (
            botocore_exceptions.ReadTimeoutError(endpoint_url="http://x"),
            ErrorCode.UNAVAILABLE,
            None,
        ),
        (
            botocore_exceptions.ConnectTimeoutError(endpoint_url="http://x"),
            ErrorCode.UNAVAILABLE,
            None,
        ),
        (
            botocore_exceptions.ConnectionClosedError(endpoint_url="http://x"),
            ErrorCode.UNAVAILABLE,
            None,
        ),
        (botocore_exceptions.NoCredentialsError(), ErrorCode.UNAUTHENTICATED, None),
        (botocore_exceptions.NoRegionError(), ErrorCode.INVALID_ARGUMENT, None),
        (ValueError("not botocore"), ErrorCode.UNKNOWN, None),
    ],
    ids=lambda v: v.name if isinstance(v, ErrorCode) else None,
)
def test_error_mapping(exc: BaseException, code: ErrorCode, cls: type | None) -> None:
    driver = SqsDriver(queue="q", region="us-east-1")
    assert driver.error_code(exc) is code
    # One boto3 attempt by default: core retries what is transient, within its deadline.
    assert driver.is_retryable(exc) is (code is ErrorCode.UNAVAILABLE)
    assert SqsDriver(queue="q", region="us-east-1", max_attempts=3).is_retryable(exc) is False
    if cls is not None:
        wrapped = wrap_error(driver, exc, "doing")
        assert type(wrapped) is cls
    if isinstance(exc, botocore_exceptions.ClientError):
        expected = "InvalidClientTokenId" if exc.response["Error"]["Code"] == "403" else None
        assert driver.backend_code(exc) == (expected or exc.response["Error"]["Code"])


@pytest.mark.parametrize(
    ("entry", "code"),
    [
        ({"Code": "ReceiptHandleIsInvalid", "SenderFault": True}, ErrorCode.LEASE_LOST),
        (
            {"Code": "InvalidParameterValue", "Message": _EXPIRED, "SenderFault": True},
            ErrorCode.LEASE_LOST,
        ),
        ({"Code": "InternalError", "SenderFault": False}, ErrorCode.UNAVAILABLE),
        ({"Code": "Mystery", "SenderFault": False}, ErrorCode.UNAVAILABLE),
        ({"Code": "Mystery", "SenderFault": True}, ErrorCode.UNKNOWN),
    ],
)
def test_batch_entry_errors_are_classified_per_entry(
    entry: dict[str, Any], code: ErrorCode
) -> None:
    error = _entry_error({"Id": "0", **entry})
    assert error.code is code
    assert error.backend_code == entry["Code"]
