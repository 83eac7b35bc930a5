"""The Consumer: completes, retries, dead-letters poison, skips duplicates, stops cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import leasekit
from leasekit import errors
from leasekit.queue import Queue
from leasekit.spi import DriverError, ErrorCode


@pytest.fixture
def queue() -> Queue:
    q = leasekit.open("memory", queue=f"consumer-{time.monotonic_ns()}", create=True)
    yield q
    q.delete_queue()
    q.close()


def test_every_message_is_handled_and_completed(queue: Queue) -> None:
    queue.send_many([b"%d" % i for i in range(50)])
    seen: list[bytes] = []
    lock = threading.Lock()

    def handler(message: leasekit.Message) -> None:
        with lock:
            seen.append(message.body)

    stats = leasekit.Consumer(queue, handler, concurrency=4, lease_duration=5).run(until_idle=True)
    assert sorted(seen) == sorted(b"%d" % i for i in range(50))
    assert stats.completed == 50 and stats.in_flight == 0
    assert queue.stats().visible == 0 and queue.stats().leased == 0


def test_a_failing_handler_is_retried_then_dead_lettered_as_poison(queue: Queue) -> None:
    queue.send(b"poison")
    calls: list[int] = []

    def handler(message: leasekit.Message) -> None:
        calls.append(message.delivery_count)
        raise ValueError("cannot parse")

    stats = leasekit.Consumer(
        queue, handler, lease_duration=5, max_deliveries=3, backoff_base=0.01
    ).run(until_idle=True)
    assert calls == [1, 2, 3]
    assert stats.failed == 3 and stats.dead_lettered == 1
    [letter] = queue.peek_dead_letters()
    assert "max_deliveries is 3" in (letter.reason or "")


def test_abandon_delay_backs_off_exponentially(queue: Queue) -> None:
    from leasekit.worker_policy import abandon_delay

    consumer = leasekit.Consumer(queue, lambda m: None, backoff_base=2, backoff_max=30)
    delays = [abandon_delay(n, consumer.settings, queue.capabilities) for n in (1, 2, 3, 6)]
    assert delays == [2, 4, 8, 30]


def test_a_handler_slower_than_the_lease_finishes_without_a_stale_receipt(queue: Queue) -> None:
    queue.send_many([b"slow-1", b"slow-2"])

    def handler(message: leasekit.Message) -> None:
        time.sleep(1.0)

    stats = leasekit.Consumer(queue, handler, concurrency=2, lease_duration=0.3).run(
        until_idle=True
    )
    assert stats.completed == 2
    assert stats.stale_on_complete == 0 and stats.lost == 0


def test_idempotency_store_suppresses_an_already_processed_message(queue: Queue) -> None:
    store = leasekit.MemoryIdempotencyStore()
    message_id = queue.send(b"once")
    store.record(message_id)  # as if a worker died after recording, before completing
    calls: list[str] = []
    stats = leasekit.Consumer(queue, lambda m: calls.append(m.id), idempotency=store).run(
        until_idle=True
    )
    assert calls == []
    assert stats.duplicates_skipped == 1
    assert queue.stats().visible == 0


def test_ids_are_recorded_only_after_the_handler_succeeded(queue: Queue, tmp_path: Path) -> None:
    store = leasekit.SqliteIdempotencyStore(str(tmp_path / "ids.db"))
    ok, bad = queue.send(b"ok"), queue.send(b"bad")

    def handler(message: leasekit.Message) -> None:
        if message.body == b"bad":
            raise RuntimeError("no")

    leasekit.Consumer(queue, handler, idempotency=store, max_deliveries=1, backoff_base=0).run(
        until_idle=True
    )
    assert store.seen(ok) and not store.seen(bad)
    store.close()


def test_adaptive_policy_follows_processing_times_and_stale_receipts() -> None:
    policy = leasekit.AdaptiveLeaseDuration(minimum=1, maximum=60)
    for _ in range(100):
        policy.observe(4.0)
    assert policy.current() == pytest.approx(4.8)
    policy.stale()
    policy.stale()
    policy.stale()
    assert policy.current() == 8.0
    assert policy.figures()["stale_seen"] == 3


def test_adaptive_policy_figures_show_in_consumer_stats(queue: Queue) -> None:
    queue.send(b"x")
    policy = leasekit.AdaptiveLeaseDuration(minimum=1, maximum=10)
    stats = leasekit.Consumer(queue, lambda m: None, duration_policy=policy).run(until_idle=True)
    assert stats.lease_duration["samples"] == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"handler": "not callable"},
        {"concurrency": 0},
        {"concurrency": 1.5},
        {"max_deliveries": 0},
        {"lease_duration": -1},
        {"prefetch": -1},
        {"receivers": 0},
        {"receivers": True},
    ],
)
def test_bad_construction_is_refused(queue: Queue, kwargs: dict[str, object]) -> None:
    handler = kwargs.pop("handler", lambda m: None)
    with pytest.raises(errors.InvalidArgument):
        leasekit.Consumer(queue, handler, **kwargs)  # type: ignore[arg-type]


def _leasekit_threads(before: set[threading.Thread]) -> list[str]:
    """leasekit's threads alive now that were not ``before`` (not other tests' pools)."""
    return [
        t.name for t in threading.enumerate() if t.name.startswith("leasekit-") and t not in before
    ]


def _stop_and_wait_for_shutdown(consumer: leasekit.Consumer) -> None:
    """Stop ``consumer`` and poll (with a deadline) until its shutdown has begun."""
    consumer.stop()
    deadline = time.monotonic() + 5
    while not consumer._worker.shutting_down and time.monotonic() < deadline:
        time.sleep(0.01)  # until the consumer is shutting down (it notices within 1 s)


def test_stop_abandons_unstarted_messages_and_waits_for_in_flight(queue: Queue) -> None:
    before = set(threading.enumerate())
    queue.send_many([b"%d" % i for i in range(10)])
    started = threading.Event()
    release = threading.Event()

    def handler(message: leasekit.Message) -> None:
        started.set()
        release.wait(5)

    consumer = leasekit.Consumer(queue, handler, concurrency=1, prefetch=4, lease_duration=5)
    runner = threading.Thread(target=consumer.run)
    runner.start()
    assert started.wait(5)
    _stop_and_wait_for_shutdown(consumer)
    release.set()
    runner.join(10)
    assert not runner.is_alive()
    stats = consumer.stats
    assert stats.completed == 1
    assert stats.abandoned_at_shutdown >= 1
    counts = queue.stats()
    assert counts.leased == 0, "a clean stop left messages leased"
    assert counts.visible == 10 - stats.completed
    assert _leasekit_threads(before) == []


def test_handler_past_the_grace_period_has_its_lease_abandoned(queue: Queue) -> None:
    queue.send(b"stuck")
    started = threading.Event()
    release = threading.Event()

    def handler(message: leasekit.Message) -> None:
        started.set()
        release.wait(10)

    consumer = leasekit.Consumer(queue, handler, lease_duration=5, shutdown_grace=0.2)
    runner = threading.Thread(target=consumer.run)
    runner.start()
    assert started.wait(5)
    consumer.stop()
    runner.join(5)
    assert queue.stats().leased == 0 and queue.stats().visible == 1
    release.set()


def test_sigterm_stops_a_consumer_gracefully(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with leasekit.open("sqlite", path=str(db), queue="q", create=True) as q:
        q.send_many([b"%d" % i for i in range(200)])
    script = textwrap.dedent(
        f"""
        import time, leasekit, warnings
        warnings.simplefilter("ignore")
        q = leasekit.open("sqlite", path={str(db)!r}, queue="q")
        def handler(m):
            print("handling", flush=True)
            time.sleep(0.05)
        stats = leasekit.Consumer(q, handler, concurrency=2, lease_duration=10).run()
        print("stopped", stats.completed, stats.abandoned_at_shutdown, flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("handling")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    last = out.strip().splitlines()[-1].split()
    assert last[0] == "stopped"
    with leasekit.open("sqlite", path=str(db), queue="q") as q:
        counts = q.stats()
    assert counts.leased == 0
    assert counts.visible == 200 - int(last[1])


class _Recorder:
    def __init__(self, name: str, log: list[str], fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail

    @leasekit.hookimpl
    def leasekit_before_process(self, lease: leasekit.Lease) -> None:
        self.log.append(f"before:{self.name}")
        if self.fail:
            raise RuntimeError("observer bug")

    @leasekit.hookimpl
    def leasekit_after_process(self, outcome: str) -> None:
        self.log.append(f"after:{self.name}:{outcome}")


def test_worker_hooks_run_before_in_order_after_in_reverse_and_observer_errors_are_contained() -> (
    None
):
    registry = leasekit.BackendRegistry()
    log: list[str] = []
    registry.register_plugin(_Recorder("a", log, fail=True))
    registry.register_plugin(_Recorder("b", log))
    queue = registry.open("memory", queue=f"hooks-{time.monotonic_ns()}", create=True)
    queue.send(b"x")
    stats = leasekit.Consumer(queue, lambda m: None).run(until_idle=True)
    assert stats.completed == 1
    assert log == ["before:a", "before:b", "after:b:completed", "after:a:completed"]


def test_completions_are_grouped_into_batches(queue: Queue) -> None:
    queue.send_many([b"%d" % i for i in range(200)])
    calls = _count_delete_batches(queue)
    consumer = leasekit.Consumer(
        queue, lambda m: time.sleep(0.005), concurrency=8, lease_duration=30
    )
    assert consumer.batch_complete
    stats = consumer.run(until_idle=True)
    assert stats.completed == 200 and queue.stats().visible == 0
    assert calls and max(calls) > 1, "completions were never batched"


def test_a_stale_receipt_in_a_batch_is_counted_not_raised(queue: Queue) -> None:
    queue.send_many([b"a", b"b", b"c", b"d"])
    lost_once: list[str] = []

    def handler(lease: leasekit.Lease) -> None:
        if not lost_once:
            lost_once.append(lease.message.id)
            lease._record.lose(lease, errors.LeaseLost("simulated: taken by another consumer"))

    stats = leasekit.Consumer(
        queue, handler, concurrency=4, lease_duration=30, pass_lease=True
    ).run(until_idle=True)
    assert stats.stale_on_complete == 1
    assert stats.completed == 3


def test_group_completer_never_strands_a_waiting_completion(queue: Queue) -> None:
    """More completions arrive than one batch holds, and then none: all must finish."""
    from leasekit.consumer import _GroupCompleter

    queue.send_many([b"%d" % i for i in range(12)])
    leases = queue.lease(12, duration=30)
    completer = _GroupCompleter(queue, size=4, window=0.05, in_flight=lambda: 4)
    real_settle = queue.complete_many
    first = threading.Event()

    def settle_after_everyone_queued(batch):  # type: ignore[no-untyped-def]
        if not first.is_set():
            first.set()
            deadline = time.monotonic() + 5
            while len(completer.waiting) < 8 and time.monotonic() < deadline:
                time.sleep(0.005)  # hold the first batch until the rest are queued behind it
        return real_settle(batch)

    queue.complete_many = settle_after_everyone_queued  # type: ignore[method-assign]
    results: list[object] = []
    threads = [
        threading.Thread(target=lambda lz=lz: results.append(completer.complete(lz)))
        for lz in leases
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads), "a completion was stranded"
    assert results == [None] * 12
    assert queue.stats().leased == 0


def _count_delete_batches(queue: Queue) -> list[int]:
    calls: list[int] = []
    real = queue.driver.delete

    def counting(receipts):  # type: ignore[no-untyped-def]
        calls.append(len(receipts))
        return real(receipts)

    queue.driver.delete = counting  # type: ignore[method-assign]
    return calls


def test_fast_handlers_take_chunks_and_complete_each_chunk_in_one_call(queue: Queue) -> None:
    queue.send_many([b"%d" % i for i in range(400)])
    calls = _count_delete_batches(queue)
    consumer = leasekit.Consumer(queue, lambda m: None, concurrency=4, lease_duration=30)
    stats = consumer.run(until_idle=True)
    assert stats.completed == 400 and queue.stats().visible == 0
    assert max(calls) >= 8, f"a fast handler's completions were not batched: {calls}"
    assert len(calls) < 400 / 4, f"too many complete calls for 400 messages: {len(calls)}"


def test_slow_handlers_are_spread_one_message_per_worker(queue: Queue) -> None:
    queue.send_many([b"%d" % i for i in range(32)])
    running = 0
    peak = 0
    lock = threading.Lock()

    def handler(message: leasekit.Message) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)  # the work itself, longer than the batch window
        with lock:
            running -= 1

    stats = leasekit.Consumer(queue, handler, concurrency=4, lease_duration=30).run(until_idle=True)
    assert stats.completed == 32
    assert peak == 4, f"slow messages were not handled by every worker at once (peak {peak})"


def test_chunk_size_follows_the_handler_time(queue: Queue) -> None:
    consumer = leasekit.Consumer(queue, lambda m: None, concurrency=8, batch_window=0.005)
    assert consumer._chunk_size(16) == 1, "no handler time observed yet: one at a time"
    consumer._handler_mean = 0.000_01
    assert consumer._chunk_size(16) == 16
    assert consumer._chunk_size(5) == 5
    consumer._handler_mean = 0.002
    assert consumer._chunk_size(16) == 2
    consumer._handler_mean = 0.1
    assert consumer._chunk_size(16) == 1


def test_a_handler_that_settles_its_own_lease_is_counted_and_not_settled_again(
    queue: Queue,
) -> None:
    queue.send_many([b"%d" % i for i in range(20)])

    def handler(lease: leasekit.Lease) -> None:
        if int(lease.message.body) % 2:
            lease.dead_letter("odd")
        else:
            lease.complete()

    stats = leasekit.Consumer(
        queue, handler, concurrency=3, lease_duration=30, pass_lease=True
    ).run(until_idle=True)
    assert (stats.completed, stats.dead_lettered) == (10, 10)
    assert stats.settle_errors == 0 and stats.stale_on_complete == 0
    assert queue.stats().visible == 0 and queue.stats().leased == 0


def test_a_failing_idempotency_store_does_not_stop_the_worker(queue: Queue) -> None:
    from leasekit.idempotency import MemoryIdempotencyStore

    class FlakyStore(MemoryIdempotencyStore):
        failed = False

        def record(self, message_id: str) -> None:
            if not FlakyStore.failed:
                FlakyStore.failed = True
                raise OSError("store unavailable")
            super().record(message_id)

    queue.send_many([b"%d" % i for i in range(10)])
    consumer = leasekit.Consumer(
        queue, lambda m: None, lease_duration=30, idempotency=FlakyStore(), backoff_base=0
    )
    result: list[leasekit.ConsumerStats] = []
    runner = threading.Thread(target=lambda: result.append(consumer.run(until_idle=True)))
    runner.start()
    runner.join(20)
    assert not runner.is_alive(), "the consumer's only worker died"
    assert FlakyStore.failed
    assert result[0].completed == 10 and result[0].abandoned >= 1
    assert queue.stats().visible == 0 and queue.stats().leased == 0


def test_a_message_found_lost_while_waiting_in_a_chunk_is_counted_and_not_handled(
    queue: Queue,
) -> None:
    queue.send_many([b"a", b"b"])
    handled: list[bytes] = []
    consumer = leasekit.Consumer(queue, lambda m: handled.append(m.body), lease_duration=30)
    first, second = queue.lease(2, duration=30)
    first._record.lose(first, errors.LeaseLost("simulated: the keeper found it lost"))
    with leasekit.LeaseKeeper() as keeper:
        keeper.add_many([second])
        consumer._process_chunk(0, [first, second], keeper)
        assert second not in keeper
    assert handled == [second.message.body]
    stats = consumer.stats
    assert (stats.lost, stats.completed) == (1, 1)


class _ThreadRecorder:
    def __init__(self) -> None:
        self.events: dict[str, list[tuple[str, str]]] = {}
        self.lock = threading.Lock()

    def _add(self, kind: str, lease: leasekit.Lease) -> None:
        with self.lock:
            name = threading.current_thread().name
            self.events.setdefault(name, []).append((kind, lease.message.id))

    @leasekit.hookimpl
    def leasekit_before_process(self, lease: leasekit.Lease) -> None:
        self._add("before", lease)

    @leasekit.hookimpl
    def leasekit_after_process(self, lease: leasekit.Lease, outcome: str) -> None:
        assert outcome == "completed"
        self._add("after", lease)


def test_worker_hooks_nest_per_message_on_each_worker_thread() -> None:
    registry = leasekit.BackendRegistry()
    recorder = _ThreadRecorder()
    registry.register_plugin(recorder)
    queue = registry.open("memory", queue=f"nested-{time.monotonic_ns()}", create=True)
    queue.send_many([b"%d" % i for i in range(200)])
    stats = leasekit.Consumer(queue, lambda m: None, concurrency=3).run(until_idle=True)
    assert stats.completed == 200
    total = 0
    for events in recorder.events.values():
        pairs = list(zip(events[::2], events[1::2], strict=True))
        assert all(b[0] == "before" and a == ("after", b[1]) for b, a in pairs), events[:6]
        total += len(pairs)
    assert total == 200


class _HandleRecorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, object]] = []
        self.lock = threading.Lock()

    @leasekit.hookimpl
    def leasekit_before_handle(self, lease: leasekit.Lease) -> None:
        with self.lock:
            self.events.append(
                ("before", threading.current_thread().name, lease.message.id, lease.state)
            )

    @leasekit.hookimpl
    def leasekit_after_handle(self, lease: leasekit.Lease, error: BaseException | None) -> None:
        with self.lock:
            self.events.append(("after", threading.current_thread().name, lease.message.id, error))


