"""Benchmark ordered delivery: SQS FIFO, MNS and Service Bus sessions vs their raw SDKs; groups.

Parts (``--part fifo``, ``--part sessions``, ``--part groups``, ``--part mns``; ``both`` is
fifo and groups, ``all`` is fifo, sessions and groups):

fifo
    One moto server (``python -m moto.server``) on a free loopback port; each
    scenario gets a fresh FIFO queue and moves ``--messages`` messages, spread
    over ``--groups`` groups, through it in rounds of ``--depth`` (moto's receive
    cost grows with depth). A round is sent (timed: send rate), then drained
    (timed: consume rate, receive + delete of every message). Every scenario
    runs ``--repeat`` times, interleaved; medians, and the ratio to raw boto3.

    raw boto3          ``send_message_batch`` (10, ``MessageGroupId`` and a uuid
                       ``MessageDeduplicationId`` each); receive 10 (long poll 1 s)
                       then one ``delete_message_batch``
    leasekit           ``send_many(bodies, group=g)``; ``lease(10, wait=1)`` then
                       ``complete_many`` (one ``DeleteMessageBatch``)

sessions
    leasekit's Service Bus emulator (``python -m leasekit.emulators.servicebus``) on
    free loopback ports; each run gets a fresh ``RequiresSession`` queue (LockDuration
    30 s) and moves ``--sb-messages`` messages spread over ``--sb-groups`` sessions
    (sent per session, timed: send rate), then drains it (timed: consume rate). The
    two sides alternate (raw, leasekit, raw, leasekit...) ``--repeat`` times; the
    table shows medians and the spread (min-max) of the consume ratio per pair.

    raw SDK            per session ``send_messages`` of ``ServiceBusMessage(session_id=)``
                       in batches of 100; then, until drained: accept the next
                       available session (``NEXT_AVAILABLE_SESSION``, ``max_wait_time``
                       1 s, prefetch 0), ``receive_messages(32, max_wait_time=1)``,
                       ``complete_message`` each, close the receiver (session
                       released), as the SDK's samples do (``with receiver:``)
    raw, close off path  the same, but each ``receiver.close()`` on a thread of its own
                       (the SDK's close waits for its keep-alive thread, up to 1 s)
    leasekit           ``send_many(bodies, group=g)``; ``lease(32, wait=1)`` (which
                       accepts the next available session) then ``complete_many``
                       (the last settle releases the session; the SDK's close,
                       which waits for its keep-alive thread, runs on a closer thread)

groups
    ``leasekit.Consumer`` on an in-memory queue (``--concurrency`` threads) runs
    ``--consumer-messages`` messages spread round-robin over 1, 2, 4, ... 64
    groups; the handler waits ``--handler-ms`` (an I/O call's stand-in). One
    group is serial by definition; the curve shows the parallelism across
    groups, up to ``concurrency``. The unordered row is the same messages sent
    without a group.

mns
    leasekit's MNS emulator (``python -m leasekit.emulators.mns``) on a free
    loopback port; each scenario gets a fresh ordered queue (OpenAPI
    ``CreateQueue`` with ``QueueType=fifo``) and moves ``--messages`` messages
    over ``--groups`` groups in rounds of ``--depth``, as above. Turns alternate
    (raw, leasekit, raw, leasekit, ...) ``--repeat`` times; medians and the
    spread (lowest–highest) of each.

    raw aliyun-mns-sdk ``batch_send_message`` (16, ``message_group_id`` each,
                       the SDK's base64); ``batch_receive_message(16, 1)`` then
                       one ``batch_delete_message``
    leasekit           ``send_many(bodies, group=g)``; ``lease(16, wait=1)`` then
                       ``complete_many``

mns-cpu
    The same emulator; client CPU alone (``time.process_time``) per message for
    the send and the consume phase, raw SDK and leasekit alternating
    ``--repeat`` times, on an ordered queue (``--groups`` groups) and on a
    standard one (no groups): where leasekit's extra cost is, and whether
    ordering adds to it.

mns-calls
    The same emulator, one ordered queue; the median wall time of one receive
    (16) and of one delete of what it got, for three layers taking turns: the raw
    SDK, leasekit's driver (``driver.receive`` / ``driver.delete``, no core), and
    the ``Queue`` (``lease`` / ``complete_many``): which layer adds what.

Run (bounded: about two minutes)::

    .venv/bin/python benchmarks/bench_ordered.py --messages 500 --repeat 3 --groups 10 \\
        --consumer-messages 1000 --concurrency 16 --handler-ms 2
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import boto3

import leasekit
from leasekit.backends.memory import MemoryBroker
from leasekit.emulators._process import ServerProcess, free_port, python_module

REGION = "us-east-1"
KEY = "testing"  # moto's dummy credentials
BODY_SIZE = 256


def _bodies(count: int) -> list[bytes]:
    return [os.urandom(BODY_SIZE // 2).hex().encode()[:BODY_SIZE] for _ in range(count)]


def _groups_of(bodies: list[bytes], groups: int) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for i, body in enumerate(bodies):
        out.setdefault(f"g{i % groups}", []).append(body)
    return out


# ----------------------------------------------------------------- fifo part


def raw_send(client: Any, url: str, by_group: dict[str, list[bytes]]) -> None:
    import base64

    for group, bodies in by_group.items():
        for start in range(0, len(bodies), 10):
            entries = [
                {
                    "Id": str(i),
                    "MessageBody": base64.b64encode(body).decode("ascii"),
                    "MessageGroupId": group,
                    "MessageDeduplicationId": uuid.uuid4().hex,
                }
                for i, body in enumerate(bodies[start : start + 10])
            ]
            client.send_message_batch(QueueUrl=url, Entries=entries)


def raw_consume(client: Any, url: str, total: int) -> int:
    done = 0
    while done < total:
        messages = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageSystemAttributeNames=["ApproximateReceiveCount", "MessageGroupId"],
        ).get("Messages", [])
        if not messages:
            continue
        client.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )
        done += len(messages)
    return done


def lk_send(queue: leasekit.Queue, by_group: dict[str, list[bytes]]) -> None:
    for group, bodies in by_group.items():
        queue.send_many(bodies, group=group)


def lk_consume(queue: leasekit.Queue, total: int) -> int:
    done = 0
    while done < total:
        leases = queue.lease(10, wait=1)
        if leases:
            queue.complete_many(leases)
            done += len(leases)
    return done


def measure_fifo(
    name: str, endpoint: str, messages: int, depth: int, groups: int
) -> dict[str, float]:
    options = {
        "region": REGION,
        "endpoint_url": endpoint,
        "aws_access_key_id": KEY,
        "aws_secret_access_key": KEY,
    }
    queue_name = f"bench-{name}-{secrets.token_hex(3)}.fifo"
    queue = leasekit.open("aws-sqs", queue=queue_name, create=True, **options)
    client = boto3.client(
        "sqs",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=KEY,
    )
    url = client.get_queue_url(QueueName=queue_name)["QueueUrl"]
    send_s = consume_s = 0.0
    cpu0 = time.process_time()
    try:
        for start in range(0, messages, depth):
            count = min(depth, messages - start)
            by_group = _groups_of(_bodies(count), groups)
            t0 = time.perf_counter()
            if name == "raw":
                raw_send(client, url, by_group)
            else:
                lk_send(queue, by_group)
            t1 = time.perf_counter()
            if name == "raw":
                raw_consume(client, url, count)
            else:
                lk_consume(queue, count)
            t2 = time.perf_counter()
            send_s += t1 - t0
            consume_s += t2 - t1
        cpu = time.process_time() - cpu0
    finally:
        queue.delete_queue()
        queue.close()
    return {
        "send/s": messages / send_s,
        "consume/s": messages / consume_s,
        "client CPU us/msg": cpu / messages * 1e6,
    }


def fifo_part(args: argparse.Namespace) -> str:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": KEY, "AWS_DEFAULT_REGION": REGION}
    server = ServerProcess(
        python_module("moto.server", "-H", "127.0.0.1", "-p", str(port)),
        port,
        env=env,
        name="moto-server",
    )
    runs: dict[str, list[dict[str, float]]] = {"raw": [], "leasekit": []}
    with server:
        for _ in range(args.repeat):
            for name in runs:
                runs[name].append(
                    measure_fifo(name, endpoint, args.messages, args.depth, args.groups)
                )
    medians = {
        name: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        for name, rs in runs.items()
    }
    raw = medians["raw"]
    lines = [
        f"SQS FIFO on moto: {args.messages} messages in {args.groups} groups, rounds of "
        f"{args.depth}, median of {args.repeat}",
        "",
        "| scenario | send/s | vs raw | consume/s | vs raw | client CPU us/msg |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in medians.items():
        lines.append(
            f"| {name} | {m['send/s']:.0f} | {m['send/s'] / raw['send/s']:.2f} | "
            f"{m['consume/s']:.0f} | {m['consume/s'] / raw['consume/s']:.2f} | "
            f"{m['client CPU us/msg']:.0f} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ mns part

MNS_KEY_ID = "bench-key"
MNS_KEY_SECRET = "bench-secret"  # the emulator's, for this run only
MNS_BATCH = 16


def mns_raw_send(sdk_queue: Any, by_group: dict[str, list[bytes]]) -> None:
    from mns.queue import Message

    for group, bodies in by_group.items():
        for start in range(0, len(bodies), MNS_BATCH):
            batch = [
                Message(body.decode("ascii"), message_group_id=group)
                for body in bodies[start : start + MNS_BATCH]
            ]
            sdk_queue.batch_send_message(batch)


def mns_raw_consume(sdk_queue: Any, total: int) -> int:
    from mns.mns_exception import MNSServerException

    done = 0
    while done < total:
        try:
            messages = sdk_queue.batch_receive_message(MNS_BATCH, 1)
        except MNSServerException as exc:
            if exc.type == "MessageNotExist":
                continue
            raise
        sdk_queue.batch_delete_message([m.receipt_handle for m in messages])
        done += len(messages)
    return done


def mns_lk_consume(queue: leasekit.Queue, total: int) -> int:
    done = 0
    while done < total:
        leases = queue.lease(MNS_BATCH, wait=1)
        if leases:
            queue.complete_many(leases)
            done += len(leases)
    return done


def measure_mns(
    name: str, endpoint: str, messages: int, depth: int, groups: int
) -> dict[str, float]:
    from mns.account import Account

    queue_name = f"bench-{name}-{secrets.token_hex(3)}"
    queue = leasekit.open(
        "aliyun-mns",
        queue=queue_name,
        create=True,
        ordered=True,
        endpoint=endpoint,
        access_key_id=MNS_KEY_ID,
        access_key_secret=MNS_KEY_SECRET,
    )
    sdk_queue = Account(endpoint, MNS_KEY_ID, MNS_KEY_SECRET).get_queue(queue_name)
    send_s = consume_s = 0.0
    cpu0 = time.process_time()
    try:
        for start in range(0, messages, depth):
            count = min(depth, messages - start)
            by_group = _groups_of(_bodies(count), groups)
            t0 = time.perf_counter()
            if name == "raw":
                mns_raw_send(sdk_queue, by_group)
            else:
                lk_send(queue, by_group)
            t1 = time.perf_counter()
            if name == "raw":
                mns_raw_consume(sdk_queue, count)
            else:
                mns_lk_consume(queue, count)
            t2 = time.perf_counter()
            send_s += t1 - t0
            consume_s += t2 - t1
        cpu = time.process_time() - cpu0
    finally:
        queue.delete_queue()
        queue.close()
    return {
        "send/s": messages / send_s,
        "consume/s": messages / consume_s,
        "client CPU us/msg": cpu / messages * 1e6,
    }


def mns_part(args: argparse.Namespace) -> str:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = ServerProcess(
        python_module("leasekit.emulators.mns", "--port", str(port), "--log-level", "WARNING"),
        port,
        env={
            "LEASEKIT_MNS_ACCESS_KEY_ID": MNS_KEY_ID,
            "LEASEKIT_MNS_ACCESS_KEY_SECRET": MNS_KEY_SECRET,
        },
        name="mns-emulator",
    )
    runs: dict[str, list[dict[str, float]]] = {"raw": [], "leasekit": []}
    with server:
        for _ in range(args.repeat):
            for name in runs:  # alternate turns: raw, leasekit, raw, leasekit, ...
                runs[name].append(
                    measure_mns(name, endpoint, args.messages, args.depth, args.groups)
                )
    medians = {
        name: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        for name, rs in runs.items()
    }
    # The machine's load drifts between turns: each leasekit turn is compared with
    # the raw turn just before it, and the median of those ratios reported.
    ratios = {
        key: sorted(
            lk[key] / raw[key] for raw, lk in zip(runs["raw"], runs["leasekit"], strict=True)
        )
        for key in ("send/s", "consume/s")
    }
    lines = [
        f"MNS ordered queue on leasekit's emulator: {args.messages} messages in "
        f"{args.groups} groups, rounds of {args.depth}, {args.repeat} alternating turns each; "
        "median (lowest-highest); vs raw = median of per-turn ratios (lowest-highest)",
        "",
        "| scenario | send/s | vs raw | consume/s | vs raw | client CPU us/msg |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in medians.items():
        spread = {
            key: f"{min(r[key] for r in runs[name]):.0f}-{max(r[key] for r in runs[name]):.0f}"
            for key in m
        }
        versus = {key: "1.00" for key in ratios}
        if name != "raw":
            versus = {
                key: f"{statistics.median(r):.2f} ({r[0]:.2f}-{r[-1]:.2f})"
                for key, r in ratios.items()
            }
        lines.append(
            f"| {name} | {m['send/s']:.0f} ({spread['send/s']}) | {versus['send/s']} | "
            f"{m['consume/s']:.0f} ({spread['consume/s']}) | {versus['consume/s']} | "
            f"{m['client CPU us/msg']:.0f} |"
        )
    return "\n".join(lines)


def mns_cpu_part(args: argparse.Namespace) -> str:
    from mns.account import Account
    from mns.queue import Message

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = ServerProcess(
        python_module("leasekit.emulators.mns", "--port", str(port), "--log-level", "WARNING"),
        port,
        env={
            "LEASEKIT_MNS_ACCESS_KEY_ID": MNS_KEY_ID,
            "LEASEKIT_MNS_ACCESS_KEY_SECRET": MNS_KEY_SECRET,
        },
        name="mns-emulator",
    )
    lines = [
        f"Client CPU us/msg on the MNS emulator: {args.messages} messages per turn, "
        f"{args.repeat} alternating turns, median (lowest-highest)",
        "",
        "| queue | phase | raw | leasekit | leasekit - raw |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    with server:
        for ordered in (True, False):
            name = f"cpu-{secrets.token_hex(3)}"
            queue = leasekit.open(
                "aliyun-mns",
                queue=name,
                create=True,
                ordered=ordered,
                endpoint=endpoint,
                access_key_id=MNS_KEY_ID,
                access_key_secret=MNS_KEY_SECRET,
            )
            sdk_queue = Account(endpoint, MNS_KEY_ID, MNS_KEY_SECRET).get_queue(name)
            cpu: dict[str, list[float]] = {}
            try:
                for _ in range(args.repeat):
                    for who in ("raw", "leasekit"):
                        bodies = _bodies(args.messages)
                        by_group = _groups_of(bodies, args.groups) if ordered else {"": bodies}
                        c0 = time.process_time()
                        if who == "raw" and ordered:
                            mns_raw_send(sdk_queue, by_group)
                        elif who == "raw":
                            for start in range(0, len(bodies), MNS_BATCH):
                                chunk = bodies[start : start + MNS_BATCH]
                                sdk_queue.batch_send_message(
                                    [Message(b.decode("ascii")) for b in chunk]
                                )
                        elif ordered:
                            lk_send(queue, by_group)
                        else:
                            queue.send_many(bodies)
                        c1 = time.process_time()
                        if who == "raw":
                            mns_raw_consume(sdk_queue, args.messages)
                        else:
                            mns_lk_consume(queue, args.messages)
                        c2 = time.process_time()
                        cpu.setdefault(f"{who} send", []).append((c1 - c0) / args.messages * 1e6)
                        cpu.setdefault(f"{who} consume", []).append((c2 - c1) / args.messages * 1e6)
            finally:
                queue.delete_queue()
                queue.close()
            for phase in ("send", "consume"):
                raw, lk = sorted(cpu[f"raw {phase}"]), sorted(cpu[f"leasekit {phase}"])
                raw_m, lk_m = statistics.median(raw), statistics.median(lk)
                lines.append(
                    f"| {'ordered' if ordered else 'standard'} | {phase} | "
                    f"{raw_m:.0f} ({raw[0]:.0f}-{raw[-1]:.0f}) | "
                    f"{lk_m:.0f} ({lk[0]:.0f}-{lk[-1]:.0f}) | {lk_m - raw_m:+.0f} |"
                )
    return "\n".join(lines)


def mns_calls_part(args: argparse.Namespace) -> str:
    from mns.account import Account

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = ServerProcess(
        python_module("leasekit.emulators.mns", "--port", str(port), "--log-level", "WARNING"),
        port,
        env={
            "LEASEKIT_MNS_ACCESS_KEY_ID": MNS_KEY_ID,
            "LEASEKIT_MNS_ACCESS_KEY_SECRET": MNS_KEY_SECRET,
        },
        name="mns-emulator",
    )
    layers = ("raw SDK", "leasekit driver", "leasekit Queue")
    times: dict[str, dict[str, list[float]]] = {k: {"receive": [], "delete": []} for k in layers}
    with server:
        name = f"calls-{secrets.token_hex(3)}"
        queue = leasekit.open(
            "aliyun-mns",
            queue=name,
            create=True,
            ordered=True,
            endpoint=endpoint,
            access_key_id=MNS_KEY_ID,
            access_key_secret=MNS_KEY_SECRET,
        )
        sdk_queue = Account(endpoint, MNS_KEY_ID, MNS_KEY_SECRET).get_queue(name)
        driver = queue.driver
        try:
            for _ in range(args.repeat):
                for layer in layers:  # turns alternate between the layers
                    lk_send(queue, _groups_of(_bodies(args.messages), args.groups))
                    done = 0
                    while done < args.messages:
                        t0 = time.perf_counter()
                        if layer == "raw SDK":
                            got = sdk_queue.batch_receive_message(MNS_BATCH, 1)
                            t1 = time.perf_counter()
                            sdk_queue.batch_delete_message([m.receipt_handle for m in got])
                        elif layer == "leasekit driver":
                            got = driver.receive(MNS_BATCH, 30.0, 1.0)
                            t1 = time.perf_counter()
                            driver.delete([m.receipt for m in got])
                        else:
                            got = queue.lease(MNS_BATCH, wait=1)
                            t1 = time.perf_counter()
                            queue.complete_many(got)
                        t2 = time.perf_counter()
                        times[layer]["receive"].append(t1 - t0)
                        times[layer]["delete"].append(t2 - t1)
                        done += len(got)
        finally:
            queue.delete_queue()
            queue.close()
    medians = {
        layer: {op: statistics.median(v) * 1000 for op, v in ops.items()}
        for layer, ops in times.items()
    }
    raw_total = medians["raw SDK"]["receive"] + medians["raw SDK"]["delete"]
    lines = [
        f"MNS ordered queue, {args.groups} groups, receives of {MNS_BATCH}: median ms per call "
        f"over {args.repeat} alternating turns of {args.messages} messages per layer",
        "",
        "| layer | receive ms | delete ms | both | raw / both |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for layer, m in medians.items():
        both = m["receive"] + m["delete"]
        lines.append(
            f"| {layer} | {m['receive']:.3f} | {m['delete']:.3f} | {both:.3f} | "
            f"{raw_total / both:.2f} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------ sessions part

#: The LockDuration of the benchmark's session queues: long enough that no lock
#: ends during a run (renewal is not what is measured).
SB_LOCK = 30.0
#: Messages per receive, both sides (the driver's MAX_RECEIVE).
SB_BATCH = 32


def sb_raw_send(client: Any, queue: str, by_group: dict[str, list[bytes]]) -> None:
    from azure.servicebus import ServiceBusMessage

    with client.get_queue_sender(queue) as sender:
        for group, bodies in by_group.items():
            for start in range(0, len(bodies), 100):
                chunk = bodies[start : start + 100]
                sender.send_messages([ServiceBusMessage(b, session_id=group) for b in chunk])


def sb_raw_consume(client: Any, queue: str, total: int, *, close_off_path: bool = False) -> int:
    import threading

    from azure.servicebus import NEXT_AVAILABLE_SESSION
    from azure.servicebus.exceptions import OperationTimeoutError

    done = 0
    closers: list[threading.Thread] = []
    while done < total:
        receiver = client.get_queue_receiver(
            queue,
            session_id=NEXT_AVAILABLE_SESSION,
            max_wait_time=1,
            prefetch_count=0,
        )
        try:
            receiver.__enter__()
            messages = receiver.receive_messages(max_message_count=SB_BATCH, max_wait_time=1)
            for message in messages:
                receiver.complete_message(message)
            done += len(messages)
        except OperationTimeoutError:
            pass  # no session available yet
        if close_off_path:
            closers.append(threading.Thread(target=receiver.close))
            closers[-1].start()
        else:
            receiver.close()
    for closer in closers:
        closer.join()
    return done


def measure_sessions(name: str, server: Any, messages: int, groups: int) -> dict[str, float]:
    from azure.servicebus import ServiceBusClient

    from leasekit.emulators.servicebus import admin_client, connection_string

    host, port, http_port = server
    queue_name = f"bench-sessions-{secrets.token_hex(4)}"
    with admin_client(host, http_port) as admin:
        import datetime

        admin.create_queue(
            queue_name,
            requires_session=True,
            lock_duration=datetime.timedelta(seconds=SB_LOCK),
        )
    conn = connection_string(host, port)
    by_group = _groups_of(_bodies(messages), groups)
    cpu0 = time.process_time()
    if name != "leasekit":
        with ServiceBusClient.from_connection_string(conn) as client:
            t0 = time.perf_counter()
            sb_raw_send(client, queue_name, by_group)
            t1 = time.perf_counter()
            sb_raw_consume(client, queue_name, messages, close_off_path=name != "raw")
            t2 = time.perf_counter()
    else:
        queue = leasekit.open(
            "azure-service-bus",
            queue=queue_name,
            connection_string=conn,
            lock_duration=SB_LOCK,
            admin_port=http_port,
            sessions=True,
        )
        try:
            t0 = time.perf_counter()
            lk_send(queue, by_group)
            t1 = time.perf_counter()
            done = 0
            while done < messages:
                leases = queue.lease(SB_BATCH, wait=1)
                if leases:
                    queue.complete_many(leases)
                    done += len(leases)
            t2 = time.perf_counter()
        finally:
            queue.close()
    cpu = time.process_time() - cpu0
    with admin_client(host, http_port) as admin:
        admin.delete_queue(queue_name)
    return {
        "send/s": messages / (t1 - t0),
        "consume/s": messages / (t2 - t1),
        "client CPU us/msg": cpu / messages * 1e6,
    }


def sessions_part(args: argparse.Namespace) -> str:
    port, http_port = free_port(), free_port()
    argv = python_module(
        "leasekit.emulators.servicebus",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--http-port",
        str(http_port),
        "--log-level",
        "WARNING",
    )
    runs: dict[str, list[dict[str, float]]] = {"raw": [], "raw, close off path": [], "leasekit": []}
    with ServerProcess(argv, port, name="servicebus-emulator"):
        server = ("127.0.0.1", port, http_port)
        measure_sessions("raw", server, min(args.sb_messages, 64), args.sb_groups)  # warm-up
        for _ in range(args.repeat):
            for name in runs:  # turns alternate: raw, raw off path, leasekit, raw...
                runs[name].append(measure_sessions(name, server, args.sb_messages, args.sb_groups))
    medians = {
        name: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        for name, rs in runs.items()
    }
    pair_ratios = {
        base: [
            lk["consume/s"] / raw["consume/s"]
            for raw, lk in zip(runs[base], runs["leasekit"], strict=True)
        ]
        for base in ("raw", "raw, close off path")
    }
    raw = medians["raw"]
    lines = [
        f"Service Bus sessions on leasekit's emulator: {args.sb_messages} messages in "
        f"{args.sb_groups} sessions, {SB_BATCH} per receive, median of {args.repeat} "
        "alternating runs",
        "",
        "| scenario | send/s | vs raw | consume/s | vs raw | client CPU us/msg |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in medians.items():
        lines.append(
            f"| {name} | {m['send/s']:.0f} | {m['send/s'] / raw['send/s']:.2f} | "
            f"{m['consume/s']:.0f} | {m['consume/s'] / raw['consume/s']:.2f} | "
            f"{m['client CPU us/msg']:.0f} |"
        )
    lines.append("")
    for base, ratios in pair_ratios.items():
        lines.append(
            f"leasekit / {base} consume, per round: median {statistics.median(ratios):.2f}, "
            f"min {min(ratios):.2f}, max {max(ratios):.2f}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------- groups part


def consumer_rate(groups: int | None, messages: int, concurrency: int, handler_s: float) -> float:
    queue = leasekit.open("memory", queue="ordered-bench", broker=MemoryBroker(), create=True)
    try:
        bodies = [b"x%d" % i for i in range(messages)]
        if groups is None:
            queue.send_many(bodies)
        else:
            for group, mine in _groups_of(bodies, groups).items():
                queue.send_many(mine, group=group)

        last = [0.0]

        def handler(message: leasekit.Message) -> None:
            time.sleep(handler_s)  # the benchmark's stand-in for an I/O call
            last[0] = time.perf_counter()

        consumer = leasekit.Consumer(
            queue, handler, concurrency=concurrency, handle_signals=False, lease_duration=60
        )
        t0 = time.perf_counter()
        stats = consumer.run(until_idle=True)
        assert stats.completed == messages, stats
        # To the last handler's end: until_idle's final empty lease call (up to
        # LEASE_WAIT) is not work.
        return messages / (last[0] - t0)
    finally:
        queue.close()


def groups_part(args: argparse.Namespace) -> str:
    handler_s = args.handler_ms / 1000
    lines = [
        f"Consumer on memory://: {args.consumer_messages} messages, concurrency "
        f"{args.concurrency}, handler {args.handler_ms:g} ms, median of {args.repeat}",
        "",
        "| groups | messages/s | vs 1 group | vs unordered |",
        "| ---: | ---: | ---: | ---: |",
    ]
    rates: dict[str, float] = {}
    for groups in [1, 2, 4, 8, 16, 32, 64, None]:
        runs = [
            consumer_rate(groups, args.consumer_messages, args.concurrency, handler_s)
            for _ in range(args.repeat)
        ]
        rates["unordered" if groups is None else str(groups)] = statistics.median(runs)
    one, free = rates["1"], rates["unordered"]
    for label, rate in rates.items():
        lines.append(f"| {label} | {rate:.0f} | {rate / one:.1f}x | {rate / free:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part",
        choices=["fifo", "sessions", "groups", "mns", "mns-cpu", "mns-calls", "both", "all"],
        default="both",
    )
    parser.add_argument("--messages", type=int, default=500, help="FIFO messages per run")
    parser.add_argument("--depth", type=int, default=100, help="FIFO messages per round")
    parser.add_argument("--groups", type=int, default=10, help="FIFO groups")
    parser.add_argument("--repeat", type=int, default=3, help="runs per scenario; median kept")
    parser.add_argument("--sb-messages", type=int, default=400, help="session messages per run")
    parser.add_argument("--sb-groups", type=int, default=10, help="Service Bus sessions")
    parser.add_argument("--consumer-messages", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--handler-ms", type=float, default=2.0)
    args = parser.parse_args()
    print(f"# {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cores")
    parts: list[Callable[[argparse.Namespace], str]] = []
    if args.part in ("fifo", "both", "all"):
        parts.append(fifo_part)
    if args.part in ("sessions", "all"):
        parts.append(sessions_part)
    if args.part in ("groups", "both", "all"):
        parts.append(groups_part)
    if args.part == "mns":
        parts.append(mns_part)
    if args.part == "mns-cpu":
        parts.append(mns_cpu_part)
    if args.part == "mns-calls":
        parts.append(mns_calls_part)
    for part in parts:
        print()
        print(part(args))


if __name__ == "__main__":
    main()
