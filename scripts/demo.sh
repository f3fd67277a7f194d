#!/usr/bin/env bash
# Installs and builds depcache, then runs the main job on an embedded default:
# GraphRAG over WordNet (from Debian's wordnet-base) with a random-weight
# model the project makes itself, comparing full prefill, prefix caching and
# DepCache (dependency attention + subgraph KV reuse) on a Zipfian stream.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
D=build/demo
mkdir -p "$D"
BIN=./build/depcache
# A small Llama shape: 4 layers, 256 embd, 4 heads of 64 with 2 KV heads, f16.
[ -f "$D/model.gguf" ] || $BIN model new --preset tiny --layers 4 --embd 256 --heads 4 --heads-kv 2 --ff 768 \
  --ctx 32768 --type f16 --seed 1 -o "$D/model.gguf"
$BIN kg stats --kg "$D/wordnet.dkg" >/dev/null 2>&1 || $BIN kg import --wordnet --out "$D/wordnet.dkg"
# 30 requests, each: one question + 10 entities x up to 10 two-hop relation paths.
[ -f "$D/requests.jsonl" ] || $BIN workload generate --kg "$D/wordnet.dkg" --pattern zipf --requests 30 \
  --qa-items 100 --paths-per-entity 10 --seed 1 --out "$D/requests.jsonl"
$BIN workload stats --requests "$D/requests.jsonl"
$BIN run -m "$D/model.gguf" --requests "$D/requests.jsonl" --strategy full,prefix,depcache --serial --quiet
# With the reference material beside the clone, also show a real trained model.
STORIES=../shared/models/stories260K-f32.v1.gguf
if [ -f "$STORIES" ]; then
  $BIN generate -m "$STORIES" -p "Once upon a time" -n 60 --temp 0
fi
