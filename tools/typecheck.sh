#!/usr/bin/env bash
# Type-check the package as it is imported (leasekit, leasekit.backends, ...).
# The source folders are remapped by pyproject (core/ -> leasekit/ ...), which
# mypy cannot follow through the editable install, so build a symlink tree
# with the import layout and check that.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=.typecheck
rm -rf "$tree"
mkdir -p "$tree/leasekit"
for f in core/*.py core/py.typed; do ln -s "../../$f" "$tree/leasekit/"; done
ln -s ../../backends "$tree/leasekit/backends"
ln -s ../../plugins "$tree/leasekit/plugins"
ln -s ../../conformance_tests "$tree/leasekit/conformance"
ln -s ../../emulators "$tree/leasekit/emulators"
ln -s ../../dashboard "$tree/leasekit/dashboard"
MYPYPATH="$tree" exec "${PYTHON:-python}" -m mypy -p leasekit "$@"
