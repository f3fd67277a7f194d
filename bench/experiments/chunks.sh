#!/usr/bin/env bash
# Chunk reuse at any position against full attention, on MuSiQue and
# HotpotQA BM25 top-5 streams with Zipf skew (../shared/data).
#   quality: the trained stories260K model (64-token chunks, so five fit its
#     512 positions), every strategy and the recompute-ratio sweep; fidelity
#     to full attention (first token, KL, identical continuation, ROUGE-L),
#     tokens computed (whole-model equivalents over passes), hit rate; then
#     FusionRAG with its offline fusion (chunks fuse) and Cache-Craft's
#     Table 3 ablation (RoPE fix = realignment on/off x recompute on/off);
#     then the questions again with their chunks reordered after a warm-up:
#     the chunk strategies and Cache-Craft's alpha sweep and focus cut.
#   speed: qwen2-0.5b preset, F16, random weights (256-token chunks): each
#     strategy serves the questions once, then again with their chunks
#     reordered (measured): TTFT p50/p99 and tokens computed per strategy.
#   answers: the shipped QA model (models/depcache-qa.gguf) on the held-out
#     document QA of scripts/make_qa_model.sh (1- and 2-hop questions over
#     three documents each, worlds it never saw): exact match and token F1
#     per strategy and recompute ratio, FusionRAG's normalized F1, and the
#     fidelity to full attention; then the RoPE fix x recompute ablation.
#   bash bench/experiments/chunks.sh [quality|speed|answers|all] [requests]
#     (default: all; 40 requests, answers: 500)
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
WHAT=${1:-all}
N=${2:-$([ "$WHAT" = answers ] && echo 500 || echo 40)}
SHARED=${DEPCACHE_SHARED:-../shared}
STORIES="$SHARED/models/stories260K-f32.v1.gguf"
QWEN=build/bench-models/qwen2-0.5b-f16.gguf
D=build/bench-chunks
mkdir -p "$D" "$(dirname "$QWEN")"
[ -f "$STORIES" ] || { echo "needs $STORIES (the ../shared reference material)" >&2; exit 4; }

stream() {  # dataset, model (its tokenizer chunks), chunk tokens, requests -> file
  local set=$1 model=$2 tokens=$3 n=$4 out="$D/$1-$3-$4.jsonl"
  [ -f "$out" ] || $BIN workload generate --corpus "$SHARED/data/$set/${set}_train_corpus.json" \
    --questions "$SHARED/data/$set/${set}_train.json" --pattern zipf --requests "$n" --top-k 5 \
    --chunk-tokens "$tokens" --overlap 0 --vocab "$model" --seed 7 --out "$out" >/dev/null
  echo "$out"
}

# One summary row: label, model, request file, strategy, then run options.
row() {
  local label=$1 model=$2 requests=$3 strategy=$4
  shift 4
  $BIN run --serial -m "$model" --requests "$requests" -s "$strategy" -q "$@" 2>/dev/null |
    grep -E "^$strategy +[0-9]" | awk -v label="$label" '{
      # name requests p50 p99 mean e2e req/s tok/s prompt computed reused hit pairs [1st KL identical ROUGE]
      if (NF >= 17) printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", label, $12, $10, $3, $(NF-3), $(NF-2), $(NF-1), $NF;
      else printf "| %s | %s | %s | %s | %s | %s |\n", label, $12, $10, $3, $4, $9;
    }'
}

