"""Checkpoints on the cloud backends.

Azure Storage Queue keeps them natively (its conformance class runs the checkpoint
section); here: the text Update Message writes, and that a checkpoint costs the
one call the renewal it replaces would. Service Bus, MNS and SQS keep none: the
checkpoint section runs on each with a :class:`leasekit.SqliteCheckpointStore`,
and without one ``checkpoint()`` names the ``checkpoint_store`` option.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures.azurite import Azurite

import leasekit
from leasekit.conformance import AsyncUrlHarness, CheckpointSuite, CountingDriver, UrlHarness

AZURE = "azure-storage-queue"
#: Service Bus's lock duration on the emulator (its lease is fixed by the queue).
SB_LOCK = 2.0


def _store(factory: pytest.TempPathFactory, name: str) -> leasekit.SqliteCheckpointStore:
    return leasekit.SqliteCheckpointStore(str(factory.mktemp(name) / "checkpoints.db"))


# ------------------------------------------------- the section, with a store


class TestSqsCheckpointsWithAStore(CheckpointSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, moto_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        pytest.importorskip("boto3")
        store = _store(tmp_path_factory, "sqs")
        harness = UrlHarness("aws-sqs", checkpoint_store=store, **moto_server.options)
        yield harness
        harness.close()
        store.close()


class TestMnsCheckpointsWithAStore(CheckpointSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, mns_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        pytest.importorskip("mns")
        store = _store(tmp_path_factory, "mns")
        harness = UrlHarness(
            "aliyun-mns",
            endpoint=mns_server.endpoint,
            access_key_id=mns_server.access_key_id,
            access_key_secret=mns_server.access_key_secret,
            checkpoint_store=store,
        )
        yield harness
        harness.close()
        store.close()


class TestMnsCheckpointsWithAStoreThroughAsyncio(CheckpointSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, mns_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        pytest.importorskip("mns")
        store = _store(tmp_path_factory, "mns-aio")
        harness = AsyncUrlHarness(
            "aliyun-mns",
            endpoint=mns_server.endpoint,
            access_key_id=mns_server.access_key_id,
            access_key_secret=mns_server.access_key_secret,
            checkpoint_store=store,
        )
        yield harness
        harness.close()
        store.close()


class TestServiceBusCheckpointsWithAStore(CheckpointSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(
        cls, servicebus_server: Any, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Any]:
        pytest.importorskip("azure.servicebus")
        pytest.importorskip("proton")
        store = _store(tmp_path_factory, "sb")
        harness = UrlHarness(
            "azure-service-bus",
            connection_string=servicebus_server.connection_string,
            lock_duration=SB_LOCK,
            admin_port=servicebus_server.http_port,
            checkpoint_store=store,
        )
        yield harness
        harness.close()
        store.close()


def test_without_a_store_checkpoint_names_the_option(mns_server: Any) -> None:
    pytest.importorskip("mns")
    queue = leasekit.open(
        "aliyun-mns",
        queue=f"lk-cp-{secrets.token_hex(3)}",
        endpoint=mns_server.endpoint,
        access_key_id=mns_server.access_key_id,
        access_key_secret=mns_server.access_key_secret,
        create=True,
    )
    try:
        assert not queue.capabilities.native_checkpoint and not queue.can_checkpoint
        queue.send(b"x")
        [lease] = queue.lease(1, duration=30, wait=5)
        counter = CountingDriver.install(queue.driver)
        try:
            with pytest.raises(leasekit.UnsupportedOperation, match="checkpoint_store"):
                lease.checkpoint(b"progress")
        finally:
            counter.uninstall()
        assert counter.calls == []
        lease.complete()
    finally:
        queue.delete_queue()
        queue.close()


# ------------------------------------------------ Azure Storage Queue, native


@pytest.fixture
def azure_queue(azurite: Azurite) -> Iterator[leasekit.Queue]:
    pytest.importorskip("azure.storage.queue")
    queue = leasekit.open(
        AZURE,
        queue=f"lk-cp-{secrets.token_hex(4)}",
        connection_string=azurite.connection_string,
        create=True,
    )
    try:
        yield queue
    finally:
        queue.delete_queue()
        queue.close()


def test_azure_checkpoint_is_one_update_message_and_no_other_call(
    azure_queue: leasekit.Queue,
) -> None:
    assert azure_queue.capabilities.native_checkpoint
    azure_queue.send(b"x")
    [lease] = azure_queue.lease(1, duration=30, wait=5)
    before = lease.receipt
    counter = CountingDriver.install(azure_queue.driver)
    try:
        lease.checkpoint(b"progress")
    finally:
        counter.uninstall()
    assert counter.calls == ["checkpoint"]
    assert lease.receipt != before  # Update Message rotated the pop receipt: core tracks it
    lease.complete()


def test_azure_checkpoint_rewrites_the_text_as_an_envelope_other_consumers_read(
    azure_queue: leasekit.Queue,
) -> None:
    from leasekit.backends.azure_storage_queue import decode_message

    azure_queue.send(b"\x00body", properties={"k": "v"})
    [lease] = azure_queue.lease(1, duration=1, wait=5)
    lease.checkpoint(b"half")
    [again] = azure_queue.lease(1, duration=30, wait=10)
    text = again.raw.content
    envelope = json.loads(text)
    assert envelope["leasekit"] == 1 and envelope["properties"] == {"k": "v"}
    assert base64.b64decode(envelope["body"]) == b"\x00body"
    assert base64.b64decode(envelope["checkpoint"]) == b"half"
    assert decode_message(text) == (b"\x00body", {"k": "v"})  # a reader that knows no checkpoint
    assert again.message.checkpoint == b"half"
    again.complete()


def test_azure_checkpoint_that_does_not_fit_the_text_is_refused_without_a_call(
    azure_queue: leasekit.Queue,
) -> None:
    azure_queue.send(b"x" * 30_000)
    [lease] = azure_queue.lease(1, duration=30, wait=5)
    receipt = lease.receipt
    with pytest.raises(leasekit.MessageTooLarge):
        lease.checkpoint(b"y" * 30_000)
    assert lease.state is leasekit.LeaseState.HELD and lease.receipt == receipt
    lease.checkpoint(b"y" * 10)  # the lease was given back unchanged
    lease.complete()


def test_sqlite_store_keeps_the_latest_generation(tmp_path: Path) -> None:
    store = leasekit.SqliteCheckpointStore(str(tmp_path / "cp.db"), namespace="q")
    other = leasekit.SqliteCheckpointStore(str(tmp_path / "cp.db"), namespace="other")
    try:
        assert store.save("m", b"one", 1)
        assert store.save("m", b"two", 2)
        assert not store.save("m", b"stale", 1)
        assert store.save("m", b"two-again", 2)
        assert store.load("m") == b"two-again"
        assert other.load("m") is None
        store.discard("m")
        assert store.load("m") is None and store.count() == 0
    finally:
        store.close()
        other.close()
