#!/usr/bin/env bash
# Installs what myriad's tests need beyond the Rust toolchain: Debian's
# `chromium`, which drives the admin `/status` page in a real browser
# (crates/myriad/tests/status_page.rs), `openssl`, which makes the keys the
# token tests sign with (crates/myriad/tests/auth.rs), `redis-server`, which
# the Redis engine, graph store and cluster tests start on ephemeral ports
# (crates/testkit), and the Autobahn WebSocket testsuite
# (`wstest`, Python 2 code) in a Python 2.7 virtualenv.
#
#   scripts/install-test-deps.sh
#
# Idempotent: installs a package only when it is not on PATH, and does nothing
# more when $MYRIAD_VENV/bin/wstest already works with the pinned
# requirements. Fails loudly (non-zero) when it cannot install.
#
# Environment:
#   MYRIAD_VENV        Python 2.7 env for wstest     (default <repo>/.venv-autobahn)
#   MYRIAD_TOOLS_VENV  Python 3 env holding virtualenv (default <repo>/.venv-tools)
#   MYRIAD_PYTHON27    python2.7 interpreter to use  (default: pyenv's 2.7.x, then PATH)
#   MYRIAD_PYTHON3     python3 used to make the tools venv (default: python3 on PATH)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MYRIAD_VENV="${MYRIAD_VENV:-$REPO_ROOT/.venv-autobahn}"
MYRIAD_TOOLS_VENV="${MYRIAD_TOOLS_VENV:-$REPO_ROOT/.venv-tools}"
REQUIREMENTS="$REPO_ROOT/scripts/autobahn-requirements-py27.txt"
VIRTUALENV_PIN="virtualenv==20.21.1" # last virtualenv able to create 2.7 envs
STAMP="$MYRIAD_VENV/.myriad-requirements.sha256"

log() { echo "install-test-deps: $*"; }
die() {
    {
        echo
        echo "################################################################"
        echo "install-test-deps: ERROR: $*"
        echo "################################################################"
    } >&2
    exit 1
}

# --- Debian packages ---------------------------------------------------------------
# ensure_package COMMAND PACKAGE WHY: installs PACKAGE with apt-get unless
# COMMAND is already on PATH.
apt_updated=""
ensure_package() {
    local command="$1" package="$2" why="$3"
    if command -v "$command" >/dev/null 2>&1; then
        log "$package already installed: $(command -v "$command") (nothing to do)"
        return
    fi
    command -v apt-get >/dev/null 2>&1 ||
        die "$command is not on PATH and there is no apt-get to install it with;
$why CANNOT run. Install $package so '$command' is on PATH."
    log "installing $package with apt-get"
    # Root may call apt-get directly; anyone else goes through sudo.
    local sudo_if_needed=()
    [[ "$(id -u)" == 0 ]] || sudo_if_needed=(sudo)
    if [[ -z "$apt_updated" ]]; then
        "${sudo_if_needed[@]}" apt-get update ||
            die "apt-get update failed; $package cannot be installed"
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive "${sudo_if_needed[@]}" apt-get install -y "$package" ||
        die "apt-get install -y $package failed; $why CANNOT run"
    command -v "$command" >/dev/null 2>&1 ||
        die "apt-get installed $package but '$command' is still not on PATH"
    log "ok: $(command -v "$command")"
}

ensure_package chromium chromium "the status page test (a real browser)"
ensure_package openssl openssl "the token tests (they make their keys with openssl)"
# The Sentinel tests run Sentinels as `redis-server --sentinel`: the program
# Debian's redis-sentinel package starts (it adds only a service and a
# config file), so redis-server is all they need.
ensure_package redis-server redis-server "the Redis engine, graph store, Sentinel and cluster tests and the SDKs' shared scenarios (real redis-server processes)"
# ClusterSetup joins its nodes with `redis-cli --cluster create`; redis-server
# depends on redis-tools, named here so a lone redis-server is not enough.
ensure_package redis-cli redis-tools "the testkit's Redis Cluster test (redis-cli --cluster create)"
# Debian's python3 has no ensurepip, so no `python3 -m venv`, without
# python3-venv: scripts/sdk-python.sh makes the Python SDK's venv with it.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "python3 has no venv module and there is no apt-get; install python3-venv"
    sudo_if_needed=()
    [[ "$(id -u)" == 0 ]] || sudo_if_needed=(sudo)
    if [[ -z "$apt_updated" ]]; then
        "${sudo_if_needed[@]}" apt-get update || die "apt-get update failed; python3-venv cannot be installed"
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive "${sudo_if_needed[@]}" apt-get install -y python3-venv ||
        die "apt-get install -y python3-venv failed; the Python SDK's tests CANNOT run"
fi

# --- the Autobahn testsuite ----------------------------------------------------------
[[ -f "$REQUIREMENTS" ]] || die "missing $REQUIREMENTS"
req_hash="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"

wstest_works() {
    [[ -x "$MYRIAD_VENV/bin/wstest" ]] &&
        "$MYRIAD_VENV/bin/wstest" --help >/dev/null 2>&1
}

