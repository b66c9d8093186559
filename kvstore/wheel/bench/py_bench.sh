#!/usr/bin/env bash
# The Python wheel's bench, side by side in one run, round after round (machine drift hits
# every column alike):
#   - py_bench.py on Mooncake's wheel (mooncake-transfer-engine-non-cuda, with its
#     mooncake_master as master and HTTP metadata server, and its mooncake_client as the
#     local store process of the standalone rows),
#   - the same py_bench.py on Moongate's wheel (release build, `moongate master`),
#   - the Rust figures of the same operations: store-bench (batch_put_from / batch_get_into,
#     64 values a call, the client holds the segment), the `kv` example (batch_exists of
#     128 keys) and transfer-bench (64 x 1 MiB batches, TCP).
# Everything over TCP on loopback. Prints a table (medians over rounds) and keeps the raw
# `RESULT` lines in $OUT/results.jsonl.
#
#   kvstore/wheel/bench/py_bench.sh            # builds release binaries and the wheel, 3 rounds
#   ROUNDS=1 SKIP_BUILD=1 kvstore/wheel/bench/py_bench.sh
#
# Needs the peers (../shared/bench/install_peers.sh: Mooncake's wheel in
# ~/.cache/moongate-peers/venv). Binaries: STORE_BENCH_BIN, TRANSFER_BENCH_BIN, MOONGATE_BIN,
# KV_BIN, else $CARGO_TARGET_DIR/release/... Ports: BASE_PORT (default 46000) + 51/80/3/100/52/152.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS=${ROUNDS:-3}
INNER=${INNER:-5}   # calls per pass and size, for every system (at most 24: 24 x 64 MiB fill a 2 GiB segment)
BASE_PORT=${BASE_PORT:-46000}
PEERS="${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/moongate-peers}"
MC_PY="$PEERS/venv/bin/python"
TGT=${CARGO_TARGET_DIR:-$PWD/target}
MG_VENV=${MG_VENV:-$TGT/py-bench-venv}
OUT=${OUT:-$(mktemp -d /tmp/py_bench.XXXXXX)}
mkdir -p "$OUT"
BENCH_PY=kvstore/wheel/bench/py_bench.py
MC_RPC=$((BASE_PORT + 51)); MC_META=$((BASE_PORT + 80)); MC_METRICS=$((BASE_PORT + 3)); MG_PORT=$((BASE_PORT + 100))
export MC_TCP_BIND_ADDRESS=127.0.0.1   # keep Mooncake's transfer engine on loopback
# numpy is imported for its buffers only: keep OpenBLAS's thread pool (which spins after start on
# every core) from taking CPU from the wheels measured, both alike.
export OPENBLAS_NUM_THREADS=1
[ -x "$MC_PY" ] || { echo "Mooncake's wheel is not installed: run ../shared/bench/install_peers.sh" >&2; exit 1; }

if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build --release -q -p store-bench --bin store-bench -p kvclient --example kv -p transfer --bin transfer-bench -p moongate --bin moongate
  [ -x "$MG_VENV/bin/python" ] || python3 -m venv "$MG_VENV"
  "$MG_VENV/bin/pip" install -q maturin numpy
  CARGO_TARGET_DIR="$TGT/wheel" "$MG_VENV/bin/pip" install -q --force-reinstall ./kvstore/wheel
fi
STORE_BENCH=${STORE_BENCH_BIN:-$TGT/release/store-bench}
TRANSFER_BENCH=${TRANSFER_BENCH_BIN:-$TGT/release/transfer-bench}
MOONGATE=${MOONGATE_BIN:-$TGT/release/moongate}
KV=${KV_BIN:-$TGT/release/examples/kv}
MG_PY="$MG_VENV/bin/python"
MC_DIR=$("$MC_PY" -c 'import mooncake,os; print(os.path.dirname(mooncake.__file__))')

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_port() { for _ in $(seq 1 200); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }

