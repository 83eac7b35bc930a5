"""Run the fault scenarios and print what they measured, as a markdown table.

    .venv/bin/python tools/fault_report.py [--runs N] [pytest args...]

Each test in ``tests/test_faults.py`` records its numbers with pytest's
``record_property``; this runs them (N times), reads the JUnit XML and prints
one row per scenario and backend: each number's range over the runs. The
table in docs/reliability.md comes from here.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(
    extra: list[str], runs: int
) -> tuple[dict[tuple[str, str], dict[str, list[str]]], list[str]]:
    """Run the scenarios; return their properties by (scenario, backend), and the outcomes."""
    found: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    outcomes: list[str] = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "faults.xml"
            argv = [
                sys.executable,
                "-m",
                "pytest",
                "tests/test_faults.py",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={report}",
                *extra,
            ]
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
            outcomes.append(done.stdout.strip().splitlines()[-1] if done.stdout else "?")
            for case in ElementTree.parse(report).getroot().iter("testcase"):
                match = re.match(r"(test_\w+)\[(.+)\]", case.get("name", ""))
                if not match:
                    continue
                key = (match.group(1).removeprefix("test_").replace("_", " "), match.group(2))
                for prop in case.iter("property"):
                    found[key][prop.get("name", "?")].append(prop.get("value", ""))
    return found, outcomes


def span(values: list[str]) -> str:
    try:
        numbers = sorted(float(v) for v in values)
    except ValueError:
        return "/".join(values)
    low, high = numbers[0], numbers[-1]
    return f"{low:g}" if low == high else f"{low:g}–{high:g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    args, extra = parser.parse_known_args()
    found, outcomes = run(extra, args.runs)
    print(f"runs: {args.runs} ({'; '.join(outcomes)})\n")
    print("| scenario | backend | measured |")
    print("| --- | --- | --- |")
    for (scenario, backend), props in sorted(found.items()):
        cells = ", ".join(f"{name} {span(values)}" for name, values in props.items())
        print(f"| {scenario} | {backend} | {cells} |")


if __name__ == "__main__":
    main()
