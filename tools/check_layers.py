"""Check the layers with import-linter: core, backends, plugins, emulators, dashboard.

    .venv/bin/python tools/check_layers.py            # what `make test` runs
    .venv/bin/python tools/check_layers.py --show     # print the contracts it checks

The rules (docs/writing-a-backend.md, ../shared/DESIGN.md):

1. **Core imports no backend, plugin, emulator or dashboard.** Backends are found
   by lazy strings through the registry; plugin commands through entry points.
2. **A backend only translates.** It imports core's driver-facing modules (the SPI,
   errors, capabilities, options, the registry's spec, deadlines, clocks,
   redaction, URL parsing, the poison-copy format) and none of core's policy
   (Queue, leases, the keeper, workers, the CLI); no other backend; no emulator,
   plugin or dashboard.
3. **Emulators are test servers**: nothing but tests, the conformance harness'
   users and other emulators import them, and they import no backend or plugin.
4. **Plugins and the dashboard build on core's public API**: no backend, no
   emulator, none of core's lease machinery.

The source folders are remapped by pyproject (``core/`` is ``leasekit``), which
import-linter cannot follow through the editable install, so this builds a symlink
tree with the import layout (as tools/typecheck.sh does) and checks that. Core's
module list is read from the folder each time, so a new core module is covered
without editing anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Folders of the import layout: ``leasekit.<name>`` -> folder.
SUBPACKAGES = {
    "backends": "backends",
    "plugins": "plugins",
    "conformance": "conformance_tests",
    "emulators": "emulators",
    "dashboard": "dashboard",
}
#: Core modules a backend may import: what a driver is written against.
DRIVER_FACING = [
    "capabilities",
    "clock",
    "deadline",
    "dead_letter_format",
    "errors",
    "hookspecs",
    "options",
    "redaction",
    "registry",
    "spi",
    "url",
    "message",
]
#: Core's lease machinery: nothing outside core reaches into it.
MACHINERY = [
    "lease_record",
    "lease_operations",
    "call_runner",
    "worker_policy",
    "arguments",
    "error_mapping",
    "retry",
]


def core_modules(core: Path) -> list[str]:
    return sorted(p.stem for p in core.glob("*.py") if p.stem not in ("__init__", "__main__"))


def contracts(core: list[str], present: set[str]) -> str:
    """The import-linter configuration (INI) for this tree."""
    outside = [f"leasekit.{name}" for name in SUBPACKAGES if name in present]
    backends = sorted(
        p.stem if p.suffix == ".py" else p.name
        for p in (ROOT / "backends").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__")
        or (p.is_dir() and (p / "__init__.py").exists())
    )
    policy = [f"leasekit.{m}" for m in core if m not in DRIVER_FACING]
    machinery = [f"leasekit.{m}" for m in MACHINERY if m in core]
    lines = [
        "[importlinter]",
        "root_package = leasekit",
        "include_external_packages = False",
        "",
        "[importlinter:contract:core]",
        "name = core imports no backend, plugin, emulator or dashboard",
        "type = forbidden",
        "source_modules =",
        *(f"    leasekit.{m}" for m in core),
        "forbidden_modules =",
        *(f"    {m}" for m in outside if m != "leasekit.conformance"),
        "",
        "[importlinter:contract:backends-translate]",
        "name = a backend imports core's driver-facing modules only, no emulator or plugin",
        "type = forbidden",
        "source_modules =",
        "    leasekit.backends",
        "forbidden_modules =",
        *(f"    {m}" for m in policy),
        *(f"    {m}" for m in outside if m != "leasekit.backends"),
        "allow_indirect_imports = True",
        "",
        "[importlinter:contract:backends-independent]",
        "name = no backend imports another",
        "type = independence",
        "modules =",
        *(f"    leasekit.backends.{b}" for b in backends),
        "",
        "[importlinter:contract:emulators]",
        "name = emulators import no backend, plugin or dashboard",
        "type = forbidden",
        "source_modules =",
        "    leasekit.emulators",
        "forbidden_modules =",
        *(
            f"    {m}"
            for m in outside
            if m in ("leasekit.backends", "leasekit.plugins", "leasekit.dashboard")
        ),
        "",
        "[importlinter:contract:plugins]",
        "name = plugins and the dashboard build on core's public API",
        "type = forbidden",
        "source_modules =",
        *(f"    {m}" for m in outside if m in ("leasekit.plugins", "leasekit.dashboard")),
        "forbidden_modules =",
        *(f"    {m}" for m in outside if m in ("leasekit.backends", "leasekit.emulators")),
        *(f"    {m}" for m in machinery),
        "allow_indirect_imports = True",
        "",
    ]
    return "\n".join(lines)


def build_tree(tree: Path, root: Path = ROOT) -> set[str]:
    """Symlink ``root``'s folders into ``tree`` with the import layout; the subpackages present."""
    package = tree / "leasekit"
    package.mkdir(parents=True)
    for f in (root / "core").iterdir():
        if f.suffix == ".py" or f.name == "py.typed":
            (package / f.name).symlink_to(f.resolve())
    present = set()
    for name, folder in SUBPACKAGES.items():
        if (root / folder).is_dir():
            (package / name).symlink_to((root / folder).resolve())
            present.add(name)
    return present


def check(root: Path = ROOT, *, show: bool = False) -> int:
    """Run import-linter over ``root``, printing its report; its exit status (0: all kept)."""
    status, report = check_output(root, show=show)
    print(report, end="")
    return status


def check_output(root: Path = ROOT, *, show: bool = False) -> tuple[int, str]:
    """Run import-linter over ``root``: its exit status and its report."""
    with tempfile.TemporaryDirectory(prefix="leasekit-layers-") as scratch:
        tree = Path(scratch)
        present = build_tree(tree, root)
        config = tree / "layers.ini"
        config.write_text(contracts(core_modules(root / "core"), present))
        if show:
            print(config.read_text())
        lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run(
            [lint, "--no-cache", "--no-logo", str(config)],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
        )
        return done.returncode, done.stdout + done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print the contracts checked")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to check")
    args = parser.parse_args()
    sys.exit(check(args.root, show=args.show))


if __name__ == "__main__":
    main()
