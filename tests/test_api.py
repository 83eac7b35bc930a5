"""The portable API: names, URLs, options, validation, errors, retries, registry."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

import leasekit
from leasekit import errors
from leasekit.backends.memory import MemoryBroker, MemoryDriver
from leasekit.queue import Queue
from leasekit.registry import BackendRegistry, BackendSpec
from leasekit.retry import RetryPolicy
from leasekit.spi import Driver, DriverError, ErrorCode
from leasekit.url import parse_url, redact_url


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker(clock=leasekit.ManualClock())


@pytest.fixture
def queue(broker: MemoryBroker) -> Queue:
    return leasekit.open("memory", queue="jobs", broker=broker, create=True)


# ------------------------------------------------------------------ exports


def test_all_is_sorted_and_complete() -> None:
    assert leasekit.__all__ == sorted(leasekit.__all__)
    public = {
        name
        for name, value in vars(leasekit).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("leasekit")
    }
    assert public <= set(leasekit.__all__)


def test_import_leasekit_imports_no_cloud_sdk() -> None:
    code = textwrap.dedent(
        """
        import sys, leasekit
        q = leasekit.open("memory://x", create=True)
        leasekit.default_registry().specs()
        heavy = [m for m in sys.modules if m.split(".")[0] in
                 ("azure", "boto3", "botocore", "mns", "pyspark", "proton", "pyarrow")]
        print(heavy)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_error_hierarchy_groups_by_what_the_caller_does_next() -> None:
    assert issubclass(errors.InvalidLeaseDuration, ValueError)
    assert issubclass(errors.MessageTooLarge, errors.InvalidArgument)
    assert issubclass(errors.BackendNotInstalled, ImportError)
    assert issubclass(errors.QueueEmpty, TimeoutError)
    assert not issubclass(errors.LeaseStateError, errors.LeaseError)
    assert not issubclass(errors.LeaseLost, errors.QueueNotFound)
    assert not issubclass(errors.QueueNotFound, errors.LeaseLost)
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert cls.__doc__ and cls.__doc__.startswith("Raised when"), name


# --------------------------------------------------------------------- URLs


def test_sqlite_urls_follow_sqlalchemy_slashes(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    rel = leasekit.open("sqlite:///rel.db?queue=a", create=True)
    absolute = leasekit.open(f"sqlite:///{tmp_path}/abs.db?queue=b", create=True)
    assert rel.driver.path == "rel.db"  # type: ignore[attr-defined]
    assert absolute.driver.path == f"{tmp_path}/abs.db"  # type: ignore[attr-defined]
    rel.send(b"x")
    assert (tmp_path / "rel.db").exists() and (tmp_path / "abs.db").exists()
    rel.close()
    absolute.close()


def test_keyword_form_opens_the_same_queue(tmp_path: Any) -> None:
    path = str(tmp_path / "k.db")
    with leasekit.open("sqlite", path=path, queue="orders", create=True) as q:
        q.send(b"hello")
    with leasekit.open(f"sqlite:///{path}?queue=orders") as q:
        [lease] = q.lease(duration=5)
        assert lease.message.body == b"hello"
        lease.complete()


@pytest.mark.parametrize(
    "url, message",
    [
        ("nope://x", "installed: "),
        ("memory", "needs option(s) queue"),
        ("://x", "not a backend name"),
        ("sqlite:///x.db?queue=a&queue=b", "more than once"),
        ("sqlite:///x.db?queue=a&colour=blue", "unknown option(s) colour"),
        ("sqlite://host/x.db?queue=a", "no host"),
        ("memory://x#frag", "no #fragment"),
        ("Memory Queue", "not a backend name"),
    ],
)
def test_bad_urls_get_a_clear_error(url: str, message: str) -> None:
    with pytest.raises((errors.InvalidURL, errors.BackendNotFound)) as info:
        leasekit.open(url)
    assert message in str(info.value)


def test_unknown_scheme_lists_the_installed_backends() -> None:
    with pytest.raises(errors.BackendNotFound) as info:
        leasekit.open("kafka://topic")
    assert "memory" in str(info.value) and "sqlite" in str(info.value)


def test_credentials_in_a_url_never_reach_a_message() -> None:
    url = "memory://user:hunter2@x?secret_key=s3cr3t&colour=1"
    assert "hunter2" not in redact_url(url) and "s3cr3t" not in redact_url(url)
    with pytest.raises(errors.InvalidURL) as info:
        leasekit.open(url)
    assert "hunter2" not in str(info.value) and "s3cr3t" not in str(info.value)
    assert "hunter2" not in repr(parse_url(url))


def test_a_plus_in_a_url_option_is_a_plus_and_percent_twenty_a_space() -> None:
    # As libpq and the services' connection strings read them: a base64 key or a
    # SAS signature holds pluses (HTML form encoding would make them spaces).
    parsed = parse_url("sqlite:///q.db?queue=a+b&sig=x%2By%2Fz%3D&name=two%20words")
    assert parsed.query == {"queue": "a+b", "sig": "x+y/z=", "name": "two words"}


# --------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "body, error",
    [
        ("text", errors.InvalidArgument),
        (12, errors.InvalidArgument),
        (None, errors.InvalidArgument),
        (b"x" * (256 * 1024 + 1), errors.MessageTooLarge),
    ],
)
def test_bad_bodies_are_refused_and_nothing_is_sent(queue: Queue, body: Any, error: type) -> None:
    with pytest.raises(error):
        queue.send(body)
    assert queue.stats().visible == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay": -1},
        {"delay": float("nan")},
        {"ttl": 0},
        {"ttl": "5"},
        {"properties": {"k": 1}},
        {"properties": {"": "v"}},
        {"delay": 10, "ttl": 5},
    ],
)
def test_bad_send_options_are_refused(queue: Queue, kwargs: dict[str, Any]) -> None:
    with pytest.raises(errors.InvalidArgument):
        queue.send(b"x", **kwargs)
    assert queue.stats().visible == 0


