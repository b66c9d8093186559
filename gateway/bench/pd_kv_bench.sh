#!/usr/bin/env bash
# KV move benchmark: simulated PD with the llama-3-8b shape (128 KiB of KV per token) and
# 4,096-token prompts (512 MiB of KV per request) over TCP loopback, against the transfer
# engine's own figure (transfer-bench, 64 MiB writes over TCP), alternating in one run so
# machine drift hits both alike.
#
#   gateway/bench/pd_kv_bench.sh                          # build release, 3 rounds
#   ROUNDS=5 REQUESTS=8 gateway/bench/pd_kv_bench.sh
#   MOONGATE_BIN=... TRANSFER_BENCH_BIN=... gateway/bench/pd_kv_bench.sh   # prebuilt binaries
#
# Each round: transfer-bench (initiator against a target, 64 MiB writes, one batch at a
# time, TCP, DURATION s), then REQUESTS /generate requests of 4,096 token ids (4 output
# tokens) through `moongate serve --pd-disaggregation` in front of `moongate sim-worker
# --mode prefill` and `--mode decode` (`--kv-transport tcp`, separate processes). The PD
# figure is KV bytes over the seconds the prefill spent moving them (per room: first write
# submitted to last write acknowledged by the decode, i.e. the bytes are in the decode's
# memory), from the prefill's GET /sim/kv counters, as a delta over the round. The decode
# checks every page of every request (checksums and token headers). Nothing is pinned.
# Ports: BASE_PORT..BASE_PORT+10 (default 46400).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}; REQUESTS=${REQUESTS:-12}; DURATION=${DURATION:-5}; TOKENS=${TOKENS:-4096}
SHAPE=${SHAPE:-llama-3-8b}; POOL=${POOL:-1G}
BASE_PORT=${BASE_PORT:-46400}
GW=$BASE_PORT; PREFILL=$((BASE_PORT + 1)); DECODE=$((BASE_PORT + 2)); BOOT=$((BASE_PORT + 3))
TB_PORT=$((BASE_PORT + 4))
BIN=${MOONGATE_BIN:-${CARGO_TARGET_DIR:-target}/release/moongate}
TB=${TRANSFER_BENCH_BIN:-${CARGO_TARGET_DIR:-target}/release/transfer-bench}
if [ -z "${MOONGATE_BIN:-}" ] || [ -z "${TRANSFER_BENCH_BIN:-}" ]; then
  cargo build --release -q -p moongate --bin moongate
  cargo build --release -q -p transfer --bin transfer-bench
fi

TMP=$(mktemp -d); PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
start() { # start NAME CMD...
  local name=$1; shift
  "$@" > "$TMP/$name.log" 2>&1 &
  PIDS+=($!)
}
wait_ok() { # wait_ok URL
  for _ in $(seq 1 150); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "timeout waiting for $1" >&2; exit 1
}

start tb_target "$TB" --mode target --listen "127.0.0.1:$TB_PORT" --buffer-size 1G --protocol tcp
PD=(sim-worker --host 127.0.0.1 --kv-transport tcp --model-shape "$SHAPE" --kv-pool-size "$POOL")
start prefill "$BIN" "${PD[@]}" --mode prefill --port "$PREFILL" --bootstrap-port "$BOOT"
start decode "$BIN" "${PD[@]}" --mode decode --port "$DECODE"
wait_ok "http://127.0.0.1:$PREFILL/health"; wait_ok "http://127.0.0.1:$DECODE/health"
start gateway "$BIN" serve --host 127.0.0.1 --port "$GW" --log-level warn --pd-disaggregation \
  --prefill "http://127.0.0.1:$PREFILL" "$BOOT" --decode "http://127.0.0.1:$DECODE"
wait_ok "http://127.0.0.1:$GW/readiness"
python3 -c "import json; print(json.dumps({'input_ids': [256 + (i * 7919) % 31000 for i in range($TOKENS)], 'sampling_params': {'max_new_tokens': 4}}))" > "$TMP/req.json"
pd_request() {
  out=$(curl -s -o "$TMP/out.json" -w '%{http_code} %{time_total}' "http://127.0.0.1:$GW/generate" -H 'content-type: application/json' -d @"$TMP/req.json")
  [ "${out%% *}" = 200 ] || { echo "PD request failed ($out): $(cat "$TMP/out.json")" >&2; exit 1; }
  echo "${out##* }" >> "$TMP/request_seconds"
}
kv() { curl -s "http://127.0.0.1:$PREFILL/sim/kv"; }
# Warm-up: first touches of both pools and of the transfer-bench buffers.
pd_request; pd_request; : > "$TMP/request_seconds"
"$TB" --mode initiator --segment "127.0.0.1:$TB_PORT" --listen 127.0.0.1:0 --protocol tcp --op write \
  --block-size 64M --duration 1 --no-verify > /dev/null

echo "# $(date -Is) $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg); $SHAPE, $TOKENS-token prompts ($((TOKENS * 128 / 1024)) MiB of KV each for llama-3-8b), TCP loopback"
printf '%-6s %18s %18s %8s\n' round "transfer-bench GB/s" "PD KV move GB/s" ratio
RESULTS="$TMP/results"; : > "$RESULTS"
for r in $(seq 1 "$ROUNDS"); do
  tb=$("$TB" --mode initiator --segment "127.0.0.1:$TB_PORT" --listen 127.0.0.1:0 --protocol tcp \
    --op write --block-size 64M --batch-size 1 --threads 1 --duration "$DURATION" --no-verify --json \
    | grep '^{' | python3 -c 'import json,sys; print(json.load(sys.stdin)["GBps"])')
  before=$(kv)
  for _ in $(seq 1 "$REQUESTS"); do pd_request; done
  after=$(kv)
  pd=$(python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); print(round((b['bytes']-a['bytes'])/(b['seconds']-a['seconds'])/1e9, 3))" "$before" "$after")
  ratio=$(python3 -c "print(round($pd / $tb, 3))")
  printf '%-6s %18s %18s %8s\n' "$r" "$tb" "$pd" "$ratio"
  echo "$tb $pd $ratio" >> "$RESULTS"
done
python3 - "$RESULTS" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
tb, pd, ratio = (statistics.median(c) for c in zip(*rows))
print(f"median  transfer-bench {tb:.3f} GB/s   PD KV move {pd:.3f} GB/s   ratio {ratio:.2f}")
EOF
python3 -c 'import statistics,sys; t=[float(l) for l in open(sys.argv[1])]; print("whole PD request (gateway -> compute the KV, move it, check every page, 4 output tokens): median %.3f s over %d" % (statistics.median(t), len(t)))' "$TMP/request_seconds"
curl -s "http://127.0.0.1:$DECODE/sim/kv" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("decode: %d rooms received and checked, %.1f GiB, %d failures, %d/%d pages free" % (d["moves"], d["bytes"]/2**30, d["failures"], d["free_pages"], d["pool_pages"]))'