if wstest_works && [[ -f "$STAMP" && "$(cat "$STAMP")" == "$req_hash" ]]; then
    log "wstest already installed in $MYRIAD_VENV (nothing to do)"
    exit 0
fi

# --- find python2.7 -------------------------------------------------------------
find_python27() {
    local cand root
    if [[ -n "${MYRIAD_PYTHON27:-}" ]]; then
        echo "$MYRIAD_PYTHON27"
        return
    fi
    root=""
    if command -v pyenv >/dev/null 2>&1; then
        root="$(pyenv root 2>/dev/null || true)"
    fi
    for cand in \
        ${root:+"$root/versions/2.7.18/bin/python2.7"} \
        "${PYENV_ROOT:-$HOME/.pyenv}/versions/2.7.18/bin/python2.7" \
        /root/.pyenv/versions/2.7.18/bin/python2.7 \
        ${root:+$root/versions/2.7.*/bin/python2.7} \
        "$(command -v python2.7 2>/dev/null || true)"; do
        if [[ -n "$cand" && -x "$cand" ]]; then
            echo "$cand"
            return
        fi
    done
}

PY27="$(find_python27 || true)"
if [[ -z "$PY27" ]] || ! "$PY27" -c 'import sys; assert sys.version_info[:2] == (2, 7)' 2>/dev/null; then
    die "Python 2.7 not found (looked for \$MYRIAD_PYTHON27, \$(pyenv root)/versions/2.7.18/bin/python2.7, python2.7 on PATH).
The Autobahn testsuite is Python 2 code and cannot run without it; the
WebSocket conformance tests CANNOT run on this machine.
Install Python 2.7 (e.g. 'pyenv install 2.7.18') or set MYRIAD_PYTHON27."
fi
log "python2.7: $PY27 ($("$PY27" -c 'import sys; print(sys.version.split()[0])' 2>&1))"

# --- python3 venv holding virtualenv 20.21.1 ----------------------------------------
tools_ok() {
    [[ -x "$MYRIAD_TOOLS_VENV/bin/virtualenv" ]] &&
        [[ "$("$MYRIAD_TOOLS_VENV/bin/python" -c 'import virtualenv; print(virtualenv.__version__)' 2>/dev/null)" == "${VIRTUALENV_PIN#*==}" ]]
}

if ! tools_ok; then
    PY3="${MYRIAD_PYTHON3:-$(command -v python3 || true)}"
    if [[ -z "$PY3" ]]; then # no python3 on PATH: try pyenv's newest 3.x
        PY3="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*/bin/python3 2>/dev/null | sort -V | tail -n 1 || true)"
    fi
    [[ -n "$PY3" ]] || die "python3 not found (needed to create $MYRIAD_TOOLS_VENV); on Debian: apt-get install python3 python3-venv"
    log "creating tools venv $MYRIAD_TOOLS_VENV with $PY3 ($("$PY3" --version 2>&1))"
    rm -rf "$MYRIAD_TOOLS_VENV"
    "$PY3" -m venv "$MYRIAD_TOOLS_VENV" ||
        die "'$PY3 -m venv' failed (on Debian: apt-get install python3-venv)"
    "$MYRIAD_TOOLS_VENV/bin/python" -m pip install --quiet "$VIRTUALENV_PIN" ||
        die "pip install $VIRTUALENV_PIN failed"
    tools_ok || die "virtualenv in $MYRIAD_TOOLS_VENV is not ${VIRTUALENV_PIN#*==}"
else
    log "tools venv ok: $MYRIAD_TOOLS_VENV ($VIRTUALENV_PIN)"
fi

# --- python2.7 env with the testsuite ------------------------------------------------
if ! "$MYRIAD_VENV/bin/python" -c 'import sys; assert sys.version_info[:2] == (2, 7)' 2>/dev/null; then
    log "creating Python 2.7 env $MYRIAD_VENV"
    rm -rf "$MYRIAD_VENV"
    # --no-periodic-update: use the pip/setuptools wheels bundled with virtualenv
    # (pip 20.3.4 for 2.7), never fetch newer ones in the background.
    "$MYRIAD_TOOLS_VENV/bin/virtualenv" --quiet --no-periodic-update -p "$PY27" "$MYRIAD_VENV" ||
        die "virtualenv -p $PY27 $MYRIAD_VENV failed"
fi

log "pip install -r $(basename "$REQUIREMENTS") into $MYRIAD_VENV (30-60 s from scratch)"
rm -f "$STAMP"
# pip 20.3.4 under 2.7 prints a Python 2 deprecation banner; silence it.
PYTHONWARNINGS=ignore "$MYRIAD_VENV/bin/pip" install --quiet --no-python-version-warning \
    -r "$REQUIREMENTS" || die "pip install -r $REQUIREMENTS into $MYRIAD_VENV failed"

wstest_works || die "wstest installed but '$MYRIAD_VENV/bin/wstest --help' fails:
$("$MYRIAD_VENV/bin/wstest" --help 2>&1 | tail -n 20)"
echo "$req_hash" >"$STAMP"
log "ok: $MYRIAD_VENV/bin/wstest"