def test_bytearray_and_memoryview_bodies_are_bytes_on_the_way_out(queue: Queue) -> None:
    queue.send(bytearray(b"ab"))
    queue.send(memoryview(b"cd"))
    bodies = sorted(lease.message.body for lease in queue.lease(2, duration=5))
    assert bodies == [b"ab", b"cd"]


def test_lease_one_with_a_wait_raises_queue_empty(queue: Queue) -> None:
    with pytest.raises(errors.QueueEmpty), queue.lease_one(wait=0):
        pass


def test_leave_with_an_exception_abandons_and_propagates(queue: Queue) -> None:
    queue.send(b"x")
    with pytest.raises(KeyError), queue.lease_one(duration=60, wait=0) as lease:
        raise KeyError("boom")
    assert lease.state is leasekit.LeaseState.ABANDONED
    assert queue.lease(1, duration=60)[0].message.delivery_count == 2


def test_closed_queue_refuses_use(queue: Queue) -> None:
    queue.close()
    with pytest.raises(errors.LeaseStateError, match="closed"):
        queue.send(b"x")


def test_delete_queue_deletes_the_queue_and_its_messages(queue: Queue) -> None:
    queue.send(b"x")
    queue.delete_queue()
    with pytest.raises(errors.QueueNotFound):
        queue.lease(1)


def test_delete_is_a_deprecated_alias_of_delete_queue(queue: Queue) -> None:
    with pytest.warns(DeprecationWarning, match=r"use Queue\.delete_queue\(\)"):
        queue.delete()
    with pytest.raises(errors.QueueNotFound):
        queue.lease(1)


def test_fixed_lock_backends_refuse_other_durations(broker: MemoryBroker) -> None:
    driver = MemoryDriver(queue="fixed", broker=broker)
    driver.capabilities = driver.capabilities.replace(
        fixed_lease=60.0, min_lease=60.0, max_lease=60.0
    )
    queue = Queue(driver)
    queue.create()
    assert queue.default_lease_duration == 60.0
    with pytest.raises(errors.InvalidLeaseDuration, match="LeaseKeeper"):
        queue.lease(1, duration=30)


def test_durations_round_up_to_the_backend_resolution(broker: MemoryBroker) -> None:
    driver = MemoryDriver(queue="whole", broker=broker)
    driver.capabilities = driver.capabilities.replace(lease_resolution=1.0, min_lease=1.0)
    queue = Queue(driver)
    queue.create()
    queue.send(b"x")
    [lease] = queue.lease(1, duration=1.2)
    assert lease.duration == 2.0


