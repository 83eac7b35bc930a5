"""The Redis / Valkey backend on a real Redis Cluster (``?cluster=1``).

``redis_cluster`` is three Debian redis-server 7.0 masters joined as one cluster
(``tests/_fixtures/redis_cluster.py``). The conformance suite runs on it; the
tests here check what is the cluster's own: queues land on the node serving
their hash tag's slot, a slot moved under a held lease is followed (``MOVED``)
and the lease is still renewed, completed and fenced there, a call made while
the slot migrates is retried (``TRYAGAIN``) within its deadline, dead letters,
redrive, stats and the CLI across slots, and the errors of a URL that does not
match the server.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
from _fixtures.redis_cluster import LocalRedisCluster
from typer.testing import CliRunner

import leasekit
from leasekit import (
    BackendUnavailable,
    InvalidArgument,
    InvalidURL,
    RetryPolicy,
    UnsupportedOperation,
)
from leasekit.cli import app
from leasekit.conformance import AsyncUrlHarness, ConformanceSuite, UrlHarness
from leasekit.deadline import deadline
from leasekit.emulators.redis import LocalRedis
from leasekit.queue import Queue
from leasekit.spi import DriverError, ErrorCode, OutgoingMessage

# --------------------------------------------------------------- conformance


class TestRedisClusterConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, redis_cluster: LocalRedisCluster) -> Iterator[UrlHarness]:
        harness = UrlHarness(redis_cluster.url())
        yield harness
        harness.close()


#: The same suite through asyncio, and on a Valkey cluster (another 25 s each of
#: mostly waiting for leases to lapse), and an automatic failover (a cluster of
#: its own, 6 s): every run holds them (tests/_order.py keeps this module's tests
#: in one worker, so its clusters start once).


class TestRedisClusterConformanceThroughAsyncio(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, redis_cluster: LocalRedisCluster) -> Iterator[AsyncUrlHarness]:
        harness = AsyncUrlHarness(redis_cluster.url())
        yield harness
        harness.close()


class TestValkeyClusterConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls, valkey_cluster: LocalRedisCluster) -> Iterator[UrlHarness]:
        harness = UrlHarness(valkey_cluster.url().replace("redis://", "valkey://"))
        yield harness
        harness.close()


# ------------------------------------------------------------------ helpers


def _slot(name: str) -> int:
    return int(redis.crc.key_slot(f"leasekit:{{{name}}}:messages".encode()))


def _names_on_each_node(cluster: LocalRedisCluster) -> list[str]:
    """One fresh queue name per master, each hashed to a slot that master serves."""
    masters = cluster.masters()
    found: dict[int, str] = {}
    while len(found) < len(masters):
        name = f"c-{uuid.uuid4().hex[:10]}"
        found.setdefault(cluster.owner(_slot(name)), name)
    return [found[i] for i in masters]


def _other_master(cluster: LocalRedisCluster, index: int) -> int:
    return next(m for m in cluster.masters() if m != index)


def _keys_on(cluster: LocalRedisCluster, index: int, name: str) -> set[str]:
    with cluster.client(index) as c:
        return {k.decode() for k in c.keys(f"leasekit:{{{name}}}:*")}


@pytest.fixture(params=["redis", "valkey"])
def cluster(request: pytest.FixtureRequest) -> LocalRedisCluster:
    """Each session cluster in turn."""
    found: LocalRedisCluster = request.getfixturevalue(f"{request.param}_cluster")
    return found


# -------------------------------------------------------------------- layout


def test_queues_with_different_tags_live_on_different_nodes(
    cluster: LocalRedisCluster,
) -> None:
    names = _names_on_each_node(cluster)
    url = cluster.url()  # one seed: the first node
    queues = [leasekit.open(url, queue=name, create=True) for name in names]
    try:
        for q in queues:
            q.send(b"now", ttl=60)
            q.send(b"later", delay=60)
            q.send(b"poison")
            first, second = q.lease(2, duration=30)
            first.checkpoint(b"half")
            second.dead_letter("bad")
        masters = cluster.masters()
        for index, name in zip(masters, names, strict=True):
            # Every key of the queue is on the master serving its slot, on no other master.
            mine = _keys_on(cluster, index, name)
            assert f"leasekit:{{{name}}}:messages" in mine and len(mine) >= 6
            assert all(not _keys_on(cluster, i, name) for i in masters if i != index)
        for q in queues:
            stats = q.stats()
            assert (stats.leased, stats.delayed, stats.dead_lettered) == (1, 1, 1)
            assert q.redrive() == 1
            assert q.stats().visible == 1
    finally:
        for q in queues:
            q.delete_queue()
            q.close()


# ---------------------------------------------------------- slots that move


def test_a_held_lease_is_renewed_completed_and_fenced_after_its_slot_moved(
    cluster: LocalRedisCluster,
) -> None:
    name = f"m-{uuid.uuid4().hex[:10]}"
    slot = _slot(name)
    home = cluster.owner(slot)
    elsewhere = _other_master(cluster, home)
    with leasekit.open(cluster.url(), queue=name, create=True) as q:
        q.send_many([b"one", b"two"])
        one, two = q.lease(2, duration=30)
        cluster.move_slot(slot, elsewhere)
        try:
            assert _keys_on(cluster, home, name) == set()
            # The driver still thinks the old node serves the slot: MOVED, followed.
            with cluster.client(elsewhere) as c:
                before = c.info("commandstats").get("cmdstat_evalsha", {"calls": 0})["calls"]
            one.renew(60)
            with cluster.client(elsewhere) as c:
                after = c.info("commandstats").get("cmdstat_evalsha", {"calls": 0})["calls"]
            assert after > before
            one.complete()
            # Still fenced on the new node: a settled or superseded receipt is refused.
            [stale] = q.driver.delete([one.receipt])
            assert isinstance(stale, DriverError) and stale.code is ErrorCode.LEASE_LOST
            two.abandon()
            [again] = q.lease(1, duration=30)
            assert again.message.body == b"two" and again.message.delivery_count == 2
            [stale] = q.driver.delete([two.receipt])
            assert isinstance(stale, DriverError) and stale.code is ErrorCode.LEASE_LOST
            again.complete()
            assert q.stats().total == 0
        finally:
            q.delete_queue()
            cluster.move_slot(slot, home)


def test_a_call_made_while_its_slot_migrates_is_retried_and_lands(
    cluster: LocalRedisCluster,
) -> None:
    """During the migration the queue's scripts get TRYAGAIN (some keys moved, some not)."""
    name = f"g-{uuid.uuid4().hex[:10]}"
    slot = _slot(name)
    home = cluster.owner(slot)
    elsewhere = _other_master(cluster, home)
    patient = RetryPolicy(attempts=50, base=0.02, cap=0.05)
    with leasekit.open(cluster.url(), queue=name, create=True, retry=patient) as q:
        q.send(b"x")
        [lease] = q.lease(1, duration=30)
        with cluster.client(home) as c:
            tryagain_before = _errors(c, "TRYAGAIN")
        cluster.start_migration(slot, elsewhere)
        cluster.migrate_keys(slot, elsewhere, [f"leasekit:{{{name}}}:messages"])
        done = threading.Event()
        failed: list[BaseException] = []

        def renew() -> None:
            try:
                lease.renew(60)
            except BaseException as exc:  # reported by the test below
                failed.append(exc)
            finally:
                done.set()

        worker = threading.Thread(target=renew)
        worker.start()
        try:
            with cluster.client(home) as c:
                end = time.monotonic() + 10
                while _errors(c, "TRYAGAIN") == tryagain_before and not done.is_set():
                    assert time.monotonic() < end, "the renewal never met the migration"
                    time.sleep(0.005)  # polling the server's error counter, with a deadline
            assert not done.is_set(), f"the renewal ended during the migration: {failed}"
        finally:
            cluster.finish_migration(slot, elsewhere)
            worker.join(10)
        assert done.is_set() and not failed, failed
        assert _keys_on(cluster, elsewhere, name)
        lease.complete()
        assert q.stats().total == 0
        q.delete_queue()
    cluster.move_slot(slot, home)