"$MC_DIR/mooncake_master" --rpc_address=127.0.0.1 --rpc_port=$MC_RPC \
  --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 \
  --http_metadata_server_port=$MC_META --metrics_host=127.0.0.1 --metrics_port=$MC_METRICS \
  > "$OUT/mooncake_master.log" 2>&1 &
pids+=($!)
"$MOONGATE" master --host 127.0.0.1 --port $MG_PORT > "$OUT/moongate_master.log" 2>&1 &
pids+=($!)
wait_port $MC_RPC; wait_port $MC_META; wait_port $MG_PORT

# Standalone storage: each system's local store process (its mooncake_client), for the
# `standalone` rows (a setup_dummy client beside it, then a full client; 8 dummy clients).
MC_CLIENT=$((BASE_PORT + 52)); MG_CLIENT=$((BASE_PORT + 152))
"$MC_DIR/mooncake_client" --master_server_address=127.0.0.1:$MC_RPC --host=127.0.0.1 \
  --port=$MC_CLIENT --global_segment_size=2GB --metadata_server="http://127.0.0.1:$MC_META/metadata" \
  --protocol=tcp > "$OUT/mooncake_client.log" 2>&1 &
pids+=($!)
MOONGATE_BIN="$MOONGATE" "$MG_VENV/bin/mooncake_client" --master_server_address=127.0.0.1:$MG_PORT \
  --host=127.0.0.1 --port=$MG_CLIENT --global_segment_size=2GB > "$OUT/moongate_client.log" 2>&1 &
pids+=($!)
wait_port $MC_CLIENT; wait_port $MG_CLIENT

# One pass: its RESULT lines, tagged with the round and the system; fails loudly without any.
pass() {
  local sys=$1; shift
  local got; got=$("$@" 2>>"$OUT/$sys.err" | grep -o '{.*}' | grep -E '"(GBps|median_ms)"' || true)
  if [ -z "$got" ]; then echo "$sys produced no result: $*" >&2; tail -20 "$OUT/$sys.err" >&2; exit 1; fi
  echo "$got" | sed "s/^/{\"round\":$r,\"system\":\"$sys\",\"r\":/; s/\$/}/" >> "$OUT/results.jsonl"
}

# One system's store pass. Each round takes the three in a rotated order, so that none always
# runs right after the same other one (a process that just exited leaves its 2 GiB to be
# freed, and the next one faults its own 2 GiB in).
store_pass() {
  case $1 in
    mooncake) pass mooncake-py "$MC_PY" $BENCH_PY store --metadata "http://127.0.0.1:$MC_META/metadata" --master "127.0.0.1:$MC_RPC" --rounds "$INNER" ;;
    moongate) pass moongate-py "$MG_PY" $BENCH_PY store --metadata P2PHANDSHAKE --master "127.0.0.1:$MG_PORT" --rounds "$INNER" ;;
    rust)
      pass rust "$STORE_BENCH" --master "http://127.0.0.1:$MG_PORT" --storage self --protocol tcp --segment-size 2G \
        --sizes 4K,1M --batch 64 --ops $((64 * INNER)) --rounds 1 --only batch_put_from,batch_get_into --json
      pass rust "$KV" --master "http://127.0.0.1:$MG_PORT" --segment-size 64M --listen 127.0.0.1:0 --protocol tcp bench-exists --calls 50 ;;
  esac
}
systems=(mooncake moongate rust)

