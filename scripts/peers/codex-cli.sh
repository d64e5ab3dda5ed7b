#!/usr/bin/env bash
# Install the OpenAI Codex CLI (pinned in tests/peers/codex-cli/package-lock.json) for the command
# adapter's codex-cli preset tests. Without npm it does nothing: those tests then skip, saying so.
set -euo pipefail
cd "$(dirname "$0")/../../tests/peers/codex-cli"
if ! command -v npm >/dev/null 2>&1; then
  echo "codex-cli peer: npm not found; the codex-cli tests will skip"
  exit 0
fi
# Once per lockfile: npm ci would otherwise reinstall every run.
if [ node_modules/.package-lock.json -nt package-lock.json ]; then exit 0; fi
npm ci --no-audit --no-fund --loglevel=error