quality() {
  echo "## Quality: stories260K, $N requests per set, top-5 chunks of 64 tokens, 16 greedy tokens, KV f32"
  for set in musique hotpotqa; do
    local f
    f=$(stream "$set" "$STORIES" 64 "$N")
    local q=(-n 16 --kv-type f32 --fidelity)
    echo
    echo "### $set"
    echo
    echo "| strategy | hit rate | computed | TTFT p50 | same first token | KL mean | identical | ROUGE-L |"
    echo "|---|---|---|---|---|---|---|---|"
    row "full" "$STORIES" "$f" full "${q[@]}"
    row "prefix" "$STORIES" "$f" prefix "${q[@]}"
    row "fullreuse (0%)" "$STORIES" "$f" fullreuse "${q[@]}"
    for r in 0.05 0.10 0.15 0.30 1.0; do
      for s in cacheblend fusionrag; do row "$s $r" "$STORIES" "$f" "$s" --recompute-ratio "$r" "${q[@]}"; done
    done
    # FusionRAG with its offline step: every chunk of the stream fused after
    # its 10 nearest (as many as fit the context).
    rm -rf "$D/fused-$set"
    $BIN chunks fuse -m "$STORIES" --requests "$f" --kv-type f32 --cache-dir "$D/fused-$set" >&2
    for r in 0.0 0.15; do
      row "fusionrag $r + offline fusion" "$STORIES" "$f" fusionrag --recompute-ratio "$r" --cache-dir "$D/fused-$set" \
        "${q[@]}"
    done
    rm -rf "$D/fused-$set"
    # Cache-Craft's Table 3: RoPE fix (realignment) x recompute (CacheBlend's 15%).
    row "no RoPE fix, no recompute" "$STORIES" "$f" fullreuse --no-realign "${q[@]}"
    row "RoPE fix, no recompute" "$STORIES" "$f" fullreuse "${q[@]}"
    row "no RoPE fix, recompute 15%" "$STORIES" "$f" cacheblend --recompute-ratio 0.15 --no-realign "${q[@]}"
    row "RoPE fix, recompute 15%" "$STORIES" "$f" cacheblend --recompute-ratio 0.15 "${q[@]}"
    # Reordered chunks: the questions once (warm-up), then again with their
    # chunks in another order; Cache-Craft's alpha sweep and focus cut.
    local w1="$D/$set-64-shuffled-1.jsonl" w2="$D/$set-64-shuffled-2.jsonl"
    for seed in 1 2; do
      $BIN workload generate --corpus "$SHARED/data/$set/${set}_train_corpus.json" \
        --questions "$SHARED/data/$set/${set}_train.json" --pattern dataset --top-k 5 --chunk-tokens 64 \
        --overlap 0 --vocab "$STORIES" --shuffle-chunks --seed "$seed" --out "$D/$set-64-shuffled-$seed.jsonl" \
        >/dev/null
    done
    head -"$N" "$w1" >"$D/warm.jsonl"
    echo
    echo "#### $set, reordered chunks after a warm-up"
    echo
    echo "| strategy | hit rate | computed | TTFT p50 | same first token | KL mean | identical | ROUGE-L |"
    echo "|---|---|---|---|---|---|---|---|"
    local w=(--warmup "$D/warm.jsonl" --limit "$N")
    for s in full prefix fullreuse; do row "$s" "$STORIES" "$w2" "$s" "${w[@]}" "${q[@]}"; done
    for s in cacheblend fusionrag; do row "$s 0.15" "$STORIES" "$w2" "$s" "${w[@]}" "${q[@]}"; done
    for a in 0 0.5 1 2 3; do
      row "cachecraft alpha $a" "$STORIES" "$w2" cachecraft --cachecraft-alpha "$a" "${w[@]}" "${q[@]}"
    done
    row "cachecraft alpha 1, no focus cut" "$STORIES" "$w2" cachecraft --focus-window 0 "${w[@]}" "${q[@]}"
    rm -f "$D/warm.jsonl"
  done
}

