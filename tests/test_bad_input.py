"""Bad input gets a typed leasekit error before any backend call, and loses nothing.

Property tests over ``open`` options (keyword, URL-query and raw-URL forms) and
the arguments of every public call, on the memory and SQLite backends. Each
draws values of every type a caller might pass by mistake (text with lone
surrogates, huge and non-finite numbers, bools, ``None``, bytes, objects,
lists) next to plausible ones, and asserts:

- a refusal is a leasekit error (an :class:`~leasekit.InvalidArgument` or
  another :class:`~leasekit.LeaseError`, or :class:`~leasekit.LeaseStateError`
  for misuse), never ``TypeError``/``AttributeError``/``OverflowError``;
- it comes before any backend call (the drivers here count their calls);
- nothing is lost or left leased: the messages sent before are all still there
  and visible afterwards;
- what is accepted works: an accepted ``open`` can send, lease and complete.

The example count is small so the file runs in seconds; set
``LEASEKIT_FUZZ_EXAMPLES`` (e.g. 5000) to search harder locally.
"""

from __future__ import annotations

import inspect
import math
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import leasekit
from leasekit import errors
from leasekit.backends.memory import MemoryBroker, MemoryDriver
from leasekit.backends.sqlite import SqliteDriver
from leasekit.conformance.harness import BACKEND_CALLS
from leasekit.duration_policy import AdaptiveLeaseDuration
from leasekit.idempotency import MemoryIdempotencyStore
from leasekit.lease import Lease
from leasekit.queue import Queue
from leasekit.registry import BackendRegistry, BackendSpec
from leasekit.spi import Driver

