# The two commands a new machine needs (see README.md):
#   make demo   set up, then run the main job on the embedded SQLite default
#   make test   set up everything, then run lint, type checks and the whole suite
# Both create .venv themselves; `make test` also installs Azurite with `npm ci`.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Extras the whole suite needs (every backend SDK plus the dev tools).
TEST_EXTRAS := azure-storage-queue,azure-service-bus,aliyun-mns,sqs,spark,dev

.PHONY: demo test lint typecheck pytest clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel

# Re-install when pyproject.toml changes.
$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[$(TEST_EXTRAS)]'
	touch $@ $(VENV)/.installed-base

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

demo: $(VENV)/.installed-base
	$(BIN)/leasekit demo

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-test
	PYTHON=$(BIN)/python tools/typecheck.sh

pytest: $(VENV)/.installed-test node_modules/.installed
	$(BIN)/python -m pytest

test: lint typecheck pytest

clean:
	rm -rf $(VENV) node_modules .typecheck .mypy_cache .ruff_cache .pytest_cache