def test_clamp_lease_moves_a_wanted_duration_into_the_backend_range() -> None:
    caps = leasekit.Capabilities(min_lease=5.0, max_lease=60.0)
    assert [caps.clamp_lease(s) for s in (1.0, 30.0, 600.0)] == [5.0, 30.0, 60.0]


def test_default_lease_is_30_s_within_the_backend_range(broker: MemoryBroker) -> None:
    driver = MemoryDriver(queue="short", broker=broker)
    driver.capabilities = driver.capabilities.replace(max_lease=20.0)
    assert Queue(driver).default_lease_duration == 20.0
    assert Queue(MemoryDriver(queue="free", broker=broker)).default_lease_duration == 30.0


def test_total_lease_cap_refuses_a_renew_past_it(broker: MemoryBroker) -> None:
    driver = MemoryDriver(queue="capped", broker=broker)
    driver.capabilities = driver.capabilities.replace(max_total_lease=100.0)
    queue = Queue(driver)
    queue.create()
    queue.send(b"x")
    [lease] = queue.lease(1, duration=60)
    lease.renew(90)
    with pytest.raises(errors.InvalidLeaseDuration, match="in total"):
        lease.renew(101)


def test_core_splits_a_large_lease_into_backend_sized_receives(broker: MemoryBroker) -> None:
    driver = MemoryDriver(queue="split", broker=broker)
    driver.capabilities = driver.capabilities.replace(max_receive_batch=3)
    queue = Queue(driver)
    queue.create()
    queue.send_many([b"%d" % i for i in range(8)])
    assert len(queue.lease(8, duration=5)) == 8


# ------------------------------------------------------ expiry with a clock


def test_manual_clock_drives_expiry_without_waiting(broker: MemoryBroker, queue: Queue) -> None:
    clock = broker.clock
    assert isinstance(clock, leasekit.ManualClock)
    queue.send(b"x")
    [first] = queue.lease(1, duration=30)
    assert queue.lease(1, duration=30) == []
    clock.advance(31)
    [second] = queue.lease(1, duration=30)
    assert second.message.delivery_count == 2
    with pytest.raises(errors.LeaseLost):
        first.complete()
    assert first.lost.is_set()
    with pytest.raises(errors.LeaseLost):
        first.check()
    second.complete()


def test_on_lost_callback_fires_once(broker: MemoryBroker, queue: Queue) -> None:
    seen: list[str] = []
    queue.send(b"x")
    [first] = queue.lease(1, duration=10)
    first.on_lost(lambda lease, error: seen.append(lease.message.id))
    broker.clock.advance(11)  # type: ignore[attr-defined]
    queue.lease(1, duration=10)
    with pytest.raises(errors.LeaseLost):
        first.renew()
    with pytest.raises(errors.LeaseLost):
        first.complete()
    assert seen == [first.message.id]


def test_lost_event_taken_before_the_loss_is_set_by_it(broker: MemoryBroker, queue: Queue) -> None:
    queue.send(b"x")
    [first] = queue.lease(1, duration=10)
    event = first.lost  # made on first use; the loss must set this same event
    assert not event.is_set()
    broker.clock.advance(11)  # type: ignore[attr-defined]
    queue.lease(1, duration=10)
    with pytest.raises(errors.LeaseLost):
        first.renew()
    assert event.is_set() and first.lost is event


def test_dead_letter_without_native_support_moves_to_the_poison_queue(broker: MemoryBroker) -> None:
    driver = MemoryDriver(queue="orders", broker=broker)
    driver.capabilities = driver.capabilities.replace(native_dead_letter=False)
    queue = Queue(driver)
    queue.create()
    message_id = queue.send(b"bad", properties={"k": "v"})
    [lease] = queue.lease(1, duration=10)
    lease.dead_letter("unparseable")
    poison = leasekit.open("memory", queue="orders-poison", broker=broker)
    [copy] = poison.lease(1, duration=10)
    assert copy.message.body == b"bad"
    assert copy.message.properties == {
        "k": "v",
        "leasekit-dead-letter-reason": "unparseable",
        "leasekit-original-id": message_id,
        "leasekit-delivery-count": "1",
    }
    assert queue.lease(1, duration=10) == []