EXAMPLES = int(os.environ.get("LEASEKIT_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: Errors that say "your input was refused"; they must come before any backend call.
REFUSALS = (
    errors.InvalidArgument,
    errors.UnsupportedOperation,
    errors.BackendNotFound,
    errors.LeaseStateError,
)
SEEDS = (b"seed-0", b"seed-1", b"seed-2")
SEED_QUEUE = "lk-seed"

# ------------------------------------------------------- drivers that count


class Calls:
    """How many driver calls were made since the last reset."""

    count = 0


def _counting(base: type[Driver]) -> type[Driver]:
    """A subclass of ``base`` that counts every backend call in :class:`Calls`."""

    def wrap(name: str) -> Callable[..., Any]:
        original = getattr(base, name)

        def method(self: Driver, *args: Any, **kwargs: Any) -> Any:
            Calls.count += 1
            return original(self, *args, **kwargs)

        method.__name__ = name
        return method

    return type(f"Counting{base.__name__}", (base,), {name: wrap(name) for name in BACKEND_CALLS})


CountingMemoryDriver = _counting(MemoryDriver)
CountingSqliteDriver = _counting(SqliteDriver)


@pytest.fixture(scope="module")
def registry() -> BackendRegistry:
    """A registry whose ``memory`` and ``sqlite`` drivers count their calls."""
    reg = BackendRegistry(load_entrypoints=False)
    reg.register(BackendSpec(name="memory", driver=f"{__name__}:CountingMemoryDriver"))
    reg.register(BackendSpec(name="sqlite", driver=f"{__name__}:CountingSqliteDriver"))
    return reg


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary working directory, so relative SQLite paths land in it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------- values


class Opaque:
    """An object of no type any option takes."""

    def __repr__(self) -> str:
        return "<Opaque>"


SURROGATES = st.sampled_from(["\ud800", "a\udfff", "\udc80x", "ok\ud83d"])
NUMERIC_TEXT = st.sampled_from(
    [
        *("0", "1", "-1", "30", "1.5", "1e306", "1e400", "inf", "-inf", "nan", "", " "),
        *("0x10", "1_000", "true", "no", "NORMAL", "full", "None", "9" * 30),
    ]
)
HUGE_INTS = st.sampled_from([2**31, 2**63, 2**64 + 1, 10**400, -(10**400)])
SPECIAL_FLOATS = st.sampled_from(
    [math.inf, -math.inf, math.nan, 1e306, 1e308, -1e306, 5e-324, -0.0, 0.5, 1e-9]
)
OBJECTS = st.one_of(
    st.builds(Opaque),
    st.builds(object),
    st.just(lambda: None),
    st.just(MemoryBroker),
    st.just(Exception("x")),
)
TEXT = st.one_of(st.text(max_size=12), SURROGATES, NUMERIC_TEXT)
ANY = st.one_of(
    TEXT,
    st.integers(-(10**6), 10**6),
    HUGE_INTS,
    st.floats(),
    SPECIAL_FLOATS,
    st.booleans(),
    st.none(),
    st.binary(max_size=6),
    OBJECTS,
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
NUMBER = st.one_of(st.integers(-5, 10**6), st.floats(-5, 1e7), SPECIAL_FLOATS, HUGE_INTS)


def _or_any(*plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(ANY, *plausible)


#: Values worth trying per option, besides ANY.
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "queue": st.one_of(st.just(SEED_QUEUE), TEXT),
    "broker": st.builds(MemoryBroker),
    "clock": st.one_of(st.builds(leasekit.ManualClock), st.builds(leasekit.SystemClock)),
    "rotate_receipts": st.one_of(st.booleans(), st.sampled_from(["1", "off", "yes"])),
    "max_message_size": st.one_of(NUMBER, st.integers(1, 2**20)),
    "busy_timeout": NUMBER,
    "synchronous": st.sampled_from(["NORMAL", "FULL", "normal", "off", 1, b"FULL"]),
    "create": st.booleans(),
    "lease_duration": NUMBER,
    "call_timeout": NUMBER,
    "retry": st.one_of(
        st.builds(leasekit.RetryPolicy),
        st.builds(leasekit.RetryPolicy, attempts=st.integers(1, 3)),
    ),
}
OPTION_NAMES = {
    "memory": ["queue", "broker", "clock", "rotate_receipts", "max_message_size"],
    "sqlite": ["queue", "path", "clock", "busy_timeout", "synchronous", "max_message_size"],
}
CORE_OPTIONS = ["create", "lease_duration", "retry", "call_timeout"]


def _option_value(name: str, sqlite_dir: str) -> st.SearchStrategy[Any]:
    if name == "path":
        # Text paths stay in the working directory (a temporary one).
        return st.one_of(
            ANY.filter(lambda v: not isinstance(v, str)),
            st.sampled_from(["", ".", "no-such-dir/x.db", "x\x00.db", "\ud800.db", ":memory:"]),
            st.text(st.characters(blacklist_characters="/\\"), min_size=1, max_size=8),
            st.just(f"{sqlite_dir}/fuzz.db"),
        )
    if name == "colour":
        return ANY
    return _or_any(PLAUSIBLE[name])


def _options(backend: str, sqlite_dir: str) -> st.SearchStrategy[dict[str, Any]]:
    names = [*OPTION_NAMES[backend], *CORE_OPTIONS, "colour"]
    return st.lists(st.sampled_from(names), unique=True, max_size=4).flatmap(
        lambda keys: st.fixed_dictionaries({k: _option_value(k, sqlite_dir) for k in keys})
    )


# ---------------------------------------------------------------- checks


def _seed(reg: BackendRegistry, target: str, **options: Any) -> None:
    """Make the seed queue hold exactly the seed messages, all visible."""
    with reg.open(target, create=True, **options) as q:
        q.driver.delete_queue()
        q.create()
        q.send_many(list(SEEDS))


def _seeds_intact(queue: Queue) -> str | None:
    """``None`` if the queue holds exactly the seeds, all visible; else what is wrong."""
    stats = queue.stats()
    if stats.leased or stats.visible != len(SEEDS):
        return f"seed queue changed: {stats}"
    leases = queue.lease(len(SEEDS) + 5, duration=30)
    bodies = sorted(lease.message.body for lease in leases)
    for lease in leases:
        lease.abandon()
    if bodies != sorted(SEEDS):
        return f"seed messages changed: {bodies}"
    return None


def _untyped(exc: BaseException) -> str:
    return f"untyped {type(exc).__name__}: {exc!r}"[:300]


def _smoke(queue: Queue) -> str | None:
    """An accepted queue must work: send, lease and complete a probe (empty body)."""
    try:
        with queue:
            queue.create()
            queue.send(b"")
            leases = queue.lease(20, duration=30)
            probes = [lease for lease in leases if lease.message.body == b""]
            for lease in leases:
                if lease.message.body == b"":
                    lease.complete()
                else:
                    lease.abandon()
            if not probes:
                return "accepted, but the probe message was not leased back"
    except Exception as exc:
        return f"accepted, then {type(exc).__name__}: {exc}"[:300]
    return None


def check_open(
    reg: BackendRegistry, target: str, kwargs: dict[str, Any], seeds: Queue
) -> str | None:
    """Open with these options; ``None`` if the outcome keeps every promise."""
    Calls.count = 0
    try:
        queue = reg.open(target, **kwargs)
    except REFUSALS as exc:
        if Calls.count:
            return f"refused after {Calls.count} backend call(s): {exc!r}"
        return _seeds_intact(seeds)
    except Exception as exc:
        return _untyped(exc)
    return _smoke(queue) or _seeds_intact(seeds)


def _open_cases(
    backend: str, sqlite_dir: str
) -> st.SearchStrategy[tuple[str, dict[str, Any], str]]:
    """(target, kwargs, form) for one ``open`` call on ``backend``."""
    base: dict[str, Any] = {"queue": SEED_QUEUE}
    db = f"{sqlite_dir}/seed.db"
    if backend == "sqlite":
        base["path"] = db
    keyword = _options(backend, sqlite_dir).map(
        lambda opts: (backend, {**base, "create": True, **opts}, "keyword")
    )
    prefix = (
        f"sqlite:///{db}?queue={SEED_QUEUE}" if backend == "sqlite" else f"memory://{SEED_QUEUE}"
    )
    joiner = "&" if backend == "sqlite" else "?"
    query_names = [n for n in OPTION_NAMES[backend] if n != "path"] + ["colour", "create"]
    query = st.dictionaries(st.sampled_from(query_names), TEXT, min_size=1, max_size=3)
    core = st.fixed_dictionaries(
        {}, optional={k: _option_value(k, sqlite_dir) for k in CORE_OPTIONS}
    )
    url = st.tuples(query, core).map(
        lambda qc: (
            prefix
            + joiner
            + "&".join(
                f"{quote(k)}={quote(v, safe='', errors='surrogatepass')}" for k, v in qc[0].items()
            ),
            qc[1],
            "url",
        )
    )
    raw_prefix = "sqlite:///" if backend == "sqlite" else "memory://"
    raw = st.text(max_size=16).map(lambda tail: (raw_prefix + tail, {"create": True}, "raw"))
    return st.one_of(keyword, url, raw)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_open_refuses_bad_options_with_typed_errors_before_any_call(
    backend: str, registry: BackendRegistry, workdir: Path
) -> None:
    sqlite_dir = str(workdir)
    if backend == "sqlite":
        seed_target, seed_options = "sqlite", {"path": f"{sqlite_dir}/seed.db", "queue": SEED_QUEUE}
    else:
        seed_target, seed_options = "memory", {"queue": SEED_QUEUE}
    _seed(registry, seed_target, **seed_options)
    seeds = leasekit.open(seed_target, **seed_options)
    # The first example to fail, and whether the seeds need sowing again: a failed
    # example can leave them leased, and every replay while Hypothesis shrinks would
    # then fail on that leftover and hide the input that caused it.
    first: list[str] = []

    @FUZZ
    @given(case=_open_cases(backend, sqlite_dir))
    def run(case: tuple[str, dict[str, Any], str]) -> None:
        if first:
            _seed(registry, seed_target, **seed_options)
        target, kwargs, _form = case
        problem = check_open(registry, target, kwargs, seeds)
        if problem is not None:
            first.append(f"open({target!r}, **{kwargs!r}): {problem}")
        assert problem is None, f"{first[-1]}\n(the first example to fail: {first[0]})"

    try:
        run()
    finally:
        seeds.close()


# ------------------------------------------------------------ public calls

#: Operations on the queue, a held (or settled) lease, or the worker classes,
#: each with fuzzed keyword arguments.
QUEUE_OPS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "send": {
        "body": _or_any(st.binary(max_size=8)),
        "delay": _or_any(NUMBER),
        "ttl": _or_any(NUMBER),
        "properties": _or_any(
            st.dictionaries(TEXT, TEXT, max_size=3),
            st.dictionaries(ANY.filter(lambda v: v.__hash__ is not None), ANY, max_size=2),
        ),
    },
    "send_many": {
        "bodies": _or_any(st.lists(_or_any(st.binary(max_size=4)), max_size=3)),
        "delay": _or_any(NUMBER),
        "ttl": _or_any(NUMBER),
        "properties": _or_any(st.dictionaries(TEXT, TEXT, max_size=2)),
    },
    "lease": {
        "max_messages": _or_any(st.integers(-2, 2000)),
        "duration": _or_any(NUMBER),
        "wait": _or_any(st.floats(0, 0.05), NUMBER.filter(lambda v: not 0 < v < 1e300)),
    },
    "lease_one": {
        "duration": _or_any(NUMBER),
        "wait": _or_any(st.floats(0, 0.05), NUMBER.filter(lambda v: not 0 < v < 1e300)),
    },
    "peek_dead_letters": {"limit": _or_any(st.integers(-2, 100))},
    "complete_many": {"leases": _or_any(st.lists(ANY, max_size=2)), "timeout": _or_any(NUMBER)},
    "renew_many": {
        "leases": _or_any(st.lists(ANY, max_size=2)),
        "duration": _or_any(NUMBER),
        "timeout": _or_any(NUMBER),
    },
    "abandon_many": {
        "leases": _or_any(st.lists(ANY, max_size=2)),
        "delay": _or_any(NUMBER),
        "timeout": _or_any(NUMBER),
    },
}
LEASE_OPS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "renew": {"duration": _or_any(NUMBER)},
    "abandon": {"delay": _or_any(NUMBER)},
    "dead_letter": {"reason": _or_any(TEXT, st.text(min_size=4000, max_size=5000))},
    "on_lost": {"callback": _or_any(st.just(lambda lease, error: None))},
    "complete": {},
    "keep": {"duration": _or_any(NUMBER), "max_lifetime": _or_any(NUMBER)},
}
KEEPER_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "renew_at": _or_any(st.floats(0, 1)),
    "margin": _or_any(NUMBER),
    "max_lifetime": _or_any(NUMBER),
    "workers": _or_any(st.integers(-1, 8)),
    "on_lost": _or_any(st.just(lambda lease, error: None)),
    "stop_timeout": _or_any(NUMBER),
}
CONSUMER_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "handler": _or_any(st.just(lambda message: None)),
    "concurrency": _or_any(st.integers(-1, 8)),
    "lease_duration": _or_any(NUMBER),
    "duration_policy": _or_any(st.builds(AdaptiveLeaseDuration)),
    "max_deliveries": _or_any(st.integers(-1, 10)),
    "idempotency": _or_any(st.builds(MemoryIdempotencyStore)),
    "keeper": _or_any(st.builds(leasekit.LeaseKeeper)),
    "max_lifetime": _or_any(NUMBER),
    "prefetch": _or_any(st.integers(-1, 100)),
    "receivers": _or_any(st.integers(-1, 4)),
    "backoff_base": _or_any(NUMBER),
    "backoff_max": _or_any(NUMBER),
    "shutdown_grace": _or_any(NUMBER),
    "pass_lease": _or_any(st.booleans()),
    "handle_signals": _or_any(st.booleans()),
    "batch_complete": _or_any(st.booleans()),
    "batch_window": _or_any(NUMBER),
}


