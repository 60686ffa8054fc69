#!/usr/bin/env bash
# The TypeScript client's gates (clients/js, docs/sdk.md): a clean install
# from package-lock.json, the strict type check of the client and of its
# tests, the build with its size budget (8 KB minified and gzipped; the
# build fails over it), the unit tests, the integration tests against the
# real binary, and the built bundle in headless Chromium against it (alone,
# in two pages of examples/chat exchanging messages, and recovering from
# cut connections over WebSocket, HTTP streaming and SSE)
# (skipped, and said so, when there is no Chromium: CHROMIUM, default
# `chromium` on PATH). The integration tests include the shared scenarios
# of clients/conformance, which start redis-server from PATH (as
# scripts/install-test-deps.sh installs it). Needs only Node 20+ and npm.
#
#   bash scripts/sdk-js.sh [MYRIAD_BIN]
#
# MYRIAD_BIN: the myriad binary the integration tests start (default: the
# MYRIAD_BIN variable, else the release build, target/release/myriad).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '\n==> %s\n' "$*"; }

bin="${1:-${MYRIAD_BIN:-target/release/myriad}}"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
[ -x "$bin" ] || { echo "sdk-js.sh: no executable myriad at $bin" >&2; exit 2; }
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
    || { echo "sdk-js.sh: Node 20 or later is needed, found $(node --version)" >&2; exit 2; }

cd clients/js

step "npm ci (clients/js)"
npm ci --no-audit --no-fund

step "tsc --noEmit, strict (the client, then its tests)"
npx --no-install tsc --noEmit -p tsconfig.json
npx --no-install tsc --noEmit -p tsconfig.test.json

step "build: ESM, CommonJS, declarations, minified bundle within 8 KB min+gzip"
node scripts/build.mjs

step "unit, integration and browser tests (MYRIAD_BIN=$bin)"
MYRIAD_BIN="$bin" node scripts/test.mjs all
