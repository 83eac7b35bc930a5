"""The streaming source: rows, completion on commit, heartbeat, and at-least-once on failure."""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import leasekit
from leasekit.plugins.spark.source import LeasedPartition, LeasekitStreamReader, source_schema
from leasekit.spi import QueueStats

pytestmark = pytest.mark.spark

DEADLINE = 60.0


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path}/q.db?queue=jobs"
    with leasekit.open(url, create=True):
        pass
    yield url


def _stream(spark: Any, url: str, **options: str) -> Any:
    reader = spark.readStream.format("leasekit").option("url", url)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _until(query: Any, done: Callable[[], bool], deadline: float = DEADLINE) -> None:
    """Run the query until ``done()`` (messages may still be coming back from lapsed leases)."""
    end = time.monotonic() + deadline
    while True:
        query.processAllAvailable()
        if done():
            return
        assert time.monotonic() < end, "the stream did not deliver everything in time"
        query.awaitTermination(0.2)  # a poll interval that also surfaces a failure


def _settled(queue: leasekit.Queue) -> bool:
    stats = queue.stats()
    return stats.visible == 0 and stats.leased == 0


# ----------------------------------------------------------- with Spark


def test_stream_delivers_rows_and_completes_them_after_commit(
    spark: Any, sqlite_url: str, tmp_path: Path
) -> None:
    with leasekit.open(sqlite_url) as queue:
        ids = queue.send_many([b"\x00\xffbinary", b""], properties={"k": "v"})
        ids += queue.send_many([f"m{i}".encode() for i in range(23)])
        batches: list[list[Any]] = []

        def collect(df: Any, batch_id: int) -> None:
            batches.append(df.collect())

        df = _stream(spark, sqlite_url, maxMessagesPerBatch="10", numPartitions="3")
        assert df.schema.simpleString() == (
            "struct<id:string,body:binary,delivery_count:int,enqueued_at:timestamp,"
            "properties:map<string,string>>"
        )
        query = (
            df.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .start()
        )
        try:
            _until(query, lambda: _settled(queue))
        finally:
            query.stop()
    rows = [row for batch in batches for row in batch]
    assert sorted(r.id for r in rows) == sorted(ids)  # each once: no failure, no duplicate
    assert max(len(batch) for batch in batches) == 10
    first = {r.id: r for r in rows}
    assert first[ids[0]].body == b"\x00\xffbinary" and first[ids[0]].properties == {"k": "v"}
    assert first[ids[1]].body == b"" and first[ids[2]].properties == {}
    assert {r.delivery_count for r in rows} == {1}
    # The last batch was committed on an idle queue: the heartbeat batch is empty.
    assert batches[-1] == []


@pytest.mark.parametrize("release", ["released", "lapsed"])
def test_failed_batch_comes_back_after_restart_and_none_is_lost(
    spark: Any, sqlite_url: str, tmp_path: Path, release: str
) -> None:
    """At least once: a foreachBatch fails mid-stream; the restarted query delivers all."""
    checkpoint = str(tmp_path / "ckpt")
    # Released: the stopped planner abandons its leases, so even 30 s leases come back
    # at once. Lapsed (as if the planner were killed): nobody abandons; 2 s leases lapse.
    options = {"maxMessagesPerBatch": "10", "leaseDuration": "30"}
    if release == "lapsed":
        options.update(releaseOnStop="false", leaseDuration="2")
    with leasekit.open(sqlite_url) as queue:
        ids = set(queue.send_many([f"job-{i}".encode() for i in range(40)]))
        done: dict[str, int] = {}
        failed: list[str] = []
        replayed: list[tuple[int, int]] = []

        def fail_batch_2(df: Any, batch_id: int) -> None:
            rows = df.collect()
            if batch_id == 2:
                failed.extend(r.id for r in rows)
                raise RuntimeError("boom in batch 2")
            for r in rows:
                done[r.id] = max(done.get(r.id, 0), r.delivery_count)

        query = (
            _stream(spark, sqlite_url, **options)
            .writeStream.foreachBatch(fail_batch_2)
            .option("checkpointLocation", checkpoint)
            .start()
        )
        with pytest.raises(Exception, match="boom in batch 2"):
            query.awaitTermination(DEADLINE)
        assert len(failed) == 10 and not (set(failed) & set(done))
        if release == "released":
            # The planner process is terminated asynchronously: poll, well inside 30 s.
            end = time.monotonic() + 10
            while queue.stats().leased and time.monotonic() < end:
                time.sleep(0.05)  # poll interval
            assert queue.stats() == QueueStats(
                visible=20, leased=0, delayed=0, dead_lettered=0, total=20
            )
        else:
            # Still leased (the failed batch, and maybe the prefetched next one): they
            # come back when the leases lapse.
            assert queue.stats().leased in (10, 20)

        def record(df: Any, batch_id: int) -> None:
            rows = df.collect()
            if batch_id == 2:
                replayed.append((batch_id, len(rows)))
            for r in rows:
                done[r.id] = max(done.get(r.id, 0), r.delivery_count)

        query = (
            _stream(spark, sqlite_url, **options)
            .writeStream.foreachBatch(record)
            .option("checkpointLocation", checkpoint)
            .start()
        )
        try:
            _until(query, lambda: set(done) == ids and _settled(queue))
        finally:
            query.stop()
    assert set(done) == ids  # every message delivered in a successful batch; none lost
    assert all(done[i] >= 2 for i in failed)  # the failed batch's messages came back
    # The failed batch was re-planned by a process that held none of its leases: empty.
    assert replayed == [(2, 0)]