def test_handle_hooks_bracket_each_handler_call_on_its_worker_and_carry_its_error() -> None:
    registry = leasekit.BackendRegistry()
    recorder = _HandleRecorder()
    registry.register_plugin(recorder)
    queue = registry.open("memory", queue=f"handle-{time.monotonic_ns()}", create=True)
    queue.send_many([b"%d" % i for i in range(60)])
    calls: list[tuple[str, str]] = []

    def handler(message: leasekit.Message) -> None:
        calls.append((threading.current_thread().name, message.id))
        if message.body == b"7":
            raise ValueError("seven")

    consumer = leasekit.Consumer(
        queue, handler, concurrency=3, backoff_base=60, handle_signals=False
    )
    stats = consumer.run(until_idle=True)
    assert stats.completed == 59 and stats.abandoned == 1
    per_thread: dict[str, list[tuple[str, str, object]]] = {}
    for kind, thread, message_id, extra in recorder.events:
        per_thread.setdefault(thread, []).append((kind, message_id, extra))
    bracketed = []
    for events in per_thread.values():
        for before, after in zip(events[::2], events[1::2], strict=True):
            assert before[0] == "before" and after[0] == "after" and before[1] == after[1]
            assert before[2] is leasekit.LeaseState.HELD  # not settled before the handler ran
            bracketed.append((before[1], after[2]))
    assert sorted(m for m, _ in bracketed) == sorted(m for _, m in calls)
    [failed] = [error for _, error in bracketed if error is not None]
    assert isinstance(failed, ValueError) and str(failed) == "seven"


