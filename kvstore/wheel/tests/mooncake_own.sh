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
#   - mooncake-wheel/tests/test_offload_on_eviction.py and test_promotion_on_hit.py: the
#     SSD offload (`setup(..., enable_ssd_offload=True)`, MOONCAKE_OFFLOAD_FILE_STORAGE_PATH)
#     against a second master started as their docs ask (offload on evict, 5 s leases).
#     PROMOTION_WAIT_SECONDS (default 3 here; Mooncake's 25 waits out its 10 s heartbeats)
#     is how long the promotion test waits twice.
set -euo pipefail
cd "$(dirname "$0")/../../.."
: "${MOONCAKE_SRC:?point MOONCAKE_SRC at a Mooncake checkout}"
PY=${PYTHON:-python3}
# Absolute: the offload tests run from Mooncake's test directory.
[[ "$PY" == */* ]] && PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
TGT=${CARGO_TARGET_DIR:-$PWD/target}
MOONGATE=${MOONGATE_BIN:-$TGT/debug/moongate}
work=$(mktemp -d /tmp/mooncake-own.XXXXXX)
trap 'kill "$master" "${offload_master:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
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

"$MOONGATE" master --host 127.0.0.1 --port 0 --master-lease-ttl-ms 5000 \
  --master-disk-offload-on-evict true > "$work/offload-master.log" 2>&1 &
offload_master=$!
for _ in $(seq 1 200); do grep -q "moongate master listening" "$work/offload-master.log" && break; sleep 0.05; done
offload_addr=$(sed -n 's/.*moongate master listening addr=\([^ ]*\).*/\1/p' "$work/offload-master.log")
[ -n "$offload_addr" ] || { cat "$work/offload-master.log"; exit 1; }
mkdir -m 700 "$work/ssd"
for t in test_offload_on_eviction.py test_promotion_on_hit.py; do
  echo "== $t"
  (cd "$MOONCAKE_SRC/mooncake-wheel/tests" && env MASTER_SERVER="$offload_addr" \
    MC_METADATA_SERVER=P2PHANDSHAKE LOCAL_HOSTNAME=127.0.0.1 PROTOCOL=tcp \
    MOONCAKE_OFFLOAD_FILE_STORAGE_PATH="$work/ssd" \
    PROMOTION_WAIT_SECONDS="${PROMOTION_WAIT_SECONDS:-3}" "$PY" -m pytest -q "$t")
done
echo "== Mooncake's own tests passed"
