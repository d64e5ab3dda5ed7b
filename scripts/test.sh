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
# The third-party servers the peer tests start (tests/peers/), each in a venv of its own.
bash scripts/install-peers.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== buf lint (protos/)"
(cd protos && buf lint)
echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy
echo "== pytest"
pytest -q "$@"
