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


#: The longest a backend module may be: a vendor reads one in a sitting.
MAX_BACKEND_LINES = 900
#: What every driver implements (abstract in ``leasekit.spi.Driver``), in reading order.
REQUIRED = ("send", "receive", "change_visibility", "delete", "create_queue", "delete_queue")


def _backend_modules() -> list[Path]:
    return sorted(p for p in (ROOT / "backends").rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _backend_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_backend_module_is_under_900_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_BACKEND_LINES, f"{path.name}: {lines} lines; split it along its seams"


def test_each_driver_class_opens_with_the_spis_required_methods() -> None:
    import ast

    checked = []
    for path in _backend_modules():
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            methods = [n.name for n in node.body if isinstance(n, ast.FunctionDef)]
            if not set(REQUIRED) <= set(methods):
                continue  # not a driver, or a subclass overriding a few methods
            public = [m for m in methods if not m.startswith("_") and m != "options_from_url"]
            assert tuple(public[: len(REQUIRED)]) == REQUIRED, (
                f"{path.relative_to(ROOT)}: {node.name} opens with {public[: len(REQUIRED)]}"
            )
            checked.append(node.name)
    assert len(checked) >= 9, checked  # every built-in backend's driver
