#!/usr/bin/env bash
# Replicas behind HAProxy: 1, 2 and 4 `depcache serve` replicas (one thread
# each, a hot tier of CACHE_MIB each, KV events on a local Redis), the
# GraphRAG Zipf stream (WordNet, N requests, strategy depcache) sent by
# `depcache loadgen` through HAProxy at RATE req/s per replica (Poisson, the
# same seed), routed three ways: roundrobin, consistent (hashing the request's
# entity set, bounded load 125%) and overlap (`depcache route`: the replica
# holding most of the request's KG subtrees, against its queue). Prints one
# Markdown row per (replicas, routing): token hit rate over the stream (tokens
# found in the replicas' caches / prompt tokens), TTFT p50/p99, completed.
#   bash bench/experiments/replicas.sh [N] [RATE] [CACHE_MIB] [open|keyed]
#   (default 400, 2, 8, open). keyed: the deployment a multi-tenant service
#   runs: one tenant key (with its namespace) and an operator key on every
#   replica and the router, KV event batches sealed under --cache-key-file,
#   loadgen sending the tenant key.
# The model is the demo's shape (4 layers, 256 embd, F16, random weights).
# On 2 cores, 4 replicas share them: TTFT then measures contention as much as
# routing; the hit rate does not depend on it.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
N=${1:-400}
RATE=${2:-2}
CACHE_MIB=${3:-8}
MODE_KEYS=${4:-open}
D=build/bench-replicas
mkdir -p "$D"
KEY_ARGS=()
LOAD_KEY=()
case "$MODE_KEYS" in
  open) ;;
  keyed)
    echo "tenant-key-0123456789 tenant-a" >"$D/api-keys"
    echo "operator-key-0123456789" >"$D/operator-key"
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$D/cache-key"
    KEY_ARGS=(--api-key-file "$D/api-keys" --operator-key-file "$D/operator-key" --cache-key-file "$D/cache-key")
    LOAD_KEY=(--api-key tenant-key-0123456789)
    ;;
  *) echo "the fourth argument is open or keyed" >&2; exit 2 ;;
esac
MODEL=$(demo_shape_model)
REQ=$(graphrag_stream "$D" "$N")
REDIS_PORT=$((20000 + RANDOM % 10000))
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$D/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap 'stop_all; kill $REDIS_PID 2>/dev/null || true' EXIT
wait_for() {  # log file, pid: waits for "ready", prints the port
  for _ in $(seq 1 1200); do
    if grep -q "ready" "$1" 2>/dev/null; then
      grep -o '127.0.0.1:[0-9]*' "$1" | head -1 | cut -d: -f2
      return
    fi
    kill -0 "$2" 2>/dev/null || { cat "$1" >&2; exit 1; }
    sleep 0.05
  done
  echo "not ready: $1" >&2
  exit 1
}

echo "CPU: $CPU; $N requests, $RATE req/s per replica, hot tier $CACHE_MIB MiB per replica, $MODE_KEYS"
echo
echo "| replicas | routing | token hit rate | TTFT p50 (ms) | TTFT p99 (ms) | completed |"
echo "|---|---|---|---|---|---|"
for R in 1 2 4; do
  for MODE in roundrobin consistent overlap; do
    [ "$R" = 1 ] && [ "$MODE" != roundrobin ] && continue
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    ROUTE_ARGS=()
    for i in $(seq 1 "$R"); do
      $BIN serve -m "$MODEL" -t 1 --port 0 --cache-mib "$CACHE_MIB" --host-mib 0 --kv-events \
        --kv-events-redis "127.0.0.1:$REDIS_PORT" --replica-name "r$i" \
        "${KEY_ARGS[@]}" 2>"$D/serve-$i.log" &
      PIDS+=($!)
      PORT=$(wait_for "$D/serve-$i.log" $!)
      ROUTE_ARGS+=(--replica "r$i=http://127.0.0.1:$PORT")
    done
    HAPROXY_PORT=$((30000 + RANDOM % 10000))
    $BIN route -m "$MODEL" --port 0 --redis "127.0.0.1:$REDIS_PORT" "${ROUTE_ARGS[@]}" \
      --haproxy-config "$D/haproxy.cfg" --haproxy-port "$HAPROXY_PORT" --haproxy-balance "$MODE" \
      "${KEY_ARGS[@]}" 2>"$D/route.log" &
    PIDS+=($!)
    wait_for "$D/route.log" $! >/dev/null
    haproxy -f "$D/haproxy.cfg" -db >"$D/haproxy.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$HAPROXY_PORT/health" >/dev/null && break; sleep 0.05; done
    sleep 1  # the router reads every replica's summary
    RATE_R=$(echo "$RATE * $R" | bc -l)
    $BIN loadgen --url "http://127.0.0.1:$HAPROXY_PORT" --requests "$REQ" -s depcache --rate "$RATE_R" \
      --seed 1 --concurrency 64 "${LOAD_KEY[@]}" --json "$D/rows-$R-$MODE.jsonl" >"$D/loadgen-$R-$MODE.log" 2>&1
    python3 - "$D/rows-$R-$MODE.jsonl" "$R" "$MODE" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ok = [r for r in rows if r.get("status") == 200]
prompt = sum(r.get("prompt_tokens", 0) for r in ok)
reused = sum(r.get("reused_tokens", 0) for r in ok)
ttft = sorted(r["ttft_ms"] for r in ok if "ttft_ms" in r)
q = lambda p: ttft[min(len(ttft) - 1, int(p * len(ttft)))] if ttft else float("nan")
print(f"| {sys.argv[2]} | {sys.argv[3]} | {reused / max(prompt, 1):.3f} | {q(0.5):.1f} | {q(0.99):.1f} | {len(ok)}/{len(rows)} |")
EOF
    stop_all
  done
done
