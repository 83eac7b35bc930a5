"""Collecting conformance results into a compatibility matrix (property x result)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = ["MatrixReport", "Outcome", "load_matrix", "render_markdown"]

#: Severity order when several tests make up one property.
_RANK = {"failed": 3, "skipped": 2, "passed": 1}


@dataclass
class Outcome:
    """One test's result."""

    test: str
    property: str
    outcome: str
    reason: str = ""
    duration: float = 0.0
    backend: str = ""


@dataclass
class MatrixReport:
    """A pytest plugin object that records outcomes and writes the matrix at the end."""

    backend: str
    json_path: str | None = None
    md_path: str | None = None
    outcomes: list[Outcome] = field(default_factory=list)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Iterator[None]:
        """Record each conformance test's outcome (call phase, or a skip/failure in setup)."""
        result = yield
        report: pytest.TestReport = result.get_result()  # type: ignore[attr-defined]
        fn = getattr(item, "function", None)
        prop = getattr(fn, "conformance_property", None)
        if prop is None:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            reason = ""
            if report.skipped and isinstance(report.longrepr, tuple):
                reason = str(report.longrepr[2]).removeprefix("Skipped: ")
            elif report.failed:
                reason = _first_line(report.longreprtext)
            self.outcomes.append(
                Outcome(
                    test=item.name,
                    property=str(prop),
                    outcome=report.outcome,
                    reason=reason,
                    duration=round(report.duration, 3),
                    backend=self._backend_of(item),
                )
            )

    def _backend_of(self, item: pytest.Item) -> str:
        """The backend a test ran against: the class's ``conformance_backend``, else its name."""
        cls = getattr(item, "cls", None)
        label = getattr(cls, "conformance_backend", None)
        if label:
            return str(label)
        name = cls.__name__ if cls is not None else ""
        if not name or name == "TestConformance":
            return self.backend
        return name.removeprefix("Test").removesuffix("Conformance")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write the JSON and Markdown files."""
        data = self.as_dict()
        if self.json_path:
            Path(self.json_path).write_text(json.dumps(data, indent=2) + "\n")
        if self.md_path:
            Path(self.md_path).write_text(render_markdown(data))

    def as_dict(self) -> dict[str, Any]:
        """The matrix: per backend and property the worst outcome, plus every test."""
        backends: dict[str, dict[str, dict[str, str]]] = {}
        for o in self.outcomes:
            properties = backends.setdefault(o.backend or self.backend, {})
            current = properties.get(o.property)
            if current is None or _RANK[o.outcome] > _RANK[current["result"]]:
                properties[o.property] = {"result": o.outcome, "reason": o.reason}
        only = next(iter(backends.values())) if len(backends) == 1 else {}
        return {
            "backend": next(iter(backends)) if len(backends) == 1 else self.backend,
            "properties": only,
            "backends": backends,
            "tests": [asdict(o) for o in self.outcomes],
        }


def _first_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.startswith("E "):
            return line[2:].strip()[:200]
    return text.strip().splitlines()[-1][:200] if text.strip() else ""


def load_matrix(path: str | Path) -> dict[str, Any]:
    """Read a matrix written by ``--leasekit-report-json``."""
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def render_markdown(data: dict[str, Any]) -> str:
    """The matrix as Markdown: one table, a column per backend."""
    backends: dict[str, dict[str, dict[str, str]]] = data.get("backends") or {
        data["backend"]: data["properties"]
    }
    names = list(backends)
    properties: list[str] = []
    for rows in backends.values():
        properties.extend(p for p in rows if p not in properties)
    lines = [
        "| property | " + " | ".join(f"`{n}`" for n in names) + " |",
        "| --- |" + " --- |" * len(names),
    ]
    for prop in properties:
        cells = []
        for name in names:
            row = backends[name].get(prop)
            if row is None:
                cells.append("–")
            elif row["result"] == "passed":
                cells.append("pass")
            else:
                reason = row["reason"].replace("|", "\\|")
                cells.append(f"**{row['result']}**: {reason}" if reason else row["result"])
        lines.append(f"| {prop} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
