#!/usr/bin/env bash
# Runs the Autobahn|Testsuite fuzzingclient (WebSocket conformance, RFC 6455)
# against an echo endpoint and fails unless every case passes.
#
#   scripts/autobahn.sh [--server-cmd "CMD"] [--url ws://127.0.0.1:PORT/echo]
#                       [--cases '1.*,2.*'] [--agent NAME] [--outdir DIR]
#                       [--write-summary]
#
# Default: starts "$MYRIAD_BIN serve --listen 127.0.0.1:0 ... --echo-path /echo"
# (MYRIAD_BIN defaults to <repo>/target/release/myriad; this script builds
# nothing), reads the ws address from the server's startup JSON line
# {"event":"listening","ws":"HOST:PORT",...} and tests ws://HOST:PORT/echo.
# --server-cmd runs CMD instead (through bash, with $MYRIAD_VENV/bin at the end
# of PATH so `wstest -m echoserver ...` works); give --url for a server that
# prints no listening line (without --url, CMD's stdout is read for the
# listening line too). --url without --server-cmd still starts the default
# server and overrides the URL derived from its listening line.
#
# Cases: default 1.* .. 10.*, 12.* and 13.* (permessage-deflate). Pass rule:
# behavior OK / NON-STRICT / INFORMATIONAL and behaviorClose OK / INFORMATIONAL.
# The report goes to <repo>/autobahn-reports/fuzzingclient/ (index.html).
# --write-summary also writes docs/autobahn.md. The last line printed is
# `autobahn: N passed, M failed`. Exit 0 all passed, 1 otherwise.
#
# Needs scripts/install-test-deps.sh to have run. Environment:
#   MYRIAD_BIN              server binary (default <repo>/target/release/myriad)
#   MYRIAD_VENV             Python 2.7 env with wstest (default <repo>/.venv-autobahn)
#   MYRIAD_AUTOBAHN_TIMEOUT seconds allowed for the whole wstest run (default 900)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MYRIAD_VENV="${MYRIAD_VENV:-$REPO_ROOT/.venv-autobahn}"
MYRIAD_BIN="${MYRIAD_BIN:-$REPO_ROOT/target/release/myriad}"
TIMEOUT="${MYRIAD_AUTOBAHN_TIMEOUT:-900}"
STARTUP_WAIT=20
PY3="${PYTHON3:-$(command -v python3 || echo "${MYRIAD_TOOLS_VENV:-$REPO_ROOT/.venv-tools}/bin/python")}"
WSTEST="$MYRIAD_VENV/bin/wstest"
DEFAULT_CASES="1.*,2.*,3.*,4.*,5.*,6.*,7.*,9.*,10.*,12.*,13.*" # there is no section 8 (nor 11)

