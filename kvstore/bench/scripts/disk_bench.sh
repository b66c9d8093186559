#!/usr/bin/env bash
# The disk tier against the device it sits on, side by side in one run: fio (direct I/O,
# 1 MiB blocks, queue depth 16, libaio) writes then reads a file on the file system of DIR,
# then disk-bench writes VALUES values of 1 MiB through the tier (written through and
# synced) and reads the ones that live only on disk back into a reader's memory, the page
# cache dropped first. Rounds alternate fio and disk-bench so drift hits both; each line
# ends with the ratio to fio's figure of the same round.
#
#   kvstore/bench/scripts/disk_bench.sh                      # DIR=/tmp/moongate-disk-bench, 3 rounds
#   DIR=/nvme/x ROUNDS=1 kvstore/bench/scripts/disk_bench.sh
#
# Needs fio (Debian package) and root (to drop the page cache).
set -euo pipefail
cd "$(dirname "$0")/../../.."
DIR=${DIR:-/tmp/moongate-disk-bench}
ROUNDS=${ROUNDS:-3}
VALUES=${VALUES:-1024}
TGT=${CARGO_TARGET_DIR:-$PWD/target}
command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)"; exit 1; }
cargo build -q --release -p store-bench --bin disk-bench
mkdir -p "$DIR"
fio_rate() { # rw -> GB/s
  local field=$([ "$1" = write ] && echo 48 || echo 7)
  fio --name=mg --filename="$DIR/fio.dat" --size=1G --bs=1M --iodepth=16 --direct=1 \
    --ioengine=libaio --rw="$1" --output-format=terse | awk -F';' -v f="$field" '{printf "%.2f", $f * 1024 / 1e9}'
}
for r in $(seq 1 "$ROUNDS"); do
  fw=$(fio_rate write); fr=$(fio_rate read); rm -f "$DIR/fio.dat"
  out=$("$TGT/release/disk-bench" --dir "$DIR/tier" --values "$VALUES" --drop-caches 2>/dev/null)
  w=$(echo "$out" | sed -n 's/^write: .*: \([0-9.]*\) GB\/s.*/\1/p')
  rd=$(echo "$out" | sed -n 's/^read: .*: \([0-9.]*\) GB\/s.*/\1/p')
  awk -v r="$r" -v fw="$fw" -v w="$w" -v fr="$fr" -v rd="$rd" 'BEGIN {
    printf "round %s: write fio %s GB/s, tier %s GB/s (%.2fx); read fio %s GB/s, tier %s GB/s (%.2fx)\n",
      r, fw, w, w / fw, fr, rd, rd / fr }'
done
rm -rf "$DIR"