def _errors(client: redis.Redis, word: str) -> int:
    stats = client.info("errorstats").get(f"errorstat_{word}", {"count": 0})
    return int(stats["count"])


def test_single_key_reads_follow_ask_while_the_slot_migrates(cluster: LocalRedisCluster) -> None:
    """All of the slot's keys moved, the slot not yet handed over: the old node answers ASK."""
    name = f"a-{uuid.uuid4().hex[:10]}"
    slot = _slot(name)
    home = cluster.owner(slot)
    elsewhere = _other_master(cluster, home)
    with leasekit.open(cluster.url(), queue=name, create=True) as q:
        q.send(b"poison")
        [lease] = q.lease(1, duration=30)
        lease.dead_letter("bad")
        cluster.start_migration(slot, elsewhere)
        try:
            cluster.migrate_keys(slot, elsewhere)
            with cluster.client(elsewhere) as c:
                asked = c.info("commandstats").get("cmdstat_asking", {"calls": 0})["calls"]
            [letter] = q.peek_dead_letters()  # TYPE, then XRANGE: each let in by ASKING
            assert letter.body == b"poison" and letter.reason == "bad"
            with cluster.client(elsewhere) as c:
                assert c.info("commandstats")["cmdstat_asking"]["calls"] >= asked + 2
        finally:
            cluster.finish_migration(slot, elsewhere)
        assert q.redrive() == 1
        [back] = q.lease(1, duration=30)
        back.complete()
        q.delete_queue()
    cluster.move_slot(slot, home)


