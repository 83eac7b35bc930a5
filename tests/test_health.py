"""Health: liveness and readiness, measured, and served over HTTP for probes.

The rules are checked on :func:`assess` directly; then on real consumers: one
whose handler blocks the event loop (not live, then live again), and one that
talks to moto's SQS through a fault-injecting proxy that a test blackholes —
readiness fails while the queue cannot be reached, liveness fails while a
renewal hangs past ``stuck_after``, and both recover when the network does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures.fault_proxy import MakeProxy
from _fixtures.fault_targets import FAULT_BACKENDS, FaultTarget

import leasekit
import leasekit.aio
from leasekit import Consumer, Health, HealthLimits, HealthServer, KeeperProgress, errors
from leasekit.health import WorkerPulse, assess


def _wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def _get(url: str) -> tuple[int, dict[str, Any]]:
    """GET ``url``; the status and the JSON body, whatever the status."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _keeper(**changes: Any) -> KeeperProgress:
    fields: dict[str, Any] = {
        "running": True,
        "heartbeat_age": 0.1,
        "held": 3,
        "overdue": 0,
        "oldest_overdue": 0.0,
    }
    return KeeperProgress(**{**fields, **changes})


# ------------------------------------------------------------------- the rules


def test_a_consumer_not_started_is_live_but_not_ready() -> None:
    health = assess(WorkerPulse(), None)
    assert health.live and not health.ready
    assert health.ready_problems == ("the consumer has not started",)


def test_a_running_consumer_is_ready_once_a_receive_returned() -> None:
    pulse = WorkerPulse()
    pulse.begin()
    pulse.receiving(1.0, 11.0)
    starting = assess(pulse, _keeper())
    assert starting.live and starting.ready_problems == ("no receive has returned yet",)
    pulse.received()
    pulse.expect(0.5)
    health = assess(pulse, _keeper())
    assert health.live and health.ready
    assert health.details["leases_held"] == 3 and health.details["receive_failures"] == 0
    assert json.loads(json.dumps(health.as_dict()))["ready"] is True


def test_failed_receives_make_it_not_ready_until_one_returns() -> None:
    pulse = WorkerPulse()
    pulse.begin()
    for _ in range(2):
        pulse.failed(errors.BackendUnavailable("connection refused"))
    health = assess(pulse, _keeper())
    assert health.live and not health.ready
    assert health.ready_problems == (
        "2 receive(s) failed in a row: BackendUnavailable: connection refused",
    )
    assert health.details["last_receive_error"] == "BackendUnavailable: connection refused"
    pulse.received()
    assert assess(pulse, _keeper()).ready


def test_a_receive_that_waits_past_its_long_poll_makes_it_not_ready() -> None:
    pulse = WorkerPulse()
    pulse.begin()
    pulse.received()
    pulse.receiving(1.0, 11.0)
    assert pulse.receiving_since is not None
    pulse.receiving_since -= 2.5  # the receive began 2.5 s ago
    health = assess(pulse, _keeper(), HealthLimits(slow_receive=1.0))
    assert health.live and not health.ready
    assert "a receive has waited 2.5 s (its long poll is 1 s)" in health.ready_problems[0]
    assert assess(pulse, _keeper(), HealthLimits(slow_receive=5.0)).ready


def test_a_late_loop_or_a_stuck_keeper_makes_it_not_live() -> None:
    pulse = WorkerPulse()
    pulse.begin()
    pulse.received()
    limits = HealthLimits(stuck_after=2.0)
    pulse.expect(-3.0)  # it said it would be back 3 s ago
    late = assess(pulse, _keeper(), limits)
    assert not late.live and not late.ready and late.ready_problems[0] == "not live"
    assert late.live_problems[0].startswith("the worker loop is 3.0 s late")
    pulse.expect(0.5)
    cases = {
        "the lease keeper is not running": _keeper(running=False),
        "the lease keeper's scheduler is 2.5 s late (it last ran 3.5 s ago)": _keeper(
            heartbeat_age=3.5
        ),
        "2 lease renewal(s) overdue, the oldest by 4.0 s": _keeper(overdue=2, oldest_overdue=4.0),
    }
    for problem, keeper in cases.items():
        health = assess(pulse, keeper, limits)
        assert health.live_problems == (problem,) and not health.ready
    assert assess(pulse, _keeper(overdue=1, oldest_overdue=1.5), limits).live
    assert assess(pulse, _keeper(heartbeat_age=2.5), limits).live  # it wakes every 1 s