def _kwargs(spec: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=spec)


OPERATIONS = st.one_of(
    *(st.tuples(st.just(name), _kwargs(spec)) for name, spec in QUEUE_OPS.items()),
    *(
        st.tuples(st.just(name), _kwargs(spec), st.booleans())  # True: the lease is settled
        for name, spec in LEASE_OPS.items()
    ),
    st.tuples(st.just("LeaseKeeper"), _kwargs(KEEPER_ARGS)),
    st.tuples(st.just("Consumer"), _kwargs(CONSUMER_ARGS)),
)


def _apply(queue: Queue, lease: Lease | None, name: str, kwargs: dict[str, Any]) -> None:
    """Make the call ``name`` with ``kwargs`` (missing required arguments get good values)."""
    args = dict(kwargs)
    if name == "send":
        queue.send(args.pop("body", b"x"), **args)
    elif name == "send_many":
        queue.send_many(args.pop("bodies", [b"x"]), **args)
    elif name == "lease":
        for got in queue.lease(**args):
            got.abandon()
    elif name == "lease_one":
        with queue.lease_one(**args):
            pass
    elif name == "peek_dead_letters":
        queue.peek_dead_letters(**args)
    elif name in ("complete_many", "renew_many", "abandon_many"):
        getattr(queue, name)(args.pop("leases", []), **args)
    elif name == "LeaseKeeper":
        keeper = leasekit.LeaseKeeper(**args)
        keeper.start()
        keeper.stop()
    elif name == "Consumer":
        handler = args.pop("handler", lambda message: None)
        consumer = leasekit.Consumer(queue, handler, **args)
        del consumer
    elif name == "keep":
        assert lease is not None
        with leasekit.LeaseKeeper() as keeper:
            keeper.add(lease, **args)
            keeper.discard(lease)
    else:
        assert lease is not None
        method = getattr(lease, name)
        if name == "dead_letter":
            method(args.get("reason", "bad"))
        elif name == "on_lost":
            method(args.get("callback", lambda lease, error: None))
        else:
            method(**args)


