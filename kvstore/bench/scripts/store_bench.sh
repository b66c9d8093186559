#!/usr/bin/env bash
# Store benchmark, side by side with Mooncake's store in one run: Mooncake's
# MooncakeDistributedStore (../shared/bench/mooncake/store_bench.py, protocol tcp) and
# Moongate's store-bench, taken in turn, round after round, so machine drift hits both alike.
#
#   kvstore/bench/scripts/store_bench.sh                 # build release, 3 rounds
#   ROUNDS=1 kvstore/bench/scripts/store_bench.sh        # quick look
#   MOONGATE_PROTOCOL=tcp kvstore/bench/scripts/store_bench.sh   # force Moongate onto TCP too (default: auto = shared memory on one host)
#   MG_EXTRA=--prefault kvstore/bench/scripts/store_bench.sh     # more store-bench flags (here: segment faulted in at start)
#
# Modes, for both systems: "single-client" (the bench client holds the segment: every byte
# stays in its process) and "remote-node" (another process holds the segment: Mooncake's
# holder process, Moongate's `moongate store`). Values: 4 KiB, 1 MiB, 16 MiB; ops put, get,
# put_from, get_into (zero-copy on registered buffers); Moongate also runs the batch forms
# (64 values per call; Mooncake's harness has none). Each Moongate pass is cold like each
# Mooncake pass (fresh segment process, first touch of its memory included).
# Needs the peers installed (../shared/bench/install_peers.sh). Ports: 45051/45080/45003
# (Mooncake's master), 45100 (Moongate's master); BASE_PORT moves them all.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS=${ROUNDS:-3}
BASE_PORT=${BASE_PORT:-45000}
PROTO=${MOONGATE_PROTOCOL:-auto}
PEERS="${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/moongate-peers}"
PY="$PEERS/venv/bin/python"
# The shared peer harness sits next to the main checkout (../shared) or next to the worktrees.
for d in ../shared ../../shared; do
  [ -f "$d/bench/mooncake/store_bench.py" ] && HARNESS=${HARNESS:-$d/bench/mooncake/store_bench.py}
done
[ -n "${HARNESS:-}" ] || { echo "Mooncake's store_bench.py not found (set HARNESS)" >&2; exit 1; }
OUT=${OUT:-$(mktemp -d /tmp/store_bench.XXXXXX)}
mkdir -p "$OUT"
MC_RPC=$((BASE_PORT + 51)); MC_META=$((BASE_PORT + 80)); MC_METRICS=$((BASE_PORT + 3)); MG_MASTER=$((BASE_PORT + 100))
export MC_TCP_BIND_ADDRESS=127.0.0.1   # keep Mooncake's transfer engine on loopback

if [ -z "${STORE_BENCH_BIN:-}" ]; then
  cargo build --release -q -p store-bench --bin store-bench
  cargo build --release -q -p moongate --bin moongate
fi
TARGET=${CARGO_TARGET_DIR:-target}
BENCH=${STORE_BENCH_BIN:-$TARGET/release/store-bench}
MOONGATE=${MOONGATE_BIN:-$TARGET/release/moongate}
MC_DIR=$("$PY" -c 'import mooncake,os; print(os.path.dirname(mooncake.__file__))')

"$MC_DIR/mooncake_master" --rpc_address=127.0.0.1 --rpc_port=$MC_RPC \
  --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 \
  --http_metadata_server_port=$MC_META --metrics_host=127.0.0.1 --metrics_port=$MC_METRICS \
  > "$OUT/mooncake_master.log" 2>&1 &
MC_PID=$!
# Stop it by pid and wait, so a next run finds its ports free.
trap 'kill $MC_PID 2>/dev/null; wait $MC_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$MC_RPC) 2>/dev/null && break; sleep 0.1; done

# One pass; fails loudly (with the log) when it produced no result.
run_pass() {
  local sys=$1 log=$2; shift 2
  local got; got=$("$@" 2>>"$log" | grep '^RESULT' | cut -d' ' -f2- || true)
  if [ -z "$got" ]; then echo "$sys pass produced no result: $*" >&2; tail -20 "$log" >&2; exit 1; fi
  echo "$got" | sed "s/^/{\"round\":$r,\"system\":\"$sys\",\"r\":/; s/\$/}/" >> "$OUT/results.jsonl"
}
mc() { run_pass mooncake "$OUT/mooncake.err" "$PY" "$HARNESS" --metadata "http://127.0.0.1:$MC_META/metadata" \
         --master "127.0.0.1:$MC_RPC" "$@"; }
mg() { run_pass moongate "$OUT/moongate.err" "$BENCH" --json --rounds 1 --listen 127.0.0.1:$MG_MASTER \
         --protocol "$PROTO" --moongate "$MOONGATE" ${MG_EXTRA:-} "$@"; }

for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r/$ROUNDS" >&2
  mc
  mg --storage self
  mc --holder
  mg --storage node
done

"$PY" - "$OUT/results.jsonl" "protocol $PROTO ${MG_EXTRA:-}" <<'EOF'
import json, statistics, sys
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    d = json.loads(line); r = d["r"]
    rate = r.get("values_per_s", r.get("ops_per_s"))
    ok = r.get("errors", 0) == 0 and r.get("bad", 0) == 0 and r.get("verify_ok", True)
    rows[(r["mode"], r["value_bytes"], r["op"], d["system"])].append((rate, ok))
def med(k):
    v = rows.get(k)
    return (statistics.median(x for x, _ in v), all(o for _, o in v)) if v else (None, True)
name = {4096: "4K", 1 << 20: "1M", 16 << 20: "16M"}
print(f"Moongate: {sys.argv[2]} (Mooncake: tcp). Medians over rounds; values/s and GB/s (1e9 B/s).")
print(f"{'mode':<14}{'size':>5} {'op':<15}{'Mooncake v/s':>13}{'GB/s':>7}{'Moongate v/s':>14}{'GB/s':>7}{'x':>7}")
for mode in ("single-client", "remote-node"):
    for size in (4096, 1 << 20, 16 << 20):
        for op in ("put", "get", "put_from", "get_into", "batch_put", "batch_get", "batch_put_from", "batch_get_into"):
            mc_mode = "remote-holder" if mode == "remote-node" else mode
            a, aok = med((mc_mode, size, op, "mooncake"))
            b, bok = med((mode, size, op, "moongate"))
            if a is None and b is None:
                continue
            fa = f"{a:>13.0f}{a * size / 1e9:>7.2f}" if a else f"{'-':>13}{'-':>7}"
            fb = f"{b:>14.0f}{b * size / 1e9:>7.2f}" if b else f"{'-':>14}{'-':>7}"
            x = f"{b / a:>7.2f}" if a and b else f"{'':>7}"
            bad = "" if aok and bok else "  VERIFY FAILED"
            print(f"{mode:<14}{name[size]:>5} {op:<15}{fa}{fb}{x}{bad}")
EOF
echo "raw results: $OUT/results.jsonl" >&2