def test_stop_from_a_signal_handler_while_the_loop_holds_the_lock_does_not_deadlock(
    queue: Queue,
) -> None:
    """A signal handler runs in the main thread between any two bytecodes, lock held or not."""
    consumer = leasekit.Consumer(queue, lambda m: None)
    finished = threading.Event()

    def loop_holding_the_lock_when_the_signal_lands() -> None:
        with consumer._lock:
            consumer.stop()  # what the SIGTERM handler calls
        finished.set()

    threading.Thread(target=loop_holding_the_lock_when_the_signal_lands, daemon=True).start()
    assert finished.wait(5), "stop() deadlocked on the consumer's own lock"


def test_stop_in_the_middle_of_a_chunk_settles_the_handled_and_gives_back_the_rest(
    queue: Queue,
) -> None:
    """Fast messages travel in chunks; a stop mid-chunk must leave nothing leased or lost."""
    total = 300
    queue.send_many([b"%d" % i for i in range(total)])
    handled: list[bytes] = []
    blocking = threading.Event()
    release = threading.Event()

    def handler(message: leasekit.Message) -> None:
        handled.append(message.body)
        if len(handled) == 147:  # deep in the run, where workers take chunks
            blocking.set()
            release.wait(10)

    consumer = leasekit.Consumer(queue, handler, concurrency=2, lease_duration=30, shutdown_grace=5)
    runner = threading.Thread(target=consumer.run)
    runner.start()
    assert blocking.wait(10)
    _stop_and_wait_for_shutdown(consumer)
    release.set()
    runner.join(10)
    assert not runner.is_alive()
    stats = consumer.stats
    counts = queue.stats()
    assert counts.leased == 0, "a stop mid-chunk left messages leased"
    assert counts.visible == total - stats.completed, "completed and given back must add up"
    assert len(set(handled)) == len(handled) == stats.completed
    assert stats.received == stats.completed + stats.abandoned_at_shutdown


