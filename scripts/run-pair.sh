#!/usr/bin/env bash
# Set up a virtualenv in .venv (once), install the project, and run the
# sidecar pair with the embedded defaults: the seedstore on
# unix:./run/seedstore.sock and 127.0.0.1:50061, the negotiator on
# unix:./run/negotiator.sock and 127.0.0.1:50062. Ctrl-C stops both gracefully.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[tools]'
exec .venv/bin/agentsidecar-pair "$@"
