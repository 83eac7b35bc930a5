"""MNS ordered (FIFO) queues through leasekit, on the MNS emulator (``mns_server``).

The conformance suite's ordered section runs on an ordered queue, sync and
through ``leasekit.aio``; the tests after it cover what is MNS-specific: the
OpenAPI path for creating and checking the queue type, a group on every
message, the control endpoint derived from an Alibaba endpoint, and the
classification of the OpenAPI SDK's errors.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from mns.account import Account
from mns.queue import Message as SdkMessage

import leasekit
from leasekit import InvalidArgument, InvalidURL, QueueAlreadyExists, QueueNotFound
from leasekit.backends.aliyun_mns import AliyunMnsDriver, classify
from leasekit.conformance import AsyncUrlHarness, CountingDriver, OrderedSuite, UrlHarness
from leasekit.queue import Queue
from leasekit.spi import ErrorCode

tea_exceptions = pytest.importorskip("alibabacloud_tea_openapi.exceptions")

pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated function:DeprecationWarning")


def server_options(mns_server: Any) -> dict[str, str]:
    return {
        "endpoint": mns_server.endpoint,
        "access_key_id": mns_server.access_key_id,
        "access_key_secret": mns_server.access_key_secret,
    }


# --------------------------------------------------------------- conformance


class TestAliyunMnsOrdered(OrderedSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, mns_server: Any) -> Iterator[UrlHarness]:
        harness = UrlHarness("aliyun-mns", ordered="true", **server_options(mns_server))
        yield harness
        harness.close()


class TestAliyunMnsOrderedThroughAsyncio(OrderedSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, mns_server: Any) -> Iterator[AsyncUrlHarness]:
        harness = AsyncUrlHarness("aliyun-mns", ordered="true", **server_options(mns_server))
        yield harness
        harness.close()


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def options(mns_server: Any) -> dict[str, str]:
    return server_options(mns_server)


@pytest.fixture
def ordered(options: dict[str, str]) -> Iterator[Queue]:
    name = f"o-{uuid.uuid4().hex[:12]}"
    queue = leasekit.open("aliyun-mns", queue=name, create=True, ordered=True, **options)
    try:
        yield queue
    finally:
        queue.delete_queue()
        queue.close()


@pytest.fixture
def standard(options: dict[str, str]) -> Iterator[Queue]:
    queue = leasekit.open("aliyun-mns", queue=f"s-{uuid.uuid4().hex[:12]}", create=True, **options)
    try:
        yield queue
    finally:
        queue.delete_queue()
        queue.close()


def sdk_queue(options: dict[str, str], name: str) -> Any:
    account = Account(options["endpoint"], options["access_key_id"], options["access_key_secret"])
    return account.get_queue(name)


# --------------------------------------------------------------------- tests


def test_ordered_queue_declares_groups_and_no_delays(ordered: Queue, standard: Queue) -> None:
    assert ordered.capabilities.ordered
    assert ordered.capabilities.max_send_delay == 0
    assert not ordered.capabilities.deduplicates
    assert not standard.capabilities.ordered


def test_url_option_ordered_opens_an_ordered_queue(options: dict[str, str]) -> None:
    host = options["endpoint"].split("://", 1)[1]
    name = f"u-{uuid.uuid4().hex[:12]}"
    keys = {k: v for k, v in options.items() if k != "endpoint"}
    with leasekit.open(f"aliyun-mns://{host}/{name}?ordered=true", create=True, **keys) as queue:
        assert queue.capabilities.ordered
        queue.send(b"x", group="g")
        [lease] = queue.lease(1, wait=5)
        assert lease.message.group == "g"
        lease.complete()
        queue.delete_queue()
    with pytest.raises(InvalidURL, match="ordered"):
        leasekit.open(f"aliyun-mns://{host}/{name}?ordered=maybe", **keys)


def test_create_makes_a_fifo_queue_the_plain_sdk_sees_as_one(
    ordered: Queue, options: dict[str, str]
) -> None:
    raw = sdk_queue(options, ordered.driver.queue)  # type: ignore[attr-defined]
    raw.set_encoding(False)
    raw.send_message(SdkMessage("from-sdk", message_group_id="G"))
    [lease] = ordered.lease(1, wait=5)
    assert (lease.message.group, lease.raw.message_group_id) == ("G", "G")
    lease.complete()


def test_send_without_a_group_is_refused_before_any_call(ordered: Queue) -> None:
    counting = CountingDriver.install(ordered.driver)
    try:
        with pytest.raises(InvalidArgument, match="needs a group"):
            ordered.send(b"no group")
        with pytest.raises(InvalidArgument, match="needs a group"):
            ordered.send_many([b"a", b"b"])
        assert counting.calls == []
    finally:
        counting.uninstall()


def test_group_is_sent_as_message_group_id_and_read_back(
    ordered: Queue, options: dict[str, str]
) -> None:
    ordered.send(b"a1", group="order-17")
    raw = sdk_queue(options, ordered.driver.queue)  # type: ignore[attr-defined]
    received = raw.receive_message(5)
    assert (received.message_body, received.message_group_id) == (b"a1", "order-17")
    raw.change_message_visibility(received.receipt_handle, 1)  # give it back
    [lease] = ordered.lease(1, wait=5)
    assert (lease.message.body, lease.message.group) == (b"a1", "order-17")
    lease.complete()


def test_one_receive_hands_out_one_message_per_group(ordered: Queue) -> None:
    ordered.send_many([b"a1", b"a2"], group="A")
    ordered.send_many([b"b1", b"b2"], group="B")
    leases = ordered.lease(10, wait=5)
    assert sorted(lease.message.body for lease in leases) == [b"a1", b"b1"]
    ordered.complete_many(leases)


def test_opening_a_standard_queue_as_ordered_is_refused_at_first_use(
    standard: Queue, options: dict[str, str]
) -> None:
    name = standard.driver.queue  # type: ignore[attr-defined]
    with leasekit.open("aliyun-mns", queue=name, ordered=True, **options) as queue:
        with pytest.raises(InvalidArgument, match="keeps no order"):
            queue.send(b"x", group="A")
        with pytest.raises(InvalidArgument, match="keeps no order"):
            queue.lease(1)
    with pytest.raises(QueueAlreadyExists, match="not an ordered"):
        leasekit.open("aliyun-mns", queue=name, ordered=True, create=True, **options)


def test_create_of_an_existing_ordered_queue_succeeds(
    ordered: Queue, options: dict[str, str]
) -> None:
    name = ordered.driver.queue  # type: ignore[attr-defined]
    with leasekit.open("aliyun-mns", queue=name, ordered=True, create=True, **options) as again:
        again.send(b"x", group="A")


def test_missing_ordered_queue_is_queue_not_found(options: dict[str, str]) -> None:
    opened = leasekit.open("aliyun-mns", queue="no-such-queue", ordered=True, **options)
    with opened as queue, pytest.raises(QueueNotFound):
        queue.lease(1)


def test_dead_letters_of_an_ordered_queue_keep_their_group(
    ordered: Queue, options: dict[str, str]
) -> None:
    ordered.send(b"poison", group="A")
    ordered.send(b"next", group="A")
    [lease] = ordered.lease(1, wait=5)
    lease.dead_letter("bad")
    [after] = ordered.lease(1, wait=5)
    assert after.message.body == b"next"
    after.complete()
    # aliyun-mns-sdk's peek does not read MessageGroupId: lease the poison queue instead.
    poison_name = ordered.driver.queue + "-poison"  # type: ignore[attr-defined]
    with leasekit.open("aliyun-mns", queue=poison_name, ordered=True, **options) as poison:
        [letter] = poison.lease(1, wait=5)
        assert (letter.message.body, letter.message.group) == (b"poison", "A")
        letter.complete()
        poison.delete_queue()


def test_control_endpoint_is_derived_from_an_alibaba_endpoint() -> None:
    keys = {"access_key_id": "i", "access_key_secret": "s"}
    for host in (
        "1234567890.mns.cn-hangzhou.aliyuncs.com",
        "1234567890.mns.cn-hangzhou-internal.aliyuncs.com",
        "1234567890.mns.cn-hangzhou-internal-vpc.aliyuncs.com",
    ):
        driver = AliyunMnsDriver("q", endpoint=f"https://{host}", ordered=True, **keys)
        assert repr(driver._control) == "<ControlPlane mns-open.cn-hangzhou.aliyuncs.com>"
    emulator = AliyunMnsDriver("q", endpoint="http://127.0.0.1:1", ordered=True, **keys)
    assert repr(emulator._control) == "<ControlPlane http://127.0.0.1:1>"
    given = AliyunMnsDriver(
        "q",
        endpoint="https://1234567890.mns.cn-hangzhou.aliyuncs.com",
        ordered=True,
        control_endpoint="https://mns-open.example.test",
        **keys,
    )
    assert repr(given._control) == "<ControlPlane https://mns-open.example.test>"
    standard = AliyunMnsDriver("q", endpoint="http://127.0.0.1:1", **keys)
    assert standard._control is None


def test_secrets_stay_out_of_the_ordered_drivers_repr() -> None:
    driver = AliyunMnsDriver(
        "q",
        endpoint="http://127.0.0.1:1",
        ordered=True,
        access_key_id="the-key-id",
        access_key_secret="the-very-secret",
    )
    assert "the-very-secret" not in repr(driver)
    assert "the-very-secret" not in repr(driver._control)


def test_openapi_errors_are_classified() -> None:
    def client(code: str, status: int) -> BaseException:
        return tea_exceptions.ClientException(status_code=status, code=code, message=code)

    assert classify(client("QueueNotExist", 404)) is ErrorCode.QUEUE_NOT_FOUND
    assert classify(client("QueueAlreadyExist", 409)) is ErrorCode.QUEUE_EXISTS
    assert classify(client("SignatureDoesNotMatch", 403)) is ErrorCode.UNAUTHENTICATED
    assert classify(client("InvalidArgument", 400)) is ErrorCode.INVALID_ARGUMENT
    assert classify(client("SomethingNew", 400)) is ErrorCode.UNKNOWN
    server = tea_exceptions.ServerException(status_code=503, code="ServiceUnavailable")
    assert classify(server) is ErrorCode.UNAVAILABLE
    assert classify(tea_exceptions.ServerException(status_code=500)) is ErrorCode.UNAVAILABLE
    # A network failure (the SDK's UnretryableException): test_unreachable_openapi_... below.
    driver = AliyunMnsDriver(
        "q", endpoint="http://127.0.0.1:1", access_key_id="i", access_key_secret="s"
    )
    assert driver.backend_code(client("QueueNotExist", 404)) == "QueueNotExist"


def test_unreachable_openapi_is_backend_unavailable() -> None:
    from leasekit import BackendUnavailable
    from leasekit.retry import RetryPolicy

    with (
        leasekit.open(
            "aliyun-mns",
            queue="q",
            endpoint="http://127.0.0.1:1",
            ordered=True,
            access_key_id="i",
            access_key_secret="s",
            connect_timeout=0.2,
            retry=RetryPolicy(attempts=1),
        ) as queue,
        pytest.raises(BackendUnavailable),
    ):
        queue.lease(1)


def test_a_credentials_provider_signs_the_openapi_calls_too(options: dict[str, str]) -> None:
    from mns.auth import StaticCredentialsProvider

    provider = StaticCredentialsProvider(options["access_key_id"], options["access_key_secret"])
    name = f"p-{uuid.uuid4().hex[:12]}"
    with leasekit.open(
        "aliyun-mns",
        queue=name,
        endpoint=options["endpoint"],
        credentials_provider=provider,
        ordered=True,
        create=True,
    ) as queue:
        queue.send(b"x", group="A")
        [lease] = queue.lease(1, wait=5)
        assert lease.message.group == "A"
        lease.complete()
        queue.delete_queue()
