#!/usr/bin/env bash
# Set up a virtualenv in .venv (once), install the project with its test
# extras, then run every check CI runs: proto lint, ruff, mypy, the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
export PATH="$PWD/.venv/bin:$PATH"
# Third-party test servers from npm (tests/peers/node); their tests skip where npm is absent.
if command -v npm >/dev/null 2>&1; then
  (cd tests/peers/node && npm ci --no-audit --no-fund --loglevel=error)
fi

echo "== buf lint (protos/)"
(cd protos && buf lint)
echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy
echo "== pytest"
pytest -q "$@"
