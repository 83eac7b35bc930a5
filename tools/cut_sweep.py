"""Sweep cut lengths and start times on every fault-table backend; print leases kept.

    .venv/bin/python tools/cut_sweep.py [--runs N] [pytest args, e.g. -k aliyun-mns]

Runs ``tests/sweep_cuts.py`` (see its docstring) and prints one table: a row per
backend and cut start, a column per cut length, each cell the leases kept of 5
(a range over the runs). docs/reliability.md's survivable-cut table comes from here.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    args, extra = parser.parse_known_args()
    kept: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    lengths: list[str] = []
    outcomes = []
    failures: list[str] = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "sweep.xml"
            argv = [sys.executable, "-m", "pytest", "tests/sweep_cuts.py", "-q", "-p",
                    "no:cacheprovider", f"--junitxml={report}", *extra]  # fmt: skip
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
            outcomes.append(done.stdout.strip().splitlines()[-1] if done.stdout else "?")
            for case in ElementTree.parse(report).getroot().iter("testcase"):
                match = re.match(r"test_cut\[(.+)-at([\d.]+)s-cut([\d.]+)s\]", case.get("name", ""))
                if not match:
                    continue
                backend, start, length = match.groups()
                if length not in lengths:
                    lengths.append(length)
                for failure in [*case.iter("failure"), *case.iter("error")]:
                    said = (failure.get("message") or "").splitlines()[:1]
                    failures.append(f"{case.get('name')}: {said[0] if said else '?'}")
                for prop in case.iter("property"):
                    if prop.get("name") == "kept":
                        kept[(backend, start)][length].append(int(prop.get("value", "0")))
    lengths.sort(key=float)
    print(f"runs: {args.runs} ({'; '.join(outcomes)})\n")
    for failure in failures:
        print(f"FAILED {failure}")
    print("| backend | cut starts | " + " | ".join(f"{x} s cut" for x in lengths) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in lengths) + " |")
    for (backend, start), cells in sorted(kept.items()):
        row = []
        for length in lengths:
            values = sorted(cells.get(length, []))
            if not values:
                row.append("—")
            elif values[0] == values[-1]:
                row.append(f"{values[0]}/5")
            else:
                row.append(f"{values[0]}–{values[-1]}/5")
        print(f"| {backend} | {start} s | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
