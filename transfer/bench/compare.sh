#!/usr/bin/env bash
# Side-by-side loopback benchmark of the transfer engine against its references, in one run:
# iperf3 single-stream TCP, single-thread memcpy, and transfer-bench over TCP and shared
# memory. Every figure is taken ROUNDS times, interleaved (so machine noise hits all alike),
# and the median is reported with the ratio the issue's targets use.
#
#   cargo build --release -p transfer --bin transfer-bench
#   transfer/bench/compare.sh                  # ROUNDS=3 DUR=3 PORT=41000
#   OLD_BENCH=/path/to/old/transfer-bench transfer/bench/compare.sh
#       A/B against an earlier build instead: every case run with both binaries (each
#       talking to a target of its own build), interleaved, and the new/old ratios printed
#       (CASES default: tcp64w tcp64r tcp4kw tcp4kr shm64w shm64r; also the first
#       open_segment time, connect + handshake + descriptor, from the initiator's log).
#
# Env: BENCH (binary), ROUNDS, DUR (seconds per measurement), PORT (uses PORT..PORT+2),
#      EXTRA (more initiator flags, e.g. "--lanes 4 --slice-size 4M"),
#      CASES (subset of: iperf memcpy tcp64w tcp64w1 tcp64r tcp128kw tcp128kr tcp4kw tcp4kr
#      shm64w shm64w1 shm64r shm64r1 mooncake64w), MC_PY / MC_TE_BENCH (Mooncake's te_bench.py, run when present).
# tcp64w cycles 64 MiB blocks through a 1 GiB buffer (Mooncake transfer_engine_bench style);
# tcp64w1 / shm64w1 / shm64r1 reuse one 64 MiB block (te_bench.py style, and like the memcpy
# reference, which copies the same 64 MiB each time). "cpu" is CPU ms per GB moved, both
# processes together (iperf3: client + server).
set -euo pipefail
cd "$(dirname "$0")/../.."
BENCH=${BENCH:-${CARGO_TARGET_DIR:-target}/release/transfer-bench}
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-3}
PORT=${PORT:-41000}
if [[ -n ${OLD_BENCH:-} ]]; then
  CASES=${CASES:-"tcp64w tcp64r tcp4kw tcp4kr shm64w shm64r"}
else
  CASES=${CASES:-"iperf memcpy tcp64w tcp64w1 tcp64r tcp128kw tcp128kr tcp4kw tcp4kr shm64w shm64w1 shm64r shm64r1 mooncake64w"}
