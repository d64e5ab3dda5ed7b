#!/usr/bin/env bash
# The MCP test servers from npm (tests/peers/node: @modelcontextprotocol/server-everything),
# installed once per lockfile. Their tests skip, saying why, where npm is absent.
set -euo pipefail
cd "$(dirname "$0")/../../tests/peers/node"
command -v npm >/dev/null 2>&1 || exit 0
if [ node_modules/.package-lock.json -nt package-lock.json ]; then exit 0; fi
npm ci --no-audit --no-fund --loglevel=error