SERVER_CMD=""
URL=""
CASES="$DEFAULT_CASES"
AGENT="myriad"
OUTDIR="$REPO_ROOT/autobahn-reports/fuzzingclient"
WRITE_SUMMARY=0

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
    case "$1" in
    --server-cmd) SERVER_CMD="${2:?--server-cmd needs a value}"; shift 2 ;;
    --server-cmd=*) SERVER_CMD="${1#*=}"; shift ;;
    --url) URL="${2:?--url needs a value}"; shift 2 ;;
    --url=*) URL="${1#*=}"; shift ;;
    --cases) CASES="${2:?--cases needs a value}"; shift 2 ;;
    --cases=*) CASES="${1#*=}"; shift ;;
    --agent) AGENT="${2:?--agent needs a value}"; shift 2 ;;
    --agent=*) AGENT="${1#*=}"; shift ;;
    --outdir) OUTDIR="${2:?--outdir needs a value}"; shift 2 ;;
    --outdir=*) OUTDIR="${1#*=}"; shift ;;
    --write-summary) WRITE_SUMMARY=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "autobahn.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$OUTDIR" = /* ]] || OUTDIR="$PWD/$OUTDIR"

SERVER_PID=""
SERVER_OUT="$OUTDIR/server.stdout.log"
SERVER_ERR="$OUTDIR/server.stderr.log"

stop_server() {
    [[ -n "$SERVER_PID" ]] || return 0
    local pid="$SERVER_PID" i
    SERVER_PID=""
    # The server runs in its own session/process group (setsid): signal the group.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

server_logs() {
    echo "---- server stdout (last 30 lines): $SERVER_OUT"
    tail -n 30 "$SERVER_OUT" 2>/dev/null || true
    echo "---- server stderr (last 30 lines): $SERVER_ERR"
    tail -n 30 "$SERVER_ERR" 2>/dev/null || true
    echo "----"
}

# Setup failures: loud message, the whole run counts as one failed test.
die() {
    {
        echo
        echo "################################################################"
        echo "autobahn.sh: ERROR: $*"
        echo "################################################################"
    } >&2
    stop_server
    echo "autobahn: 0 passed, 1 failed"
    exit 1
}

command -v "$PY3" >/dev/null 2>&1 || die "python3 not found (needed for scripts/autobahn_eval.py)"
if [[ ! -x "$WSTEST" ]] || ! "$WSTEST" --help >/dev/null 2>&1; then
    die "wstest not usable at $WSTEST; run scripts/install-test-deps.sh first (set MYRIAD_VENV if it lives elsewhere)"
fi
WSTEST_VERSION="$("$WSTEST" --autobahnversion 2>/dev/null | tr -s ' \n' ' ' | sed 's/ $//' || true)"

# Start from an empty outdir so a stale index.json is never evaluated; refuse
# to wipe a non-empty directory that is not an earlier report.
if [[ -d "$OUTDIR" && -n "$(ls -A "$OUTDIR")" && ! -f "$OUTDIR/spec.json" ]]; then
    die "--outdir $OUTDIR is not empty and holds no earlier report (spec.json); not wiping it"
fi
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR"

# --- start the server ---------------------------------------------------------------
if [[ -n "$SERVER_CMD" ]]; then
    DISPLAY_CMD="$SERVER_CMD"
    PATH="$PATH:$MYRIAD_VENV/bin" setsid bash -c "exec $SERVER_CMD" </dev/null >"$SERVER_OUT" 2>"$SERVER_ERR" &
    SERVER_PID=$!
else
    [[ -x "$MYRIAD_BIN" ]] || die "server binary not found or not executable: $MYRIAD_BIN (build it, e.g. cargo build --release, or set MYRIAD_BIN)"
    SERVER_ARGS=(serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --echo-path /echo
        --workers 2 --max-message-size 16777216 --max-outbound-bytes 67108864)
    DISPLAY_CMD="${MYRIAD_BIN#"$REPO_ROOT"/} ${SERVER_ARGS[*]}"
    setsid "$MYRIAD_BIN" "${SERVER_ARGS[@]}" </dev/null >"$SERVER_OUT" 2>"$SERVER_ERR" &
    SERVER_PID=$!
fi
echo "autobahn: server: $DISPLAY_CMD (pid $SERVER_PID)"

# Wait for the {"event":"listening","ws":"HOST:PORT"} line (unless --url was given),
# then for the port to accept TCP connections.
listen_addr() {
    grep -m1 '"event"[[:space:]]*:[[:space:]]*"listening"' "$SERVER_OUT" 2>/dev/null |
        sed -n 's/.*"ws"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p'
}
port_open() { # URL
    "$PY3" - "$1" <<'EOF'
import socket, sys
from urllib.parse import urlsplit
u = urlsplit(sys.argv[1])
port = u.port or (443 if u.scheme == "wss" else 80)
try:
    socket.create_connection((u.hostname, port), timeout=1).close()
except OSError:
    sys.exit(1)
EOF
}

deadline=$((SECONDS + STARTUP_WAIT))
while :; do
    kill -0 "$SERVER_PID" 2>/dev/null || {
        wait "$SERVER_PID" && rc=0 || rc=$?
        SERVER_PID=""
        server_logs >&2
        die "server exited during startup (exit code $rc): $DISPLAY_CMD"
    }
    if [[ -z "$URL" ]]; then
        addr="$(listen_addr || true)"
        [[ -n "$addr" ]] && URL="ws://$addr/echo"
    fi
    if [[ -n "$URL" ]] && port_open "$URL"; then
        break
    fi
    if ((SECONDS >= deadline)); then
        server_logs >&2
        if [[ -z "$URL" ]]; then
            die "no {\"event\":\"listening\",\"ws\":...} line on the server's stdout within ${STARTUP_WAIT}s"
        fi
        die "server not accepting connections at $URL within ${STARTUP_WAIT}s"
    fi
    sleep 0.1
done
echo "autobahn: url: $URL"

# --- run the fuzzingclient ----------------------------------------------------------------
SPEC="$OUTDIR/spec.json"
"$PY3" - "$SPEC" "$OUTDIR" "$AGENT" "$URL" "$CASES" <<'EOF'
import json, sys
spec, outdir, agent, url, cases = sys.argv[1:]
with open(spec, "w") as f:
    json.dump({
        "outdir": outdir,
        "servers": [{"agent": agent, "url": url}],
        "cases": [c.strip() for c in cases.split(",") if c.strip()],
        "exclude-cases": [],
        "exclude-agent-cases": {},
    }, f, indent=2)
EOF
echo "autobahn: cases: $CASES; report: ${OUTDIR#"$REPO_ROOT"/}/index.html"

WSTEST_LOG="$OUTDIR/wstest.log"
start=$SECONDS
rc=0
(cd "$OUTDIR" && timeout --kill-after=10 "$TIMEOUT" "$WSTEST" -m fuzzingclient -s "$SPEC") \
    </dev/null >"$WSTEST_LOG" 2>&1 || rc=$?
echo "autobahn: wstest finished in $((SECONDS - start))s (exit code $rc)"

server_died=""
if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    wait "$SERVER_PID" && src=0 || src=$?
    SERVER_PID=""
    server_died="server exited during the run (exit code $src)"
fi
stop_server

if [[ $rc -ne 0 ]]; then
    echo "---- wstest log (last 40 lines): $WSTEST_LOG" >&2
    tail -n 40 "$WSTEST_LOG" >&2 || true
    [[ -n "$server_died" ]] && server_logs >&2
    [[ $rc -eq 124 || $rc -eq 137 ]] && die "wstest timed out after ${TIMEOUT}s (MYRIAD_AUTOBAHN_TIMEOUT)"
    die "wstest -m fuzzingclient failed (exit code $rc)"
fi
[[ -f "$OUTDIR/index.json" ]] || {
    tail -n 40 "$WSTEST_LOG" >&2 || true
    die "wstest wrote no $OUTDIR/index.json"
}

# --- evaluate ----------------------------------------------------------------------------
COUNTS="$OUTDIR/counts.txt"
EVAL_ARGS=("$OUTDIR/index.json" --agent "$AGENT" --counts-file "$COUNTS"
    --server-cmd "$DISPLAY_CMD" --url "$URL" --cases "$CASES" --wstest-version "$WSTEST_VERSION"
    --wstest-log "$WSTEST_LOG")
((WRITE_SUMMARY)) && EVAL_ARGS+=(--summary "$REPO_ROOT/docs/autobahn.md")
erc=0
"$PY3" "$REPO_ROOT/scripts/autobahn_eval.py" "${EVAL_ARGS[@]}" || erc=$?
[[ $erc -le 1 && -f "$COUNTS" ]] || die "could not evaluate $OUTDIR/index.json (autobahn_eval.py exit code $erc)"
read -r n_pass n_fail <"$COUNTS"

if [[ -n "$server_died" ]]; then
    server_logs >&2
    echo "autobahn: FAILED: $server_died" >&2
    ((n_fail > 0)) || n_fail=1
fi
echo "autobahn: report: $OUTDIR/index.html"
echo "autobahn: $n_pass passed, $n_fail failed"
[[ $n_fail -eq 0 ]]
