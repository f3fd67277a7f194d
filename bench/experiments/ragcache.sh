#!/usr/bin/env bash
# RAGCache at this machine's scale, on MuSiQue and HotpotQA BM25 top-2
# streams with Zipf skew (../shared/data), 256-token chunks of the
# qwen2-0.5b tokenizer:
#   policies: document hit rate of the knowledge tree (strategy ragcache)
#     against host-tier capacity for PGDSF, GDSF, LRU and LFU, with a small
#     hot tier and swap-out-once; PGDSF ranks by the prefill cost table
#     profiled with qwen2-0.5b on this machine (RAGCache Table 2 analog).
#   ttft: full, prefix and ragcache on qwen2-0.5b F16 (random weights) under
#     Poisson arrivals: TTFT p50/p99 and tokens computed; then ragcache under
#     overload with and without cache-aware reordering.
#   speculation: dynamic speculative pipelining through `serve --corpus`
#     (the server searches, in STAGES stages by documents) on qwen2-0.5b F16
#     with ragcache/PGDSF, Poisson arrivals at LIGHT req/s; for each added
#     stage latency (LATENCIES, ms: BM25 over these corpora takes well under
#     a millisecond, so the latency stands for a slower retriever) with and
#     without --speculate: TTFT and the search time no prefill overlapped.
#   bash bench/experiments/ragcache.sh [policies|ttft|speculation|all] [requests]
#     (default: all; 2000 / 40 / 20 requests)
#   SETS="musique hotpotqa" (the data sets), LIGHT=0.3 and HEAVY=2 (req/s),
#   STAGES=8, LATENCIES="0 50 150".
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
WHAT=${1:-all}
SHARED=${DEPCACHE_SHARED:-../shared}
QWEN=build/bench-models/qwen2-0.5b-f16.gguf
SETS=${SETS:-musique hotpotqa}
LIGHT=${LIGHT:-0.3}
HEAVY=${HEAVY:-2}
D=build/bench-ragcache
mkdir -p "$D" "$(dirname "$QWEN")"
[ -d "$SHARED/data/musique" ] || { echo "needs $SHARED/data (the ../shared reference material)" >&2; exit 4; }
qwen_model >/dev/null

stream() {  # dataset, requests, rate -> file
  local set=$1 n=$2 rate=$3 out="$D/$1-$2-$3.jsonl"
  [ -f "$out" ] || $BIN workload generate --corpus "$SHARED/data/$set/${set}_train_corpus.json" \
    --questions "$SHARED/data/$set/${set}_train.json" --pattern zipf --requests "$n" --top-k 2 \
    --chunk-tokens 256 --overlap 0 --vocab "$QWEN" --rate "$rate" --seed 7 --out "$out" >/dev/null
  echo "$out"
}

policies() {
  local n=${1:-2000}
  echo "## Document hit rate (%) of the knowledge tree, $n requests, hot tier 5% of the distinct KV, swap-out-once"
  for set in $SETS; do
    local f
    f=$(stream "$set" "$n" 0)
    echo
    echo "### $set"
    echo
    echo "| host tier | pgdsf | gdsf | lru | lfu |"
    echo "|---|---|---|---|---|"
    for host in 0 5% 10% 20% 40%; do
      # One run for the four policies (the cost table is profiled once per run).
      $BIN simulate --requests "$f" --vocab "$QWEN" --strategy ragcache --capacity 5% \
        --host-capacity "$host" --swap-out-once --policy pgdsf,gdsf,lru,lfu --cost-model "$QWEN" \
        --json 2>/dev/null |
        sed -n 's/.*"item_hit_rate":\([0-9.e-]*\).*/\1/p' |
        awk -v host="$host" '{ line = line sprintf(" %.1f |", 100 * $1) } END { print "| " host " |" line }'
    done
  done
}

