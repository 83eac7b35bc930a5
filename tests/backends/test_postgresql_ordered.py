"""Ordered groups on PostgreSQL: what the conformance suite's ordered section cannot see.

The ordered section (part of ``ConformanceSuite``, run by
``test_postgresql.py``) checks the rules through one queue handle. Here: two
receivers on separate connections never hold two messages of one group at
once; a receive that finds a group's head row locked by another receive skips
the whole group (it does not take the next message); and a schema made before
groups existed (version 1) is brought up to date and keeps its messages.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import leasekit
from leasekit import Lease
from leasekit.backends import postgresql
from leasekit.backends.postgresql import SCHEMA_VERSION
from leasekit.emulators.postgres import LocalPostgres
from leasekit.queue import Queue


def _open(server: LocalPostgres, name: str, **options: Any) -> Queue:
    return leasekit.open(server.url(), queue=name, **options)


def test_two_concurrent_receivers_never_hold_two_messages_of_one_group(
    postgres_server: LocalPostgres,
) -> None:
    schema = f"lk_{uuid.uuid4().hex[:8]}"
    name = "orders"
    count = 30
    bodies = [f"g-{i:03d}".encode() for i in range(count)]
    with _open(postgres_server, name, schema=schema, create=True) as sender:
        sender.send_many(bodies, group="order-17")

    guard = threading.Lock()
    holding: list[bytes] = []  # the group's messages leased right now
    overlaps: list[tuple[bytes, ...]] = []
    seen: list[tuple[bytes, int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def receiver() -> None:
        try:
            with _open(postgres_server, name, schema=schema) as q:
                start.wait()
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    with guard:
                        if len(seen) >= count:
                            return
                    leases: list[Lease] = q.lease(10, duration=30, wait=0.05)
                    if not leases:
                        continue
                    with guard:
                        if holding or len(leases) > 1:
                            overlaps.append((*holding, *(lease.message.body for lease in leases)))
                        holding.extend(lease.message.body for lease in leases)
                        seen.extend(
                            (lease.message.body, lease.message.delivery_count) for lease in leases
                        )
                    time.sleep(0.005)  # hold it while the other receiver polls
                    with guard:
                        for lease in leases:
                            holding.remove(lease.message.body)
                    # Completed only after it is no longer counted as held: the
                    # group's next message can be leased only after this commits.
                    q.complete_many(leases)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=receiver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    try:
        assert not errors, errors
        assert overlaps == [], f"two messages of one group were held at once: {overlaps[:3]}"
        assert [body for body, _ in seen] == bodies
        assert {n for _, n in seen} == {1}, "a message was delivered twice"
    finally:
        postgres_server.psql(f"DROP SCHEMA {schema} CASCADE")


def test_a_receive_that_finds_the_head_row_locked_skips_the_whole_group(
    postgres_server: LocalPostgres,
) -> None:
    import psycopg

    schema = f"lk_{uuid.uuid4().hex[:8]}"
    with _open(postgres_server, "orders", schema=schema, create=True) as q:
        q.send_many([b"a1", b"a2"], group="A")
        q.send(b"b1", group="B")
        q.send(b"u1")
        with psycopg.connect(postgres_server.dsn()) as other:
            # Another receive in the middle of taking A's head: it holds the row lock.
            [(head,)] = other.execute(
                f"SELECT body FROM {schema}.messages WHERE grp = 'A' ORDER BY seq LIMIT 1 "
                "FOR UPDATE"
            ).fetchall()
            assert bytes(head) == b"a1"
            leases = q.lease(10, duration=30)
            assert sorted(lease.message.body for lease in leases) == [b"b1", b"u1"]
            assert {lease.message.group for lease in leases} == {"B", None}
            other.rollback()
        q.complete_many(leases)
        [head_lease] = q.lease(10, duration=30)
        assert (head_lease.message.body, head_lease.message.group) == (b"a1", "A")
        head_lease.dead_letter("poison")
        [dead] = q.peek_dead_letters()
        assert (dead.body, dead.group) == (b"a1", "A")
        [next_lease] = q.lease(10, duration=30)
        assert next_lease.message.body == b"a2"
        next_lease.complete()
        q.delete_queue()
    postgres_server.psql(f"DROP SCHEMA {schema} CASCADE")


def test_a_schema_made_before_groups_is_brought_up_and_keeps_its_messages(
    postgres_server: LocalPostgres,
) -> None:
    schema = f"lk_{uuid.uuid4().hex[:8]}"
    assert SCHEMA_VERSION >= 2
    version_1 = [m for m in postgresql.MIGRATIONS if m[0] == 1]
    # Made by version 1 (no grp column): the statements of that version, as it ran them.
    postgres_server.psql(f"CREATE SCHEMA {schema}")
    postgres_server.psql(
        f"CREATE TABLE {schema}.schema_version (version integer NOT NULL, "
        "applied_at timestamptz NOT NULL DEFAULT now())"
    )
    for statement in version_1[0][1]:
        postgres_server.psql(statement.replace("{s}", schema))
    postgres_server.psql(f"INSERT INTO {schema}.schema_version (version) VALUES (1)")
    postgres_server.psql(f"INSERT INTO {schema}.queues (name) VALUES ('jobs')")
    postgres_server.psql(
        f"INSERT INTO {schema}.messages (queue_id, id, body, enqueued_at, visible_at) "
        f"SELECT id, gen_random_uuid(), 'old'::bytea, now(), now() FROM {schema}.queues"
    )
    with _open(postgres_server, "jobs", schema=schema) as q:
        [old] = q.lease(1, duration=5)
        assert (old.message.body, old.message.group) == (b"old", None)
        old.complete()
        q.send(b"new", group="G")
        [new] = q.lease(1, duration=5)
        assert (new.message.body, new.message.group) == (b"new", "G")
        new.complete()
    version = postgres_server.psql(f"SELECT max(version) FROM {schema}.schema_version")
    assert int(version) == SCHEMA_VERSION
    postgres_server.psql(f"DROP SCHEMA {schema} CASCADE")
