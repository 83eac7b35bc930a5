"""The command line: backends, send, lease, stats, conformance; errors as one line and a code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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