for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r/$ROUNDS" >&2
  k=$(( (r - 1) % ${#systems[@]} ))
  for who in "${systems[@]:k}" "${systems[@]:0:k}"; do store_pass "$who"; done
  pass mooncake-py "$MC_PY" $BENCH_PY standalone --client 127.0.0.1:$MC_CLIENT \
    --metadata "http://127.0.0.1:$MC_META/metadata" --master "127.0.0.1:$MC_RPC" --rounds "$INNER"
  pass moongate-py "$MG_PY" $BENCH_PY standalone --client 127.0.0.1:$MG_CLIENT \
    --metadata P2PHANDSHAKE --master "127.0.0.1:$MG_PORT" --rounds "$INNER"
  pass mooncake-py "$MC_PY" $BENCH_PY standalone --clients 8 --client 127.0.0.1:$MC_CLIENT --rounds "$INNER"
  pass moongate-py "$MG_PY" $BENCH_PY standalone --clients 8 --client 127.0.0.1:$MG_CLIENT --rounds "$INNER"
  pass mooncake-py "$MC_PY" $BENCH_PY te --rounds "$INNER"
  pass moongate-py "$MG_PY" $BENCH_PY te --rounds "$INNER"
  "$TRANSFER_BENCH" --mode target --listen 127.0.0.1:0 --buffer-size 64M --protocol tcp > "$OUT/tb-target.log" 2>&1 &
  tb=$!; pids+=($tb)
  for _ in $(seq 1 200); do grep -q "ready: segment" "$OUT/tb-target.log" && break; sleep 0.05; done
  seg=$(sed -n 's/.*ready: segment \([^ ]*\) .*/\1/p' "$OUT/tb-target.log")
  pass rust "$TRANSFER_BENCH" --mode initiator --segment "$seg" --listen 127.0.0.1:0 --protocol tcp \
    --block-size 1M --batch-size 64 --buffer-size 64M --duration 3 --json
  kill $tb; wait $tb 2>/dev/null || true
done

python3 - "$OUT/results.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def key(r):
    x = r["r"]
    op = x.get("op")
    if x.get("bench") == "transfer-bench":
        return ("batch_transfer_sync_write", 64 << 20)
    if op == "batch_exists":
        op = "batch_is_exist"
    return (op, x.get("value_bytes") or x.get("bytes") or x.get("keys") or x.get("chunk_bytes"))
def value(r):
    x = r["r"]
    if "GBps" in x:
        return x["GBps"]
    return x["median_ms"]
table = {}
dropped = []
for r in rows:
    # A round whose values failed measured failures, not the store: left out, and said so.
    if r["r"].get("errors"):
        dropped.append(f"{r['system']} {key(r)[0]} {key(r)[1]} round {r['round']}: {r['r']['errors']} errors")
        continue
    table.setdefault(key(r), {}).setdefault(r["system"], []).append(value(r))
print(f"{'operation':<28}{'size':>10}{'Mooncake py':>14}{'Moongate py':>14}{'Rust':>10}{'py/Rust':>9}{'MG/MC':>8}")
for (op, size), by in sorted(table.items(), key=lambda kv: str(kv[0])):
    med = {s: statistics.median(v) for s, v in by.items()}
    mc, mg, rust = med.get("mooncake-py"), med.get("moongate-py"), med.get("rust")
    unit = "ms" if op == "batch_is_exist" else "GB/s"
    f = lambda v: "-" if v is None else f"{v:.3f}"
    if op == "batch_is_exist":
        ratio = f"{mg / rust:.2f}" if mg and rust else "-"      # time: lower is better
        mgmc = f"{mc / mg:.2f}" if mg and mc else "-"
    else:
        ratio = f"{mg / rust:.2f}" if mg and rust else "-"
        mgmc = f"{mg / mc:.2f}" if mg and mc else "-"
    size_s = f"{size >> 20} MiB" if size and size >= 1 << 20 else (f"{size >> 10} KiB" if size and size >= 1024 else f"{size} keys")
    print(f"{op + ' (' + unit + ')':<28}{size_s:>10}{f(mc):>14}{f(mg):>14}{f(rust):>10}{ratio:>9}{mgmc:>8}")
print(f"(medians over rounds; raw results: {sys.argv[1]}; batch_is_exist is ms per call, the"
      " ratios are Moongate/Rust time and Mooncake/Moongate time)")
for d in dropped:
    print(f"left out (values failed): {d}")
EOF