def test_a_held_lease_survives_a_manual_failover_of_its_master(
    redis_cluster: LocalRedisCluster,
) -> None:
    """CLUSTER FAILOVER: the replica takes the slots; the old master answers MOVED."""
    replica = redis_cluster.size  # the first master's replica
    name = next(
        n
        for n in (f"f-{uuid.uuid4().hex[:10]}" for _ in range(1000))
        if redis_cluster.owner(_slot(n)) == 0
    )
    with leasekit.open(redis_cluster.url(), queue=name, create=True) as q:
        q.send_many([b"one", b"two"])
        one, two = q.lease(2, duration=30)
        redis_cluster.failover(replica)
        try:
            assert redis_cluster.owner(_slot(name)) == replica
            assert redis_cluster.role(0) == "slave"
            one.renew(60)
            one.complete()
            [stale] = q.driver.delete([one.receipt])
            assert isinstance(stale, DriverError) and stale.code is ErrorCode.LEASE_LOST
            two.complete()
            assert q.stats().total == 0
            q.delete_queue()
        finally:
            redis_cluster.failover(0, ("TAKEOVER",))


# -------------------------------------------------------- across the slots


def test_cli_send_and_stats_on_a_cluster_url(redis_cluster: LocalRedisCluster) -> None:
    runner = CliRunner()
    for name in _names_on_each_node(redis_cluster):
        url = f"{redis_cluster.url()}&queue={name}"
        result = runner.invoke(app, ["send", url, "hello", "--create"])
        assert result.exit_code == 0, result.output
        stats = runner.invoke(app, ["stats", url])
        assert stats.exit_code == 0, stats.output
        counts = {
            cells[0]: cells[1]
            for line in stats.output.splitlines()
            if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 2
        }
        assert counts["visible"] == "1" and counts["total"] == "1"
        with leasekit.open(url) as q:
            q.delete_queue()


def test_consumers_on_threads_drain_queues_on_every_node(redis_cluster: LocalRedisCluster) -> None:
    """Three consumers at once, each on a queue another node serves."""
    names = _names_on_each_node(redis_cluster)
    handled: Counter[bytes] = Counter()
    lock = threading.Lock()
    completed: list[int] = []

    def handler(message: leasekit.Message) -> None:
        with lock:
            handled[message.body] += 1

    def drain(queue: Queue) -> None:
        consumer = leasekit.Consumer(queue, handler, concurrency=4, handle_signals=False)
        completed.append(consumer.run(until_idle=True).completed)

    queues = [leasekit.open(redis_cluster.url(), queue=name, create=True) for name in names]
    try:
        for name, queue in zip(names, queues, strict=True):
            queue.send_many([b"%s-%d" % (name.encode(), i) for i in range(60)])
        threads = [threading.Thread(target=drain, args=(queue,)) for queue in queues]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert completed == [60, 60, 60]
        assert all(queue.stats().total == 0 for queue in queues)
    finally:
        for queue in queues:
            queue.delete_queue()
            queue.close()
    assert len(handled) == 180 and set(handled.values()) == {1}


# ------------------------------------------------------------------ deadlines


def test_a_hung_node_is_backend_unavailable_within_the_call_timeout(
    redis_cluster: LocalRedisCluster,
) -> None:
    """The queue's node stops answering (SIGSTOP): each call still ends by its deadline."""
    names = _names_on_each_node(redis_cluster)
    index = redis_cluster.masters()[-1]  # not the seed, no replica
    name = names[-1]
    with leasekit.open(redis_cluster.url(), queue=name, create=True, call_timeout=0.5) as q:
        q.send(b"x")
        [lease] = q.lease(1, duration=30)
        pid = redis_cluster.pid(index)
        os.kill(pid, signal.SIGSTOP)
        try:
            for call in (lambda: q.send(b"y"), lambda: lease.renew(30), q.stats):
                start = time.monotonic()
                with pytest.raises(BackendUnavailable):
                    call()
                assert time.monotonic() - start < 1.5
        finally:
            os.kill(pid, signal.SIGCONT)
        # Back: the map is read again (the node did not answer) and the lease still holds.
        lease.renew(30)
        lease.complete()
        q.delete_queue()


