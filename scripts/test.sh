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
# Third-party peers the tests start on loopback (each script is idempotent and
# quick once its peer is installed).
for peer in scripts/peers/*.sh; do
  if [ -e "$peer" ]; then bash "$peer"; fi
done

echo "== buf lint (protos/)"
(cd protos && buf lint)
echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy
echo "== pytest"
pytest -q "$@"