def test_native_dead_letter_keeps_reason_and_counts(queue: Queue) -> None:
    queue.send(b"bad")
    [lease] = queue.lease(1, duration=10)
    with pytest.raises(errors.InvalidArgument):
        lease.dead_letter("")
    lease.dead_letter("why")
    [letter] = queue.peek_dead_letters()
    assert (letter.body, letter.reason, letter.delivery_count) == (b"bad", "why", 1)
    assert queue.stats().dead_lettered == 1


# ---------------------------------------------------- error mapping (mocks)


class _Boom(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(f"service said {code}")
        self.code = code


class _FlakyDriver(MemoryDriver):
    """A memory driver whose calls fail first with scripted SDK-like errors."""

    failures: list[Exception]

    def error_code(self, exc: BaseException) -> ErrorCode:
        if isinstance(exc, _Boom):
            return {"Gone": ErrorCode.LEASE_LOST, "Busy": ErrorCode.UNAVAILABLE}.get(
                exc.code, ErrorCode.UNKNOWN
            )
        return super().error_code(exc)

    def backend_code(self, exc: BaseException) -> str | None:
        return exc.code if isinstance(exc, _Boom) else super().backend_code(exc)

    def is_retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, _Boom) and exc.code == "Busy"

    def send(self, message: Any) -> str:
        if self.failures:
            raise self.failures.pop(0)
        return super().send(message)


def _flaky(broker: MemoryBroker, *failures: Exception) -> Queue:
    driver = _FlakyDriver(queue="flaky", broker=broker)
    driver.failures = list(failures)
    queue = Queue(driver, retry=RetryPolicy(attempts=3, base=0, cap=0))
    queue.create()
    return queue


def test_sdk_errors_are_mapped_once_with_the_original_chained(broker: MemoryBroker) -> None:
    original = _Boom("Gone")
    queue = _flaky(broker, original)
    with pytest.raises(errors.LeaseLost) as info:
        queue.send(b"x")
    assert info.value.__cause__ is original
    assert info.value.backend_code == "Gone"
    assert "Gone" in str(info.value)


def test_unknown_sdk_errors_become_backend_error(broker: MemoryBroker) -> None:
    queue = _flaky(broker, _Boom("Weird"))
    with pytest.raises(errors.BackendError) as info:
        queue.send(b"x")
    assert isinstance(info.value.__cause__, _Boom)


def test_retryable_errors_are_retried_then_succeed(broker: MemoryBroker) -> None:
    queue = _flaky(broker, _Boom("Busy"), _Boom("Busy"))
    assert queue.send(b"x")


def test_retries_give_up_with_backend_unavailable(broker: MemoryBroker) -> None:
    queue = _flaky(broker, _Boom("Busy"), _Boom("Busy"), _Boom("Busy"))
    with pytest.raises(errors.BackendUnavailable):
        queue.send(b"x")


def test_driver_error_codes_map_to_classes() -> None:
    from leasekit.error_mapping import ERROR_CLASSES

    assert set(ERROR_CLASSES) == set(ErrorCode)
    driver = MemoryDriver(queue="x")
    error = leasekit.error_mapping.wrap_error(  # type: ignore[attr-defined]
        driver, DriverError(ErrorCode.QUEUE_NOT_FOUND, "no", backend_code="Q"), "lease"
    )
    assert isinstance(error, errors.QueueNotFound) and error.backend_code == "Q"


# ------------------------------------------------------------------ registry


def test_registry_hookspecs_have_no_unmatched_implementations() -> None:
    registry = leasekit.default_registry()
    registry.specs()
    registry.plugin_manager.check_pending()


def test_missing_sdk_gives_an_install_hint() -> None:
    registry = BackendRegistry(load_entrypoints=False)
    registry.register(
        BackendSpec(name="ghost", driver="leasekit_ghost_sdk.driver:Ghost", extra="ghost")
    )
    with pytest.raises(errors.BackendNotInstalled) as info:
        registry.open("ghost://q")
    assert "pip install 'leasekit[ghost]'" in str(info.value)


def test_duplicate_scheme_needs_clobber() -> None:
    registry = BackendRegistry(load_entrypoints=False)
    spec = BackendSpec(name="dup", driver="leasekit.backends.memory:MemoryDriver")
    registry.register(spec)
    with pytest.raises(ValueError, match="clobber"):
        registry.register(spec)
    registry.register(spec, clobber=True)


