"""PostgreSQL configuration: URL userinfo decoded as libpq does, and errors no retry mends.

Against the real server (``postgres_server``): roles whose passwords hold the
characters a URL must percent-encode, parameters libpq refuses, a database
that does not exist. A configuration error must end ``Consumer.run()`` with
that error, not be retried without end as if the server were unreachable.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any
from urllib.parse import quote

import pytest
from psycopg.conninfo import conninfo_to_dict

import leasekit
from leasekit import AuthenticationFailed, InvalidArgument, InvalidURL, QueueNotFound
from leasekit.backends.postgresql import PostgresqlDriver
from leasekit.emulators.postgres import LocalPostgres
from leasekit.url import parse_url

#: Passwords a URL can carry only percent-encoded (``+`` is written as it is: a
#: plus in a URI is a plus to libpq, not a space), and how each is written there.
PASSWORDS = {
    "slash": ("pa/ss", "pa%2Fss"),
    "plus": ("pa+ss", "pa+ss"),
    "at": ("pa@ss", "pa%40ss"),
    "colon": ("pa:ss", "pa%3Ass"),
    "percent": ("pa%ss", "pa%25ss"),
    "space": ("pa ss", "pa%20ss"),
    "all": ("a/b+c@d:e%f g", quote("a/b+c@d:e%f g", safe="+")),
}


def _userinfo_url(server: LocalPostgres, role: str, written: str, **query: str) -> str:
    tail = "&".join(f"{k}={v}" for k, v in query.items())
    return f"postgresql://{role}:{written}@{server.host}:{server.port}/postgres?{tail}"


@pytest.mark.parametrize("kind", sorted(PASSWORDS))
def test_a_url_password_is_percent_decoded_as_libpq_decodes_it(
    postgres_server: LocalPostgres, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    password, written = PASSWORDS[kind]
    secret = f"{password}-{uuid.uuid4().hex[:8]}"
    encoded = f"{written}-{secret[len(password) + 1 :]}"
    role = f"lk_{uuid.uuid4().hex[:8]}"
    postgres_server.create_role(role, secret)
    name = f"userinfo-{uuid.uuid4().hex[:8]}"
    url = _userinfo_url(postgres_server, role, encoded, queue=name, schema=role)
    # What libpq (through psycopg) reads from the same URI, without leasekit's query.
    libpq = conninfo_to_dict(url.split("?")[0])
    options = PostgresqlDriver.options_from_url(parse_url(url))
    assert (options["user"], options["password"]) == (libpq["user"], libpq["password"])
    assert options["password"] == secret
    caplog.set_level(logging.DEBUG)
    with leasekit.open(url, create=True) as queue:
        queue.send(b"through a decoded password")
        [lease] = queue.lease(1, duration=5)
        assert lease.message.body == b"through a decoded password"
        lease.complete()
        shown = [repr(queue), repr(queue.driver), str(queue)]
        queue.delete_queue()
    # A wrong password with the same characters: refused, and shown nowhere.
    wrong = _userinfo_url(postgres_server, role, encoded + "x", queue=name, schema=role)
    with leasekit.open(wrong) as queue:
        with pytest.raises(AuthenticationFailed) as info:
            queue.send(b"x")
        shown += [repr(queue.driver), str(info.value), repr(info.value)]
    shown += [record.getMessage() for record in caplog.records]
    for text in shown:
        for planted in (secret, secret + "x", encoded, encoded + "x"):
            assert planted not in text, f"the password shows in {text!r}"


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("sslmode=bogus", 'invalid sslmode value: "bogus"'),
        ("port=abc", '"port"'),
        ("target_session_attrs=nope", "target_session_attrs"),
        ("service=leasekit-no-such-service", "service"),
        ("keepalives=often", "keepalives"),
        ("hostaddr=not-an-address", "hostaddr"),
    ],
)
def test_a_libpq_parameter_libpq_refuses_is_invalid_url_when_the_queue_is_opened(
    option: str, words: str
) -> None:
    # 192.0.2.1 (TEST-NET-1) answers nothing: were the check to connect, it would hang.
    with pytest.raises(InvalidURL) as info:
        leasekit.open(f"postgresql://u@192.0.2.1/db?queue=q&connect_timeout=30&{option}")
    assert words in str(info.value)


def test_good_libpq_parameters_open_without_connecting() -> None:
    url = (
        "postgresql://u@192.0.2.1,192.0.2.2/db?queue=q&port=5432,5433&sslmode=verify-full"
        "&target_session_attrs=read-write&keepalives=1&gssencmode=prefer"
    )
    with leasekit.open(url) as queue:
        assert "192.0.2.1" in repr(queue.driver)


def _run_to_its_end(queue: leasekit.Queue, within: float = 30) -> BaseException | None:
    """Run a Consumer on ``queue``; what ``run()`` raised (fails if it is still retrying)."""
    consumer = leasekit.Consumer(queue, lambda m: None, lease_duration=5, handle_signals=False)
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(consumer.run())
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(within)
    if worker.is_alive():
        retries = consumer.stats.receive_errors
        consumer.stop()
        worker.join(30)
        pytest.fail(f"run() still retrying after {within:g} s ({retries} receive errors)")
    return outcome[0] if outcome and isinstance(outcome[0], BaseException) else None


def test_consumer_run_ends_on_a_database_that_does_not_exist(
    postgres_server: LocalPostgres,
) -> None:
    url = postgres_server.url(dbname=f"nope_{uuid.uuid4().hex[:8]}") + "?queue=jobs"
    with leasekit.open(url) as queue:
        error = _run_to_its_end(queue)
    assert isinstance(error, QueueNotFound), error
    assert "does not exist" in str(error)


def test_consumer_run_ends_on_a_role_that_does_not_exist(postgres_server: LocalPostgres) -> None:
    url = postgres_server.url(user=f"nobody_{uuid.uuid4().hex[:8]}") + "?queue=jobs"
    with leasekit.open(url, password="whatever") as queue:
        error = _run_to_its_end(queue)
    assert isinstance(error, AuthenticationFailed), error


def test_consumer_run_ends_on_a_setting_the_server_refuses(
    postgres_server: LocalPostgres,
) -> None:
    url = postgres_server.url() + "?queue=jobs&options=-c%20statement_timeout%3Dsoon"
    with leasekit.open(url) as queue:
        error = _run_to_its_end(queue)
    assert isinstance(error, InvalidArgument), error
    assert "statement_timeout" in str(error)