def check_call(queue: Queue, op: tuple[Any, ...]) -> str | None:
    """Run one fuzzed call on a queue holding the seeds; ``None`` if every promise holds."""
    name, kwargs = op[0], op[1]
    lease: Lease | None = None
    if name in LEASE_OPS:
        [lease] = queue.lease(1, duration=30)
        if op[2]:
            lease.complete()
            queue.send(lease.message.body)  # keep every seed in the queue
    Calls.count = 0
    try:
        _apply(queue, lease, name, kwargs)
    except REFUSALS as exc:
        if Calls.count:
            return f"refused after {Calls.count} backend call(s): {exc!r}"[:300]
        if lease is not None and not op[2]:
            if lease.state is not leasekit.LeaseState.HELD:
                return f"refused, but the lease is now {lease.state.value}"
            lease.abandon()
        return _seeds_intact(queue)
    except errors.QueueEmpty:
        if name != "lease_one":
            return "QueueEmpty from a call that does not wait for one message"
        return None
    except Exception as exc:
        return _untyped(exc)
    return None


@pytest.fixture
def fresh_queue(
    request: pytest.FixtureRequest, registry: BackendRegistry, workdir: Path
) -> Iterator[Callable[[], Queue]]:
    """Makes a new queue holding the seed messages, on the parametrised backend."""
    made: list[Queue] = []

    def make() -> Queue:
        name = f"q-{uuid.uuid4().hex[:10]}"
        if request.param == "memory":
            q = registry.open("memory", queue=name, broker=MemoryBroker(), create=True)
        else:
            q = registry.open("sqlite", path=str(workdir / "calls.db"), queue=name, create=True)
        q.send_many(list(SEEDS))
        made.append(q)
        return q

    yield make
    for q in made:
        q.close()


