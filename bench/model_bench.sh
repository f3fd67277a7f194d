#!/usr/bin/env bash
# Prompt-processing and generation throughput on the random-weight presets,
# in the form of the leading C++ engine's bench tool. Usage:
#   bench/model_bench.sh [PRESET] [TYPES] [THREADS]
# e.g. bench/model_bench.sh qwen2-0.5b "f16 q8_0" 2
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-qwen2-0.5b}
TYPES=${2:-"f16 q8_0"}
THREADS=${3:-2}
mkdir -p build/bench-models
for type in $TYPES; do
  model=build/bench-models/$PRESET-$type.gguf
  [ -f "$model" ] || ./build/depcache model new --preset "$PRESET" --type "$type" -o "$model"
  ./build/depcache bench-model -m "$model" -p 128,512,2048 -n 64 -t "$THREADS" -r 2
done
