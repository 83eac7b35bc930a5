"""The packaged suite as a pytest plugin: options, skips with reasons, and the matrix report."""

from __future__ import annotations

import json

import pytest

pytest_plugins = ["pytester"]


def test_suite_runs_against_a_url_and_writes_the_matrix(pytester: pytest.Pytester) -> None:
    report = pytester.path / "matrix.json"
    result = pytester.runpytest_subprocess(
        "--pyargs",
        "leasekit.conformance",
        "--leasekit-backend",
        "memory",
        "--leasekit-report-json",
        str(report),
        "-k",
        "body or batch or missing_queue",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::RuntimeWarning",
    )
    result.assert_outcomes(passed=8, skipped=1)
    data = json.loads(report.read_text())
    assert data["backend"] == "memory"
    assert data["properties"]["body fidelity"]["result"] == "passed"
    skipped = data["properties"]["batch receive limits"]
    assert skipped["result"] == "skipped"
    assert "too large to overflow" in skipped["reason"]


def test_suite_without_a_backend_skips_with_the_reason(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        "--pyargs", "leasekit.conformance", "-k", "body_over", "-rs", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no --leasekit-backend given*"])


def test_option_without_equals_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        "--pyargs",
        "leasekit.conformance",
        "--leasekit-backend",
        "memory",
        "--leasekit-option",
        "novalue",
        "-k",
        "body_over",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*KEY=VALUE*"])
