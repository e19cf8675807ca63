#!/usr/bin/env bash
# sandkeeperd's figures (docs/performance.md, "sandkeeperd"), with one command from the
# workspace's root:
#
#     server/perf/run.sh [ROUNDS] [CLIENTS] [SECONDS]     (defaults 200, 64, 30)
#
# Builds sandkeeperd, sandkeeper-init (beside it, so each sandbox gets one bubblewrap with the
# init as its PID 1, as a deployed server) and the example exec_direct in release; makes (or reuses) a venv with the SDK version the tests use under the target
# directory; then, each server on a fresh temporary root with a fresh API key and stopped
# after its phase, in this order:
#   1. sdk_perf.py latency ROUNDS against sandkeeperd: creates (fresh, warm), kills, then
#      commands.run("true"), each interleaved with a round of exec_direct --serve (the same
#      command through the library, and bare spawns on the host); the ratios of the p50s
#                                                                         (server.*)
#   2. exec_direct ROUNDS on its own: the same execs, and the library's acquire of a fresh
#      and of a shared session                                            (lib.*, host.*)
#   3. sdk_perf.py throughput CLIENTS SECONDS against sandkeeperd      (server.*)
#   4. sdk_perf.py replicas ROUNDS against two sandkeeperd --fleet on one root: creates,
#      kills, and commands.run("true") direct and forwarded           (server.fleet_*,
#                                                                      server.forwarded_*)
# CARGO_TARGET_DIR is honoured (default: target/).
set -euo pipefail

ROUNDS=${1:-200}
CLIENTS=${2:-64}
SECONDS_=${3:-30}
E2B_VERSION=2.63.0 # as server/tests/e2b_sdk.rs

cd "$(dirname "$0")/../.."
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
export CARGO_TARGET_DIR=$TARGET

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average: $(load)"
cargo build --release --quiet -p sandkeeperd -p sandkeeper-tokio \
    --bin sandkeeperd --bin sandkeeper-init --example exec_direct

VENV=$TARGET/tmp/e2b-venv
PY=$VENV/bin/python
CHECK="import importlib.metadata as m; assert m.version('e2b') == '$E2B_VERSION'"
if ! "$PY" -c "$CHECK" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "e2b==$E2B_VERSION"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/sandkeeperd-perf.XXXXXX")
KEY=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
SERVER_PID=
stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=
    fi
}
trap 'stop_server; rm -rf "$WORK"' EXIT

# Starts a server (argv), on a fresh root under $WORK, and points the SDK at it.
start_server() {
    local name=$1
    shift
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    SERVER_PID=$!
    for _ in $(seq 100); do
        grep -q '^sandkeeperd listening on ' "$WORK/$name.out" 2>/dev/null && break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    URL=$(sed -n 's/^sandkeeperd listening on //p' "$WORK/$name.out")
    if [ -z "$URL" ]; then
        echo "$name did not start:" >&2
        cat "$WORK/$name.err" >&2
        exit 1
    fi
    export E2B_API_URL=$URL E2B_SANDBOX_URL=$URL E2B_API_KEY=$KEY SERVER_PID
}
unset E2B_DEBUG E2B_DOMAIN
export EXEC_DIRECT=$TARGET/release/examples/exec_direct

# 64 clients hold up to 64 sandboxes at once: the team's bound raised above that. No request
# rate bound (the default).
PER_TEAM=$((CLIENTS * 2))
sandkeeperd() {
    start_server "$1" "$TARGET/release/sandkeeperd" --listen 127.0.0.1:0 --root "$WORK/root-$1" \
        --api-key "perf:$KEY" --sandboxes-per-team "$PER_TEAM"
}

echo "## latency: sandkeeperd"
sandkeeperd latency
EXEC_DIRECT_ROOT=$WORK/direct-1 FIGURE_PREFIX=server "$PY" server/perf/sdk_perf.py latency "$ROUNDS"
stop_server

echo "## the library directly, and a bare spawn, on their own"
"$EXEC_DIRECT" "$ROUNDS" "$WORK/direct-3"

echo "## throughput: sandkeeperd (load average before: $(load))"
sandkeeperd throughput
FIGURE_PREFIX=server "$PY" server/perf/sdk_perf.py throughput "$CLIENTS" "$SECONDS_"
stop_server

echo "## replicas: two sandkeeperd --fleet on one root (load average before: $(load))"
start_server replica-b "$TARGET/release/sandkeeperd" --listen 127.0.0.1:0 --root "$WORK/root-fleet" \
    --fleet --api-key "perf:$KEY" --sandboxes-per-team "$PER_TEAM"
B_PID=$SERVER_PID
export URL_B=$URL
start_server replica-a "$TARGET/release/sandkeeperd" --listen 127.0.0.1:0 --root "$WORK/root-fleet" \
    --fleet --api-key "perf:$KEY" --sandboxes-per-team "$PER_TEAM"
FIGURE_PREFIX=server "$PY" server/perf/sdk_perf.py replicas "$ROUNDS"
stop_server
SERVER_PID=$B_PID
stop_server

for f in "$WORK"/*.err; do
    if [ -s "$f" ]; then
        echo "# $(basename "$f" .err)'s stderr:"
        cat "$f"
    fi
done
echo "# load average at the end: $(load)"