def test_a_non_driver_class_is_refused() -> None:
    registry = BackendRegistry(load_entrypoints=False)
    registry.register(BackendSpec(name="notdriver", driver="leasekit.queue:Queue"))
    with pytest.raises(errors.BackendNotFound, match="not a leasekit Driver"):
        registry.open("notdriver://q")


def test_abstract_driver_methods_name_themselves() -> None:
    class Half(Driver):
        scheme = "half"

    with pytest.raises(TypeError):
        Half()  # type: ignore[abstract]


def test_a_long_multi_line_sdk_message_is_trimmed_but_kept_as_the_cause(
    broker: MemoryBroker,
) -> None:
    original = _Boom("Weird")
    original.args = ("first line of the service's answer\n<?xml version='1.0'?><Error>...",)
    queue = _flaky(broker, original)
    with pytest.raises(errors.BackendError) as info:
        queue.send(b"x")
    assert "first line of the service's answer" in str(info.value)
    assert "<?xml" not in str(info.value)
    assert info.value.__cause__ is original


def test_dead_letter_of_a_body_with_no_room_for_the_reason_still_moves_it(
    broker: MemoryBroker,
) -> None:
    driver = MemoryDriver(queue="full", broker=broker, max_message_size=10)
    driver.capabilities = driver.capabilities.replace(native_dead_letter=False)

    class TightPoison(MemoryDriver):
        def send(self, messages):  # type: ignore[no-untyped-def]
            if any(message.properties for message in messages):
                raise DriverError(ErrorCode.TOO_LARGE, "no room for properties")
            return super().send(messages)

    driver.sibling = lambda name: TightPoison(queue=name, broker=broker)  # type: ignore[method-assign]
    queue = Queue(driver)
    queue.create()
    queue.send(b"0123456789")
    [lease] = queue.lease(1, duration=10)
    lease.dead_letter("too big to annotate")
    assert queue.lease(1, duration=10) == []
    poison = leasekit.open("memory", queue="full-poison", broker=broker)
    assert poison.lease(1, duration=10)[0].message.body == b"0123456789"


@pytest.mark.parametrize("url", ["sqlite://admin:hunter2@/x.db?queue=q", "memory://u:hunter2@jobs"])
def test_core_refuses_credentials_in_any_url_without_echoing_them(url: str) -> None:
    with pytest.raises(errors.InvalidURL, match="carry no credentials") as info:
        leasekit.open(url)
    assert "hunter2" not in str(info.value)


def test_a_failed_duration_change_after_receive_keeps_the_lease(broker: MemoryBroker) -> None:
    """Where the lease is set after receive (MNS), a failed change must not drop messages."""
    import dataclasses
    from datetime import timedelta

    driver = MemoryDriver(queue="after-receive", broker=broker)
    # As MNS: the lease is set after receive, one visibility change per call.
    driver.capabilities = driver.capabilities.replace(
        lease_set_after_receive=True, max_renew_batch=1
    )
    queue = Queue(driver, retry=RetryPolicy(attempts=1))
    queue.create()
    queue.send_many([b"a", b"b"])
    real_receive = driver.receive

    def receive_with_queue_visibility(max_messages: int, visibility: float, wait: float) -> Any:
        # As MNS does: the receive hides messages for the queue's own timeout (here +20 s).
        return [
            dataclasses.replace(raw, visible_until=raw.visible_until + timedelta(seconds=20))
            for raw in real_receive(max_messages, visibility, wait)
        ]

    def failing_change(receipts: list[str], seconds: float) -> Any:
        raise DriverError(ErrorCode.UNAVAILABLE, "blip")

    driver.receive = receive_with_queue_visibility  # type: ignore[method-assign]
    driver.change_visibility = failing_change  # type: ignore[method-assign]
    leases = queue.lease(2, duration=10)
    assert len(leases) == 2, "a failed visibility change dropped received messages"
    assert queue.complete_many(leases) == [None, None]
    assert queue.stats().visible == 0


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_message_abandoned_with_a_delay_counts_as_delayed_not_leased(
    backend: str, tmp_path: Any
) -> None:
    options: dict[str, Any] = {"path": str(tmp_path / "q.db")} if backend == "sqlite" else {}
    with leasekit.open(backend, queue="abandoned", create=True, **options) as queue:
        queue.send_many([b"a", b"b"])
        first, second = queue.lease(2, duration=30)
        first.abandon(delay=60)
        stats = queue.stats()
        assert (stats.visible, stats.leased, stats.delayed) == (0, 1, 1)
        second.abandon()
        assert queue.stats().visible == 1
        queue.delete_queue()