fi
MC_PY=${MC_PY:-$HOME/.cache/moongate-peers/venv/bin/python}
MC_TE_BENCH=${MC_TE_BENCH:-/work/shared/bench/mooncake/te_bench.py}
[[ -x $MC_PY && -f $MC_TE_BENCH ]] || CASES=${CASES//mooncake64w/}
TMP=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

declare -A tpid
start_target() { # protocol port [binary key]
  local bin=${3:-$BENCH} key=${4:-}
  "$bin" --mode target --listen "127.0.0.1:$2" --buffer-size 1G --protocol "$1" > "$TMP/target-$key$1.log" 2>&1 &
  pids+=($!)
  tpid[$key$1]=$!
  for _ in $(seq 1 100); do grep -q ready "$TMP/target-$key$1.log" && return; sleep 0.1; done
  echo "target $key$1 did not start" >&2; cat "$TMP/target-$key$1.log" >&2; exit 1
}
start_target tcp "$PORT"
start_target shm "$((PORT + 2))"
if [[ -n ${OLD_BENCH:-} ]]; then
  start_target tcp "$((PORT + 3))" "$OLD_BENCH" old-
  start_target shm "$((PORT + 4))" "$OLD_BENCH" old-
else
  iperf3 -s -B 127.0.0.1 -p "$((PORT + 1))" > /dev/null 2>&1 &
  pids+=($!)
fi
sleep 0.5
# Which build a run uses: "" (BENCH) or "old-" (OLD_BENCH, its targets on PORT+3/PORT+4).
KEY=

median() { tr ';' '\n' | grep -v '^$' | awk -v f="$1" '{print $f}' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { python3 -c "a,b=float('$1' or 0),float('$2' or 0); print(f'{a/b:.2f}' if b else 'n/a')"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)

# one case -> "GB/s req/s cpu-ms-per-GB" (CPU of both processes: initiator and target)
run() {
  local bin=$BENCH tport=$PORT sport=$((PORT + 2))
  [[ $KEY == old- ]] && { bin=$OLD_BENCH; tport=$((PORT + 3)); sport=$((PORT + 4)); }
  local seg=127.0.0.1:$tport proto=tcp
  case $1 in
    iperf)
      iperf3 -c 127.0.0.1 -p "$((PORT + 1))" -t "$DUR" -J | python3 -c '
import json,sys; d=json.load(sys.stdin)["end"]
gb = d["sum_received"]["bytes"] / 1e9; secs = d["sum_received"]["seconds"]
cpu = (d["cpu_utilization_percent"]["host_total"] + d["cpu_utilization_percent"]["remote_total"]) / 100 * secs
print(round(gb / secs, 3), 0, round(cpu * 1e3 / gb))'
      return ;;
    mooncake64w)
      MC_TCP_BIND_ADDRESS=127.0.0.1 "$MC_PY" "$MC_TE_BENCH" --metadata P2PHANDSHAKE --sizes 64M --reps 30 2>/dev/null |
        grep '^RESULT' | cut -d' ' -f2- | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["median_GBps"], 0, 0)'
      return ;;
    memcpy) set -- memcpy --mode memcpy --block-size 64M ;;
    tcp64w) set -- x --op write --block-size 64M --batch-size 1 ;;
    tcp64w1) set -- x --op write --block-size 64M --batch-size 1 --buffer-size 64M ;;
    tcp64r) set -- x --op read --block-size 64M --batch-size 1 ;;
    tcp128kw) set -- x --op write --block-size 128K --batch-size 32 ;;
    tcp128kr) set -- x --op read --block-size 128K --batch-size 32 ;;
    tcp4kw) set -- x --op write --block-size 4K --batch-size 64 --buffer-size 64M ;;
    tcp4kr) set -- x --op read --block-size 4K --batch-size 64 --buffer-size 64M ;;
    shm64w) set -- x --op write --block-size 64M --batch-size 1; seg=127.0.0.1:$sport; proto=shm ;;
    shm64r) set -- x --op read --block-size 64M --batch-size 1; seg=127.0.0.1:$sport; proto=shm ;;
    shm64w1) set -- x --op write --block-size 64M --buffer-size 64M; seg=127.0.0.1:$sport; proto=shm ;;
    shm64r1) set -- x --op read --block-size 64M --buffer-size 64M; seg=127.0.0.1:$sport; proto=shm ;;
  esac
  shift
  local args=("$@")
  [[ " ${args[*]} " == *" --mode memcpy "* ]] || args=(--mode initiator --segment "$seg" --listen 127.0.0.1:0 --protocol "$proto" --threads 1 "${args[@]}")
  [[ " ${args[*]} " == *" --mode initiator "* ]] && args+=(${EXTRA:-})
  local t=${tpid[$KEY$proto]} t0 t1 out
  t0=$(cpu_ticks "$t")
  out=$("$bin" "${args[@]}" --duration "$DUR" --json) || { echo "transfer-bench failed: $out" >&2; exit 1; }
  OPEN_MS=$(grep '^open_segment_ms: ' <<< "$out" | cut -d' ' -f2 || true)
  t1=$(cpu_ticks "$t")
  if [[ " ${args[*]} " == *" --mode initiator "* ]] && ! grep -q '^verified: ' <<< "$out"; then
    echo "transfer-bench did not verify its bytes: $out" >&2; exit 1
  fi
  out=$(grep '^{' <<< "$out")
  [[ " ${args[*]} " == *" --mode memcpy "* ]] && t1=$t0
  echo "$out" | python3 -c "
import json,sys; d=json.load(sys.stdin); gb = d['GBps'] * d['seconds']
cpu = d.get('cpu_s', 0) + ($t1 - $t0) / $TICK
print(d['GBps'], d['req_per_s'], round(cpu * 1e3 / gb) if gb and cpu else 0, '$OPEN_MS')"
}

