"""The Google Cloud Pub/Sub backend against leasekit's Pub/Sub emulator (``pubsub_server``).

Conformance runs on an exactly-once subscription (sync and through asyncio)
and on one without exactly-once, which skips only what its capabilities say.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.pubsub_v1")

import leasekit
from leasekit import (
    InvalidArgument,
    InvalidLeaseDuration,
    LeaseLost,
    MessageTooLarge,
    QueueNotFound,
)
from leasekit.backends.gcp_pubsub import PubSubDriver
from leasekit.conformance import AsyncUrlHarness, CheckpointSuite, ConformanceSuite, UrlHarness
from leasekit.emulators._process import free_port
from leasekit.queue import Queue


def _options(server: Any, **more: Any) -> dict[str, Any]:
    return {"project": server.project, "endpoint": server.address, **more}


class DeadLetterHarness(UrlHarness):
    """Each queue with a dead-letter topic of its own (``<queue>-dl``), so that
    reading one queue's dead letters back sees no other test's."""

    def open_queue(self, name: str, *, create: bool) -> Queue:
        return self._opener(
            self.target, queue=name, create=create, dead_letter_topic=f"{name}-dl", **self.options
        )


class AsyncDeadLetterHarness(AsyncUrlHarness):
    """:class:`DeadLetterHarness` through ``leasekit.aio``."""

    def open_queue(self, name: str, *, create: bool) -> Any:
        options = self.options
        self.options = {**options, "dead_letter_topic": f"{name}-dl"}
        try:
            return super().open_queue(name, create=create)
        finally:
            self.options = options


class TestPubSubConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, pubsub_server: Any) -> Iterator[UrlHarness]:
        harness = DeadLetterHarness("gcp-pubsub", **_options(pubsub_server))
        yield harness
        harness.close()


class TestPubSubConformanceThroughAsyncio(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, pubsub_server: Any) -> Iterator[AsyncUrlHarness]:
        harness = AsyncDeadLetterHarness("gcp-pubsub", **_options(pubsub_server))
        yield harness
        harness.close()


class TestPubSubConformanceWithoutExactlyOnce(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, pubsub_server: Any) -> Iterator[UrlHarness]:
        harness = UrlHarness("gcp-pubsub", **_options(pubsub_server, exactly_once=False))
        yield harness
        harness.close()


# ------------------------------------------------------------------ helpers


def _name() -> str:
    return f"t-{secrets.token_hex(4)}"


@pytest.fixture
def queue(pubsub_server: Any) -> Iterator[Queue]:
    q = leasekit.open("gcp-pubsub", queue=_name(), create=True, **_options(pubsub_server))
    try:
        yield q
    finally:
        q.delete_queue()
        q.close()


# ------------------------------------------------------- URLs and options


def test_url_names_project_subscription_and_topic_without_any_network() -> None:
    port = free_port()  # nothing listens there: opening must not connect
    q = leasekit.open(f"gcp-pubsub://my-project/orders-sub?topic=orders&endpoint=127.0.0.1:{port}")
    driver = q.driver
    assert isinstance(driver, PubSubDriver)
    assert driver.subscription == "projects/my-project/subscriptions/orders-sub"
    assert driver.topic == "projects/my-project/topics/orders"
    assert driver._clients is None, "the API clients must be made lazily"
    q.close()


@pytest.mark.parametrize(
    "url",
    [
        "gcp-pubsub://p/s?credentials=abc",
        "gcp-pubsub://p/s?credentials_file=/tmp/key.json",
        "gcp-pubsub://p/a/b",
        "gcp-pubsub://p",
        "gcp-pubsub://p/s?colour=red",
    ],
)
def test_bad_urls_are_refused_before_any_call(url: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        leasekit.open(url)
    assert "abc" not in str(caught.value)


def test_ack_deadline_out_of_range_is_invalid_lease_duration() -> None:
    for bad in (9, 601):
        with pytest.raises(InvalidLeaseDuration):
            leasekit.open("gcp-pubsub://p/s", ack_deadline=bad)


def test_a_credentials_file_that_does_not_exist_is_refused_without_its_path(tmp_path: Any) -> None:
    missing = tmp_path / "secret-key-name.json"
    with pytest.raises(InvalidArgument) as caught:
        leasekit.open("gcp-pubsub://p/s", credentials_file=str(missing))
    assert "secret-key-name" not in str(caught.value)


def test_credentials_never_appear_in_a_repr(tmp_path: Any) -> None:
    key = tmp_path / "key-file-xyz.json"
    key.write_text("{}")
    q = leasekit.open("gcp-pubsub://p/s", credentials_file=str(key))
    assert "key-file-xyz" not in repr(q.driver) and "key-file-xyz" not in repr(vars(q.driver))
    q.close()


def test_lease_duration_beyond_600_seconds_is_refused_before_any_call(queue: Queue) -> None:
    with pytest.raises(InvalidLeaseDuration):
        queue.lease(1, duration=601)


def test_a_message_over_the_publish_limit_is_too_large_before_any_call(queue: Queue) -> None:
    with pytest.raises(MessageTooLarge):
        queue.send(b"x" * 10_000_001)


def test_missing_subscription_and_topic_are_queue_not_found_naming_them(pubsub_server: Any) -> None:
    name = _name()
    q = leasekit.open("gcp-pubsub", queue=name, **_options(pubsub_server))
    with pytest.raises(QueueNotFound, match=f"subscriptions/{name}"):
        q.lease(1, duration=10)
    with pytest.raises(QueueNotFound, match=f"topics/{name}"):
        q.send(b"x")
    q.close()


def test_a_subscription_without_exactly_once_is_refused_when_opened_as_exactly_once(
    pubsub_server: Any,
) -> None:
    name = _name()
    lax = leasekit.open(
        "gcp-pubsub", queue=name, create=True, **_options(pubsub_server, exactly_once=False)
    )
    strict = leasekit.open("gcp-pubsub", queue=name, **_options(pubsub_server))
    try:
        with pytest.raises(InvalidArgument, match="exactly_once=false"):
            strict.lease(1, duration=10)
    finally:
        strict.close()
        lax.delete_queue()
        lax.close()


# ------------------------------------------------------------ batching


def test_renew_and_complete_are_one_call_each_for_a_batch(queue: Queue) -> None:
    queue.send_many([f"m{n}".encode() for n in range(20)])
    leases = queue.lease(20, duration=30, wait=5)
    while len(leases) < 20:
        leases += queue.lease(20 - len(leases), duration=30, wait=5)
    driver = queue.driver
    assert isinstance(driver, PubSubDriver)
    calls: list[int] = []
    original = driver.change_visibility

    def counted(receipts: Any, seconds: float) -> Any:
        calls.append(len(receipts))
        return original(receipts, seconds)

    driver.change_visibility = counted  # type: ignore[method-assign]
    results = queue.renew_many(leases, 60)
    assert calls == [20]
    assert all(r is None for r in results)


def test_a_stale_receipt_fails_alone_in_a_batch(queue: Queue) -> None:
    queue.send_many([b"a", b"b"])
    leases = queue.lease(2, duration=1, wait=5)
    while len(leases) < 2:
        leases += queue.lease(1, duration=1, wait=5)
    again = queue.lease(1, duration=30, wait=10)
    assert again, "an expired lease did not come back"
    stale = next(lease for lease in leases if lease.message.id == again[0].message.id)
    with pytest.raises(LeaseLost):
        stale.complete()
    again[0].complete()


class TestPubSubCheckpointsWithAStore(CheckpointSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(
        cls, pubsub_server: Any, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[UrlHarness]:
        store = leasekit.SqliteCheckpointStore(
            str(tmp_path_factory.mktemp("pubsub") / "checkpoints.db")
        )
        harness = UrlHarness("gcp-pubsub", checkpoint_store=store, **_options(pubsub_server))
        yield harness
        harness.close()
        store.close()
