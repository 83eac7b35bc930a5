"""The command line: backends, send, lease, stats, conformance; errors as one line and a code."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.text import Text
from typer.testing import CliRunner

from leasekit.cli import app

runner = CliRunner()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/cli.db?queue=jobs"


def test_backends_lists_installed_backends_with_capabilities() -> None:
    result = runner.invoke(app, ["backends", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert rows["sqlite"]["installed"] and rows["memory"]["installed"]
    assert rows["sqlite"]["capabilities"]["max_receive_batch"] >= 1


def test_send_lease_complete_and_stats_round_trip(url: str) -> None:
    sent = runner.invoke(app, ["send", url, "hello", "--create", "-p", "kind=greeting"])
    assert sent.exit_code == 0, sent.output
    message_id = sent.output.strip()
    leased = runner.invoke(app, ["lease", url, "--json", "--settle", "complete"])
    assert leased.exit_code == 0, leased.output
    [line] = [json.loads(x) for x in leased.output.splitlines() if x.startswith("{")]
    assert line["id"] == message_id and line["properties"] == {"kind": "greeting"}
    stats = runner.invoke(app, ["stats", url])
    assert stats.exit_code == 0 and "visible" in stats.output
    assert "total" in stats.output and "dead-lettered" in stats.output


def test_lease_abandons_by_default_so_nothing_is_lost(url: str) -> None:
    runner.invoke(app, ["send", url, "keep me", "--create"])
    first = runner.invoke(app, ["lease", url, "--json"])
    second = runner.invoke(app, ["lease", url, "--json"])
    ids = [json.loads(r.output.splitlines()[0])["id"] for r in (first, second)]
    assert ids[0] == ids[1]


def test_errors_are_one_line_with_an_exit_code(url: str) -> None:
    missing = runner.invoke(app, ["lease", url])
    assert missing.exit_code == 1
    assert "QueueNotFound" in missing.output
    unknown = runner.invoke(app, ["stats", "kafka://x"])
    assert unknown.exit_code == 2 and "installed:" in unknown.output
    bad = runner.invoke(app, ["send", url, "x", "--create", "--option", "nonsense"])
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output


@pytest.mark.slow
def test_conformance_prints_the_matrix_and_writes_markdown_and_json(tmp_path: Path) -> None:
    md, js = tmp_path / "m.md", tmp_path / "m.json"
    result = runner.invoke(
        app,
        ["conformance", "memory", "-k", "body or batch", "--markdown", str(md), "--json", str(js)],
    )
    assert result.exit_code == 0, result.output
    assert "body fidelity" in result.output
    assert "| body fidelity | pass |" in md.read_text()
    data = json.loads(js.read_text())
    assert data["backend"] == "memory"
    assert data["properties"]["batch receive limits"]["result"] == "skipped"


# ---------------------------------------------------------- what a newcomer sees first


def _commands() -> list[tuple[str, Any]]:
    """The CLI's commands by name (typer's click objects)."""
    return sorted(typer.main.get_command(app).commands.items())  # type: ignore[attr-defined]


def test_no_help_text_loses_words_to_rich_markup() -> None:
    """Help is rendered as rich markup: a bare ``[spark]`` would vanish from it."""
    texts = [typer.main.get_command(app).help or ""]
    for _, command in _commands():
        texts.append(command.help or "")
        texts += [getattr(param, "help", None) or "" for param in command.params]
    for text in texts:
        assert Text.from_markup(text).plain == text.replace("\\[", "["), text


@pytest.mark.parametrize("args", [[], *([name] for name, _ in _commands())])
def test_every_help_page_fits_80_columns(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    if not args:
        assert "(needs [spark])" in result.output


def test_backends_shows_every_backends_limits_at_80_columns() -> None:
    result = runner.invoke(app, ["backends"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = {line.split("│")[1].strip(): line for line in lines if line.startswith("│ ")}
    # The cloud services' documented limits, known without credentials.
    assert "1 s–12 h" in rows["aws-sqs"] and "not detected" in rows["aws-sqs"]
    assert "fixed 1 min" in rows["azure-service-bus"]
    assert "1 s–7 d" in rows["azure-storage-queue"] and "48 KiB" in rows["azure-storage-queue"]
    assert "16" in rows["aliyun-mns"] and "refused" in rows["aliyun-mns"]
    assert all(" - " not in row for row in rows.values())


def test_backends_shows_an_alias_in_its_backends_description_not_as_a_row() -> None:
    result = runner.invoke(app, ["backends"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip() for line in result.output.splitlines() if "│" in line}
    assert "postgresql" in rows and "postgres" not in rows
    assert "(also postgres://)" in " ".join(result.output.split())
    listed = {
        row["name"]: row for row in json.loads(runner.invoke(app, ["backends", "--json"]).output)
    }
    assert listed["postgres"]["alias_of"] == "postgresql"
    assert listed["postgresql"]["aliases"] == ["postgres"]


def test_backends_json_has_capabilities_for_every_builtin_backend() -> None:
    result = runner.invoke(app, ["backends", "--json"])
    rows = {row["name"]: row for row in json.loads(result.output)}
    for name in ("aliyun-mns", "aws-sqs", "azure-service-bus", "azure-storage-queue"):
        assert rows[name]["capabilities"]["max_receive_batch"] > 1, name
        assert rows[name]["installed"] is True  # the test venv has every SDK
    assert rows["azure-service-bus"]["capabilities"]["fixed_lease"] == 60.0


def test_backends_url_shows_one_queues_own_capabilities() -> None:
    small = runner.invoke(
        app, ["backends", "--url", "memory://caps", "-o", "max_message_size=1000", "--json"]
    )
    assert small.exit_code == 0, small.output
    assert json.loads(small.output)["max_message_size"] == 1000
    table = runner.invoke(app, ["backends", "--url", "memory://caps"], env={"COLUMNS": "80"})
    assert table.exit_code == 0 and "max_message_size" in table.output
    assert "262144" in table.output
    bad = runner.invoke(app, ["backends", "--url", "kafka://x"])
    assert bad.exit_code == 2


# ------------------------------------------------------------------- consume

HANDLERS = """
import asyncio
from pathlib import Path