speed() {
  qwen_model >/dev/null
  local n=$((N < 20 ? N : 20))
  echo "## Speed: qwen2-0.5b F16 (random weights), $n questions per set, top-5 chunks of 256 tokens"
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) threads; one request at a time"
  echo
  echo "Each strategy first serves the $n questions once (warm-up, unmeasured), then the same questions with"
  echo "their chunks in another order (measured): every chunk is cached, no prompt is. TTFT includes loads."
  for set in musique hotpotqa; do
    local f="$D/$set-256-shuffled-2.jsonl" warm="$D/$set-256-shuffled-1.jsonl"
    for seed in 1 2; do
      [ -f "$D/$set-256-shuffled-$seed.jsonl" ] || $BIN workload generate \
        --corpus "$SHARED/data/$set/${set}_train_corpus.json" --questions "$SHARED/data/$set/${set}_train.json" \
        --pattern dataset --top-k 5 --chunk-tokens 256 --overlap 0 --vocab "$QWEN" --shuffle-chunks \
        --seed "$seed" --out "$D/$set-256-shuffled-$seed.jsonl" >/dev/null
    done
    head -"$n" "$warm" >"$D/warm.jsonl"
    echo
    echo "### $set"
    echo
    echo "| strategy | hit rate | computed | TTFT p50 | TTFT p99 | prompt |"
    echo "|---|---|---|---|---|---|"
    local rows=("full" "prefix" "fullreuse" "cacheblend 0.15" "fusionrag 0.15" "cachecraft 1")
    for spec in "${rows[@]}"; do
      read -r s r <<<"$spec"
      row "$spec" "$QWEN" "$f" "$s" --recompute-ratio "${r:-0.15}" --cachecraft-alpha "${r:-1}" -n 1 \
        --limit "$n" --warmup "$D/warm.jsonl"
    done
    rm -f "$D/warm.jsonl"
  done
}

answers() {
  local qa=models/depcache-qa.gguf held=build/qa-model/data
  [ -f "$held/heldout-2-hop-documents.jsonl" ] || DATA_ONLY=heldout bash scripts/make_qa_model.sh >&2
  echo "## Answers: $qa on held-out document QA ($N questions per set, 3 documents each), greedy, KV f16"
  for hops in 1 2; do
    local f="$held/heldout-$hops-hop-documents.jsonl" f1_full="" f1_reuse=""
    echo
    echo "### $hops-hop questions"
    echo
    echo "| strategy | hit rate | computed | exact match | token F1 | normalized F1 | KL mean | identical |"
    echo "|---|---|---|---|---|---|---|---|"
    local rows=("full" "prefix" "fullreuse" "cacheblend 0.05" "cacheblend 0.15" "cacheblend 0.30" "fusionrag 0.05"
      "fusionrag 0.15" "fusionrag 0.30" "cachecraft 1" "fullreuse 0 --no-realign" "cacheblend 0.15 --no-realign")
    for spec in "${rows[@]}"; do
      local s r extra out em f1 summary
      read -r s r extra <<<"$spec"
      out=$($BIN run --serial -m "$qa" --requests "$f" --limit "$N" -s "$s" --recompute-ratio "${r:-0.15}" \
        --cachecraft-alpha "${r:-1}" -n 12 --fidelity -q $extra 2>/dev/null)
      em=$(sed -n 's/.* answers: .* exact (\(.*%\)), token F1 \([0-9.]*\).*/\1/p' <<<"$out")
      f1=$(sed -n 's/.* answers: .* exact (\(.*%\)), token F1 \([0-9.]*\).*/\2/p' <<<"$out")
      [ "$s" = full ] && f1_full=$f1
      [ "$spec" = fullreuse ] && f1_reuse=$f1
      summary=$(grep -E "^$s +[0-9]" <<<"$out")
      awk -v label="$spec" -v em="$em" -v f1="$f1" -v full="$f1_full" -v reuse="$f1_reuse" '{
        # Undefined where full and fullreuse are within 0.01 F1, as `run` says it.
        gap = full - reuse;
        norm = (full != "" && reuse != "" && (gap >= 0.01 || gap <= -0.01)) ? sprintf("%.3f", (f1 - reuse) / gap) : "undefined";
        printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", label, $12, $10, em, f1, norm, $(NF-2), $(NF-1);
      }' <<<"$summary"
    done
  done
}

case $WHAT in
  quality) quality ;;
  speed) speed ;;
  answers) answers ;;
  all) quality && echo && speed && echo && answers ;;
  *) echo "usage: bash bench/experiments/chunks.sh [quality|speed|answers|all] [requests]" >&2; exit 2 ;;
esac
