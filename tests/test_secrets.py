"""No secret anywhere: reprs, errors, CLI output and DEBUG logs, on every cloud backend.

The unit tests check the redaction policy (``leasekit.redaction``), the refusal
of credentials in URLs and endpoint options, and when the log filter is
installed. The backend tests plant credentials the servers accept (a session
token for moto, an account key and a SAS for Azurite, a SharedAccessKey for
the Service Bus emulator, an access key secret and STS token for the MNS
emulator), make real calls with every logger at DEBUG, and grep everything
leasekit and the SDKs showed for them.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

import leasekit
from leasekit import errors, redaction
from leasekit.cli import app
from leasekit.queue import Queue
from leasekit.redaction import redact, redact_url

runner = CliRunner()

# ------------------------------------------------------------------ policy


@pytest.mark.parametrize(
    "url, secret",
    [
        ("aws-sqs://AKIAEXAMPLE:wJalr/XUtnFEMI@us-east-1/q", "wJalr/XUtnFEMI"),
        ("aliyun-mns://SECRETKEY@127.0.0.1:99999/q", "SECRETKEY"),
        ("memory://u:p/w@x", "u:p/w"),
        ("memory://a@b@c/q", "a@b"),
        ("aws-sqs://AK:ab?cd@us-east-1/q", "ab?cd"),
        ("azure-service-bus://user:pa%2Fss@ns/q", "pa%2Fss"),
        ("azure-storage-queue://acct/q?sv=2020&sig=SIGNATURE1", "SIGNATURE1"),
        ("aws-sqs://us-east-1/q?endpoint_url=http://u:hunter22@h", "hunter22"),
        ("weird:TOKEN@host", "TOKEN"),
    ],
)
def test_redact_url_hides_every_userinfo_and_secret_query_value(url: str, secret: str) -> None:
    assert secret not in redact_url(url)
    assert "***" in redact_url(url)


@pytest.mark.parametrize(
    "line, secret",
    [
        (
            "Sending http request: <AWSPreparedRequest headers={'X-Amz-Date': b'20260101', "
            "'X-Amz-Security-Token': b'FQoGZXIvYXdzPLANTED', 'Authorization': "
            "b'AWS4-HMAC-SHA256 Credential=AKIA/2026/us-east-1/sqs/aws4_request, "
            "SignedHeaders=host, Signature=abcdef0123'}>",
            ("FQoGZXIvYXdzPLANTED", "abcdef0123", "AKIA/2026"),
        ),
        (
            'http://127.0.0.1:10001 "GET /devstoreaccount1/q/messages?sv=2021&se=2030'
            '&sp=raup&sig=Zm9vYmFy%2Bc2ln%3D HTTP/1.1" 200 None',
            ("Zm9vYmFy%2Bc2ln%3D",),
        ),
        (
            "SendRequest Method: GET\nUri: /queues/q/messages\nHeader: "
            "Authorization: MNS LTAIid:c2lnbmF0dXJl\nsecurity-token: STSPLANTED\nData: ",
            ("c2lnbmF0dXJl", "STSPLANTED"),
        ),
        (
            "Endpoint=sb://ns/;SharedAccessKeyName=Root;SharedAccessKey=KEYPLANTED=;EntityPath=q",
            ("KEYPLANTED",),
        ),
        (
            "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=ACCOUNTKEY+/==;"
            "QueueEndpoint=http://h/a",
            ("ACCOUNTKEY",),
        ),
        (
            "token: SharedAccessSignature sr=amqp%3A%2F%2Fns&sig=CBSSIG%3D&se=1&skn=Root",
            ("CBSSIG",),
        ),
        ("Authorization: Bearer eyJ0eXAiOiJKV1Q.PLANTED", ("eyJ0eXAiOiJKV1Q.PLANTED",)),
        ("send: b'PUT /q HTTP/1.1\\r\\nAuthorization: MNS id:SIGPLANTED\\r\\n'", ("SIGPLANTED",)),
        ('{"aws_secret_access_key": "JSONPLANTED", "region": "x"}', ("JSONPLANTED",)),
    ],
)
def test_redact_hides_tokens_signatures_headers_and_keys(line: str, secret: tuple[str]) -> None:
    clean = redact(line)
    for value in secret:
        assert value not in clean, clean


def test_a_remembered_secret_is_hidden_in_any_text() -> None:
    secret = f"plain-{uuid.uuid4().hex}"
    redaction.remember_secret(secret)
    assert secret not in redact(f"the SDK said {secret} somewhere")
    redaction.remember_secret("short")  # too short to hide everywhere
    assert redact("a short word") == "a short word"


def test_a_held_secret_shows_as_hidden_in_any_repr() -> None:
    held = redaction.Secret(("AKIAEXAMPLE", "wJalrXUtnFEMI/K7MDENG", None))
    assert held.value[1] == "wJalrXUtnFEMI/K7MDENG"
    for shown in (repr(held), str(held), f"{held!r}", repr([held]), repr({"c": held})):
        assert "wJalr" not in shown and "AKIA" not in shown
    assert repr(held) == "<credentials hidden>"


@pytest.mark.parametrize(
    "url",
    [
        "aws-sqs://AKIAEXAMPLE:wJalr/XUtnFEMI@us-east-1/q",
        "aliyun-mns://SECRETKEY@127.0.0.1:99999/q",
        "azure-storage-queue://acct:KEY/PART@acct/q",
        "azure-service-bus://RootManage:KEY/PART@ns/q",
        "memory://user:pw/x@q",
        "sqlite://u:p@/x.db?queue=q",
    ],
)
def test_urls_with_any_userinfo_are_refused_without_echoing_it(url: str) -> None:
    secret = url.split("://", 1)[1].rsplit("@", 1)[0]
    with pytest.raises(errors.InvalidURL) as info:
        leasekit.open(url)
    assert "userinfo" in str(info.value)
    assert secret not in str(info.value) and secret not in repr(info.value)
    result = runner.invoke(app, ["send", url, "x"])
    assert result.exit_code == 2 and "InvalidURL" in result.output
    assert secret not in result.output


#: Each cloud backend's endpoint-like options, with the other options that make it open.
ENDPOINT_OPTIONS = [
    ("aws-sqs", "endpoint_url", "http://AKID:SECRETVALUE@127.0.0.1:1", {"queue": "q"}),
    ("aws-sqs", "queue", "https://AKID:SECRETVALUE@sqs.us-east-1.amazonaws.com/1/q", {}),
    (
        "aliyun-mns",
        "endpoint",
        "http://AKID:SECRETVALUE@127.0.0.1:1",
        {"queue": "q", "access_key_id": "i", "access_key_secret": "s"},
    ),
    (
        "azure-storage-queue",
        "account_url",
        "http://acct:SECRETVALUE@127.0.0.1:1/acct",
        {"queue": "qqq"},
    ),
    (
        "azure-storage-queue",
        "connection_string",
        "AccountName=a;AccountKey=a2V5;QueueEndpoint=http://a:SECRETVALUE@127.0.0.1:1/a",
        {"queue": "qqq"},
    ),
    (
        "azure-service-bus",
        "namespace",
        "sb://Root:SECRETVALUE@ns.servicebus.windows.net",
        {"queue": "q", "credential": object()},
    ),
    (
        "azure-service-bus",
        "connection_string",
        "Endpoint=sb://Root:SECRETVALUE@127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=v",
        {"queue": "q"},
    ),
]


@pytest.mark.parametrize("scheme, option, value, others", ENDPOINT_OPTIONS)
def test_endpoint_options_with_userinfo_are_refused_naming_the_option(
    scheme: str, option: str, value: str, others: dict[str, Any]
) -> None:
    with pytest.raises(errors.InvalidURL) as info:
        leasekit.open(scheme, **{option: value}, **others)
    assert option in str(info.value) and "credentials" in str(info.value)
    assert "SECRETVALUE" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "aws-sqs://us-east-1/q?endpoint_url=http%3A%2F%2Fu%3ASECRETVALUE%40127.0.0.1%3A1",
        "aws-sqs://us-east-1/q?endpoint_url=http://u:SECRETVALUE@127.0.0.1:1",
    ],
)
def test_an_endpoint_with_userinfo_in_the_query_is_refused_too(url: str) -> None:
    with pytest.raises(errors.InvalidURL) as info:
        leasekit.open(url, aws_access_key_id="i", aws_secret_access_key="s")
    assert "SECRETVALUE" not in str(info.value)


def _run_python(code: str, env: dict[str, str] | None = None) -> str:
    import os

    full_env = {**os.environ, **(env or {})}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=True,
        env=full_env,
    )
    return result.stdout.strip()


def test_log_redaction_is_installed_by_a_driver_not_by_import() -> None:
    code = """
        import logging, leasekit
        from leasekit import redaction
        before = logging.getLogRecordFactory() is logging.LogRecord
        leasekit.open("memory://q")
        after_memory = sorted(redaction.log_redaction_installed())
        leasekit.open("aws-sqs", queue="q", region="us-east-1")
        print(before, after_memory, sorted(redaction.log_redaction_installed()))
    """
    out = _run_python(code, env={"LEASEKIT_LOG_REDACTION": ""})
    assert out == "True [] ['boto3', 'botocore', 'leasekit', 'urllib3']"


def test_log_redaction_can_be_turned_off() -> None:
    code = """
        import logging, leasekit
        from leasekit import redaction
        leasekit.open("aws-sqs", queue="q", region="us-east-1")
        print(sorted(redaction.log_redaction_installed()))
    """
    assert _run_python(code, env={"LEASEKIT_LOG_REDACTION": "off"}) == "[]"
    code = """
        import logging, leasekit
        from leasekit import redaction
        leasekit.open("aws-sqs", queue="q", region="us-east-1")
        redaction.uninstall_log_redaction()
        print(logging.getLogRecordFactory() is logging.LogRecord)
    """
    assert _run_python(code) == "True"


def test_child_loggers_made_later_and_tracebacks_are_redacted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    redaction.install_log_redaction(["lk-test-sdk"])
    caplog.set_level(logging.DEBUG)
    child = logging.getLogger(f"lk-test-sdk.made.later.{uuid.uuid4().hex}")
    child.debug("GET /q?sv=1&sig=%s HTTP/1.1", "SIGPLANTED")
    try:
        raise RuntimeError("Authorization: MNS id:TRACEPLANTED")
    except RuntimeError:
        child.exception("failed")
    logging.getLogger("unrelated").debug("sig=VISIBLE")
    assert "SIGPLANTED" not in caplog.text and "TRACEPLANTED" not in caplog.text
    assert "sig=VISIBLE" in caplog.text  # loggers leasekit does not drive are left alone


# ------------------------------------------------------- real backends


def _assert_clean(where: str, text: str, secrets: tuple[str, ...]) -> None:
    for secret in secrets:
        assert secret not in text, f"{where} shows a planted secret ({secret[:6]}...)"
    leaks = [
        r"(?i)\bsig=(?!\*\*\*)[\w%]",
        r"(?i)signature=(?!\*\*\*)[\w%]",
        r"(?i)security-token['\"]?\s*:\s*(?!(?:b?['\"])?\*\*\*)\S",
        r"(?i)authorization['\"]?\s*:\s*(?!(?:b?['\"])?\*\*\*)\S",
        r"(?i)signature:\s*\n\s*[0-9a-f]{16}",
        r"(?i)(?:SharedAccessKey|AccountKey)=(?!\*\*\*)\w",
    ]
    for pattern in leaks:
        match = re.search(pattern, text)
        assert match is None, f"{where}: {text[max(0, match.start() - 80) : match.end() + 20]}"


def _exercise(open_queue: Callable[..., Queue], missing: Callable[[], Queue]) -> list[str]:
    """Real calls at DEBUG level; returns every repr and error message seen."""
    shown: list[str] = []
    with open_queue() as queue:
        queue.send(b"payload", properties={"kind": "test"})
        [lease] = queue.lease(1, wait=5)
        lease.renew()
        shown += [repr(queue), repr(queue.driver), repr(lease), repr(lease.message)]
        lease.complete()
    with missing() as gone, pytest.raises(errors.LeaseError) as info:
        gone.lease(1)
    shown += [str(info.value), repr(info.value), repr(gone), repr(gone.driver)]
    return shown


def _check_backend(
    caplog: pytest.LogCaptureFixture,
    secrets: tuple[str, ...],
    open_queue: Callable[..., Queue],
    missing: Callable[[], Queue],
    cli: list[list[str]],
    sdk_logger: str | None,
) -> None:
    caplog.set_level(logging.DEBUG)
    shown = _exercise(open_queue, missing)
    outputs = []
    for argv in cli:
        result = runner.invoke(app, argv)
        outputs.append(result.output)
    if sdk_logger is not None:
        assert any(r.name.startswith(sdk_logger) for r in caplog.records), "no SDK log to check"
    _assert_clean("a repr or error", "\n".join(shown), secrets)
    _assert_clean("the CLI output", "\n".join(outputs), secrets)
    _assert_clean("the DEBUG log", caplog.text, secrets)


def _cli_options(options: dict[str, str]) -> list[str]:
    argv = []
    for key, value in options.items():
        argv += ["--option", f"{key}={value}"]
    return argv


def test_sqs_on_moto_shows_no_secret(caplog: pytest.LogCaptureFixture, moto_server: Any) -> None:
    secret = f"wJalrXUtnFEMI/K7MDENG/{uuid.uuid4().hex}"
    token = f"FQoGZXIvYXdzEPLANTED{uuid.uuid4().hex}"
    options = {
        "region": moto_server.region,
        "endpoint_url": moto_server.endpoint,
        "aws_access_key_id": "AKIAPLANTEDKEYID",
        "aws_secret_access_key": secret,
        "aws_session_token": token,
    }
    name = f"secrets-{uuid.uuid4().hex[:8]}"
    _check_backend(
        caplog,
        (secret, token),
        lambda: leasekit.open("aws-sqs", queue=name, create=True, **options),
        lambda: leasekit.open("aws-sqs", queue="missing-" + name, **options),
        [
            ["send", f"aws-sqs://{moto_server.region}/{name}", "x", *_cli_options(options)],
            ["lease", f"aws-sqs://{moto_server.region}/none-{name}", *_cli_options(options)],
        ],
        "botocore",
    )
    assert "X-Amz-Security-Token" in caplog.text  # the header was logged, redacted


def test_azure_storage_queue_on_azurite_shows_no_secret(
    caplog: pytest.LogCaptureFixture, azurite: Any
) -> None:
    from azure.storage.queue import AccountSasPermissions, ResourceTypes, generate_account_sas

    sas = generate_account_sas(
        azurite.account_name,
        azurite.account_key,
        resource_types=ResourceTypes(service=True, container=True, object=True),
        permission=AccountSasPermissions(
            read=True,
            write=True,
            delete=True,
            list=True,
            add=True,
            create=True,
            update=True,
            process=True,
        ),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    signature = re.search(r"sig=([^&]+)", sas).group(1)  # type: ignore[union-attr]
    name = f"lk-secrets-{uuid.uuid4().hex[:8]}"
    by_key = {"connection_string": azurite.connection_string}
    by_sas = {"account_url": azurite.account_url, "credential": sas}
    try:
        _check_backend(
            caplog,
            (azurite.account_key, sas, signature),
            lambda: leasekit.open("azure-storage-queue", queue=name, create=True, **by_sas),
            lambda: leasekit.open("azure-storage-queue", queue="missing-" + name, **by_sas),
            [
                [
                    "send",
                    "azure-storage-queue",
                    "x",
                    "--option",
                    f"queue={name}",
                    *_cli_options(by_key),
                ],
                [
                    "lease",
                    "azure-storage-queue",
                    "--option",
                    f"queue=none-{name}",
                    *_cli_options(by_sas),
                ],
            ],
            "urllib3",
        )
    finally:
        with leasekit.open("azure-storage-queue", queue=name, **by_key) as q:
            q.delete_queue()
    assert "sig=***" in caplog.text  # the SAS went over the wire, and was hidden in the log


def test_service_bus_on_the_emulator_shows_no_secret(
    caplog: pytest.LogCaptureFixture, servicebus_server: Any
) -> None:
    key = f"PLANTED{uuid.uuid4().hex}="
    connection_string = servicebus_server.connection_string.replace("SAS_KEY_VALUE", key)
    assert key in connection_string
    name = servicebus_server.create_queue(lock_duration=2)
    options = {"connection_string": connection_string, "lock_duration": "2"}
    try:
        _check_backend(
            caplog,
            (key,),
            lambda: leasekit.open("azure-service-bus", queue=name, **options),
            lambda: leasekit.open("azure-service-bus", queue="missing-" + name, **options),
            [
                [
                    "send",
                    "azure-service-bus",
                    "x",
                    "--option",
                    f"queue={name}",
                    *_cli_options(options),
                ],
                [
                    "lease",
                    "azure-service-bus",
                    "--option",
                    f"queue=none-{name}",
                    *_cli_options(options),
                ],
            ],
            "azure.servicebus",
        )
    finally:
        servicebus_server.delete_queue(name)


def test_mns_on_the_emulator_shows_no_secret(
    caplog: pytest.LogCaptureFixture, mns_server: Any
) -> None:
    token = f"STSPLANTED{uuid.uuid4().hex}"
    options = {
        "endpoint": mns_server.endpoint,
        "access_key_id": mns_server.access_key_id,
        "access_key_secret": mns_server.access_key_secret,
        "security_token": token,
    }
    name = f"secrets-{uuid.uuid4().hex[:8]}"
    wrong = {**options, "access_key_secret": f"WRONG{uuid.uuid4().hex}"}
    url = f"aliyun-mns://{mns_server.endpoint.split('://')[1]}"
    _check_backend(
        caplog,
        (mns_server.access_key_secret, token, wrong["access_key_secret"]),
        lambda: leasekit.open("aliyun-mns", queue=name, create=True, **options),
        lambda: leasekit.open("aliyun-mns", queue="missing-" + name, **wrong),
        [
            [
                "send",
                f"{url}/{name}",
                "x",
                *_cli_options({k: v for k, v in options.items() if k != "endpoint"}),
            ],
            [
                "lease",
                f"{url}/{name}",
                *_cli_options({k: v for k, v in wrong.items() if k != "endpoint"}),
            ],
        ],
        None,  # the SDK logs only through a logger it is given, and leasekit gives none
    )


def test_postgresql_shows_no_secret(caplog: pytest.LogCaptureFixture, postgres_server: Any) -> None:
    password = f"PGPLANTED{uuid.uuid4().hex}"
    role = f"lk_{uuid.uuid4().hex[:8]}"
    postgres_server.create_role(role, password)
    host, port = postgres_server.host, postgres_server.port
    name = f"secrets-{uuid.uuid4().hex[:8]}"
    schema = f"s_{role}"
    in_url = f"postgresql://{role}:{password}@{host}:{port}/postgres?schema={schema}"
    dsn = f"host={host} port={port} dbname=postgres user={role} password={password}"
    wrong = f"WRONG{uuid.uuid4().hex}"
    caplog.set_level(logging.DEBUG, logger="psycopg")  # psycopg sets WARNING on import
    _check_backend(
        caplog,
        (password, wrong),
        # The password three ways: in the URL, in a dsn, as a keyword.
        lambda: leasekit.open(f"{in_url}&queue={name}", create=True),
        lambda: leasekit.open(
            "postgresql", queue="missing", dsn=dsn.replace(password, wrong), schema=schema
        ),
        [
            ["send", f"{in_url}&queue={name}", "x"],
            ["lease", f"{in_url}&queue={name}"],
            ["stats", f"{in_url}&queue={name}"],
            ["send", f"postgresql://{role}:{wrong}@{host}:{port}/postgres?queue={name}", "x"],
        ],
        "psycopg",
    )
    keywords = {"host": host, "port": port, "dbname": "postgres", "user": role}
    with leasekit.open("postgresql", queue=name, schema=schema, password=password, **keywords) as q:
        shown = [repr(q), repr(q.driver)]
        q.delete_queue()
    _assert_clean("a repr", "\n".join(shown), (password,))