def test_a_chunk_cut_short_by_shutdown_completes_its_handled_part_and_abandons_the_rest(
    queue: Queue,
) -> None:
    queue.send_many([b"a", b"b", b"c", b"d"])
    consumer = leasekit.Consumer(queue, lambda m: None, lease_duration=30)

    def handler(message: leasekit.Message) -> None:
        if message.body == b"b":
            consumer._closing = True  # the stop arrives while "b" is being handled

    consumer.handler = handler
    chunk = sorted(queue.lease(4, duration=30), key=lambda lease: lease.message.body)
    with leasekit.LeaseKeeper() as keeper:
        keeper.add_many(chunk)
        consumer._process_chunk(0, chunk, keeper)
        assert len(keeper) == 0, "the keeper still holds leases of the cut chunk"
    assert [lease.state.value for lease in chunk] == [
        "completed",
        "completed",
        "abandoned",
        "abandoned",
    ]
    stats = consumer.stats
    assert (stats.completed, stats.abandoned_at_shutdown) == (2, 2)
    assert queue.stats().visible == 2


def _slow_small_receives(queue: Queue, batch: int, seconds: float) -> list[str]:
    """Cap the receive batch and give each receive a round-trip time; record callers."""
    driver = queue.driver
    driver.capabilities = driver.capabilities.replace(max_receive_batch=batch)
    callers: list[str] = []
    real = driver.receive

    def receive(max_messages, visibility, wait):  # type: ignore[no-untyped-def]
        callers.append(threading.current_thread().name)
        time.sleep(seconds)  # the round trip to a distant region, not synchronisation
        return real(max_messages, visibility, wait)

    driver.receive = receive  # type: ignore[method-assign]
    return callers