# One summary row: label, request file, strategy, then run options.
row() {
  local label=$1 requests=$2 strategy=$3
  shift 3
  $BIN run -m "$QWEN" --requests "$requests" -s "$strategy" -n 1 -q "$@" 2>/dev/null |
    grep -E "^$strategy +[0-9]" | awk -v label="$label" '{
      # name requests p50 p99 mean e2e req/s tok/s prompt computed reused hit pairs
      printf "| %s | %s | %s | %s | %s | %s |\n", label, $3, $4, $9, $10, $12;
    }'
}

ttft() {
  local n=${1:-40}
  echo "## TTFT (ms) on qwen2-0.5b F16, $n requests, top-2 chunks of 256 tokens, PGDSF, 64 MiB hot + 256 MiB host"
  for set in $SETS; do
    local f o
    f=$(stream "$set" "$n" "$LIGHT")
    o=$(stream "$set" "$n" "$HEAVY")
    echo
    echo "### $set"
    echo
    echo "| strategy, load | TTFT p50 | TTFT p99 | prompt tokens | computed | hit rate |"
    echo "|---|---|---|---|---|---|"
    for s in full prefix ragcache; do
      row "$s, $LIGHT req/s" "$f" "$s" --policy pgdsf --cache-mib 64 --host-mib 256 --swap-out-once
    done
    row "ragcache, $HEAVY req/s, fifo" "$o" ragcache --policy pgdsf --cache-mib 64 --host-mib 256 --swap-out-once \
      --scheduler fifo --max-running 1
    row "ragcache, $HEAVY req/s, reordered" "$o" ragcache --policy pgdsf --cache-mib 64 --host-mib 256 \
      --swap-out-once --scheduler ragcache --max-running 1
  done
}

# One `serve` for a configuration, loaded with `loadgen --retrieve 2`.
served_row() {  # label, dataset, requests file, then serve options
  local label=$1 set=$2 requests=$3 log port pid out
  shift 3
  log=$(mktemp)
  $BIN serve -m "$QWEN" --port 0 -t 2 --corpus "$SHARED/data/$set/${set}_train_corpus.json" --strategy ragcache \
    --policy pgdsf --cache-mib 64 --host-mib 256 --swap-out-once "$@" 2>"$log" &
  pid=$!
  for _ in $(seq 600); do grep -q "ready" "$log" && break; sleep 0.1; done
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
  out=$($BIN loadgen --url "http://127.0.0.1:$port" --requests "$requests" --retrieve 2 -s ragcache -n 1 \
    --rate "$LIGHT" --concurrency 64 2>&1 || true)
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  rm -f "$log"
  echo "$out" | awk -v label="$label" '
    /^TTFT ms \(first token\)/ { p50 = $6; p99 = $10 }
    /^server search ms/ { search = $5 }
    /^non-overlapped ms/ { non = $4 }
    /^speculation:/ { spec = $2; acc = $5 "/" $7 }
    END { printf "| %s | %s | %s | %s | %s | %s | %s |\n", label, p50, p99, search, non, spec, acc }'
}

speculation() {
  local n=${1:-20} stages=${STAGES:-8}
  echo "## Speculative pipelining: qwen2-0.5b F16, $n requests at $LIGHT req/s, top-2 chunks, $stages search stages by documents"
  for set in $SETS; do
    local f
    f=$(stream "$set" "$n" "$LIGHT")
    echo
    echo "### $set"
    echo
    echo "| stage latency, mode | TTFT p50 | TTFT p99 | search mean | non-overlapped mean | speculative prefills | accepted |"
    echo "|---|---|---|---|---|---|---|"
    for latency in ${LATENCIES:-0 50 150}; do
      served_row "${latency} ms, plain" "$set" "$f" --search-stages "$stages" --search-stage-latency-ms "$latency"
      served_row "${latency} ms, speculative" "$set" "$f" --search-stages "$stages" \
        --search-stage-latency-ms "$latency" --speculate
    done
  done
}

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads"
case $WHAT in
  policies) policies "${2:-2000}" ;;
  ttft) ttft "${2:-40}" ;;
  speculation) speculation "${2:-20}" ;;
  all) policies && ttft && speculation ;;
  *) echo "usage: bash bench/experiments/ragcache.sh [policies|ttft|speculation|all] [requests]" >&2; exit 2 ;;
esac
