#!/usr/bin/env bash
# Mooncake's own Python tests, from a Mooncake checkout, against Moongate's wheel and a real
# `moongate master`. Nothing is fetched or committed: point MOONCAKE_SRC at a checkout.
#
#   MOONCAKE_SRC=~/src/Mooncake PYTHON=target/py-venv/bin/python kvstore/wheel/tests/mooncake_own.sh
#
# Runs, each in its own interpreter:
#   - mooncake-store/tests/e2e/session_ranges_tcp_e2e.py: put and get sessions with ranged
#     multi-buffer calls, then at SGLang's layer-wise loader shape (64 pages x 61 layers x
#     16 KiB). It imports the built module as `store`: a one-line shim maps that name onto
#     `mooncake.store`.
set -euo pipefail
cd "$(dirname "$0")/../../.."
: "${MOONCAKE_SRC:?point MOONCAKE_SRC at a Mooncake checkout}"
PY=${PYTHON:-python3}
TGT=${CARGO_TARGET_DIR:-$PWD/target}
MOONGATE=${MOONGATE_BIN:-$TGT/debug/moongate}
work=$(mktemp -d /tmp/mooncake-own.XXXXXX)
trap 'kill "$master" 2>/dev/null || true; wait "$master" 2>/dev/null || true; rm -rf "$work"' EXIT
echo 'from mooncake.store import *  # Mooncake e2e tests import the built module as `store`' > "$work/store.py"

"$MOONGATE" master --host 127.0.0.1 --port 0 > "$work/master.log" 2>&1 &
master=$!
for _ in $(seq 1 200); do grep -q "moongate master listening" "$work/master.log" && break; sleep 0.05; done
addr=$(sed -n 's/.*moongate master listening addr=\([^ ]*\).*/\1/p' "$work/master.log")
[ -n "$addr" ] || { cat "$work/master.log"; exit 1; }

run() {
  echo "== $*"
  env PYTHONPATH="$work" MOONCAKE_MASTER="$addr" MOONCAKE_PROTOCOL=tcp \
    MOONCAKE_TE_META_DATA_SERVER=P2PHANDSHAKE "$@"
}
e2e="$MOONCAKE_SRC/mooncake-store/tests/e2e/session_ranges_tcp_e2e.py"
run "$PY" "$e2e"
E2E_NUM_KEYS=64 E2E_NUM_LAYERS=61 E2E_PAGE_SIZE=16384 run "$PY" "$e2e"
echo "== Mooncake's own tests passed"