def test_an_event_loop_that_misses_its_ticks_makes_it_not_live() -> None:
    pulse = WorkerPulse()
    pulse.begin()
    pulse.received()
    pulse.expect(30)  # a receive in flight: the loop's own promise is far away
    pulse.ticked(0.25)
    assert assess(pulse, _keeper(), HealthLimits(stuck_after=1.0)).live
    assert pulse.tick is not None
    pulse.tick -= 2.05
    health = assess(pulse, _keeper(), HealthLimits(stuck_after=1.0))
    assert health.live_problems == ("the event loop has been blocked for 1.8 s",)


def test_stopping_is_live_but_not_ready_and_stopped_is_neither() -> None:
    pulse = WorkerPulse()
    pulse.begin()
    pulse.received()
    pulse.stopping()
    pulse.back_by = time.monotonic() - 60  # the loop has ended: lateness no longer counts
    stopping = assess(pulse, _keeper())
    assert stopping.live and stopping.ready_problems == ("the consumer is stopping",)
    pulse.end()
    stopped = assess(pulse, _keeper())
    assert not stopped.live and stopped.live_problems == ("the consumer has stopped",)


def test_bad_limits_and_server_arguments_are_refused() -> None:
    for kwargs in ({"stuck_after": 0}, {"slow_receive": -1}, {"stuck_after": "10"}):
        with pytest.raises(errors.InvalidArgument):
            HealthLimits(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgument):
        HealthServer(object())  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgument):
        HealthServer(lambda: Health(live=True, ready=True), port=70000)


# ------------------------------------------------------------------ the server


def test_the_server_answers_livez_and_readyz_with_json_and_404_elsewhere() -> None:
    current = {"health": Health(live=True, ready=False, ready_problems=("not yet",))}
    with HealthServer(lambda: current["health"]) as server:
        assert _get(f"{server.url}/livez") == (200, current["health"].as_dict())
        status, body = _get(f"{server.url}/readyz?verbose")
        assert status == 503 and body["ready_problems"] == ["not yet"]
        current["health"] = Health(live=False, ready=False, live_problems=("stuck",))
        assert _get(f"{server.url}/livez")[0] == 503
        request = urllib.request.Request(f"{server.url}/livez", method="HEAD")
        with pytest.raises(urllib.error.HTTPError) as head:
            urllib.request.urlopen(request, timeout=5)
        assert head.value.code == 503 and head.value.read() == b""
        assert _get(f"{server.url}/metrics")[0] == 404
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{server.url}/livez", timeout=2)


def test_a_check_that_raises_is_answered_503() -> None:
    def broken() -> Health:
        raise RuntimeError("boom")

    with HealthServer(broken) as server:
        status, body = _get(f"{server.url}/livez")
    assert status == 503 and "boom" in body["error"]


