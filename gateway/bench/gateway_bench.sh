#!/usr/bin/env bash
# Gateway overhead benchmark: the same load sent straight to a simulated worker and through
# `moongate serve`, alternating within one run, so machine drift hits both alike.
#
#   gateway/bench/gateway_bench.sh                       # build release, 3 rounds x 10 s per target and scenario
#   DURATION=5 ROUNDS=1 gateway/bench/gateway_bench.sh   # quick look
#   COMPARE_BIN=/tmp/old/moongate gateway/bench/gateway_bench.sh   # A/B: a second gateway ("gateway_b") in the same run
#   TRACES=1 gateway/bench/gateway_bench.sh              # A/B: a second gateway exporting every request's
#                                                # span (--otlp-traces-endpoint, 100% sampled) to a
#                                                # sink on CPU_AUX ("gateway_traced"), and its CPU ratio
#   CLIENT_KEYS=1 gateway/bench/gateway_bench.sh         # A/B: a second gateway with --client-api-keys-file
#                                                # ("gateway_keys", sent a valid key), and its CPU ratio
#   KV_AWARE=1 gateway/bench/gateway_bench.sh            # A/B: gateways on cache_aware ("cache_aware") and on
#                                                # kv_aware with --tokenizer-path ("kv_aware"), the sim
#                                                # workers tokenizing alike and publishing KV events;
#                                                # UNIQUE=1 makes every prompt new (no cached pieces);
#                                                # KV_EXTRA: more flags for the kv_aware gateway
#
# Layout on 2 cores: the server under test (the gateway, or the direct sim worker) is pinned
# alone on CPU_SUT (default 1); wrk and the gateway's two sim workers share CPU_AUX (default 0).
# Load: wrk -t1 -c$CONC (64), POST /v1/chat/completions with a ~1 KiB prompt, 16 output
# tokens; scenario `chat` (JSON) and `chat_stream` (SSE, 16 chunks + [DONE]);
# SCENARIOS="chat embeddings rerank classify score tokenize responses" adds those routes
# (the same ~1 KiB text, see lua/chat.lua).
# Reported per target: req/s, p50/p99 latency, CPU microseconds per request of the server
# under test (utime+stime from /proc, all threads), peak RSS.
# Installs wrk with apt-get when it is missing. Ports: 43100-43110 (override with BASE_PORT).
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10}; ROUNDS=${ROUNDS:-3}; CONC=${CONC:-64}
SCENARIOS=${SCENARIOS:-"chat chat_stream"}
CPU_SUT=${CPU_SUT:-1}; CPU_AUX=${CPU_AUX:-0}
BASE_PORT=${BASE_PORT:-43100}
GW_PORT=$BASE_PORT; W1=$((BASE_PORT + 1)); W2=$((BASE_PORT + 2)); DIRECT=$((BASE_PORT + 10))
TOKENS=${TOKENS:-16}
BIN=${MOONGATE_BIN:-${CARGO_TARGET_DIR:-target}/release/moongate}

if ! command -v wrk >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q wrk
fi
if [ -z "${MOONGATE_BIN:-}" ]; then cargo build --release -q -p moongate; fi

