#!/usr/bin/env bash
# Installs and builds depcache, then runs the main job on an embedded default:
# a random-weight model made by the project itself.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
MODEL=build/demo-model.gguf
[ -f "$MODEL" ] || ./build/depcache model new --preset tiny --layers 4 --embd 256 --heads 8 --heads-kv 4 --ff 640 \
  --type q8_0 --seed 1 -o "$MODEL"
./build/depcache generate -m "$MODEL" -p "Retrieval-augmented generation reuses" -n 32 --seed 1
./build/depcache bench-model -m "$MODEL" -p 128 -n 32 -r 2
# With the reference material beside the clone, also show a real trained model.
STORIES=../shared/models/stories260K-f32.v1.gguf
if [ -f "$STORIES" ]; then
  ./build/depcache generate -m "$STORIES" -p "Once upon a time" -n 60 --temp 0
fi
