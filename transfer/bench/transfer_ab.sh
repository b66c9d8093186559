#!/usr/bin/env bash
# Two builds of transfer-bench side by side in one run: does a change move any figure?
# Alternates the binaries case by case (and which goes first, round by round), so machine
# drift hits both alike, and prints the median GB/s of each and their ratio.
#
#   transfer/bench/transfer_ab.sh OLD_BINARY NEW_BINARY
#   ROUNDS=6 DURATION=3 transfer/bench/transfer_ab.sh /tmp/tb-old target/release/transfer-bench
#   CASES="tcp:write:1M:4 shm:read:64K:16" transfer/bench/transfer_ab.sh A B
#
# Build the old binary from a worktree with its own target directory, e.g.
#   git worktree add /tmp/old REV && (cd /tmp/old && CARGO_TARGET_DIR=/tmp/old-target \
#     cargo build --release -p transfer --bin transfer-bench)
# Each case is PROTOCOL:OP:BLOCK:BATCH, two processes on loopback, one submitting thread,
# 256 MiB buffers; every run verifies the bytes it moved. Ports: BASE_PORT.. (default 46800).
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,14p' "$0"; exit 2; }
OLD=$1; NEW=$2
ROUNDS=${ROUNDS:-3}; DURATION=${DURATION:-3}; BASE_PORT=${BASE_PORT:-46800}
CASES=${CASES:-"tcp:write:1M:4 tcp:read:1M:4 tcp:write:64K:16 shm:write:1M:4 shm:read:1M:4"}

TMP=$(mktemp -d); PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

port=$BASE_PORT
# run WHICH BINARY CASE: one target and one initiator; appends "CASE WHICH GBps".
run() {
  local which=$1 tb=$2 case=$3 proto op block batch
  IFS=: read -r proto op block batch <<< "$case"
  port=$((port + 1))
  "$tb" --mode target --listen "127.0.0.1:$port" --buffer-size 256M --protocol "$proto" \
    --threads 1 > "$TMP/target.log" 2>&1 &
  local tpid=$!
  PIDS+=($tpid)
  for _ in $(seq 1 300); do grep -q "ready" "$TMP/target.log" && break; sleep 0.1; done
  grep -q "ready" "$TMP/target.log" || { echo "target did not start: $(cat "$TMP/target.log")" >&2; exit 1; }
  "$tb" --mode initiator --segment "127.0.0.1:$port" --protocol "$proto" --op "$op" \
    --block-size "$block" --batch-size "$batch" --threads 1 --buffer-size 256M \
    --duration "$DURATION" --json > "$TMP/init.log" 2>&1 \
    || { echo "$which $case failed: $(cat "$TMP/init.log")" >&2; exit 1; }
  grep -q "bytes match" "$TMP/init.log" || { echo "$which $case not verified" >&2; exit 1; }
  kill -INT "$tpid"; wait "$tpid" 2>/dev/null || true
  local gbps
  gbps=$(grep '^{"bench"' "$TMP/init.log" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GBps"])')
  echo "$case $which $gbps" >> "$TMP/results"
  echo "  $case $which: $gbps GB/s"
}

for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS"
  for case in $CASES; do
    if [ $((r % 2)) = 1 ]; then
      run old "$OLD" "$case"; run new "$NEW" "$case"
    else
      run new "$NEW" "$case"; run old "$OLD" "$case"
    fi
  done
done

python3 - "$TMP/results" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    case, which, gbps = line.split()
    runs.setdefault(case, {}).setdefault(which, []).append(float(gbps))
print(f"\n{'case':<20}{'old GB/s':>10}{'new GB/s':>10}{'new/old':>9}")
for case, r in runs.items():
    o, n = statistics.median(r["old"]), statistics.median(r["new"])
    print(f"{case:<20}{o:>10.2f}{n:>10.2f}{n / o:>9.2f}")
EOF
