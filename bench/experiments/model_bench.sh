#!/usr/bin/env bash
# Prompt-processing (pp) and generation (tg) throughput on the random-weight
# presets, in the table form of the leading C++ engine's bench tool. With
# --other, that tool (its llama-bench binary) runs on the same GGUF files and
# a ratio table follows.
#
#   bench/experiments/model_bench.sh [--preset qwen2-0.5b] [--types "f16 bf16 q8_0 q4_k"]
#                        [--threads 2] [--reps 3] [--prompts 128,512,2048]
#                        [--gen 64] [--other /path/to/llama-bench]
#
# Models are written once to build/bench-models/PRESET-TYPE.gguf.
set -euo pipefail
cd "$(dirname "$0")/../.."

preset=qwen2-0.5b types="f16 bf16 q8_0 q4_k" threads=2 reps=3 prompts=128,512,2048 gen=64 other=""
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --prompts) prompts=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --other) other=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "model_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ -n "$other" ] && [ ! -x "$other" ]; then
  echo "model_bench.sh: --other $other is not an executable" >&2
  exit 2
fi
[ -x build/depcache ] || { echo "model_bench.sh: build/depcache is missing; run scripts/setup.sh" >&2; exit 4; }

# Prints "test value" for every row of a markdown bench table on stdin,
# locating the columns by their header names.
table_values() {
  awk -F'|' '
    /\| *test *\|/ { for (i = 1; i <= NF; i++) { h = $i; gsub(/ /, "", h); if (h == "test") tc = i; if (h == "t/s") vc = i }; next }
    tc && vc && $tc ~ /[a-z]+[0-9]+/ { t = $tc; gsub(/ /, "", t); split($vc, v, " "); print t, v[1] }'
}

mkdir -p build/bench-models
ours=$(mktemp) theirs=$(mktemp)
trap 'rm -f "$ours" "$theirs"' EXIT
for type in $types; do
  model=build/bench-models/$preset-$type.gguf
  # Phi-3 files carry Phi-3's vocabulary: the other engine looks its special
  # tokens up by the model's name (scripts/fetch_llama_cpp.sh brings it).
  vocab=()
  case "$preset" in *phi3*) vocab=(--vocab-from build/third_party/llama.cpp/models/ggml-vocab-phi-3.gguf) ;; esac
  # Fallback-type notes are expected (e.g. 896-wide rows in Q4_K); errors still show.
  [ -f "$model" ] || ./build/depcache model new --preset "$preset" --type "$type" "${vocab[@]}" -o "$model" \
    2> >(grep -v '^note:' >&2)
  out=$(./build/depcache bench-model -m "$model" -p "$prompts" -n "$gen" -t "$threads" -r "$reps")
  echo "$out"
  echo "$out" | table_values | sed "s/^/$type /" >>"$ours"
  if [ -n "$other" ]; then
    out=$("$other" -m "$model" -p "$prompts" -n "$gen" -t "$threads" -r "$reps" 2>/dev/null)
    echo "$out"
    echo "$out" | table_values | sed "s/^/$type /" >>"$theirs"
  fi
done

if [ -n "$other" ]; then
  echo
  echo "| type | test | depcache t/s | other t/s | ratio |"
  echo "| ---- | ---- | -----------: | --------: | ----: |"
  awk 'NR == FNR { other[$1 " " $2] = $3; next }
       { k = $1 " " $2; o = other[k];
         printf "| %s | %s | %.2f | %s | %s |\n", $1, $2, $3, (o == "" ? "-" : sprintf("%.2f", o)),
                (o == "" || o == 0 ? "-" : sprintf("%.2f", $3 / o)) }' "$theirs" "$ours"
fi
