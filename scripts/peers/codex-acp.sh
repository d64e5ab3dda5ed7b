#!/usr/bin/env bash
# Install the codex-acp agent (@zed-industries/codex-acp, pinned in tests/peers/codex-acp) that
# the acp adapter's tests run against a local mock provider. Without npm there is nothing to
# install, and those tests skip saying so.
set -euo pipefail
cd "$(dirname "$0")/../../tests/peers/codex-acp"
if ! command -v npm >/dev/null 2>&1; then
  echo "codex-acp peer: npm not found; the tests that need codex-acp will skip"
  exit 0
fi
# Once per lockfile: npm ci would otherwise reinstall every run.
if [ node_modules/.package-lock.json -nt package-lock.json ]; then exit 0; fi
npm ci --no-audit --no-fund --loglevel=error