def test_abandon_waits_at_least_the_declared_minimum(broker: MemoryBroker) -> None:
    driver = MemoryDriver(queue="min-abandon", broker=broker)
    driver.capabilities = driver.capabilities.replace(min_abandon_delay=1.0)
    queue = Queue(driver)
    queue.create()
    queue.send(b"x")
    [lease] = queue.lease(1, duration=10)
    lease.abandon()
    assert queue.lease(1, duration=10) == [], "visible before min_abandon_delay"
    broker.clock.advance(1.0)  # type: ignore[attr-defined]
    [again] = queue.lease(1, duration=10)
    assert again.message.id == lease.message.id


def test_capabilities_refuse_a_minimum_abandon_delay_above_the_maximum() -> None:
    with pytest.raises(ValueError, match="min_abandon_delay"):
        leasekit.Capabilities(max_abandon_delay=1.0, min_abandon_delay=2.0)
    with pytest.raises(ValueError, match="min_abandon_delay"):
        leasekit.Capabilities(min_abandon_delay=-1.0)


class _Refusing(MemoryDriver):
    """Refuses every message whose body starts with b"no", per entry; or fails a whole call."""

    fail_calls: int = 0

    def send(self, messages):  # type: ignore[no-untyped-def]
        if self.fail_calls:
            self.fail_calls -= 1
            raise DriverError(ErrorCode.UNAVAILABLE, "the whole call failed")
        sent = super().send([m for m in messages if not m.body.startswith(b"no")])
        ids = iter(sent)
        return [
            DriverError(ErrorCode.INVALID_ARGUMENT, "refused")
            if m.body.startswith(b"no")
            else next(ids)
            for m in messages
        ]


def test_send_many_reports_each_message_sent_or_not(broker: MemoryBroker) -> None:
    driver = _Refusing(queue="partial", broker=broker)
    driver.capabilities = driver.capabilities.replace(max_send_batch=2)
    queue = Queue(driver, retry=RetryPolicy(attempts=1))
    queue.create()
    with pytest.raises(errors.SendIncomplete) as info:
        queue.send_many([b"a", b"no-b", b"c", b"d", b"no-e"])
    results = info.value.results
    assert [isinstance(r, str) for r in results] == [True, False, True, True, False]
    assert isinstance(results[1], errors.InvalidArgument)
    assert sorted(info.value.failed) == [1, 4] and sorted(info.value.sent) == [0, 2, 3]
    # Every message after the refused one was still sent: their ids are not lost.
    got = queue.lease(10, duration=30)
    assert sorted(lz.message.id for lz in got) == sorted(info.value.sent.values())
    queue.complete_many(got)


def test_send_many_stops_after_a_call_that_failed_whole(broker: MemoryBroker) -> None:
    driver = _Refusing(queue="whole", broker=broker)
    driver.capabilities = driver.capabilities.replace(max_send_batch=2)
    queue = Queue(driver, retry=RetryPolicy(attempts=1))
    queue.create()
    queue.send(b"first")
    driver.fail_calls = 1
    with pytest.raises(errors.SendIncomplete) as info:
        queue.send_many([b"a", b"b", b"c"])
    assert all(isinstance(r, errors.BackendUnavailable) for r in info.value.results)
    assert [lz.message.body for lz in queue.lease(10, duration=30)] == [b"first"]


def test_send_batches_stay_within_the_byte_limit(broker: MemoryBroker) -> None:
    driver = MemoryDriver(queue="bytes", broker=broker)
    driver.capabilities = driver.capabilities.replace(max_send_batch=16, max_send_batch_bytes=100)
    calls: list[int] = []
    real = driver.send

    def counting(messages):  # type: ignore[no-untyped-def]
        calls.append(sum(len(m.body) for m in messages))
        return real(messages)

    driver.send = counting  # type: ignore[method-assign]
    queue = Queue(driver)
    queue.create()
    queue.send_many([b"x" * 40] * 5 + [b"y" * 100])
    assert calls == [80, 80, 40, 100]