if [[ -n ${OLD_BENCH:-} ]]; then
  declare -A ab opens
  for r in $(seq 1 "$ROUNDS"); do
    for c in $CASES; do
      for KEY in "" old-; do
        v=$(run "$c")
        ab[$KEY$c]+="$v;"
        echo "round $r ${KEY:-new-}$c: $v" >&2
      done
    done
  done
  printf '\n%-10s %12s %12s %12s %12s %8s   (medians of %s rounds of %s s; ratio = median of per-round new/old; load avg %s)\n' case new-GB/s old-GB/s new-req/s old-req/s ratio "$ROUNDS" "$DUR" "$(cut -d' ' -f1-3 /proc/loadavg)"
  allnew=""; allold=""
  for c in $CASES; do
    n=${ab[$c]} o=${ab[old-$c]}
    ng=$(echo "$n" | median 1) og=$(echo "$o" | median 1) nr=$(echo "$n" | median 2) or=$(echo "$o" | median 2)
    # The median of the per-round ratios (each new run paired with the old run right after
    # it): steadier than a ratio of medians on a machine whose load drifts.
    f=1; case $c in tcp4k*) f=2 ;; esac
    rat=$(python3 -c "
import statistics,sys
n=[float(x.split()[$f-1]) for x in '$n'.split(';') if x.strip()]
o=[float(x.split()[$f-1]) for x in '$o'.split(';') if x.strip()]
print(f'{statistics.median(a/b for a,b in zip(n,o) if b):.2f}')")
    printf '%-10s %12s %12s %12s %12s %8s\n' "$c" "$ng" "$og" "$nr" "$or" "$rat"
    allnew+="$n"; allold+="$o"
  done
  echo
  echo "first open_segment (connect + handshake + descriptor), median ms: new $(echo "$allnew" | median 4), old $(echo "$allold" | median 4)"
  exit 0
fi

declare -A all
for r in $(seq 1 "$ROUNDS"); do
  for c in $CASES; do
    v=$(run "$c")
    all[$c]+="$v;"
    echo "round $r $c: $v" >&2
  done
done

printf '\n%-12s %10s %12s %10s   (median of %s rounds, %s s each; load avg %s)\n' case GB/s req/s cpu-ms/GB "$ROUNDS" "$DUR" "$(cut -d' ' -f1-3 /proc/loadavg)"
declare -A gb rq
for c in $CASES; do
  gb[$c]=$(echo "${all[$c]}" | median 1)
  rq[$c]=$(echo "${all[$c]}" | median 2)
  printf '%-12s %10s %12s %10s\n' "$c" "${gb[$c]}" "${rq[$c]}" "$(echo "${all[$c]}" | median 3)"
done
echo
[[ -n ${gb[iperf]:-} && -n ${gb[tcp64w]:-} ]] && echo "tcp 64M write / iperf3        = $(ratio "${gb[tcp64w]}" "${gb[iperf]}")   (target >= 0.90)"
[[ -n ${gb[iperf]:-} && -n ${gb[tcp64w1]:-} ]] && echo "tcp 64M write, one block / iperf3 = $(ratio "${gb[tcp64w1]}" "${gb[iperf]}")"
[[ -n ${gb[mooncake64w]:-} && -n ${gb[tcp64w1]:-} ]] && echo "tcp 64M write, one block / Mooncake TE = $(ratio "${gb[tcp64w1]}" "${gb[mooncake64w]}")"
[[ -n ${gb[iperf]:-} && -n ${gb[tcp64r]:-} ]] && echo "tcp 64M read  / iperf3        = $(ratio "${gb[tcp64r]}" "${gb[iperf]}")   (target >= 0.90)"
[[ -n ${gb[tcp128kw]:-} && -n ${gb[tcp64w]:-} ]] && echo "tcp 128K x32 write / 64M write = $(ratio "${gb[tcp128kw]}" "${gb[tcp64w]}")   (target >= 0.80)"
[[ -n ${gb[tcp128kr]:-} && -n ${gb[tcp64r]:-} ]] && echo "tcp 128K x32 read  / 64M read  = $(ratio "${gb[tcp128kr]}" "${gb[tcp64r]}")   (target >= 0.80)"
[[ -n ${gb[memcpy]:-} && -n ${gb[shm64w]:-} ]] && echo "shm 64M write / memcpy        = $(ratio "${gb[shm64w]}" "${gb[memcpy]}")   (target >= 0.70)"
[[ -n ${gb[memcpy]:-} && -n ${gb[shm64w1]:-} ]] && echo "shm 64M write, one block / memcpy = $(ratio "${gb[shm64w1]}" "${gb[memcpy]}")   (target >= 0.70)"
[[ -n ${gb[memcpy]:-} && -n ${gb[shm64r1]:-} ]] && echo "shm 64M read,  one block / memcpy = $(ratio "${gb[shm64r1]}" "${gb[memcpy]}")   (target >= 0.70)"
[[ -n ${gb[memcpy]:-} && -n ${gb[shm64r]:-} ]] && echo "shm 64M read  / memcpy        = $(ratio "${gb[shm64r]}" "${gb[memcpy]}")   (target >= 0.70)"
[[ -n ${rq[tcp4kw]:-} ]] && echo "tcp 4K x64 write req/s        = ${rq[tcp4kw]}   (target >= 100000)"
[[ -n ${rq[tcp4kr]:-} ]] && echo "tcp 4K x64 read  req/s        = ${rq[tcp4kr]}   (target >= 100000)"
