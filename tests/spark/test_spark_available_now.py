"""``Trigger.AvailableNow``: a run takes the messages visible when it starts, then stops.

With Spark (a real ``local[2]`` session, a ``sqlite://`` queue) and, for the
bound's bookkeeping, the reader alone on ``memory://``.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import leasekit
from leasekit.clock import to_datetime
from leasekit.plugins.spark.source import AvailableNowBound, LeasekitStreamReader, source_schema
from leasekit.spi import QueueStats

pytestmark = pytest.mark.spark

DEADLINE = 60.0


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path}/q.db?queue=jobs"
    with leasekit.open(url, create=True):
        pass
    yield url


def _available_now(
    spark: Any, url: str, checkpoint: str, each_batch: Callable[[Any, int], None], **options: str
) -> Any:
    """Start a ``trigger(availableNow=True)`` query on the leasekit source."""
    reader = spark.readStream.format("leasekit").option("url", url)
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.foreachBatch(each_batch)
        .trigger(availableNow=True)
        .option("checkpointLocation", checkpoint)
        .start()
    )


def _poll(done: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not done():
        assert time.monotonic() < end, f"timed out waiting until {what}"
        time.sleep(0.05)  # poll interval


# ----------------------------------------------------------- with Spark


def test_available_now_takes_the_messages_present_at_start_and_stops_by_itself(
    spark: Any, sqlite_url: str, tmp_path: Path
) -> None:
    with leasekit.open(sqlite_url) as queue:
        present = queue.send_many([f"present-{i}".encode() for i in range(25)])
        late: list[str] = []
        batches: list[list[str]] = []

        def collect(df: Any, batch_id: int) -> None:
            batches.append([r.id for r in df.collect()])
            if len(batches) == 1:  # the run has begun: these are sent after its start
                late.extend(queue.send_many([f"late-{i}".encode() for i in range(5)]))

        query = _available_now(
            spark, sqlite_url, str(tmp_path / "ckpt"), collect, maxMessagesPerBatch="10"
        )
        try:
            assert query.awaitTermination(DEADLINE), "the AvailableNow run did not stop by itself"
        finally:
            query.stop()
        assert query.exception() is None
        # Three batches of the 25, then the empty heartbeat that commits the last one.
        assert [len(b) for b in batches] == [10, 10, 5, 0]
        delivered = Counter(i for b in batches for i in b)
        assert sorted(delivered) == sorted(present) and set(delivered.values()) == {1}
        # Every present message completed; the late ones remain, never leased.
        _poll(lambda: queue.stats().leased == 0, "the planner let go of everything")
        assert queue.stats() == QueueStats(visible=5, leased=0, delayed=0, dead_lettered=0, total=5)
        remaining = queue.lease(10)
        assert sorted(lz.message.id for lz in remaining) == sorted(late)
        assert {lz.message.delivery_count for lz in remaining} == {1}


@pytest.mark.parametrize("release", ["released", "lapsed"])
def test_available_now_run_that_crashes_then_restarts_delivers_every_message_once(
    spark: Any, sqlite_url: str, tmp_path: Path, release: str
) -> None:
    """A run fails in batch 2; the next run (same checkpoint) delivers the rest, none twice."""
    checkpoint = str(tmp_path / "ckpt")
    # Released: the stopped planner abandons its leases (30 s) at once. Lapsed (as if the
    # planner were killed): nobody abandons; the next run starts once the 2 s leases lapsed.
    options = {"maxMessagesPerBatch": "10", "leaseDuration": "30"}
    if release == "lapsed":
        options.update(releaseOnStop="false", leaseDuration="2")
    with leasekit.open(sqlite_url) as queue:
        first = set(queue.send_many([f"job-{i}".encode() for i in range(40)]))
        delivered: Counter[str] = Counter()  # in batches whose foreachBatch succeeded
        failed: list[str] = []
        replayed: list[int] = []

        def fail_batch_2(df: Any, batch_id: int) -> None:
            rows = df.collect()
            if batch_id == 2:
                failed.extend(r.id for r in rows)
                raise RuntimeError("boom in batch 2")
            delivered.update(r.id for r in rows)

        query = _available_now(spark, sqlite_url, checkpoint, fail_batch_2, **options)
        with pytest.raises(Exception, match="boom in batch 2"):
            query.awaitTermination(DEADLINE)
        assert len(failed) == 10 and not set(failed) & set(delivered)
        assert sum(delivered.values()) == 20
        # Batches 0 and 1 were completed; the failed batch 2 and the prefetched batch 3
        # come back (released at once, or when their leases lapse).
        _poll(lambda: queue.stats().leased == 0, "the failed run's leases were released")
        assert queue.stats() == QueueStats(
            visible=20, leased=0, delayed=0, dead_lettered=0, total=20
        )
        between = set(queue.send_many([f"between-{i}".encode() for i in range(5)]))

        def record(df: Any, batch_id: int) -> None:
            rows = df.collect()
            if batch_id == 2:
                replayed.append(len(rows))
            delivered.update(r.id for r in rows)

        query = _available_now(spark, sqlite_url, checkpoint, record, **options)
        try:
            assert query.awaitTermination(DEADLINE), "the restarted run did not stop by itself"
        finally:
            query.stop()
        assert query.exception() is None
    # The failed batch was re-planned by a process that held none of its leases: empty.
    assert replayed == [0]
    # No message lost, none delivered twice by a successful batch.
    assert set(delivered) == first | between
    assert set(delivered.values()) == {1}
    with leasekit.open(sqlite_url) as queue:
        _poll(lambda: queue.stats().total == 0, "the restarted run completed everything")


# ------------------------------------------------- the reader, without Spark


def _reader(url: str, **options: str) -> LeasekitStreamReader:
    return LeasekitStreamReader(source_schema(), {"url": url, **options})


def _flush(reader: LeasekitStreamReader) -> None:
    assert reader._planner is not None
    reader._planner.background.submit(lambda: None).result()


def test_reader_bound_stops_at_the_count_visible_at_prepare() -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    url = f"memory://spark-{uuid.uuid4().hex[:8]}"
    with leasekit.open(url, create=True) as queue:
        queue.send_many([f"m{i}".encode() for i in range(5)])
        reader = _reader(url, maxMessagesPerBatch="3", prefetch="false")
        reader.prepareForTriggerAvailableNow()
        late = set(queue.send_many([b"late-1", b"late-2", b"late-3"]))
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadMaxRows(3))
        assert end["messages"] == 3
        reader.partitions(start, end)
        end2 = reader.latestOffset(end, ReadMaxRows(3))
        assert end2["messages"] == 5  # 2 more: the 5 visible at prepare, not the late ones
        reader.partitions(end, end2)
        reader.commit(end)
        # The bound is spent: a heartbeat commits batch 2, then the run is over.
        beat = reader.latestOffset(end2, ReadMaxRows(3))
        assert beat["seq"] == end2["seq"] + 1 and beat["messages"] == 5
        reader.partitions(end2, beat)
        reader.commit(end2)
        _flush(reader)
        assert reader.latestOffset(beat, ReadMaxRows(3)) == beat
        assert queue.stats().visible == 3 and queue.stats().leased == 0
        reader.stop()
        rest = queue.lease(10)
        assert {lz.message.id for lz in rest} == late
        assert {lz.message.delivery_count for lz in rest} == {1}  # never received by the run


def test_reader_bound_gives_back_messages_sent_after_prepare() -> None:
    """Another consumer took part of the snapshot: the count reaches later sends, given back."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    url = f"memory://spark-{uuid.uuid4().hex[:8]}"
    with leasekit.open(url, create=True) as queue:
        present = queue.send_many([f"m{i}".encode() for i in range(5)])
        reader = _reader(url, maxMessagesPerBatch="10", prefetch="false")
        reader.prepareForTriggerAvailableNow()
        other = queue.lease(2, duration=60)  # a competing consumer
        late = set(queue.send_many([b"late-1", b"late-2", b"late-3"]))
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadMaxRows(10))
        # 5 received (the count at prepare): 3 inside the bound, 2 late ones given back.
        assert end["messages"] == 3
        parts = reader.partitions(start, end)
        assert [i for part in parts for i in part.ids] == present[2:]
        assert reader._planner is not None and reader._planner.bound is not None
        assert reader._planner.bound.released == 2 and reader._planner.bound.done
        assert queue.stats().visible == 3 and queue.stats().leased == 5
        beat = reader.latestOffset(end, ReadMaxRows(10))
        reader.commit(end)
        reader.partitions(end, beat)
        assert reader.latestOffset(beat, ReadMaxRows(10)) == beat
        reader.stop()
        rest = queue.lease(10)
        assert {lz.message.id for lz in rest} == late
        # Two were received (and given back) once, one never.
        assert sorted(lz.message.delivery_count for lz in rest) == [1, 2, 2]
        queue.complete_many([*other, *rest])


def test_bound_without_a_count_stops_at_the_first_receive_with_nothing_inside() -> None:
    clock = leasekit.ManualClock()
    with leasekit.open("memory", queue=f"spark-{uuid.uuid4().hex[:8]}", clock=clock) as queue:
        queue.create()
        queue.send_many([b"a", b"b"])
        bound = AvailableNowBound(to_datetime(clock.time()), None)
        clock.advance(1)
        queue.send_many([b"c"])
        assert bound.allow(1000) == 1000
        inside, beyond = bound.split(queue.lease(2))
        assert [lz.message.body for lz in inside] == [b"a", b"b"] and beyond == []
        assert not bound.done
        inside, beyond = bound.split(queue.lease(2))
        assert inside == [] and [lz.message.body for lz in beyond] == [b"c"]
        assert bound.done and bound.allow(1000) == 0
