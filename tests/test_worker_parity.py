"""One worker, two faces: Consumer (threads) and AsyncConsumer (tasks) do the same to a message.

Each scenario of the table runs through both faces on its own in-memory queue
(a manual clock, so a lease ends when the test says so), and the two runs must
agree on the stats, the handler's calls and the idempotency store's contents —
and match what ``docs/consumer.md`` says happens.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import leasekit
import leasekit.aio
from leasekit import errors
from leasekit.aio import AsyncConsumer, AsyncLease
from leasekit.backends.memory import MemoryBroker

_names = itertools.count()

#: The counters a scenario compares (the current gauges and the policy's figures are not).
COUNTERS = (
    "received",
    "completed",
    "failed",
    "abandoned",
    "dead_lettered",
    "duplicates_skipped",
    "stale_on_complete",
    "lost",
    "settle_errors",
    "abandoned_at_shutdown",
    # Async only (a thread cannot be cancelled): 0 on both faces in every row here;
    # its scenarios are in tests/test_aio_lost_handler.py.
    "cancelled_on_loss",
    "returned_in_order",
)


@dataclass
class World:
    """What one run of a scenario sees: its queue, a second handle on it, clock and store."""

    queue: leasekit.Queue
    other: leasekit.Queue  # "another consumer" on the same queue
    clock: leasekit.ManualClock
    store: leasekit.MemoryIdempotencyStore
    stop: Callable[[], None] = lambda: None
    calls: list[bytes] = field(default_factory=list)
    ids: dict[str, bytes] = field(default_factory=dict)  # message id -> body
    ordered: bool = False  # the messages were sent in one group: the calls' order counts


def _take_over(world: World) -> None:
    """Someone else gets the message: its lease ends (clock) and another consumer leases it.

    Both in one step under the broker's lock: otherwise the consumer's own
    receiver, polling meanwhile, may lease the message first when it sees the
    clock move (seen under a loaded CI run: the handler then ran twice).
    """
    driver = world.other.driver
    with driver.broker.cond:
        world.clock.advance(31)
        assert len(driver._receive_now(10, 60)) >= 1


def _returns(world: World, arg: Any) -> None:
    pass


def _raises(world: World, arg: Any) -> None:
    raise RuntimeError("handler failed")


def _taken_over_then_returns(world: World, arg: Any) -> None:
    _take_over(world)


def _taken_over_renew_fails_then_returns(world: World, lease: leasekit.Lease) -> None:
    _take_over(world)
    with pytest.raises(errors.LeaseLost):
        lease.renew()  # the lease is found lost while the handler runs
    assert lease.state is leasekit.LeaseState.LOST


def _taken_over_then_gives_up(world: World, lease: leasekit.Lease) -> None:
    _take_over(world)
    with pytest.raises(errors.LeaseLost):
        lease.renew()
    lease.check()  # raises LeaseLost: the handler stops, its work unfinished


def _raises_on_first_m1(world: World, arg: Any) -> None:
    if _body(arg) == b"m1" and world.calls.count(b"m1") == 1:
        raise RuntimeError("handler failed on m1, once")


def _stops_mid_batch(world: World, arg: Any) -> None:
    world.stop()  # the others stay buffered: given back at shutdown


def _no_setup(world: World) -> None:
    pass


def _delivered_three_times(world: World) -> None:
    for _ in range(2):
        [lease] = world.queue.lease(1, duration=30)
        lease.abandon()


def _already_processed(world: World) -> None:
    world.store.record(next(iter(world.ids)))


@dataclass(frozen=True)
class Scenario:
    name: str
    messages: int
    handler: Callable[[World, Any], None]
    expected: dict[str, int]
    setup: Callable[[World], None] = _no_setup
    options: dict[str, Any] = field(default_factory=dict)
    #: Whether the message ends up recorded in the idempotency store.
    recorded: bool = False
    handler_calls: int | None = None  # default: one per message
    #: Send the messages in this ordered group; ``calls`` is then the handler's calls in order.
    group: str | None = None
    calls: tuple[bytes, ...] = ()


SCENARIOS = [
    Scenario("plain completion", 5, _returns, {"received": 5, "completed": 5}, recorded=True),
    Scenario(
        "handler error with backoff",
        1,
        _raises,
        {"received": 1, "failed": 1, "abandoned": 1},
        options={"backoff_base": 30.0},
    ),
    Scenario(
        "poison message",
        1,
        _returns,
        {"received": 1, "dead_lettered": 1},
        setup=_delivered_three_times,
        options={"max_deliveries": 2},
        handler_calls=0,
    ),
    Scenario(
        "duplicate in the idempotency store",
        1,
        _returns,
        {"received": 1, "duplicates_skipped": 1},
        setup=_already_processed,
        recorded=True,
        handler_calls=0,
    ),
    Scenario(
        "lease lost during the handler",
        1,
        _taken_over_then_returns,
        {"received": 1, "stale_on_complete": 1},
        recorded=True,
    ),
    Scenario(
        "lease lost during a pass_lease handler that returns",
        1,
        _taken_over_renew_fails_then_returns,
        {"received": 1, "stale_on_complete": 1},
        options={"pass_lease": True},
        recorded=True,
    ),
    Scenario(
        "lease lost during a pass_lease handler that gives up",
        1,
        _taken_over_then_gives_up,
        {"received": 1, "failed": 1, "lost": 1},
        options={"pass_lease": True},
    ),
    Scenario(
        "shutdown in mid-batch",
        10,
        _stops_mid_batch,
        {"received": 5, "completed": 1, "abandoned_at_shutdown": 4},
        options={"prefetch": 4},
        recorded=True,
        handler_calls=1,
    ),
    Scenario(
        "ordered group: a failed message holds its group until it is handled",
        4,
        _raises_on_first_m1,
        {"received": 5, "completed": 4, "failed": 1, "abandoned": 1},
        options={"concurrency": 4, "backoff_base": 0.0},
        recorded=True,
        handler_calls=5,
        group="order-17",
        calls=(b"m0", b"m1", b"m1", b"m2", b"m3"),
    ),
    Scenario(
        "ordered group: a poison head is dead-lettered, the rest go on in order",
        3,
        _returns,
        {"received": 3, "dead_lettered": 1, "completed": 2},
        setup=_delivered_three_times,
        options={"max_deliveries": 2, "concurrency": 4},
        recorded=True,
        handler_calls=2,
        group="order-17",
        calls=(b"m1", b"m2"),
    ),
]


def _world() -> World:
    clock = leasekit.ManualClock()
    broker = MemoryBroker(clock=clock)
    name = f"parity-{next(_names)}"
    queue = leasekit.open("memory", queue=name, broker=broker, create=True)
    other = leasekit.open("memory", queue=name, broker=broker)
    return World(queue, other, clock, leasekit.MemoryIdempotencyStore())


def _prepare(scenario: Scenario) -> World:
    world = _world()
    bodies = [b"m%d" % i for i in range(scenario.messages)]
    sent = world.queue.send_many(bodies, group=scenario.group)
    world.ids = dict(zip(sent, bodies, strict=True))
    world.ordered = scenario.group is not None
    scenario.setup(world)
    return world


def _options(scenario: Scenario, world: World) -> dict[str, Any]:
    return {
        "concurrency": 1,
        "lease_duration": 30,
        "idempotency": world.store,
        "handle_signals": False,
        **scenario.options,
    }


def _body(arg: Any) -> bytes:
    return bytes(arg.message.body if hasattr(arg, "message") else arg.body)


def _threads(scenario: Scenario) -> tuple[leasekit.ConsumerStats, World]:
    world = _prepare(scenario)

    def handler(arg: Any) -> None:
        world.calls.append(_body(arg))
        scenario.handler(world, arg)

    consumer = leasekit.Consumer(world.queue, handler, **_options(scenario, world))
    world.stop = consumer.stop
    return consumer.run(until_idle=True), world


def _tasks(scenario: Scenario) -> tuple[leasekit.ConsumerStats, World]:
    world = _prepare(scenario)

    async def handler(arg: Any) -> None:
        world.calls.append(_body(arg))
        # The scenarios' handlers are quick and never wait on the network (memory://).
        scenario.handler(world, arg.lease if isinstance(arg, AsyncLease) else arg)

    async def main() -> leasekit.ConsumerStats:
        async with leasekit.aio.AsyncQueue(world.queue) as queue:
            consumer = AsyncConsumer(queue, handler, **_options(scenario, world))
            world.stop = consumer.stop
            return await consumer.run(until_idle=True)

    return asyncio.run(main()), world


def _summary(stats: leasekit.ConsumerStats, world: World) -> dict[str, Any]:
    return {
        "stats": {name: getattr(stats, name) for name in COUNTERS},
        "calls": list(world.calls) if world.ordered else sorted(world.calls),
        "store": sorted(body for i, body in world.ids.items() if world.store.seen(i)),
    }


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_both_faces_do_the_same_to_a_message(scenario: Scenario) -> None:
    threads = _summary(*_threads(scenario))
    tasks = _summary(*_tasks(scenario))
    assert threads == tasks, f"{scenario.name}: the faces disagree"
    expected = {name: scenario.expected.get(name, 0) for name in COUNTERS}
    assert threads["stats"] == expected
    calls = scenario.messages if scenario.handler_calls is None else scenario.handler_calls
    assert len(threads["calls"]) == calls
    recorded = threads["store"]
    assert bool(recorded) == scenario.recorded, f"recorded ids: {recorded}"
    if scenario.group is not None:
        assert threads["calls"] == list(scenario.calls), "the group's order was broken"
