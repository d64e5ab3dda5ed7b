#!/usr/bin/env bash
# Install the third-party OpenAI-compatible servers the peer tests start
# (tests/peers/) into venvs of their own under .peers/: LiteLLM's proxy and
# llmock pin conflicting uvicorn versions, so they cannot share one. Idempotent:
# a venv whose pinned package already imports is left as it is.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

# LiteLLM 1.107.0 was a compromised release: the pin is exact and must stay below it.
LITELLM_SPEC='litellm[proxy]==1.80.0'
LLMOCK_SPEC='llmock==0.2.2'

install_peer() {
  local name="$1" spec="$2" dist="$3" version="$4"
  local venv=".peers/$name"
  if [ -x "$venv/bin/python" ] \
    && [ "$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null)" = "$version" ]; then
    return 0
  fi
  echo "== installing $spec into $venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "$spec"
}

install_peer litellm "$LITELLM_SPEC" litellm 1.80.0
install_peer llmock "$LLMOCK_SPEC" llmock 0.2.2
