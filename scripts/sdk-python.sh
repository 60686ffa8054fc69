#!/usr/bin/env bash
# The Python client's gates (clients/python, docs/sdk.md): a virtualenv in
# clients/python/.venv built from the pinned requirements-dev.txt (made
# again whenever that file changes), `pip check`, `mypy --strict` on the
# package, its tests and its benches (bench/, docs/benchmarks.md), then
# pytest: unit tests, the client against a scriptable fake node, and the
# client and the API client against the real binary, the shared scenarios
# of clients/conformance among them (they start redis-server from PATH, as
# scripts/install-test-deps.sh installs it). Needs only python3 (3.9 or
# later) with its venv module (Debian: the python3-venv package) and
# access to PyPI for the first run.
#
#   bash scripts/sdk-python.sh [MYRIAD_BIN]
#
# MYRIAD_BIN: the myriad binary the integration tests start (default: the
# MYRIAD_BIN variable, else the release build, target/release/myriad).
# PYTHON: the interpreter the venv is made from (default python3).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '\n==> %s\n' "$*"; }

bin="${1:-${MYRIAD_BIN:-target/release/myriad}}"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
[ -x "$bin" ] || { echo "sdk-python.sh: no executable myriad at $bin" >&2; exit 2; }
python="${PYTHON:-python3}"
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' \
    || { echo "sdk-python.sh: Python 3.9 or later is needed, found $("$python" --version 2>&1)" >&2; exit 2; }
"$python" -c 'import ensurepip, venv' 2>/dev/null \
    || { echo "sdk-python.sh: $python has no venv/ensurepip module (Debian: apt-get install python3-venv)" >&2; exit 2; }

cd clients/python
venv=.venv
stamp="$venv/.requirements.sha256"
want="$(sha256sum requirements-dev.txt | cut -d' ' -f1)"

if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    step "virtualenv clients/python/$venv from requirements-dev.txt"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-dev.txt
    echo "$want" > "$stamp"
else
    step "virtualenv clients/python/$venv is up to date with requirements-dev.txt"
fi
"$venv/bin/python" -m pip check --disable-pip-version-check

step "mypy --strict (the package, its tests and its benches)"
"$venv/bin/python" -m mypy --strict src tests bench

step "pytest: unit, fake node, real node (MYRIAD_BIN=$bin)"
MYRIAD_BIN="$bin" "$venv/bin/python" -m pytest -q
