#!/usr/bin/env bash
# `depcache serve` over HTTP against `depcache run` on the same GraphRAG
# stream (WordNet, Zipf, 10 entities x <= 10 paths, N requests, 4 generated
# tokens each, strategy depcache), on MODEL (default: the qwen2-0.5b preset in
# F16, made if missing), 2 threads. `depcache loadgen` replays the stream,
# streamed, from a fresh server each time (cold cache, as `run` starts).
# Prints Markdown tables:
#  overhead  one request at a time (run --serial; loadgen --concurrency 1):
#            TTFT to the first token (for serve: the client's wait before
#            sending plus the server's TTFT, from the response's `timings`),
#            the client's TTFT to the first text, end-to-end p50, and the HTTP
#            layer's time per request: the client's send-to-receive time less
#            the server's own;
#  rates     Poisson arrivals at RATES req/s (same seed, hence the same
#            arrival times in both): TTFT p50/p99 from arrival, requests
#            served per second, and the share within the SLO (TTFT to the
#            first token <= SLO_MS, default 5x the unloaded TTFT p50 of run);
#            the highest rate whose p99 is within the SLO is the throughput at
#            the SLO.
#            With HOSTILE=F (e.g. 0.1), each rate is also served with that
#            share of hostile connections mixed in (loadgen --hostile: slow
#            senders, malformed and oversized bodies, garbage); the figures are
#            the normal requests'.
#   bash bench/experiments/serve.sh [MODEL] [N] [RATES...]     (default N = 20, RATES = 0.25 0.5 1 2)
# BIN overrides the binary (to keep measuring while the tree is rebuilt).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
MODEL=${1:-build/bench-models/qwen2-0.5b-f16.gguf}
N=${2:-20}
shift $(($# < 2 ? $# : 2))
RATES=${*:-0.25 0.5 1 2}
D=build/bench-serve
mkdir -p "$D" "$(dirname "$MODEL")"
[ -f "$MODEL" ] || qwen_model >/dev/null
$BIN kg stats --kg "$D/wordnet.dkg" >/dev/null 2>&1 || $BIN kg import --wordnet --out "$D/wordnet.dkg" >/dev/null
REQ="$D/graphrag-$N.jsonl"
[ -f "$REQ" ] || $BIN workload generate --kg "$D/wordnet.dkg" --pattern zipf --requests "$N" --qa-items 100 \
  --paths-per-entity 10 --seed 1 --out "$REQ" >/dev/null

SERVER_PID=
stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
  fi
}
trap stop_server EXIT
start_server() {  # a fresh server on a free port; sets PORT
  stop_server
  $BIN serve -m "$MODEL" -t 2 --port 0 2>"$D/serve.log" &
  SERVER_PID=$!
  PORT=
  for _ in $(seq 1 1200); do
    if grep -q "ready" "$D/serve.log" 2>/dev/null; then
      PORT=$(grep -o '127.0.0.1:[0-9]*' "$D/serve.log" | head -1 | cut -d: -f2)
      break
    fi
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$D/serve.log" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$PORT" ] || { echo "the server did not come up" >&2; exit 1; }
}
# run: TTFT p50, p99, e2e p50, req/s of depcache's summary row, and the share
# of its requests within the SLO (from its per-request rows)
run_stats() {
  local out within
  out=$($BIN run -m "$MODEL" -t 2 -q --requests "$REQ" -s depcache -n 4 --json "$D/run-rows.jsonl" "$@" 2>/dev/null)
  within=$(grep -o '"ttft_ms":[0-9.e+-]*' "$D/run-rows.jsonl" | cut -d: -f2 |
    awk -v slo="${SLO_MS:-0}" '{ n++; if ($1 <= slo) ok++ } END { printf "%.1f%%", n ? 100 * ok / n : 0 }')
  echo "$out" | sed 's/ms//g' | awk -v w="$within" '$1 == "depcache" && $2 ~ /^[0-9]+$/ { print $3, $4, $6, $7, w }'
}
# loadgen over a fresh server: TTFT to the first token p50 p99, to the first
# text p50 p99, e2e p50, HTTP layer p50 p99, req/s, share within the SLO
http_stats() {
  start_server
  local out
  out=$($BIN loadgen --url "http://127.0.0.1:$PORT" --requests "$REQ" -s depcache -n 4 --slo-ms "$SLO_MS" "$@")
  stop_server
  echo "$out" | awk '
    function after(key,   i) { for (i = 1; i < NF; i++) if ($i == key) return $(i + 1); return "-" }
    # every field set, so that a line missing from the output cannot shift the rest
    BEGIN { t50 = t99 = x50 = x99 = e2e = h50 = h99 = rps = slo = "-" }
    /^TTFT ms \(first token\)/ { t50 = after("p50"); t99 = after("p99") }
    /^TTFT ms \(first text\)/ { x50 = after("p50"); x99 = after("p99") }
    /^end to end/ { e2e = after("p50") }
    /^HTTP layer/ { h50 = after("p50"); h99 = after("p99") }
    /^served/ { rps = $2 }
    /^within the SLO/ { slo = $NF }
    END { print t50, t99, x50, x99, e2e, h50, h99, rps, slo }'
}

echo "model $MODEL; CPU: $CPU, 2 threads; $N GraphRAG requests (Zipf), depcache, 4 generated tokens each"
read -r R_P50 R_P99 R_E2E R_RPS _ <<<"$(run_stats --serial)"
SLO_MS=${SLO_MS:-$(awk -v p="$R_P50" 'BEGIN { printf "%.0f", 5 * p }')}
read -r T_P50 T_P99 X_P50 _ X_E2E H_P50 H_P99 H_RPS _ <<<"$(http_stats --concurrency 1)"
echo
echo "One request at a time (TTFT to the first token; for serve also to the first text the client receives)"
echo
echo "| | TTFT p50 ms | TTFT p99 ms | first text p50 ms | end-to-end p50 ms | req/s |"
echo "|---|---|---|---|---|---|"
echo "| run (engine only) | $R_P50 | $R_P99 | | $R_E2E | $R_RPS |"
echo "| serve + loadgen (HTTP, streamed) | $T_P50 | $T_P99 | $X_P50 | $X_E2E | $H_RPS |"
echo
echo "HTTP layer per request (sent to received, less the server's own time): p50 $H_P50 ms, p99 $H_P99 ms"
echo
echo "Poisson arrivals (SLO: TTFT to the first token <= $SLO_MS ms)"
echo
echo "| offered req/s | path | TTFT p50 ms | TTFT p99 ms | first text p50 / p99 ms | served req/s | within SLO |"
echo "|---|---|---|---|---|---|---|"
for r in $RATES; do
  read -r P50 P99 _ RPS WITHIN <<<"$(run_stats --rate "$r" --seed 1)"
  echo "| $r | run | $P50 | $P99 | | $RPS | $WITHIN |"
  read -r T_P50 T_P99 X_P50 X_P99 _ _ _ RPS WITHIN <<<"$(http_stats --rate "$r" --seed 1 --concurrency 64)"
  echo "| $r | serve | $T_P50 | $T_P99 | $X_P50 / $X_P99 | $RPS | $WITHIN |"
  if [ -n "${HOSTILE:-}" ]; then
    read -r T_P50 T_P99 X_P50 X_P99 _ _ _ RPS WITHIN <<<"$(http_stats --rate "$r" --seed 1 --concurrency 64 \
      --hostile "$HOSTILE")"
    echo "| $r | serve, $HOSTILE hostile | $T_P50 | $T_P99 | $X_P50 / $X_P99 | $RPS | $WITHIN |"
  fi
done