@pytest.mark.parametrize("fresh_queue", ["memory", "sqlite"], indirect=True)
def test_public_calls_refuse_bad_arguments_before_any_call_and_lose_nothing(
    fresh_queue: Callable[[], Queue],
) -> None:
    @FUZZ
    @given(op=OPERATIONS)
    def run(op: tuple[Any, ...]) -> None:
        queue = fresh_queue()
        try:
            problem = check_call(queue, op)
        finally:
            queue.close()
        assert problem is None, f"{op!r}: {problem}"

    run()


# ------------------------------------------------- the cases the issue named


@pytest.mark.parametrize(
    "target, options",
    [
        ("sqlite:///x.db?queue=q", {"synchronous": 1}),
        ("memory://q", {"broker": "x"}),
        ("memory://q", {"max_message_size": math.inf}),
        ("sqlite:///x.db?queue=q", {"max_message_size": math.inf}),
        ("memory://q", {"retry": "x"}),
        ("sqlite:///x.db?queue=q", {"busy_timeout": 1e306}),
        ("memory://q", {"clock": leasekit.ManualClock}),
        ("memory://q", {"create": "no"}),
    ],
)
def test_named_bad_options_are_invalid_urls_before_any_call(
    target: str, options: dict[str, Any], registry: BackendRegistry, workdir: Path
) -> None:
    Calls.count = 0
    with pytest.raises(errors.InvalidArgument) as info:
        registry.open(target, **options)
    assert Calls.count == 0
    assert next(iter(options)) in str(info.value)


