#!/usr/bin/env bash
# Fidelity to full attention of each position scheme, with and without
# reuse, on the trained stories260K model (../shared/models): for documents
# (model-written stories retrieved by BM25, three per request) and for
# relation-path trees (WordNet, three entities of four two-hop paths). Prints
# one Markdown table: per workload, scheme and reuse, how often depcache's
# first token and whole greedy continuation equal full attention's, the mean
# KL divergence of the first-token distributions and the mean token ROUGE-L.
#   bash bench/experiments/fidelity.sh [requests] [tokens]
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-16}
TOKENS=${2:-24}
BIN=./build/depcache
SHARED=${DEPCACHE_SHARED:-../shared}
M="$SHARED/models/stories260K-f32.v1.gguf"
D=build/bench-fidelity
mkdir -p "$D"
[ -f "$M" ] || { echo "needs $M (the ../shared reference material)" >&2; exit 4; }

# JSON string body of stdin: backslashes, quotes, tabs and newlines escaped.
json_escape() { sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' | sed ':a;N;$!ba;s/\n/\\n/g'; }

# Stories the model writes itself, one per prompt and seed: the corpus.
if [ ! -f "$D/stories.jsonl" ]; then
  : >"$D/stories.jsonl.tmp"
  i=0
  for prompt in "Once upon a time" "Lily" "Tom" "One day" "The dog" "The sun" "Ben and Sue" "The little bird"; do
    for seed in 1 2; do
      text=$($BIN generate -m "$M" -p "$prompt" -n 70 --seed "$seed" --temp 0.8 2>/dev/null | json_escape)
      printf '{"id": "s%d", "title": "", "text": "%s"}\n' "$i" "$text" >>"$D/stories.jsonl.tmp"
      i=$((i + 1))
    done
  done
  mv "$D/stories.jsonl.tmp" "$D/stories.jsonl"
fi
# Questions (MuSiQue's shape; no answers: fidelity compares with full attention).
if [ ! -f "$D/questions.json" ]; then
  {
    echo "["
    sep=""
    i=0
    for q in "Lily" "Tom" "The dog" "One day" "the ball" "a cat" "the park" "Sue" "Ben" "the bird" "mom" \
      "the tree" "the sun" "a box" "the car" "a big red ball"; do
      printf '%s{"id": "q%d", "question": "%s", "answer": "", "paragraphs": []}\n' "$sep" "$i" "$q"
      sep=","
      i=$((i + 1))
    done
    echo "]"
  } >"$D/questions.json"
fi
DOCS="$D/documents-$N.jsonl"
[ -f "$DOCS" ] || $BIN workload generate --corpus "$D/stories.jsonl" --questions "$D/questions.json" \
  --pattern dataset --requests "$N" --top-k 3 --chunk-tokens 128 --overlap 0 --vocab "$M" --out "$DOCS" >/dev/null
$BIN kg stats --kg "$D/wordnet.dkg" >/dev/null 2>&1 || $BIN kg import --wordnet --out "$D/wordnet.dkg" >/dev/null
PATHS="$D/paths-$N.jsonl"
[ -f "$PATHS" ] || $BIN workload generate --kg "$D/wordnet.dkg" --pattern zipf --requests "$N" --qa-items 12 \
  --entities-per-request 3 --paths-per-entity 4 --seed 2 --out "$PATHS" >/dev/null

row() {  # workload label, request file, strategy, scheme, reuse (yes/no) -> one table row
  local label=$1 requests=$2 strategy=$3 scheme=$4 reuse=$5 extra=()
  [ "$reuse" = no ] && extra=(--no-reuse)
  local summary
  summary=$($BIN run --serial -m "$M" --requests "$requests" -s "$strategy" --scheme "${scheme/-/sequential}" --kv-type f32 \
    -n "$TOKENS" --fidelity -q "${extra[@]}" 2>/dev/null | grep -E "^$strategy +[0-9]")
  # Columns from the end: 1st token, KL mean, identical, ROUGE-L; the hit rate is column 12.
  awk -v label="$label" -v strategy="$strategy" -v scheme="$scheme" -v reuse="$reuse" '{
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label, strategy, scheme, reuse, $12, $(NF-3), $(NF-1), $(NF-2), $NF
  }' <<<"$summary"
}

echo "stories260K, $N requests per workload, $TOKENS greedy tokens, KV f32; against full attention on the flat prompt"
echo
echo "| workload | strategy | scheme | reuse | hit rate | same first token | identical continuation | KL mean | ROUGE-L |"
echo "|---|---|---|---|---|---|---|---|---|"
for w in documents paths; do
  file=$DOCS
  [ "$w" = paths ] && file=$PATHS
  row "$w" "$file" prefix - yes
  for scheme in depth sequential stacked; do
    for reuse in no yes; do row "$w" "$file" depcache "$scheme" "$reuse"; done
  done
done
