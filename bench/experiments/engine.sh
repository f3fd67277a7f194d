#!/usr/bin/env bash
# The engine under load, on MODEL (default: the qwen2-0.5b preset in F16,
# made if missing), 2 threads. Prints Markdown tables:
#  decode   aggregate generated tokens/s with 1, 4 and 16 sequences decoding
#           together (short prompts, `full`, 64 tokens each);
#  stream   a GraphRAG stream (WordNet, Zipf, 10 entities x <= 10 paths, N
#           requests, 4 generated tokens each): one request at a time, then
#           Poisson arrivals at several rates, TTFT p50/p99 from arrival and
#           the rate served, per strategy (full and prefix at the lowest
#           loaded rate only: they saturate far below depcache);
#  shared   depcache at 1 and 2 req/s with and without --no-wait-for-shared;
#  budget   depcache at the highest rate with --batch-tokens 256..4096;
#  batched  depcache overloaded (2 req/s) with 4 and 16 generated tokens,
#           batched and one request at a time (--max-running 1);
#  slo      depcache's highest Poisson rate within the SLO (p99 TTFT <= 5x the
#           unloaded p50), batched and one request at a time (--max-running 1),
#           with 16 generated tokens per request (decoding is where batching
#           pays on 2 cores). With few requests the p99 is the cold start's
#           first requests, so this section is not in the default set.
#   bash bench/experiments/engine.sh [MODEL] [N] [sections...]     (default: all four, N = 20)
# BIN overrides the binary (to keep measuring while the tree is rebuilt).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
MODEL=${1:-build/bench-models/qwen2-0.5b-f16.gguf}
N=${2:-20}
shift $(($# < 2 ? $# : 2))
SECTIONS=${*:-decode stream shared budget batched}
D=build/bench-engine
mkdir -p "$D" "$(dirname "$MODEL")"
[ -f "$MODEL" ] || qwen_model >/dev/null
RUN=($BIN run -m "$MODEL" -t 2 -q)

summary() {  # run's output -> the summary rows (strategy, TTFT p50, p99, req/s, tok/s)
  grep -E '^(full|prefix|depcache) +[0-9]' | awk '{ printf "%s %s %s %s %s\n", $1, $3, $4, $7, $8 }'
}
has() { [[ " $SECTIONS " == *" $1 "* ]]; }

echo "model $MODEL; CPU: $CPU, 2 threads"
if has decode; then
  echo
  echo "| sequences decoding together | generated tok/s | TTFT p50 |"
  echo "|---|---|---|"
  for c in 1 4 16; do
    : >"$D/decode-$c.jsonl"
    for i in $(seq 1 "$c"); do
      printf '{"id": "s%d", "question": "What next?", "text": "Story %d. Once upon a time there was a little robot who liked to count."}\n' \
        "$i" "$i" >>"$D/decode-$c.jsonl"
    done
    "${RUN[@]}" --requests "$D/decode-$c.jsonl" -s full -n 64 2>/dev/null | summary |
      awk -v c="$c" '{ printf "| %s | %s | %s |\n", c, $5, $2 }'
  done
fi

$BIN kg stats --kg "$D/wordnet.dkg" >/dev/null 2>&1 || $BIN kg import --wordnet --out "$D/wordnet.dkg" >/dev/null
REQ="$D/graphrag-$N.jsonl"
[ -f "$REQ" ] || $BIN workload generate --kg "$D/wordnet.dkg" --pattern zipf --requests "$N" --qa-items 100 \
  --paths-per-entity 10 --seed 1 --out "$REQ" >/dev/null
table() { echo; echo "| arrivals | strategy | TTFT p50 | TTFT p99 | req/s |"; echo "|---|---|---|---|---|"; }
row() {  # label, strategies, run options...
  local label=$1 strategies=$2
  shift 2
  "${RUN[@]}" --requests "$REQ" -s "$strategies" -n 4 "$@" 2>/dev/null | summary |
    awk -v l="$label" '{ printf "| %s | %s | %s | %s | %s |\n", l, $1, $2, $3, $4 }'
}
if has stream; then
  echo
  echo "GraphRAG stream: $N Zipf requests (WordNet, 10 entities x <= 10 paths), 4 generated tokens each"
  table
  row "one at a time" full,prefix,depcache --serial
  row "Poisson 0.25/s" full,prefix,depcache --rate 0.25 --seed 1
  for r in 0.5 1 2; do row "Poisson $r/s" depcache --rate "$r" --seed 1; done
fi
if has shared; then
  echo
  echo "depcache: requests sharing runs with a prefill under way wait for it (default) or run beside it"
  table
  for r in 1 2; do
    row "Poisson $r/s, wait for shared" depcache --rate "$r" --seed 1
    row "Poisson $r/s, beside" depcache --rate "$r" --seed 1 --no-wait-for-shared
  done
fi
if has budget; then
  echo
  echo "depcache, Poisson 2/s, by --batch-tokens"
  table
  for b in 256 512 1024 2048 4096; do row "batch tokens $b" depcache --rate 2 --seed 1 --batch-tokens "$b"; done
fi
if has batched; then
  echo
  echo "depcache, Poisson 2/s: batched or one request at a time"
  echo
  echo "| generated tokens | in flight | TTFT p50 | TTFT p99 | req/s | generated tok/s |"
  echo "|---|---|---|---|---|---|"
  for n in 4 16; do
    for m in 0 1; do
      "${RUN[@]}" --requests "$REQ" -s depcache -n "$n" --rate 2 --seed 1 --max-running "$m" 2>/dev/null | summary |
        awk -v n="$n" -v m="$([ "$m" = 0 ] && echo batched || echo 'one at a time')" \
          '{ printf "| %s | %s | %s | %s | %s | %s |\n", n, m, $2, $3, $4, $5 }'
    done
  done
fi
if has slo; then
  for m in 0 1; do
    echo
    echo "depcache, rate sweep, --max-running $m ($([ "$m" = 0 ] && echo batched || echo one request at a time))"
    "${RUN[@]}" --requests "$REQ" -s depcache -n 16 --sweep-rate --max-running "$m" --seed 1 2>/dev/null |
      sed -n '/^| strategy | unloaded/,$p'
  done
fi
