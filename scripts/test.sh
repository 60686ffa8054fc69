#!/usr/bin/env bash
# Installs what the tests need and runs every test: formatting and lint
# gates, unit/property/integration tests against the real binary, the
# TypeScript SDK's gates and tests (scripts/sdk-js.sh), and the Autobahn
# WebSocket conformance suite against the real server's echo endpoint.
# This is the README's test command and what CI runs.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
step() { printf '\n==> %s\n' "$*"; }

step "install test dependencies"
bash scripts/install-test-deps.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test (unit, property and integration tests)"
cargo test --workspace --locked

step "release build"
cargo build --release --locked -p myriad

TARGET_DIR="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"

step "TypeScript SDK (clients/js): strict types, the size budget, unit tests, the real binary in Node and in headless Chromium"
bash scripts/sdk-js.sh "$TARGET_DIR/release/myriad"

step "Python SDK (clients/python): pinned venv, mypy --strict, tests against the real binary"
bash scripts/sdk-python.sh "$TARGET_DIR/release/myriad"

step "scale proof, smoke size: 2,000 subscribers over 2 nodes and Redis; 0 lost, nothing left running"
python3 scripts/scale_smoke.py "$TARGET_DIR/release/myriad" "$TARGET_DIR/scale-smoke"

step "presence, smoke size: 300 members joining at once, on one node (with join/leave events) and on 2 nodes over Redis"
python3 scripts/presence_bench.py --bin "$TARGET_DIR/release/myriad" --out "$TARGET_DIR/presence-smoke" \
    --runs 1 --members 300 --variants plain presence events --duration 5s --wait 20 --stats-requests 50 --check
python3 scripts/presence_bench.py --bin "$TARGET_DIR/release/myriad" --out "$TARGET_DIR/presence-smoke" \
    --runs 1 --members 300 --nodes 2 --variants plain presence --duration 8s --hold 2 --wait 20 --stats-requests 50 --check

step "Autobahn conformance, sections 1-10, 12 and 13 (permessage-deflate), against the real server"
MYRIAD_BIN="$TARGET_DIR/release/myriad" bash scripts/autobahn.sh