TMP=$(mktemp -d); PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
start() { # start NAME CPU CMD...
  local name=$1 cpu=$2; shift 2
  taskset -c "$cpu" "$@" > "$TMP/$name.log" 2>&1 &
  PIDS+=($!); echo $! > "$TMP/$name.pid"
}
pid() { cat "$TMP/$1.pid"; }
wait_ok() { # wait_ok URL
  for _ in $(seq 1 100); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "timeout waiting for $1" >&2; exit 1
}
cpu_ticks() { awk '{print $14+$15}' "/proc/$(pid "$1")/stat"; }
hwm_mib() { awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$(pid "$1")/status"; }

SIM=(sim-worker --host 127.0.0.1 --output-tokens "$TOKENS")
TOKENIZER=tests/fixtures/tokenizer
if [ "${KV_AWARE:-0}" = 1 ]; then
  SIM+=(--tokenizer-path "$TOKENIZER")
  ev() { echo "{\"publisher\":\"zmq\",\"endpoint\":\"tcp://127.0.0.1:$1\",\"topic\":\"kv-events\"}"; }
  start w1 "$CPU_AUX" "$BIN" "${SIM[@]}" --port "$W1" --kv-events-config "$(ev $((BASE_PORT + 7)))"
  start w2 "$CPU_AUX" "$BIN" "${SIM[@]}" --port "$W2" --kv-events-config "$(ev $((BASE_PORT + 8)))"
else
  start w1 "$CPU_AUX" "$BIN" "${SIM[@]}" --port "$W1"
  start w2 "$CPU_AUX" "$BIN" "${SIM[@]}" --port "$W2"
fi
start direct "$CPU_SUT" "$BIN" "${SIM[@]}" --port "$DIRECT"
for p in $W1 $W2 $DIRECT; do wait_ok "http://127.0.0.1:$p/health"; done
start gateway "$CPU_SUT" "$BIN" serve --host 127.0.0.1 --port "$GW_PORT" --policy round_robin \
  --log-level warn --worker-urls "http://127.0.0.1:$W1" "http://127.0.0.1:$W2"
wait_ok "http://127.0.0.1:$GW_PORT/readiness"
TARGETS="direct:$DIRECT gateway:$GW_PORT"
if [ -n "${COMPARE_BIN:-}" ]; then
  GWB_PORT=$((BASE_PORT + 3))
  start gateway_b "$CPU_SUT" "$COMPARE_BIN" serve --host 127.0.0.1 --port "$GWB_PORT" --policy round_robin \
    --log-level warn --worker-urls "http://127.0.0.1:$W1" "http://127.0.0.1:$W2"
  wait_ok "http://127.0.0.1:$GWB_PORT/readiness"
  TARGETS="$TARGETS gateway_b:$GWB_PORT"
fi
if [ "${KV_AWARE:-0}" = 1 ]; then
  GWC_PORT=$((BASE_PORT + 5)); GWV_PORT=$((BASE_PORT + 6))
  start cache_aware "$CPU_SUT" "$BIN" serve --host 127.0.0.1 --port "$GWC_PORT" --policy cache_aware \
    --log-level warn --worker-urls "http://127.0.0.1:$W1" "http://127.0.0.1:$W2"
  start kv_aware "$CPU_SUT" "$BIN" serve --host 127.0.0.1 --port "$GWV_PORT" --policy kv_aware \
    --tokenizer-path "$TOKENIZER" --log-level warn ${KV_EXTRA:-} --worker-urls "http://127.0.0.1:$W1" "http://127.0.0.1:$W2"
  for p in $GWC_PORT $GWV_PORT; do wait_ok "http://127.0.0.1:$p/readiness"; done
  # kv_aware on events: wait until it routes on both workers' events, not its fallback
  # (each worker sent a new prompt of several pages straight, every try: they publish
  # whole new pages only, and a subscriber misses what was published before it joined).
  PROBE=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 1 23))
  chat() { curl -s -o /dev/null -H 'content-type: application/json' "http://127.0.0.1:$1/v1/chat/completions" \
      -d "{\"model\":\"moongate-sim\",\"messages\":[{\"role\":\"user\",\"content\":\"$2 $PROBE\"}],\"max_tokens\":2}"; }
  for i in $(seq 1 100); do
    chat "$W1" "w1 $i"; chat "$W2" "w2 $i"; chat "$GWV_PORT" "gw $i"
    m=$(curl -s "http://127.0.0.1:$GWV_PORT/metrics")
    grep -q 'kv_aware_decisions_total{decision="events"}' <<<"$m" && break
    [ "$i" = 100 ] && { echo "kv_aware never routed on events" >&2; exit 1; }
    sleep 0.1
  done
  TARGETS="$TARGETS cache_aware:$GWC_PORT kv_aware:$GWV_PORT"
fi
if [ "${TRACES:-0}" = 1 ]; then
  GWT_PORT=$((BASE_PORT + 9)); SINK=$((BASE_PORT + 11))
  # An OTLP/HTTP sink: reads each export and answers 200 (what a collector does first).
  start otlp_sink "$CPU_AUX" python3 -c '
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()' "$SINK"
  start gateway_traced "$CPU_SUT" "$BIN" serve --host 127.0.0.1 --port "$GWT_PORT" --policy round_robin \
    --log-level warn --otlp-traces-endpoint "http://127.0.0.1:$SINK/v1/traces" \
    --worker-urls "http://127.0.0.1:$W1" "http://127.0.0.1:$W2"
  wait_ok "http://127.0.0.1:$GWT_PORT/readiness"
  TARGETS="$TARGETS gateway_traced:$GWT_PORT"
fi
CLIENT_KEY=""
if [ "${CLIENT_KEYS:-0}" = 1 ]; then
  GWK_PORT=$((BASE_PORT + 4))
  CLIENT_KEY=bench-client-key-0003
  printf '# bench clients\nbench-client-key-0001\nbench-client-key-0002\n%s\n' "$CLIENT_KEY" > "$TMP/client-keys"
  start gateway_keys "$CPU_SUT" "$BIN" serve --host 127.0.0.1 --port "$GWK_PORT" --policy round_robin \
    --log-level warn --client-api-keys-file "$TMP/client-keys" \
    --worker-urls "http://127.0.0.1:$W1" "http://127.0.0.1:$W2"
  wait_ok "http://127.0.0.1:$GWK_PORT/readiness"
  TARGETS="$TARGETS gateway_keys:$GWK_PORT"
