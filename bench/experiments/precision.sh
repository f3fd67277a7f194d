#!/usr/bin/env bash
# What the approximate modes cost in answers: each model answers a request
# stream with q8_0 KV against the reference KV type, and with int8
# activations (on a Q8_0 copy) against exact matmuls (full attention on the
# flat prompt, greedy), and the report compares them: same first token, mean KL of the
# first-token distributions, identical continuations, ROUGE-L and, for the
# shipped QA model on a world it never saw, exact match. BF16 products are
# measured on BF16 and F16 copies against exact matmuls. Calibration row:
# f16 against f32 KV. Prints one Markdown table.
#   bash bench/experiments/precision.sh [requests] [tokens]
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
N=${1:-100}
TOKENS=${2:-16}
SHARED=${DEPCACHE_SHARED:-../shared}
STORIES="$SHARED/models/stories260K-f32.v1.gguf"
QA=models/depcache-qa.gguf
D=build/bench-precision
mkdir -p "$D"
[ -f "$STORIES" ] || { echo "needs $STORIES (the ../shared reference material)" >&2; exit 4; }
$BIN kg stats --kg "$D/wordnet.dkg" >/dev/null 2>&1 || $BIN kg import --wordnet --out "$D/wordnet.dkg" >/dev/null
PATHS="$D/paths-$N.jsonl"
[ -f "$PATHS" ] || $BIN workload generate --kg "$D/wordnet.dkg" --pattern zipf --requests "$N" --qa-items "$N" \
  --entities-per-request 3 --paths-per-entity 4 --seed 2 --out "$PATHS" >/dev/null
[ -f "$D/qa-world.dkg" ] || $BIN kg import --synthetic --entities 300 --name-pool 1000 --seed 9101 \
  -o "$D/qa-world.dkg" >/dev/null
QAREQ="$D/qa-$N.jsonl"
[ -f "$QAREQ" ] || $BIN workload generate --kg "$D/qa-world.dkg" --pattern dataset --qa-items "$N" \
  --entities-per-request 3 --paths-per-entity 9 --min-paths 1 --hops 2 --question-hops 1 --seed 77 \
  --question-form cloze --out "$QAREQ" >/dev/null

row() {  # label, model, requests, kv type, reference kv type, extra run options... -> one table row
  local label=$1 model=$2 requests=$3 kv=$4 ref=$5 out summary em
  shift 5
  out=$($BIN run --serial -m "$model" --requests "$requests" -s full --kv-type "$kv" --reference-kv-type "$ref" \
    -n "$TOKENS" --fidelity -q "$@" 2>/dev/null)
  summary=$(grep -E '^full +[0-9]' <<<"$out")
  em=$(grep -oE 'answers: [0-9]+ of [0-9]+ exact \([0-9.]+%\)' <<<"$out" | grep -oE '[0-9.]+%' || echo "-")
  [ "$label" = "${label#QA}" ] && em="-"
  # Columns from the end: 1st token, KL mean, identical, ROUGE-L.
  local what="$kv KV vs $ref"
  [ $# -gt 0 ] && what="$* vs exact"
  awk -v label="$label" -v what="$what" -v em="$em" '{
    printf "| %s | %s | %s | %s | %s | %s | %s |\n", label, what, $(NF-3), $(NF-1), $(NF-2), $NF, em
  }' <<<"$summary"
}

echo "CPU: $CPU; $N requests per model, $TOKENS greedy tokens, full attention; against the reference KV type"
echo
echo "| model | KV | same first token | identical continuation | KL mean | ROUGE-L | exact match |"
echo "|---|---|---|---|---|---|---|"
row "stories260K (WordNet paths)" "$STORIES" "$PATHS" f16 f32
row "stories260K (WordNet paths)" "$STORIES" "$PATHS" q8_0 f16
row "QA model (held-out world)" "$QA" "$QAREQ" f16 f32
row "QA model (held-out world)" "$QA" "$QAREQ" q8_0 f16
# Int8 activations, on Q8_0 copies of the models (f16 KV both sides).
STORIES_Q8="$D/stories260K-q8_0.gguf" QA_Q8="$D/depcache-qa-q8_0.gguf"
[ -f "$STORIES_Q8" ] || $BIN model quantize -m "$STORIES" -o "$STORIES_Q8" --type q8_0 >/dev/null
[ -f "$QA_Q8" ] || $BIN model quantize -m "$QA" -o "$QA_Q8" --type q8_0 >/dev/null
row "stories260K Q8_0 (WordNet paths)" "$STORIES_Q8" "$PATHS" f16 f16 --int8-activations
row "QA model Q8_0 (held-out world)" "$QA_Q8" "$QAREQ" f16 f16 --int8-activations
# BF16 products, on BF16 and F16 copies (exact on a CPU without AVX512-BF16).
for type in bf16 f16; do
  upper=$(tr a-z A-Z <<<"$type")
  [ -f "$D/stories260K-$type.gguf" ] || $BIN model quantize -m "$STORIES" -o "$D/stories260K-$type.gguf" --type "$type" >/dev/null
  [ -f "$D/depcache-qa-$type.gguf" ] || $BIN model quantize -m "$QA" -o "$D/depcache-qa-$type.gguf" --type "$type" >/dev/null
  row "stories260K $upper (WordNet paths)" "$D/stories260K-$type.gguf" "$PATHS" f16 f16 --bf16-products
  row "QA model $upper (held-out world)" "$D/depcache-qa-$type.gguf" "$QAREQ" f16 f16 --bf16-products
done
