#!/usr/bin/env bash
# The SSD tier's read path through Mooncake's Python API, Mooncake's wheel and Moongate's
# side by side in one run (rounds alternate): ssd_bench.py puts 512 values of 1 MiB into a
# client with a 64 MiB segment and enable_ssd_offload, waits until the first 384 live on
# disk only, drops the page cache (root), and reads them back with get.
#   - Mooncake 0.3.13: its mooncake_master with --enable_offload --root_fs_dir (what its
#     docs ask for the client's FileStorage), the client's offload heartbeat every second;
#   - Moongate: `moongate master`, the wheel's write-through disk tier.
#
#   kvstore/wheel/bench/ssd_bench.sh            # builds the release wheel, 3 rounds
#   ROUNDS=1 SKIP_BUILD=1 kvstore/wheel/bench/ssd_bench.sh
#
# Needs the peers (../shared/bench/install_peers.sh) and root (the page cache).
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS=${ROUNDS:-3}
BASE_PORT=${BASE_PORT:-47000}
PEERS="${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/moongate-peers}"
MC_PY="$PEERS/venv/bin/python"
TGT=${CARGO_TARGET_DIR:-$PWD/target}
MG_VENV=${MG_VENV:-$TGT/py-bench-venv}
WORK=$(mktemp -d /tmp/ssd_bench.XXXXXX)
BENCH_PY=kvstore/wheel/bench/ssd_bench.py
export MC_TCP_BIND_ADDRESS=127.0.0.1
[ -x "$MC_PY" ] || { echo "Mooncake's wheel is not installed: run ../shared/bench/install_peers.sh" >&2; exit 1; }
if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build --release -q -p moongate --bin moongate
  [ -x "$MG_VENV/bin/python" ] || python3 -m venv "$MG_VENV"
  "$MG_VENV/bin/pip" install -q maturin numpy
  CARGO_TARGET_DIR="$TGT/wheel" "$MG_VENV/bin/pip" install -q --force-reinstall ./kvstore/wheel
fi
MOONGATE=${MOONGATE_BIN:-$TGT/release/moongate}
MC_DIR=$("$MC_PY" -c 'import mooncake,os; print(os.path.dirname(mooncake.__file__))')
pid=
cleanup() { [ -n "$pid" ] && { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }; rm -rf "$WORK"; }
trap cleanup EXIT
wait_port() { for _ in $(seq 1 200); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }
stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }

for r in $(seq 1 "$ROUNDS"); do
  rm -rf "$WORK"/*; mkdir -p -m 700 "$WORK/mc-ssd" "$WORK/mc-root" "$WORK/mg-ssd"
  "$MC_DIR/mooncake_master" --rpc_address=127.0.0.1 --rpc_port=$((BASE_PORT + 51)) \
    --enable_offload=true --root_fs_dir="$WORK/mc-root" --metrics_port=$((BASE_PORT + 3)) \
    > "$WORK/mc-master.log" 2>&1 &
  pid=$!; wait_port $((BASE_PORT + 51))
  mc=$(MOONCAKE_OFFLOAD_FILE_STORAGE_PATH="$WORK/mc-ssd" MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS=1 \
    "$MC_PY" "$BENCH_PY" 127.0.0.1:$((BASE_PORT + 51)) "$WORK/mc-ssd" 2>"$WORK/mc-client.log" | sed -n 's/^RESULT //p')
  [ -n "$mc" ] || { echo "round $r: Mooncake's run gave no result:" >&2; tail -20 "$WORK/mc-client.log" >&2; exit 1; }
  stop
  "$MOONGATE" master --host 127.0.0.1 --port $((BASE_PORT + 100)) > "$WORK/mg-master.log" 2>&1 &
  pid=$!; wait_port $((BASE_PORT + 100))
  mg=$("$MG_VENV/bin/python" "$BENCH_PY" 127.0.0.1:$((BASE_PORT + 100)) "$WORK/mg-ssd" 2>"$WORK/mg-client.log" | sed -n 's/^RESULT //p')
  [ -n "$mg" ] || { echo "round $r: Moongate's run gave no result:" >&2; tail -20 "$WORK/mg-client.log" >&2; exit 1; }
  stop
  echo "round $r mooncake $mc"
  echo "round $r moongate $mg"
  MC="$mc" MG="$mg" R="$r" python3 - <<'PY'
import json, os
a, b = json.loads(os.environ["MC"]), json.loads(os.environ["MG"])
print(f"round {os.environ['R']}: read from disk: Moongate {b['read_gbps']} GB/s "
      f"({b['read_ok']}/{b['cold']} right), Mooncake {a['read_gbps']} GB/s "
      f"({a['read_ok']}/{a['cold']} right): {b['read_gbps'] / a['read_gbps']:.2f}x; "
      f"puts accepted {b['accepted']} vs {a['accepted']} of {a['values']}, "
      f"in {b['put_s']} s vs {a['put_s']} s")
PY
done
