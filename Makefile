# Tasks for working on agentsidecar. Each target runs the commands scripts/test.sh (and so CI,
# .ci/run) runs, with the same tools from the same virtualenv; `make check` is scripts/test.sh.
#
#   make venv                  .venv with the project and its test extras (editable)
#   make lint                  buf lint, ruff check, ruff format --check
#   make type                  mypy (strict; the files listed in pyproject.toml)
#   make test                  every test (ARGS="..." passes pytest arguments)
#   make test-quick            the tests not marked slow (tests/conftest.py)
#   make test ARGS="tests/negotiator/test_config.py -k schema"   one file, some tests
#   make bench / bench-quick   bench/run_all.py (bench/README.md); writes bench/results/latest.md
#   make check                 all of the above but bench, as CI runs it
#   make fresh-clone           CI's run in a fresh clone of the committed HEAD

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3.11
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
ARGS ?=
# As scripts/test.sh: the venv's console scripts (negotiator, seedstore, grpcurl, buf) first on PATH.
export PATH := $(BIN):$(PATH)

.PHONY: venv peers lint format type test test-quick bench bench-quick check fresh-clone

venv: $(BIN)/pytest

$(BIN)/pytest: pyproject.toml hatch_build.py
	command -v $(PYTHON) >/dev/null 2>&1 || { echo "$(PYTHON) not found; make PYTHON=python3" >&2; exit 1; }
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

# Third-party peers the tests start on loopback (each script is idempotent; without npm they skip).
peers:
	for peer in scripts/peers/*.sh; do if [ -e "$$peer" ]; then bash "$$peer"; fi; done

lint: venv
	cd protos && buf lint
	ruff check .
	ruff format --check .

# Rewrites files: ruff's fixes and formatting.
format: venv
	ruff check --fix .
	ruff format .

type: venv
	mypy

test: venv peers
	pytest -q $(ARGS)

test-quick: venv
	pytest -q -m "not slow" $(ARGS)

bench: venv
	python -m bench.run_all $(ARGS)

bench-quick: venv
	python -m bench.run_all --quick $(ARGS)

check:
	bash scripts/test.sh $(ARGS)

# What CI does with a submission: a fresh clone of the committed HEAD (uncommitted work is not in
# it), CI=true, .ci/run. Catches a file that was never committed or an install step that only
# this checkout's .venv had.
fresh-clone:
	dir="$$(mktemp -d)/agentsidecar"; \
	git clone --quiet --no-local "$(CURDIR)" "$$dir"; \
	git -C "$$dir" checkout --quiet "$$(git rev-parse HEAD)"; \
	echo "fresh clone of $$(git rev-parse --short HEAD) in $$dir"; \
	cd "$$dir" && env -u VIRTUAL_ENV PATH="$(subst $(BIN):,,$(PATH))" CI=true bash .ci/run