def test_several_receivers_lease_at_once_and_every_message_is_handled_once(
    queue: Queue,
) -> None:
    before = set(threading.enumerate())
    queue.send_many([b"%d" % i for i in range(300)])
    callers = _slow_small_receives(queue, batch=5, seconds=0.01)
    seen: list[bytes] = []
    lock = threading.Lock()

    def handler(message: leasekit.Message) -> None:
        with lock:
            seen.append(message.body)

    consumer = leasekit.Consumer(queue, handler, concurrency=4, lease_duration=30, receivers=3)
    stats = consumer.run(until_idle=True)
    assert stats.completed == 300 and sorted(seen) == sorted(b"%d" % i for i in range(300))
    assert len(set(callers)) >= 2, f"only one thread leased: {set(callers)}"
    assert queue.stats().visible == 0 and queue.stats().leased == 0
    assert _leasekit_threads(before) == []


def test_a_receiver_failing_stops_the_run_with_its_error_and_leaves_nothing_leased(
    queue: Queue,
) -> None:
    queue.send_many([b"%d" % i for i in range(100)])
    driver = queue.driver
    driver.capabilities = driver.capabilities.replace(max_receive_batch=5)
    real = driver.receive
    calls = 0
    lock = threading.Lock()

    def receive(max_messages, visibility, wait):  # type: ignore[no-untyped-def]
        nonlocal calls
        with lock:
            calls += 1
            failing = calls >= 6
        if failing:
            raise DriverError(ErrorCode.UNKNOWN, "the receive broke")
        return real(max_messages, visibility, wait)

    driver.receive = receive  # type: ignore[method-assign]
    consumer = leasekit.Consumer(queue, lambda m: None, concurrency=2, receivers=2)
    with pytest.raises(errors.BackendError, match="the receive broke"):
        consumer.run(until_idle=True)
    counts = queue.stats()
    assert counts.leased == 0, "a failed run left messages leased"
    assert counts.visible == 100 - consumer.stats.completed
