#!/usr/bin/env bash
# SubGCache at this machine's scale: batches of GraphRAG queries over one
# small synthetic world (40 entities, so the queries' subgraphs overlap, as
# on the paper's Scene Graph), each query 2 entities with up to 9 two-hop
# relation paths, its subgraph as G-Retriever CSV.
#   speed: qwen2-0.5b F16 (random weights), one greedy token: TTFT (p50,
#     mean) and tokens computed of the per-query prompts (full, prefix)
#     against SubGCache, against the number of clusters c (batch of 32) and
#     the batch size (c = batch / 8); plus the clustering time.
#   quality: the QA model (MODEL, default the shipped one) on the same
#     kind of stream: agreement of SubGCache's answers with the per-query
#     prompts' (first token, KL, identical continuation, ROUGE-L) and exact
#     match, against c.
#   bash bench/experiments/subgcache.sh [speed|quality|all] [MODEL]
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
WHAT=${1:-all}
QA=${2:-models/depcache-qa.gguf}
QWEN=build/bench-models/qwen2-0.5b-f16.gguf
D=build/bench-subgcache
mkdir -p "$D" "$(dirname "$QWEN")"
qwen_model >/dev/null
[ -f "$D/world.dkg" ] || $BIN kg import --synthetic --entities 40 --relations 12 --facts-per-entity 3 \
  --name-pool 1000 --seed 4242 -o "$D/world.dkg" >/dev/null

stream() {  # requests -> file
  local n=$1 out="$D/queries-$1.jsonl"
  [ -f "$out" ] || $BIN workload generate --kg "$D/world.dkg" --pattern uniform --requests "$n" --qa-items 40 \
    --entities-per-request 2 --paths-per-entity 9 --min-paths 1 --hops 2 --question-hops 1 --seed 5 \
    --out "$out" >/dev/null
  echo "$out"
}

# Summary rows of one run: label prefix, model, requests, then run options.
rows() {
  local label=$1 model=$2 requests=$3
  shift 3
  $BIN run --serial -m "$model" --requests "$requests" -q "$@" 2>/dev/null | awk -v label="$label" '
    /^subgcache: / { for (i = 1; i <= NF; ++i) if ($i == "clustering") ms = $(i + 1) }
    /^(full|prefix|subgcache) +[0-9]/ {
      # name requests p50 p99 mean e2e req/s tok/s prompt computed reused hit pairs [1st KL identical ROUGE]
      fid = NF >= 17 ? sprintf(" %s | %s | %s | %s |", $(NF-3), $(NF-2), $(NF-1), $NF) : "";
      printf "| %s %s | %s | %s | %s | %s |%s\n", label, $1, $3, $5, $9, $10, fid;
    }
    /answers:/ { em[$1] = $3 "/" $5 " " $7 }
    END { if (ms != "") printf "| %s clustering | %s ms | | | |\n", label, ms;
          for (s in em) printf "| %s %s exact match | %s | | | |\n", label, s, em[s]; }'
}

speed() {
  echo "## Speed: qwen2-0.5b F16, batches of GraphRAG queries (2 entities, <= 9 two-hop paths each, 40-entity world)"
  echo
  echo "| run, strategy | TTFT p50 | TTFT mean | prompt tokens | computed |"
  echo "|---|---|---|---|---|"
  local f
  f=$(stream 32)
  # subgcache in the run puts every strategy on the CSV form (the per-query prompts).
  rows "per-query:" "$QWEN" "$f" -s full,prefix,subgcache --clusters 32 --query-batch 32 -n 1
  for c in 1 2 4 8 16 32; do
    rows "batch 32, c=$c:" "$QWEN" "$f" -s subgcache --clusters "$c" --query-batch 32 -n 1
  done
  f=$(stream 64)
  for b in 8 16 32 64; do
    rows "batch $b, c=$((b / 8)):" "$QWEN" "$f" -s subgcache --clusters $((b / 8)) --query-batch "$b" -n 1
  done
}

quality() {
  [ -f "$QA" ] || { echo "needs the QA model $QA" >&2; exit 4; }
  echo "## Quality: $QA, 64 queries, batches of 32, answers of up to 8 tokens, against the per-query prompts"
  echo
  echo "| run, strategy | TTFT p50 | TTFT mean | prompt tokens | computed | same first token | KL mean | identical | ROUGE-L |"
  echo "|---|---|---|---|---|---|---|---|---|"
  local f
  f=$(stream 64)
  for c in 32 16 8 4 1; do
    rows "c=$c:" "$QA" "$f" -s full,subgcache --clusters "$c" --query-batch 32 -n 8 --fidelity
  done
}

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads"
case $WHAT in
  speed) speed ;;
  quality) quality ;;
  all) speed && quality ;;
  *) echo "usage: bash bench/experiments/subgcache.sh [speed|quality|all] [MODEL]" >&2; exit 2 ;;
esac
