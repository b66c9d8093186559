#!/usr/bin/env bash
# Device memory in the transfer engine, on a GPU machine: transfer-bench with both buffers in
# GPU memory, against the host figures of the same run (alternating, so machine drift hits
# both alike), and CUDA IPC against the device's own copy bandwidth.
#
#   tests/gpu_bench.sh                               # build release, 3 rounds
#   ROUNDS=1 DURATION=3 tests/gpu_bench.sh
#   TRANSFER_BENCH_BIN=... tests/gpu_bench.sh        # a prebuilt binary
#
# Each round, two processes on loopback, 64 MiB writes then reads, one batch of 4 at a time,
# 1 GiB buffers:
#   tcp  host -> host            the reference of staged TCP
#   tcp  cuda:0 -> cuda:0        staged on both sides (pinned buffers, copies overlapping I/O)
#   shm  host -> host            shared memory (a CPU copy), for reference
#   shm  cuda:0 -> cuda:0        CUDA IPC: device to device, no staging
#   memcpy cuda:0                one device copying into itself: the IPC reference
# Every run verifies the bytes it moved. Prints a table of median GB/s and the two ratios of
# the targets (staged TCP device/host >= 0.8, CUDA IPC / device copy >= 0.7).
# Ports: BASE_PORT.. (default 46600). GPU: DEVICE (default cuda:0).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DURATION=${DURATION:-5}; BASE_PORT=${BASE_PORT:-46600}
DEVICE=${DEVICE:-cuda:0}; BLOCK=${BLOCK:-64M}; BATCH=${BATCH:-4}; BUFFER=${BUFFER:-1G}
TB=${TRANSFER_BENCH_BIN:-${CARGO_TARGET_DIR:-target}/release/transfer-bench}
if [ -z "${TRANSFER_BENCH_BIN:-}" ]; then
  cargo build --release -q -p transfer --bin transfer-bench
fi

TMP=$(mktemp -d); PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

port=$BASE_PORT
# run CASE PROTOCOL LOCATION OP: a target and an initiator at LOCATION; appends "CASE GBps".
run() {
  local case=$1 proto=$2 loc=$3 op=$4
  port=$((port + 1))
  "$TB" --mode target --listen "127.0.0.1:$port" --buffer-size "$BUFFER" --protocol "$proto" \
    --location "$loc" > "$TMP/target.log" 2>&1 &
  local tpid=$!
  PIDS+=($tpid)
  for _ in $(seq 1 300); do grep -q "ready" "$TMP/target.log" && break; sleep 0.1; done
  grep -q "ready" "$TMP/target.log" || { echo "target did not start: $(cat "$TMP/target.log")" >&2; exit 1; }
  local seg
  seg=$(sed -n 's/.*segment \([^ ]*\) .*/\1/p' "$TMP/target.log" | head -1)
  "$TB" --mode initiator --segment "$seg" --protocol "$proto" --location "$loc" --op "$op" \
    --block-size "$BLOCK" --batch-size "$BATCH" --buffer-size "$BUFFER" --duration "$DURATION" \
    --json > "$TMP/init.log" 2>&1 || { echo "$case $op failed: $(cat "$TMP/init.log")" >&2; exit 1; }
  grep -q "bytes match" "$TMP/init.log" || { echo "$case $op not verified" >&2; exit 1; }
  kill "$tpid"; wait "$tpid" 2>/dev/null || true
  local gbps
  gbps=$(grep '^{"bench"' "$TMP/init.log" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GBps"])')
  echo "$case-$op $gbps" >> "$TMP/results"
  echo "  $case $op: $gbps GB/s ($(grep '^routes:' "$TMP/init.log"))"
}

for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS"
  for op in write read; do
    run tcp-host tcp cpu "$op"
    run tcp-device tcp "$DEVICE" "$op"
    run shm-host shm cpu "$op"
    run ipc-device shm "$DEVICE" "$op"
  done
  "$TB" --mode memcpy --location "$DEVICE" --block-size "$BLOCK" --duration "$DURATION" --json \
    > "$TMP/memcpy.log" 2>&1 || { echo "device memcpy failed: $(cat "$TMP/memcpy.log")" >&2; exit 1; }
  gbps=$(grep '^{"bench"' "$TMP/memcpy.log" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GBps"])')
  echo "device-copy-copy $gbps" >> "$TMP/results"
  echo "  device copy: $gbps GB/s"
done

python3 - "$TMP/results" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    case, gbps = line.split()
    runs.setdefault(case, []).append(float(gbps))
med = {k: statistics.median(v) for k, v in runs.items()}
print(f"\n{'case':<22}{'median GB/s':>12}   runs")
for k in sorted(med):
    print(f"{k:<22}{med[k]:>12.3f}   {', '.join(f'{x:.2f}' for x in runs[k])}")
for op in ("write", "read"):
    t = med[f"tcp-device-{op}"] / med[f"tcp-host-{op}"]
    i = med[f"ipc-device-{op}"] / med["device-copy-copy"]
    print(f"{op}: staged TCP device/host {t:.2f} (target >= 0.8); CUDA IPC / device copy {i:.2f} (target >= 0.7)")
EOF