def record(message):
    with open(Path(__file__).with_name("done.txt"), "ab") as out:
        out.write(message.body + b"\\n")

async def record_async(message):
    await asyncio.sleep(0)
    record(message)

not_callable = 3
"""


#: ``leasekit consume`` run as its own process (signals, a health port).
CONSUME = [sys.executable, "-m", "leasekit.cli", "consume"]


def _wait_for(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_consume_runs_a_handler_serves_health_and_stops_gracefully_on_sigterm(
    tmp_path: Path, url: str
) -> None:
    (tmp_path / "handlers.py").write_text(HANDLERS)
    assert runner.invoke(app, ["send", url, "one", "--create"]).exit_code == 0
    process = subprocess.Popen(
        [*CONSUME, url, "--handler", "handlers:record", "--health-port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    try:
        assert process.stderr is not None
        banner = process.stderr.readline() + process.stderr.readline()
        match = re.search(r"health: (http://[\d.:]+)/livez", banner)
        assert match, banner
        base = match.group(1)
        _wait_for(lambda: _status(f"{base}/readyz") == 200, 10, "the consumer to be ready")
        assert _status(f"{base}/livez") == 200
        assert runner.invoke(app, ["send", url, "two"]).exit_code == 0
        done = tmp_path / "done.txt"
        _wait_for(lambda: done.exists() and len(done.read_text().split()) == 2, 10, "both")
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=20)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, out
    assert sorted(done.read_text().split()) == ["one", "two"]
    assert re.search(r"completed\s+│\s+2", out), out


def test_consume_runs_an_async_handler_until_idle(tmp_path: Path, url: str) -> None:
    (tmp_path / "handlers.py").write_text(HANDLERS)
    runner.invoke(app, ["send", url, "a", "--create", "--count", "3"])
    result = subprocess.run(
        [*CONSUME, url, "--handler", "handlers:record_async", "--until-idle", "--concurrency", "4"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "done.txt").read_text().split() == ["a", "a", "a"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("handlers", "MODULE:FUNCTION"),
        ("no_such_module:f", "cannot import 'no_such_module'"),
        ("handlers:missing", "has no attribute 'missing'"),
        ("handlers:not_callable", "is not callable"),
    ],
)
def test_consume_refuses_a_bad_handler_before_opening_the_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, message: str
) -> None:
    (tmp_path / "handlers.py").write_text(HANDLERS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = runner.invoke(app, ["consume", "kafka://nowhere", "--handler", spec])
    assert result.exit_code == 2 and message in result.output, result.output


def test_lease_shows_whole_ids_and_bodies_at_80_columns(url: str) -> None:
    runner.invoke(app, ["send", url, "[bold]not markup[/] " + "x" * 100, "--create", "-p", "k=v"])
    result = runner.invoke(app, ["lease", url], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    leased = runner.invoke(app, ["lease", url, "--json"])
    message_id = json.loads(leased.output.splitlines()[0])["id"]
    assert message_id in result.output  # never cut short
    assert "[bold]not markup[/]" in result.output and "(k=v)" in result.output
    assert result.output.count("x") >= 100


# ------------------------------------------------------- the CLI as an operator meets it

#: One bad input per command: (arguments, exit status, words the error must hold).
#: ``{url}`` is a SQLite queue that exists; ``{missing}`` one whose file has no such queue.
BAD_INPUT = {
    "backends": (["backends", "--url", "kafka://x"], 2, "BackendNotFound"),
    "send": (["send", "{missing}", "hello"], 1, "QueueNotFound"),
    "lease": (["lease", "{url}", "--settle", "maybe"], 2, "--settle must be"),
    "stats": (["stats", "sqlite:///no/such/dir/x.db?queue=q"], 2, "InvalidURL"),
    "consume": (["consume", "{url}", "--handler", "nomodule"], 2, "MODULE:FUNCTION"),
    "watch": (["watch", "{url}", "--interval", "0"], 2, "--interval must be"),
    "conformance": (["conformance"], 2, "Missing argument 'URL'"),
    "dashboard": (["dashboard", "{url}", "--host", "0.0.0.0", "--no-token"], 2, "--no-token is"),
    "demo": (["demo", "--messages", "0"], 2, "--messages"),
    "dead-letters": (["dead-letters", "{missing}"], 1, "QueueNotFound"),
    "redrive": (["redrive", "{url}", "--limit", "0"], 2, "--limit"),
    "spark-demo": (["spark-demo", "--batch", "many"], 2, "--batch"),
}


def _one_error_line(stderr: str) -> str:
    """The error printed: one line, ``error: ...``, ending in a newline."""
    assert stderr.endswith("\n") and stderr.count("\n") == 1, repr(stderr)
    assert stderr.startswith("error: "), repr(stderr)
    return stderr


@pytest.fixture
def queues(tmp_path: Path) -> dict[str, str]:
    url = f"sqlite:///{tmp_path}/ops.db?queue=jobs"
    assert runner.invoke(app, ["send", url, "x", "--create"]).exit_code == 0
    return {"url": url, "missing": f"sqlite:///{tmp_path}/ops.db?queue=nope"}


def test_every_command_has_a_bad_input_case() -> None:
    assert sorted(BAD_INPUT) == sorted(name for name, _ in _commands())


@pytest.mark.parametrize("command", sorted(BAD_INPUT))
def test_bad_input_is_one_error_line_with_the_documented_exit_status_at_80_columns(
    command: str, queues: dict[str, str]
) -> None:
    args, status, words = BAD_INPUT[command]
    result = runner.invoke(app, [a.format(**queues) for a in args], env={"COLUMNS": "80"})
    assert result.exit_code == status, result.output
    assert words in _one_error_line(result.stderr)
    assert result.stdout == ""


@pytest.mark.parametrize("args", [["nosuch"], ["--bogus"], ["stats"], ["send", "--count", "x"]])
def test_usage_errors_are_one_line_not_a_panel(args: list[str]) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 2
    line = _one_error_line(result.stderr)
    assert "╭" not in line and "--help" in line


def test_backend_errors_exit_1(queues: dict[str, str]) -> None:
    for args in (["stats", queues["missing"]], ["lease", queues["missing"]]):
        result = runner.invoke(app, args, env={"COLUMNS": "80"})
        assert result.exit_code == 1, result.output
        assert "QueueNotFound" in _one_error_line(result.stderr)


@pytest.mark.parametrize("count", ["1", "3"])
def test_send_to_a_missing_queue_reports_queue_not_found_not_send_incomplete(
    queues: dict[str, str], count: str
) -> None:
    result = runner.invoke(app, ["send", queues["missing"], "hi", "--count", count])
    assert result.exit_code == 1
    line = _one_error_line(result.stderr)
    assert line.startswith("error: QueueNotFound:") and "SendIncomplete" not in line


@pytest.mark.parametrize("args", [[], *([name] for name, _ in _commands())])
def test_help_shows_no_typer_placeholders(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "<bool>" not in result.output
    assert not re.search(r"\{[A-Z_]+\}", result.output), result.output
    if args and args[0] in ("send", "lease", "stats"):
        assert f"leasekit {args[0]} [OPTIONS] URL" in result.output


@pytest.mark.parametrize("flag", ["-o", "--option", "-p"])
def test_a_key_value_item_without_equals_is_not_echoed(queues: dict[str, str], flag: str) -> None:
    secret = "aws_secret_access_keyAKIAEXAMPLESECRET"
    result = runner.invoke(app, ["send", queues["url"], "x", flag, "a=1", flag, secret])
    assert result.exit_code == 2
    line = _one_error_line(result.stderr)
    assert secret not in result.output and "AKIA" not in result.output
    assert "KEY=VALUE" in line and "number 2" in line


@pytest.mark.parametrize(
    "metrics",
    [
        "http://user:AWSsecret/metrics",  # a password where the port should be
        "http://user:AWSsecret@127.0.0.1:9/metrics",
        "http://[::1:AWSsecret/metrics",
        "ftp://AWSsecret/metrics",
    ],
)
def test_watch_refuses_a_malformed_metrics_url_without_showing_it(
    queues: dict[str, str], metrics: str
) -> None:
    result = runner.invoke(
        app, ["watch", queues["url"], "--metrics", metrics, "--once", "--interval", "0.1"]
    )
    assert result.exit_code == 2, result.output
    assert "--metrics" in _one_error_line(result.stderr)
    assert "AWSsecret" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_python_dash_m_leasekit_is_the_leasekit_script(queues: dict[str, str]) -> None:
    script = Path(sys.executable).with_name("leasekit")
    env = {**os.environ, "COLUMNS": "80"}
    for args in (["stats", queues["url"]], ["stats", queues["missing"]], ["nosuch"]):
        by_module = subprocess.run(
            [sys.executable, "-m", "leasekit", *args], capture_output=True, text=True, env=env
        )
        by_script = subprocess.run([script, *args], capture_output=True, text=True, env=env)
        assert by_module.returncode == by_script.returncode, args
        assert by_module.stdout == by_script.stdout
        assert by_module.stderr.replace("python -m leasekit", "leasekit") == by_script.stderr


def _dead_lettered(url: str, bodies: list[str]) -> None:
    import leasekit

    with leasekit.open(url, create=True) as queue:
        queue.send_many([b.encode() for b in bodies])
        for lease in queue.lease(len(bodies)):
            lease.dead_letter("handler raised ValueError: " + "why " * 30)


def test_dead_letters_lists_age_reason_count_and_body_at_80_columns(url: str) -> None:
    _dead_lettered(url, ["short", "long " * 40, "\u00e9t\u00e9"])
    result = runner.invoke(app, ["dead-letters", url], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "3 dead letter(s) of jobs" in lines[0]
    header = next(line for line in lines if "reason" in line)
    assert "age" in header and "#" in header and "body" in header
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 3
    assert all("handler raised" in row and "…" in row for row in rows)  # reason cut to fit
    assert any("short" in row for row in rows) and any("\u00e9t\u00e9" in row for row in rows)
    assert all(re.search(r"│\s+[\d.]+ (ms|s)\s+│\s+1\s+│", row) for row in rows), rows


def test_redrive_dry_run_moves_nothing_then_redrive_moves_with_a_summary(url: str) -> None:
    _dead_lettered(url, ["a", "b", "c"])
    dry = runner.invoke(app, ["redrive", url, "--dry-run"], env={"COLUMNS": "80"})
    assert dry.exit_code == 0 and "would move 3 dead letter(s)" in dry.stdout
    limited = runner.invoke(app, ["redrive", url, "--limit", "2"], env={"COLUMNS": "80"})
    assert limited.exit_code == 0, limited.output
    assert "moved 2 dead letter(s) back to jobs" in limited.stdout
    assert "more are left" in limited.stdout
    rest = runner.invoke(app, ["redrive", url], env={"COLUMNS": "80"})
    assert "moved 1 dead letter(s)" in rest.stdout and "more are left" not in rest.stdout
    leased = runner.invoke(app, ["lease", url, "--max", "10", "--json"])
    bodies = sorted(
        base64.b64decode(json.loads(line)["body_base64"])
        for line in leased.stdout.splitlines()
        if line.startswith("{")
    )
    assert bodies == [b"a", b"b", b"c"]
    empty = runner.invoke(app, ["dead-letters", url])
    assert empty.exit_code == 0 and "no dead letters" in empty.output
