#!/usr/bin/env bash
# Durable puts with the HA master on, next to the same master with HA off, in one run:
#
#   kvstore/bench/scripts/ha_bench.sh                       # 8 clients, 4 KiB values, 3 rounds
#   CLIENTS=16 ROUNDS=1 kvstore/bench/scripts/ha_bench.sh
#
# One etcd member (Debian's `etcd-server`) on loopback with a fresh data dir; one
# `moongate master --ha` on it and one plain `moongate master`, the same release binary.
# Each round runs `store-bench --storage self --clients CLIENTS --sizes SIZE --only
# put,batch_put` against the HA master, then against the plain one. Every `put` ends with a
# `put_end` the HA master commits to etcd before answering (group commit: concurrent
# put_ends share one transaction), so the HA figures are durable put_ends per second.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-8}
SIZE=${SIZE:-4K}
SEGMENT=${SEGMENT:-256M}   # each client's segment (the clients hold the store's memory)
TARGET=${CARGO_TARGET_DIR:-target}
if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build --release -q -p store-bench --bin store-bench -p moongate --bin moongate --features moongate/etcd
fi
SB=${STORE_BENCH_BIN:-$TARGET/release/store-bench}
MG=${MOONGATE_BIN:-$TARGET/release/moongate}
OUT=${OUT:-$(mktemp -d /tmp/ha_bench.XXXXXX)}
mkdir -p "$OUT"
command -v etcd >/dev/null || { echo "needs the etcd binary (apt-get install etcd-server)" >&2; exit 1; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
EC=$(free_port); EP=$(free_port); HA=$(free_port); PLAIN=$(free_port)
etcd --data-dir "$OUT/etcd" --listen-client-urls "http://127.0.0.1:$EC" --advertise-client-urls "http://127.0.0.1:$EC" \
  --listen-peer-urls "http://127.0.0.1:$EP" --initial-advertise-peer-urls "http://127.0.0.1:$EP" \
  --initial-cluster "default=http://127.0.0.1:$EP" > "$OUT/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$EC/health" >/dev/null 2>&1 && break; sleep 0.1; done
"$MG" master --host 127.0.0.1 --port "$HA" --ha --etcd-endpoints "http://127.0.0.1:$EC" \
  --advertise-url "http://127.0.0.1:$HA" --cluster-id bench > "$OUT/ha.log" 2>&1 &
pids+=($!)
"$MG" master --host 127.0.0.1 --port "$PLAIN" > "$OUT/plain.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q 'leading' "$OUT/ha.log" && break; sleep 0.1; done
grep -q 'leading' "$OUT/ha.log" || { echo "the HA master did not lead" >&2; cat "$OUT/ha.log" >&2; exit 1; }
for r in $(seq 1 "$ROUNDS"); do
  for which in ha plain; do
    port=$HA; [ "$which" = plain ] && port=$PLAIN
    "$SB" --master "http://127.0.0.1:$port" --storage self --clients "$CLIENTS" --sizes "$SIZE" \
      --only put,batch_put --rounds 1 --segment-size "$SEGMENT" > "$OUT/$which.$r.txt"
    awk -v w="$which" -v r="$r" '$1=="put"||$1=="batch_put" {print w, r, $1, $4}' "$OUT/$which.$r.txt"
  done
done | tee "$OUT/all.txt"
echo
echo "medians over $ROUNDS round(s), $CLIENTS clients, $SIZE values: values/s (durable put_ends/s with HA)"
for op in put batch_put; do
  ha=$(awk -v o=$op '$1=="ha" && $3==o {print $4}' "$OUT/all.txt" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  plain=$(awk -v o=$op '$1=="plain" && $3==o {print $4}' "$OUT/all.txt" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  printf '%-10s HA on %8s   HA off %8s   ratio %s\n' "$op" "$ha" "$plain" "$(awk -v a="$ha" -v b="$plain" 'BEGIN {printf "%.2f", a/b}')"
done
echo "etcd transactions and changes the leader committed:"
curl -fs "http://127.0.0.1:$HA/metrics" | grep -E '^moongate_master_ha_(commits|changes)_total' || true
echo "outputs in $OUT"
