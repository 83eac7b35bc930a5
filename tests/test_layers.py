"""The layers hold, and the check that says so can fail.

``tools/check_layers.py`` (run by ``make test``) checks the import contracts
with import-linter; here it runs on this checkout and on a copy of it with one
deliberate violation in each direction, which it must refuse. And core has no
import circle at run time (imports under ``TYPE_CHECKING`` aside: a lease names
its queue and a queue makes leases, so their types refer to each other).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")
grimp = pytest.importorskip("grimp")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import check_layers  # noqa: E402


def _copy(tmp_path: Path) -> Path:
    """The source folders of this checkout, copied (symlinks would edit the real files)."""
    copy = tmp_path / "checkout"
    for folder in ("core", "backends", "plugins", "conformance_tests", "emulators", "dashboard"):
        if (ROOT / folder).is_dir():
            shutil.copytree(
                ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__")
            )
    return copy


def test_this_checkout_keeps_every_layer_contract() -> None:
    assert check_layers.check(ROOT) == 0


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("core/_violation.py", "import leasekit.backends.memory\n"),
        ("backends/_violation.py", "import leasekit.queue\n"),
        ("backends/_violation.py", "import leasekit.emulators.mns\n"),
        ("plugins/_violation.py", "import leasekit.backends.sqlite\n"),
    ],
    ids=[
        "core-imports-a-backend",
        "backend-imports-policy",
        "backend-imports-emulator",
        "plugin-imports-a-backend",
    ],
)
def test_a_deliberate_violation_fails_the_check(tmp_path: Path, where: str, line: str) -> None:
    copy = _copy(tmp_path)
    (copy / where).write_text(f'"""A deliberate layer violation."""\n\n{line}')
    status, report = check_layers.check_output(copy)
    assert status != 0
    package = {"core": "leasekit", "backends": "leasekit.backends", "plugins": "leasekit.plugins"}
    violator = f"{package[where.split('/')[0]]}._violation"
    assert f"{violator} -> {line.split()[1]}" in report, report


def test_core_has_no_import_circle_at_run_time(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    check_layers.build_tree(tree)
    sys.path.insert(0, str(tree))
    try:
        graph = grimp.build_graph("leasekit", cache_dir=None, exclude_type_checking_imports=True)
    finally:
        sys.path.remove(str(tree))
    core = {m for m in graph.modules if m.count(".") == 1} - {
        f"leasekit.{name}" for name in check_layers.SUBPACKAGES
    }
    circles = []
    for module in sorted(core):
        for imported in graph.find_modules_directly_imported_by(module) & core:
            if graph.chain_exists(imported=module, importer=imported):
                circles.append(f"{module} -> {imported} -> ... -> {module}")
    assert circles == []