def test_a_prober_gone_before_its_answer_prints_no_traceback_and_the_server_goes_on(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    asked, answer = threading.Event(), threading.Event()

    def slow() -> Health:  # a frozen consumer: the prober gives up before the answer
        asked.set()
        answer.wait(10)
        return Health(live=True, ready=True)

    caplog.set_level(logging.DEBUG, logger="leasekit.health")
    with HealthServer(slow) as server:
        prober = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        prober.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        assert asked.wait(5)
        # Gone with a reset (SO_LINGER 0), so the server's write fails at once.
        prober.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        prober.close()
        answer.set()
        deadline = time.monotonic() + 5
        while not any("left before its answer" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the server never wrote to the gone prober"
            time.sleep(0.01)  # polling the log, with a deadline
        assert _get(f"{server.url}/livez")[0] == 200  # still serving
    assert "Traceback" not in capfd.readouterr().err


def test_a_consumer_is_live_before_ready_while_running_and_neither_once_stopped(
    tmp_path: Path,
) -> None:
    queue = leasekit.open(f"sqlite:///{tmp_path}/h.db?queue=jobs", create=True)
    queue.send_many([b"a", b"b"])
    handled = threading.Event()
    consumer = Consumer(queue, lambda message: handled.set(), handle_signals=False)
    with HealthServer(consumer) as server:
        assert _get(f"{server.url}/livez")[0] == 200
        assert _get(f"{server.url}/readyz")[1]["ready_problems"] == ["the consumer has not started"]
        runner = threading.Thread(target=consumer.run)
        runner.start()
        try:
            assert handled.wait(5)
            _wait_until(lambda: _get(f"{server.url}/readyz")[0] == 200, 5, "ready")
            status, body = _get(f"{server.url}/livez")
            assert status == 200 and body["details"]["keeper_running"] is True
        finally:
            consumer.stop()
            runner.join(10)
        status, body = _get(f"{server.url}/livez")
    assert status == 503 and body["live_problems"] == ["the consumer has stopped"]
    queue.close()


# ------------------------------------------------------------- stuck for real


def test_an_async_consumer_whose_event_loop_is_blocked_is_not_live_until_it_runs_again(
    tmp_path: Path,
) -> None:
    """The server runs on its own thread: it answers, and says the loop is blocked."""
    unblock = threading.Event()
    seen: list[tuple[int, dict[str, Any]]] = []
    failures: list[BaseException] = []

    async def handler(message: leasekit.Message) -> None:
        unblock.wait(20)  # blocks the whole event loop (the fault under test)

    async def main() -> None:
        url = f"sqlite:///{tmp_path}/blocked.db?queue=jobs"
        async with leasekit.aio.open(url, create=True) as queue:
            await queue.send(b"x")
            consumer = leasekit.aio.AsyncConsumer(queue, handler, handle_signals=False)
            server = HealthServer(consumer, limits=HealthLimits(stuck_after=0.5)).start()

            def probe() -> None:  # from another thread, while the loop is blocked
                try:
                    _wait_until(lambda: _get(f"{server.url}/livez")[0] == 503, 10, "not live")
                    seen.append(_get(f"{server.url}/livez"))
                    unblock.set()
                    _wait_until(lambda: _get(f"{server.url}/livez")[0] == 200, 10, "live again")
                    _wait_until(lambda: _get(f"{server.url}/readyz")[0] == 200, 10, "ready")
                    seen.append(_get(f"{server.url}/readyz"))
                except BaseException as exc:  # reported by the test thread
                    failures.append(exc)
                finally:
                    unblock.set()
                    consumer.stop()

            prober = threading.Thread(target=probe)
            prober.start()
            try:
                await consumer.run()
            finally:
                unblock.set()
                prober.join(30)
                server.stop()

    asyncio.run(main())
    if failures:
        raise failures[0]
    (status, stuck), (ready_status, ready) = seen
    assert status == 503 and not stuck["ready"]
    assert stuck["live_problems"][0].startswith("the event loop has been blocked for"), stuck
    # The keeper runs on its own thread: no renewal was overdue while the loop was blocked.
    assert stuck["details"]["renewals_overdue"] == 0
    assert ready_status == 200 and ready["ready"] is True


@pytest.fixture
def sqs_behind_proxy(
    request: pytest.FixtureRequest, fault_proxy: MakeProxy
) -> Iterator[FaultTarget]:
    target = FAULT_BACKENDS["aws-sqs"](fault_proxy, request)
    try:
        yield target
    finally:
        target.close()


def test_liveness_and_readiness_fail_while_the_network_is_gone_and_both_recover(
    sqs_behind_proxy: FaultTarget,
) -> None:
    # A receive through the blackhole fails after its 1 s poll plus a 3 s call timeout.
    proxied, direct = sqs_behind_proxy.queues(call_timeout=3)
    direct.send(b"long job")
    started, finish = threading.Event(), threading.Event()

    def handler(message: leasekit.Message) -> None:
        started.set()
        finish.wait(30)

    # A 6 s lease is renewed about 4 s in; a renewal hung for 1 s makes it not live.
    consumer = Consumer(proxied, handler, lease_duration=6, handle_signals=False)
    limits = HealthLimits(stuck_after=1.0, slow_receive=1.0)
    runner = threading.Thread(target=consumer.run)
    with HealthServer(consumer, limits=limits) as server:
        runner.start()
        try:
            assert started.wait(10), "the handler did not start"
            _wait_until(lambda: _get(f"{server.url}/readyz")[0] == 200, 5, "ready")
            assert _get(f"{server.url}/livez")[0] == 200
            sqs_behind_proxy.proxy.blackhole()
            _wait_until(lambda: _get(f"{server.url}/readyz")[0] == 503, 8, "not ready")
            cut_off = _get(f"{server.url}/readyz")[1]
            _wait_until(lambda: _get(f"{server.url}/livez")[0] == 503, 8, "not live")
            stuck = _get(f"{server.url}/livez")[1]
            sqs_behind_proxy.proxy.pass_()
            _wait_until(lambda: _get(f"{server.url}/livez")[0] == 200, 8, "live again")
            _wait_until(lambda: _get(f"{server.url}/readyz")[0] == 200, 8, "ready again")
        finally:
            finish.set()
            consumer.stop()
            runner.join(15)
    assert cut_off["live"] is True
    assert any(
        "receive has waited" in p or "failed in a row" in p for p in cut_off["ready_problems"]
    ), cut_off
    assert stuck["live_problems"][0].startswith("1 lease renewal(s) overdue"), stuck
    assert stuck["details"]["leases_held"] == 1
