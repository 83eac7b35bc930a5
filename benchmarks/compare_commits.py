"""Run one benchmark script against two checkouts of leasekit, taking turns.

    .venv/bin/python benchmarks/compare_commits.py mns --before ../bench-f6ac435 --turns 3 \\
        -- --messages 1000 --repeat 3 --workers 8 --paired 4

Each checkout ("before" and "after") brings its own ``.venv`` with leasekit
installed from that checkout (editable). The turns alternate — before, after,
before, after, … — so the drift of a shared machine falls on both alike. By
default the *after* checkout's copy of the benchmark script runs under both
venvs ("same script"); ``--own-script`` runs each checkout's own copy instead,
for a script that calls something the old code lacks. Whichever is used, the
output says so, and whether the two copies differ.

From each run the preset's figures are taken out of the script's own output
(its markdown table and summary lines); the result is one row per figure with
every run, the median of each side and after/before. Every run's whole output,
with the 1-minute load average before and after it, is kept in ``--log-dir``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import filecmp
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
Extractor = Callable[[str], float | None]


def cell(label: str, column: int, *, prefix: bool = False) -> Extractor:
    """A number from a markdown table row whose first cell is ``label``.

    ``column`` counts the cells after the first (1 = the second cell); commas,
    ``×`` and ``x`` suffixes are dropped. With ``prefix`` the first cell need
    only start with ``label``.
    """

    def extract(output: str) -> float | None:
        for line in output.splitlines():
            if not line.startswith("|"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            first = cells[0]
            if (first.startswith(label) if prefix else first == label) and len(cells) > column:
                return number(cells[column])
        return None

    return extract


def pattern(regex: str) -> Extractor:
    """The first group of the first match of ``regex`` in the output, as a number."""
    compiled = re.compile(regex)

    def extract(output: str) -> float | None:
        match = compiled.search(output)
        return number(match.group(1)) if match else None

    return extract


def number(text: str) -> float | None:
    match = re.match(r"[-+]?[\d,]*\.?\d+", text.strip())
    return float(match.group(0).replace(",", "")) if match else None


@dataclasses.dataclass(frozen=True)
class Preset:
    """A benchmark script, its default arguments and the figures taken from its output."""

    script: str
    args: tuple[str, ...]
    figures: dict[str, Extractor]


KEEPER_LINE = r"keeper: leases=[\d,]+ "
PRESETS: dict[str, Preset] = {
    "sqlite": Preset(
        "bench_sqlite.py",
        ("--messages", "20000", "--batch", "100", "--repeat", "3", "--only", "leasekit"),
        {
            "batch complete, lease+complete msg/s": cell("leasekit (batch complete)", 2),
            "complete each, lease+complete msg/s": cell("leasekit (complete each)", 2),
            "batch complete, send msg/s": cell("leasekit (batch complete)", 1),
        },
    ),
    "cost-10": Preset(
        "bench_sqlite.py",
        (
            # 30,000 messages, median of 5: at 10,000 a run lasts 0.1 s and the
            # plain loop flipped between two speeds (10 and 20 µs per message).
            "--messages",
            "30000",
            "--batch",
            "10",
            "--repeat",
            "5",
            "--only",
            "batch complete",
            "--only",
            "plain",
            "--dir",
            "/dev/shm",
        ),
        {
            "leasekit lease+complete msg/s": cell("leasekit (batch complete)", 2),
            "plain sqlite3 msg/s": cell("plain sqlite3 (", 2, prefix=True),
            "leasekit ÷ plain": cell("plain sqlite3 (", 3, prefix=True),
            "leasekit CPU µs/msg": cell("leasekit (batch complete)", 4),
            "plain CPU µs/msg": cell("plain sqlite3 (", 4, prefix=True),
        },
    ),
    # Issue 37: against the careful plain loop (executemany fenced DELETE), with
    # the per-round ratio; pass "-- ... --batch 100" for the other batch size.
    "careful": Preset(
        "bench_sqlite.py",
        (
            "--messages",
            "10000",
            "--batch",
            "10",
            "--repeat",
            "7",
            "--only",
            "leasekit (batch complete)",
            "--only",
            "plain",
            "--dir",
            "/dev/shm",
        ),
        {
            "leasekit lease+complete msg/s": cell("leasekit (batch complete)", 2),
            "plain sqlite3 msg/s": cell("plain sqlite3 (", 2, prefix=True),
            "leasekit ÷ plain, per round (msg/s)": pattern(r"per round \(msg/s\): median ([\d.]+)"),
            "leasekit ÷ plain, per round (CPU)": pattern(r"by CPU per message: median ([\d.]+)"),
            "leasekit CPU µs/msg": cell("leasekit (batch complete)", 4),
            "plain CPU µs/msg": cell("plain sqlite3 (", 4, prefix=True),
        },
    ),
    "cost-100": Preset(
        "bench_sqlite.py",
        (
            "--messages",
            "20000",
            "--batch",
            "100",
            "--repeat",
            "3",
            "--only",
            "batch complete",
            "--only",
            "plain",
            "--dir",
            "/dev/shm",
            "--memory",
            "50000",
        ),
        {
            "leasekit lease+complete msg/s": cell("leasekit (batch complete)", 2),
            "plain sqlite3 msg/s": cell("plain sqlite3 (", 2, prefix=True),
            "leasekit ÷ plain": cell("plain sqlite3 (", 3, prefix=True),
            "leasekit CPU µs/msg": cell("leasekit (batch complete)", 4),
            "plain CPU µs/msg": cell("plain sqlite3 (", 4, prefix=True),
            "bytes per held lease (with keeper entry)": pattern(
                r"per held lease with its keeper entry: ([\d,]+) B"
            ),
            "LeaseKeeper.add_many µs per lease": pattern(r"add_many CPU per lease: ([\d.]+)"),
        },
    ),
    "mns": Preset(
        "bench_aliyun_mns.py",
        ("--messages", "1000", "--repeat", "3", "--workers", "8", "--paired", "4"),
        {
            "leasekit loop / raw loop": cell("leasekit", 2),
            "leasekit loop / raw loop, paired": pattern(r"leasekit / raw: median ([\d.]+)"),
            "Consumer / raw loop": cell("leasekit.Consumer, concurrency 8", 2),
            "raw loop msg/s": cell("raw SDK", 1),
            "raw loop client CPU us/msg": cell("raw SDK", 3),
            "leasekit loop client CPU us/msg": cell("leasekit", 3),
            "Consumer client CPU us/msg": cell("leasekit.Consumer, concurrency 8", 3),
        },
    ),
    "sqs": Preset(
        "bench_aws_sqs.py",
        ("--messages", "300", "--repeat", "2", "--workers", "8", "--depth", "100"),
        {
            "leasekit loop / raw loop": cell("leasekit", 2),
            "Consumer / raw loop": cell("leasekit.Consumer, concurrency 8", 2),
            "batched complete / raw loop": cell("leasekit, batched complete", 2, prefix=True),
            "raw loop msg/s": cell("raw boto3", 1),
            "raw loop client CPU ms/msg": cell("raw boto3", 3),
            "leasekit loop client CPU ms/msg": cell("leasekit", 3),
            "Consumer client CPU ms/msg": cell("leasekit.Consumer, concurrency 8", 3),
        },
    ),
    "storage-queue": Preset(
        "bench_azure_storage_queue.py",
        ("--messages", "500", "--repeat", "2", "--paired", "2", "--only", "abc"),
        {
            "leasekit loop / raw loop": cell("(b)", 3, prefix=True),
            "leasekit loop / raw loop, paired": pattern(r"\(b\)/\(a\) median ([\d.]+)"),
            "Consumer / raw loop": cell("(c)", 3, prefix=True),
            "raw loop msg/s": cell("(a)", 1, prefix=True),
            "raw loop Python CPU ms/msg": cell("(a)", 4, prefix=True),
            "leasekit loop Python CPU ms/msg": cell("(b)", 4, prefix=True),
            "Consumer Python CPU ms/msg": cell("(c)", 4, prefix=True),
        },
    ),
    "service-bus": Preset(
        "bench_azure_service_bus.py",
        ("--messages", "1000", "--repeat", "2", "--concurrency", "1", "8", "--locks", "0"),
        {
            "leasekit loop / raw loop": cell("leasekit", 2),
            "Consumer (1 thread) / raw loop": cell("leasekit.Consumer, concurrency 1", 2),
            "Consumer (8 threads) / raw loop": cell("leasekit.Consumer, concurrency 8", 2),
            "raw loop msg/s": cell("raw SDK", 1),
            "raw loop client CPU ms/msg": cell("raw SDK", 3),
            "leasekit loop client CPU ms/msg": cell("leasekit", 3),
            "Consumer (8) client CPU ms/msg": cell("leasekit.Consumer, concurrency 8", 3),
        },
    ),
    "asyncio-loop": Preset(
        "bench_asyncio.py",
        ("loop", "--backend", "sqlite", "--messages", "3000", "--turns", "3"),
        {
            "async/sync loop (median of turns)": pattern(r"async/sync median ([\d.]+)"),
            "sync loop msg/s": pattern(r"sync median ([\d,]+) msg/s"),
            "async loop msg/s": pattern(r"async median ([\d,]+) msg/s"),
        },
    ),
    "asyncio-consumers": Preset(
        "bench_asyncio.py",
        ("consumers", "--concurrency", "200", "--io", "0.05", "--turns", "2"),
        {
            "AsyncConsumer / Consumer": pattern(r"AsyncConsumer / Consumer throughput: ([\d.]+)"),
            "AsyncConsumer msg/s": pattern(r"async: median ([\d,]+) msg/s"),
            "Consumer (threads) msg/s": pattern(r"threads: median ([\d,]+) msg/s"),
        },
    ),
    "keeper": Preset(
        "bench_keeper.py",
        ("--leases", "100000", "--lease", "2", "--seconds", "60"),
        {
            "lost": pattern(KEEPER_LINE + r"lost=(\d+)"),
            "lapsed (most visible at a sample)": pattern(KEEPER_LINE + r"lost=\d+ lapsed=(\d+)"),
            "renewal lateness p99 ms": pattern(KEEPER_LINE + r".*?p99=([\d.]+) ms"),
            "renewal lateness max ms": pattern(KEEPER_LINE + r".*?max=([\d.]+) ms"),
            "CPU us/renewal": pattern(KEEPER_LINE + r".*?\(([\d.]+) us/renewal\)"),
            "renewals": pattern(KEEPER_LINE + r".*?renewals=([\d,]+)"),
        },
    ),
}


@dataclasses.dataclass
class Run:
    """One run of the script under one checkout."""

    side: str
    turn: int
    seconds: float
    load_before: float
    load_after: float
    returncode: int
    figures: dict[str, float | None]


def checkout_python(tree: Path) -> Path:
    python = tree / ".venv" / "bin" / "python"
    if not python.exists():
        sys.exit(f"{python} not found: set up that checkout with its Makefile first")
    return python


def installed_from(python: Path) -> str:
    """Where that venv imports leasekit from (it must be its own checkout)."""
    out = subprocess.run(
        [str(python), "-c", "import leasekit; print(leasekit.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return str(Path(out.stdout.strip()).resolve().parent.parent)


def run_once(
    side: str, turn: int, tree: Path, script: Path, args: list[str], preset: Preset, log_dir: Path
) -> Run:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    proc = subprocess.run(
        [str(checkout_python(tree)), str(script), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - start
    load_after = os.getloadavg()[0]
    log = log_dir / f"{turn:02d}-{side}.log"
    log.write_text(
        f"$ {checkout_python(tree)} {script} {' '.join(args)}\n# cwd {tree}\n"
        f"# load {load_before:.2f} -> {load_after:.2f}, {seconds:.0f} s, rc {proc.returncode}\n\n"
        f"{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )
    figures = {name: extract(proc.stdout) for name, extract in preset.figures.items()}
    shown = ", ".join(f"{k} {fmt(v)}" for k, v in list(figures.items())[:3])
    print(
        f"turn {turn} {side:>6}: {seconds:5.0f} s, load {load_before:.2f}->{load_after:.2f}, "
        f"rc {proc.returncode}: {shown}",
        flush=True,
    )
    if proc.returncode != 0:
        print(f"  failed; see {log}", file=sys.stderr)
    return Run(side, turn, seconds, load_before, load_after, proc.returncode, figures)


def fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value < 10 else f"{value:.1f}"


def median(runs: list[Run], name: str) -> float | None:
    values = [r.figures[name] for r in runs if r.figures[name] is not None]
    return statistics.median(v for v in values if v is not None) if values else None


def report(preset: Preset, runs: list[Run]) -> None:
    before = [r for r in runs if r.side == "before"]
    after = [r for r in runs if r.side == "after"]
    print()
    print("| figure | before runs | after runs | before median | after median | after/before |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for name in preset.figures:
        b, a = median(before, name), median(after, name)
        ratio = f"{a / b:.2f}" if a is not None and b else "—"
        b_runs = ", ".join(fmt(r.figures[name]) for r in before)
        a_runs = ", ".join(fmt(r.figures[name]) for r in after)
        print(f"| {name} | {b_runs} | {a_runs} | {fmt(b)} | {fmt(a)} | {ratio} |")
    loads = [x for r in runs for x in (r.load_before, r.load_after)]
    print(
        f"\n{len(before)} before and {len(after)} after runs, {sum(r.seconds for r in runs):.0f} s "
        f"in all; 1-minute load average {min(loads):.1f}–{max(loads):.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Arguments after -- go to the script (default: the preset's).",
    )
    parser.add_argument("preset", choices=sorted(PRESETS), help="which benchmark")
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument(
        "--after", type=Path, default=HERE.parent, help="the newer checkout (default: this one)"
    )
    parser.add_argument("--turns", type=int, default=3, help="runs on each side")
    parser.add_argument(
        "--own-script",
        action="store_true",
        help="run each checkout's own copy of the script, not the after copy on both",
    )
    parser.add_argument("--log-dir", type=Path, default=None, help="where each run's output goes")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    script_args = argv[split + 1 :] or list(PRESETS[args.preset].args)
    preset = PRESETS[args.preset]
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for side, tree in trees.items():
        source = installed_from(checkout_python(tree))
        if Path(source) != tree:
            sys.exit(f"{side}: {tree}/.venv imports leasekit from {source}, not from {tree}")
    scripts = {side: tree / "benchmarks" / preset.script for side, tree in trees.items()}
    same = filecmp.cmp(scripts["before"], scripts["after"], shallow=False)
    if not args.own_script:
        scripts["before"] = scripts["after"]
    log_dir = args.log_dir or Path("/tmp") / (
        f"compare-{args.preset}-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    )
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"benchmarks/{preset.script} {' '.join(script_args)}")
    print(f"before: {trees['before']}\nafter:  {trees['after']}")
    print(
        ("each checkout's own copy of the script" if args.own_script else "the after copy on both")
        + (" (the two copies are identical)" if same else " (the two copies differ)")
    )
    print(f"logs: {log_dir}\n", flush=True)
    runs: list[Run] = []
    for turn in range(1, args.turns + 1):
        for side in ("before", "after"):
            runs.append(
                run_once(side, turn, trees[side], scripts[side], script_args, preset, log_dir)
            )
    report(preset, runs)


if __name__ == "__main__":
    main()