def test_once_the_seed_fails_the_map_is_read_from_another_node(
    redis_cluster: LocalRedisCluster,
) -> None:
    """The seed hangs: a call on its queue times out, and the map is then read elsewhere."""
    seed_queue, other_queue = _names_on_each_node(redis_cluster)[:2]
    assert redis_cluster.owner(_slot(seed_queue)) == 0  # the seed serves the first queue
    with leasekit.open(redis_cluster.url(), queue=seed_queue, create=True) as q:
        driver = q.driver
        other = driver.sibling(other_queue)
        with deadline(5):
            other.create_queue()
        pid = redis_cluster.pid(0)
        os.kill(pid, signal.SIGSTOP)
        try:
            with deadline(0.3), pytest.raises(redis.exceptions.TimeoutError):
                driver.send([OutgoingMessage(b"x")])
            # The map must be read again (a node failed); the seed is asked last now.
            start = time.monotonic()
            with deadline(2.0):
                [sent] = other.send([OutgoingMessage(b"y")])
            assert isinstance(sent, str)
            assert time.monotonic() - start < 1.0  # not the 2 s a hung seed would take
        finally:
            os.kill(pid, signal.SIGCONT)
        with deadline(5):
            other.delete_queue()
        q.delete_queue()


def test_calls_reach_the_promoted_replica_after_a_master_dies() -> None:
    """SIGKILL of a master (the seed): its replica is promoted, and the held lease goes on."""
    with LocalRedisCluster("redis", replicas=1, node_timeout=1000) as cluster:
        replica = cluster.size
        name = next(
            n
            for n in (f"d-{uuid.uuid4().hex[:10]}" for _ in range(1000))
            if cluster.owner(_slot(n)) == 0
        )
        patient = RetryPolicy(attempts=200, base=0.05, cap=0.2)
        with leasekit.open(
            cluster.url(), queue=name, create=True, retry=patient, call_timeout=30
        ) as q:
            q.send_many([b"one", b"two"])
            one, two = q.lease(2, duration=60)
            end = time.monotonic() + 10
            while not cluster.synced(replica):  # (else the kill may lose the lease's writes)
                assert time.monotonic() < end, "the replica did not catch up"
                time.sleep(0.01)
            cluster.nodes[0].kill()
            one.renew(60)  # retried (connection refused, CLUSTERDOWN) until the promotion
            assert cluster.role(replica) == "master"
            one.complete()
            two.complete()
            assert q.stats().total == 0


def test_a_seed_nobody_listens_on_is_backend_unavailable_within_the_call_timeout() -> None:
    port = LocalRedis("redis").port  # nothing listens there
    with leasekit.open(f"redis://127.0.0.1:{port}/?cluster=1", queue="gone", call_timeout=0.5) as q:
        start = time.monotonic()
        with pytest.raises(BackendUnavailable):
            q.send(b"x")
        assert time.monotonic() - start < 3


# -------------------------------------------------------------------- errors


def test_cluster_replies_are_classified() -> None:
    """The SDK's own exception objects, as redis-py raises them for a cluster's replies."""
    driver = leasekit.open("redis://127.0.0.1:1/?cluster=1&queue=classify").driver
    down = redis.exceptions.ClusterDownError("The cluster is down")
    again = redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot")
    master = redis.exceptions.MasterDownError("Link with MASTER is down")
    for exc, word in ((down, "CLUSTERDOWN"), (again, "TRYAGAIN"), (master, "MASTERDOWN")):
        assert driver.error_code(exc) is ErrorCode.UNAVAILABLE and driver.is_retryable(exc)
        assert driver.backend_code(exc) == word
    resharding = DriverError(ErrorCode.UNAVAILABLE, "redirected 5 times", backend_code="MOVED")
    assert driver.is_retryable(resharding)
    driver.close()


def test_a_cluster_node_without_cluster_1_is_unsupported_with_a_hint(
    redis_cluster: LocalRedisCluster,
) -> None:
    node = redis_cluster.nodes[0]
    name = next(
        n
        for n in (f"u-{uuid.uuid4().hex[:10]}" for _ in range(1000))
        if redis_cluster.owner(_slot(n)) != 0
    )
    with leasekit.open(node.url(), queue=name) as q:
        with pytest.raises(UnsupportedOperation) as info:
            q.send(b"x")
        assert "cluster=1" in str(info.value)


def test_cluster_1_on_a_server_that_is_not_a_cluster_is_invalid_argument(
    redis_server: LocalRedis,
) -> None:
    with leasekit.open(f"{redis_server.url()}?cluster=1", queue="nc") as q:
        with pytest.raises(InvalidArgument) as info:
            q.send(b"x")
        assert "cluster" in str(info.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis://127.0.0.1:1/3?queue=q&cluster=1", "database 0"),
        ("redis://127.0.0.1:1/?queue=q&cluster=maybe", "cluster must be 1 or 0"),
    ],
)
def test_bad_cluster_urls_are_refused_at_open(url: str, words: str) -> None:
    with pytest.raises(InvalidURL) as info:
        leasekit.open(url)
    assert words in str(info.value)
