#!/usr/bin/env bash
# The engine under load. Prints two Markdown tables:
#  1. decode: aggregate generated tokens/s with 1, 4 and 16 sequences decoding
#     together (a burst of short prompts, `full`, 64 tokens each) on MODEL
#     (default: the qwen2-0.5b preset in F16, made if missing);
#  2. a GraphRAG stream (WordNet, Zipf, 10 entities x <= 10 paths) on the
#     demo's small model, one request at a time and with Poisson arrivals at
#     three rates: TTFT p50/p99 from arrival and throughput, per strategy.
#   bash bench/engine.sh [MODEL] [requests]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=./build/depcache
MODEL=${1:-build/bench-models/qwen2-0.5b-f16.gguf}
N=${2:-60}
D=build/bench-engine
mkdir -p "$D" "$(dirname "$MODEL")"
[ -f "$MODEL" ] || $BIN model new --preset qwen2-0.5b --type f16 -o "$MODEL" >/dev/null

summary() {  # run's output -> the summary rows (strategy, TTFT p50, p99, req/s, tok/s)
  grep -E '^(full|prefix|depcache) +[0-9]' | awk '{ printf "%s %s %s %s %s\n", $1, $3, $4, $7, $8 }'
}

echo "decode, $MODEL, 64 tokens per sequence (CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo
echo "| sequences decoding together | generated tok/s | TTFT p50 |"
echo "|---|---|---|"
for c in 1 4 16; do
  : >"$D/decode-$c.jsonl"
  for i in $(seq 1 "$c"); do
    printf '{"id": "s%d", "question": "What next?", "text": "Story %d. Once upon a time there was a little robot who liked to count."}\n' \
      "$i" "$i" >>"$D/decode-$c.jsonl"
  done
  $BIN run -m "$MODEL" --requests "$D/decode-$c.jsonl" -s full -n 64 -q 2>/dev/null | summary |
    awk -v c="$c" '{ printf "| %s | %s | %s |\n", c, $5, $2 }'
done

echo
M="$D/small.gguf"
[ -f "$M" ] || $BIN model new --preset tiny --layers 4 --embd 256 --heads 4 --heads-kv 2 --ff 768 --ctx 32768 \
  --type f16 --seed 1 -o "$M" >/dev/null
$BIN kg stats --kg "$D/wordnet.dkg" >/dev/null 2>&1 || $BIN kg import --wordnet --out "$D/wordnet.dkg" >/dev/null
REQ="$D/graphrag-$N.jsonl"
[ -f "$REQ" ] || $BIN workload generate --kg "$D/wordnet.dkg" --pattern zipf --requests "$N" --qa-items 100 \
  --paths-per-entity 10 --seed 1 --out "$REQ" >/dev/null
echo "GraphRAG stream, $N Zipf requests, demo model (4 layers, 256 embd), 4 generated tokens each"
echo
echo "| arrivals | strategy | TTFT p50 | TTFT p99 | req/s |"
echo "|---|---|---|---|---|"
for mode in serial 5 20 80; do
  if [ "$mode" = serial ]; then args=(--serial); label="one at a time"; else args=(--rate "$mode" --seed 1); label="Poisson $mode/s"; fi
  $BIN run -m "$M" --requests "$REQ" -s full,prefix,depcache -n 4 -q "${args[@]}" 2>/dev/null | summary |
    awk -v l="$label" '{ printf "| %s | %s | %s | %s | %s |\n", l, $1, $2, $3, $4 }'
done