fi
TCK=$(getconf CLK_TCK)
run_wrk() { # run_wrk PORT STREAM SECONDS -> "requests rps p50 p99 errors"
  local key=""; [ -n "${GWK_PORT:-}" ] && [ "$1" = "$GWK_PORT" ] && key=$CLIENT_KEY
  UNIQUE=${UNIQUE:-0} AUTH_KEY=$key ROUTE=${ROUTE:-} STREAM=$2 MAX_TOKENS=$TOKENS taskset -c "$CPU_AUX" wrk -t1 -c"$CONC" -d"$3s" -s gateway/bench/lua/chat.lua \
    "http://127.0.0.1:$1" 2>&1 | awk '/^RESULT/{print $2, $3, $4, $5, $6}'
}
echo "# $(date -Is) $(nproc) cpus; SUT cpu $CPU_SUT, wrk + gateway's sim workers cpu $CPU_AUX; wrk -t1 -c$CONC; ${DURATION}s x $ROUNDS rounds; $TOKENS tokens"
RES="$TMP/results"; : > "$RES"
for sc in $SCENARIOS; do
  st=0; [ "$sc" = chat_stream ] && st=1
  case $sc in chat | chat_stream) ROUTE="" ;; *) ROUTE=$sc ;; esac
  for t in $TARGETS; do run_wrk "${t#*:}" $st 2 > /dev/null; done # warm-up
  for r in $(seq 1 "$ROUNDS"); do
    # Each round starts one target later, so none always runs first or last.
    read -r -a order <<<"$TARGETS"
    k=$(( (r - 1) % ${#order[@]} )); order=("${order[@]:k}" "${order[@]:0:k}")
    for t in "${order[@]}"; do
      name=${t%%:*}; port=${t#*:}
      c0=$(cpu_ticks "$name")
      read -r n rps p50 p99 errs <<<"$(run_wrk "$port" $st "$DURATION")"
      c1=$(cpu_ticks "$name")
      us=$(awk -v c=$((c1 - c0)) -v t="$TCK" -v n="$n" 'BEGIN{printf "%.1f", c / t * 1e6 / (n > 0 ? n : 1)}')
      printf '%-12s r%d %-8s %9.0f req/s  p50 %6.2f ms  p99 %6.2f ms  cpu %6.1f us/req  rss %3s MiB  errors %s\n' \
        "$sc" "$r" "$name" "$rps" "$p50" "$p99" "$us" "$(hwm_mib "$name")" "$errs"
      echo "$sc $name $rps $p50 $p99 $us $(hwm_mib "$name") $errs" >> "$RES"
    done
  done
done
echo
echo "median over rounds:"
printf '| %-11s | %-8s | %9s | %8s | %8s | %10s | %8s |\n' scenario target "req/s" "p50 ms" "p99 ms" "CPU us/req" "RSS MiB"
printf '|%s|\n' "-------------|----------|-----------|----------|----------|------------|----------"
for sc in $SCENARIOS; do for t in $TARGETS; do name=${t%%:*}
  awk -v sc="$sc" -v n="$name" '$1==sc && $2==n' "$RES" | sort -k3 -n | awk -v sc="$sc" -v n="$name" '
    {rps[NR]=$3; p50[NR]=$4; p99[NR]=$5; us[NR]=$6; rss=$7}
    END{m=int((NR+1)/2); printf "| %-11s | %-8s | %9.0f | %8.2f | %8.2f | %10.1f | %8s |\n", sc, n, rps[m], p50[m], p99[m], us[m], rss}'
done; done
# cpu_ratio A B WHAT [NOTE]: per scenario, the median over rounds of B's CPU per request / A's.
cpu_ratio() {
  echo
  for sc in $SCENARIOS; do
    awk -v sc="$sc" -v a="$1" -v b="$2" '$1==sc && ($2==a || $2==b)' "$RES" | python3 -c "
import sys, statistics
rows = [l.split() for l in sys.stdin]
a = [float(r[5]) for r in rows if r[1] == '$1']
b = [float(r[5]) for r in rows if r[1] == '$2']
pairs = [y / x for x, y in zip(a, b) if x]
print(f'$sc: CPU per request $3 = {statistics.median(pairs):.3f} (median of per-round ratios${4:+; $4})')"
  done
}
if [ -n "${GWV_PORT:-}" ]; then cpu_ratio cache_aware kv_aware "kv_aware / cache_aware"; fi
if [ -n "${GWK_PORT:-}" ]; then
  cpu_ratio gateway gateway_keys "with client keys / without" "target <= 1.05"
fi
if [ -n "${GWT_PORT:-}" ]; then
  cpu_ratio gateway gateway_traced "with traces exported / without" "target <= 1.15"
fi