@pytest.mark.parametrize("reason", ["\ud800", "ok\udfff"])
@pytest.mark.parametrize("fresh_queue", ["memory", "sqlite"], indirect=True)
def test_a_reason_that_is_not_utf8_is_refused_alike_everywhere(
    fresh_queue: Callable[[], Queue], reason: str
) -> None:
    queue = fresh_queue()
    [lease] = queue.lease(1, duration=30)
    Calls.count = 0
    with pytest.raises(errors.InvalidArgument, match="UTF-8"):
        lease.dead_letter(reason)
    assert Calls.count == 0
    assert lease.state is leasekit.LeaseState.HELD
    lease.abandon()
    assert _seeds_intact(queue) is None


# ---------------------------------------------- the cloud drivers' options

#: Options that open each cloud backend without any network call.
CLOUD_OPTIONS: dict[str, dict[str, Any]] = {
    "aws-sqs": {
        "queue": "q",
        "region": "us-east-1",
        "endpoint_url": "http://127.0.0.1:1",
        "aws_access_key_id": "AKIDEXAMPLE",
        "aws_secret_access_key": "secret-value",
    },
    "aliyun-mns": {
        "queue": "q",
        "endpoint": "http://127.0.0.1:1",
        "access_key_id": "id",
        "access_key_secret": "secret-value",
    },
    "azure-storage-queue": {
        "queue": "qqq",
        "account_url": "http://127.0.0.1:1/devstoreaccount1",
        "credential": "a2V5",
    },
    "azure-service-bus": {
        "queue": "q",
        "connection_string": "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;"
        "SharedAccessKey=v;UseDevelopmentEmulator=true",
    },
    "gcp-pubsub": {"project": "p", "queue": "q", "endpoint": "127.0.0.1:1"},
}


@pytest.mark.parametrize("scheme", sorted(CLOUD_OPTIONS))
def test_cloud_driver_options_get_typed_errors_when_opened(scheme: str) -> None:
    cls = leasekit.default_registry().driver_class(scheme)
    names = sorted(n for n in inspect.signature(cls).parameters if not n.startswith("_"))

    @settings(FUZZ, max_examples=min(EXAMPLES, 60))
    @given(
        options=st.lists(st.sampled_from(names), unique=True, min_size=1, max_size=3).flatmap(
            lambda keys: st.fixed_dictionaries({k: ANY for k in keys})
        )
    )
    def run(options: dict[str, Any]) -> None:
        try:
            queue = leasekit.open(scheme, **{**CLOUD_OPTIONS[scheme], **options})
        except (errors.LeaseError, errors.LeaseStateError):
            return
        except Exception as exc:
            pytest.fail(f"{scheme} {options!r}: {_untyped(exc)}")
        queue.close()

    run()