def test_stream_from_aws_sqs_completes_everything(
    spark: Any, moto_server: Any, tmp_path: Path
) -> None:
    name = f"spark-{uuid.uuid4().hex[:10]}"
    queue = leasekit.open("aws-sqs", queue=name, create=True, **moto_server.options)
    try:
        ids = set(queue.send_many([f"sqs-{i}".encode() for i in range(25)]))
        seen: list[str] = []
        options = {f"backend.{k}": str(v) for k, v in moto_server.options.items() if k != "region"}
        query = (
            _stream(
                spark,
                f"aws-sqs://{moto_server.region}/{name}",
                maxMessagesPerBatch="10",
                leaseDuration="20",
                **options,
            )
            .writeStream.foreachBatch(lambda df, _: seen.extend(r.id for r in df.collect()))
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .start()
        )
        try:
            _until(query, lambda: set(seen) == ids and _settled(queue))
        finally:
            query.stop()
        assert sorted(seen) == sorted(ids)
    finally:
        queue.delete_queue()
        queue.close()


# ------------------------------------------------- the reader, without Spark


def _reader(url: str, **options: str) -> LeasekitStreamReader:
    return LeasekitStreamReader(source_schema(), {"url": url, **options})


def _flush(reader: LeasekitStreamReader) -> None:
    assert reader._planner is not None
    reader._planner.background.submit(lambda: None).result()


def test_reader_offsets_heartbeat_commit_and_unknown_batches() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    url = f"memory://spark-{uuid.uuid4().hex[:8]}"
    with leasekit.open(url, create=True) as queue:
        queue.send_many([f"m{i}".encode() for i in range(5)])
        reader = _reader(url, maxMessagesPerBatch="3", numPartitions="2")
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadMaxRows(3))
        assert end["seq"] == 1 and end["messages"] == 3
        assert reader.latestOffset(start, ReadMaxRows(3)) == end  # same batch, no more leased
        parts = reader.partitions(start, end)
        assert [len(p) for p in parts] == [2, 1]
        # The reader and its partitions pickle without the leases, keeper or queue.
        clone = pickle.loads(pickle.dumps(reader))
        assert clone._planner is None
        rows = [pickle.loads(pickle.dumps(p)) for p in parts]
        batch = next(iter(clone.read(rows[0])))
        assert batch.num_rows == 2 and batch.column("body").to_pylist() == [b"m0", b"m1"]
        # Next batch: the 2 remaining messages (ReadAllAvailable still leases one batch).
        end2 = reader.latestOffset(end, ReadAllAvailable())
        assert end2["seq"] == 2 and end2["messages"] == 5
        reader.partitions(end, end2)
        reader.commit(end)  # batch 1's output committed: its 3 messages completed
        _flush(reader)  # (in the background, overlapping the next batch)
        assert queue.stats().leased == 2
        # Idle with batch 2 uncommitted: one heartbeat, then nothing new.
        beat = reader.latestOffset(end2, ReadMaxRows(3))
        assert beat["seq"] == 3 and beat["messages"] == 5
        assert reader.partitions(end2, beat) == []
        reader.commit(end2)
        _flush(reader)
        assert reader.latestOffset(beat, ReadMaxRows(3)) == beat
        assert queue.stats().visible == 0 and queue.stats().leased == 0
        # A batch leased by another (gone) planner process is replayed empty.
        other = {"run": "gone", "seq": 4, "messages": 9}
        assert reader.partitions(beat, other) == []
        reader.commit(other)  # nothing held: a no-op
        reader.stop()


def test_reader_stop_releases_uncommitted_leases() -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    url = f"memory://spark-{uuid.uuid4().hex[:8]}"
    with leasekit.open(url, create=True) as queue:
        queue.send_many([b"a", b"b"])
        reader = _reader(url)
        start = reader.initialOffset()
        reader.partitions(start, reader.latestOffset(start, ReadMaxRows(10)))
        assert queue.stats().leased == 2
        reader.stop()
        assert queue.stats().visible == 2
        again = queue.lease(2)
        assert {lz.message.delivery_count for lz in again} == {2}


def test_partition_to_arrow_matches_spark_schema() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    url = f"memory://spark-{uuid.uuid4().hex[:8]}"
    with leasekit.open(url, create=True) as queue:
        queue.send(b"x", properties={"a": "1"})
        (lease,) = queue.lease(1)
        part = LeasedPartition(1, 0)
        part.append(lease)
        schema = to_arrow_schema(source_schema(), timezone="UTC")
        batch = part.to_arrow(schema)
        assert batch.schema.equals(schema)
        assert batch.column("properties").to_pylist() == [[("a", "1")]]
        assert "messages=1" in repr(part)


def test_reader_needs_a_url() -> None:
    with pytest.raises(leasekit.InvalidArgument, match="url"):
        LeasekitStreamReader(None, {})  # type: ignore[arg-type]


def test_importing_leasekit_and_the_plugin_package_does_not_import_pyspark() -> None:
    import subprocess
    import sys

    code = (
        "import sys, leasekit, leasekit.plugins.spark as s\n"
        "assert 'pyspark' not in sys.modules, 'pyspark imported'\n"
        "assert callable(s.register)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_reader_refuses_another_schema() -> None:
    from pyspark.sql.types import IntegerType, StructField, StructType

    with pytest.raises(leasekit.InvalidArgument, match="schema is fixed"):
        LeasekitStreamReader(StructType([StructField("x", IntegerType())]), {"url": "memory://x"})


def test_plugin_exports_resolve() -> None:
    import leasekit.plugins.spark as plugin

    assert len(set(plugin.__all__)) == len(plugin.__all__)  # (order: ruff's RUF022)
    for name in plugin.__all__:
        assert getattr(plugin, name) is not None
