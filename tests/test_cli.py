"""The command line: backends, send, lease, stats, conformance; errors as one line and a code."""

from __future__ import annotations

import json
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
