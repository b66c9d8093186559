#!/usr/bin/env bash
# Many store clients against several storage nodes, next to what the transfer engine alone
# moves with as many connections, in one run (taken in turn, round after round):
#
#   kvstore/bench/scripts/store_clients.sh                    # 8 clients, 2 nodes, 1 MiB values, 3 rounds
#   CLIENTS=4 NODES=1 SIZE=4M ROUNDS=1 kvstore/bench/scripts/store_clients.sh
#   SB_EXTRA='--rpc-busy-poll-us 0' kvstore/bench/scripts/store_clients.sh   # more store-bench flags
#   BATCH=16 kvstore/bench/scripts/store_clients.sh           # batch forms, 16 values a call (HiCache's shape)
#
# Store side: `store-bench --storage node --nodes NODES --clients CLIENTS` (put_from and
# get_into, zero-copy, one call at a time per client; every client its own engine and
# connections, as one SGLang TP rank each). With BATCH > 1, batch_put_from and
# batch_get_into of BATCH values a call instead: SGLang's HiCache writes and reads its
# pages that way, one call per batch of pages. Reference: `transfer-bench` with NODES
# targets and, for each, CLIENTS/NODES initiator threads writing (then reading) batches of
# BATCH SIZE blocks, one batch at a time, over CLIENTS x LANES connections: the same bytes
# per request and the same connections per node as the store (each of its clients opens
# LANES to every node, since the master spreads every client's values over all of them),
# with no master round trips. Both on PROTOCOL (default tcp: the
# figure a cluster of hosts sees; `auto` lets the store use shared memory, which
# transfer-bench calls `shm`). Both sides' memory is resident before timing
# (transfer-bench's target fills its buffer; the storage nodes run `--prefault start`): this
# compares data paths, not the kernel's first touch (on this project's VMs 8-13 s a GiB,
# which made cold nodes' 1 MiB puts stall up to 0.8 s).
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-8}
NODES=${NODES:-2}
SIZE=${SIZE:-1M}
BATCH=${BATCH:-1}
PROTOCOL=${PROTOCOL:-tcp}
DURATION=${DURATION:-3}
TARGET=${CARGO_TARGET_DIR:-target}
if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build --release -q -p store-bench --bin store-bench -p transfer --bin transfer-bench -p moongate --bin moongate
fi
SB=${STORE_BENCH_BIN:-$TARGET/release/store-bench}
TB=${TRANSFER_BENCH_BIN:-$TARGET/release/transfer-bench}
MG=${MOONGATE_BIN:-$TARGET/release/moongate}
OUT=${OUT:-$(mktemp -d /tmp/store_clients.XXXXXX)}
mkdir -p "$OUT"
TB_PROTO=$PROTOCOL; [ "$PROTOCOL" = auto ] && TB_PROTO=shm
PER_NODE=$(( (CLIENTS + NODES - 1) / NODES ))
LANES=${LANES:-2}   # TCP connections per peer of each client's engine (the engine's default)
SB_OPS=put_from,get_into
if [ "$BATCH" -gt 1 ]; then SB_OPS=batch_put_from,batch_get_into; fi
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# transfer-bench: NODES targets, PER_NODE initiator threads each, all at once; GB/s summed.
# Runs in a command substitution, a subshell the EXIT trap does not reach: a failure stops
# its targets itself.
te_pass() {
  local op=$1 total=0 segs=() ipids=()
  pids=()
  for n in $(seq 1 "$NODES"); do
    "$TB" --mode target --listen 127.0.0.1:0 --protocol "$TB_PROTO" --buffer-size 1G \
      > "$OUT/target$n.log" 2>&1 &
    pids+=($!)
  done
  for n in $(seq 1 "$NODES"); do
    # A target faults its 1 GiB buffer in before it is ready: seconds on a VM whose host
    # backs memory lazily (8-13 s a GiB on this project's machines).
    for _ in $(seq 1 600); do grep -q 'segment' "$OUT/target$n.log" 2>/dev/null && break; sleep 0.1; done
    grep -q 'segment' "$OUT/target$n.log" || { echo "transfer-bench target $n never got ready" >&2; cat "$OUT/target$n.log" >&2; cleanup; exit 1; }
    segs+=("$(grep -o 'segment [^ ]*' "$OUT/target$n.log" | head -1 | cut -d' ' -f2)")
  done
  for n in $(seq 1 "$NODES"); do
    "$TB" --mode initiator --segment "${segs[$((n - 1))]}" --protocol "$TB_PROTO" --op "$op" \
      --block-size "$SIZE" --batch-size "$BATCH" --threads "$PER_NODE" --lanes "$((CLIENTS * LANES))" --duration "$DURATION" \
      --buffer-size 256M --json > "$OUT/init$n.log" 2>&1 &
    ipids+=($!)
  done
  for p in "${ipids[@]}"; do wait "$p"; done
  for n in $(seq 1 "$NODES"); do
    g=$(grep '"bench":"transfer-bench"' "$OUT/init$n.log" | grep -o '"GBps":[0-9.]*' | cut -d: -f2)
    [ -n "$g" ] || { echo "transfer-bench produced no result" >&2; cat "$OUT/init$n.log" >&2; cleanup; exit 1; }
    total=$(python3 -c "print($total + $g)")
  done
  cleanup; pids=()
  echo "$total"
}

for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r/$ROUNDS" >&2
  w=$(te_pass write); rd=$(te_pass read)
  echo "{\"round\":$r,\"system\":\"transfer-bench\",\"put_from\":$w,\"get_into\":$rd}" >> "$OUT/results.jsonl"
  "$SB" --json --rounds 1 --storage node --nodes "$NODES" --clients "$CLIENTS" --protocol "$PROTOCOL" \
    --moongate "$MG" --sizes "$SIZE" --only "$SB_OPS" --batch "$BATCH" --segment-size 2G --prefault start ${SB_EXTRA:-} 2>>"$OUT/store.err" \
    | grep '^RESULT' | cut -d' ' -f2- \
    | sed "s/^/{\"round\":$r,\"system\":\"store\",\"r\":/; s/\$/}/" >> "$OUT/results.jsonl"
done

python3 - "$OUT/results.jsonl" "$CLIENTS" "$NODES" "$SIZE" "$PROTOCOL" "$BATCH" <<'EOF'
import json, statistics, sys
from collections import defaultdict
te, st, mn = defaultdict(list), defaultdict(list), defaultdict(list)
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d["system"] == "transfer-bench":
        for op in ("put_from", "get_into"):
            te[op].append(d[op])
    else:
        r = d["r"]
        ok = r["errors"] == 0 and r["bad"] == 0
        op = r["op"].removeprefix("batch_")
        st[op].append(r["GBps"] if ok else 0.0)
        mn[op].append(r["client_min_GBps"])
batch = int(sys.argv[6])
shape = "one value a call" if batch == 1 else f"batches of {batch} values"
print(f"{sys.argv[2]} clients, {sys.argv[3]} nodes, {sys.argv[4]} values, {shape}, protocol {sys.argv[5]}; medians over rounds, GB/s")
print(f"{'op':<16}{'transfer-bench':>15}{'store (all)':>13}{'slowest client':>16}{'ratio':>7}")
for op in ("put_from", "get_into"):
    a, b, c = statistics.median(te[op]), statistics.median(st[op]), statistics.median(mn[op])
    name = op if batch == 1 else f"batch_{op}"
    print(f"{name:<16}{a:>15.2f}{b:>13.2f}{c:>16.3f}{b / a:>7.2f}")
EOF
echo "raw results: $OUT/results.jsonl" >&2
