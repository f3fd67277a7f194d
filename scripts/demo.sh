#!/usr/bin/env bash
# Installs and builds depcache, then runs the main job on an embedded default:
# GraphRAG over WordNet (from Debian's wordnet-base) with a random-weight
# model the project makes itself, comparing full prefill, prefix caching and
# DepCache (dependency attention + subgraph KV reuse) on a Zipfian stream;
# then the shipped question-answering models answer questions about a world
# they never saw.
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
# The question-answering model the project trains and ships, on a world it
# never saw: exact match of its greedy answers per strategy.
QA=models/depcache-qa.gguf
[ -f "$D/qa-world.dkg" ] || $BIN kg import --synthetic --entities 300 --name-pool 1000 --seed 9101 \
  -o "$D/qa-world.dkg" >/dev/null
[ -f "$D/qa.jsonl" ] || $BIN workload generate --kg "$D/qa-world.dkg" --pattern dataset --qa-items 60 \
  --entities-per-request 3 --paths-per-entity 9 --min-paths 1 --hops 2 --question-hops 1 --seed 77 \
  --question-form cloze --out "$D/qa.jsonl" >/dev/null
$BIN run -m "$QA" --requests "$D/qa.jsonl" --strategy full,prefix,depcache -n 12 --quiet
# The same facts as documents of sentences, one per entity (chunk RAG):
# full attention, each document's cache reused as computed alone
# (fullreuse), and FusionRAG recomputing 15% of the chunk tokens.
[ -f "$D/qa-documents.jsonl" ] || $BIN workload generate --kg "$D/qa-world.dkg" --pattern dataset \
  --qa-items 60 --entities-per-request 3 --paths-per-entity 9 --min-paths 1 --hops 2 --question-hops 1 \
  --seed 77 --question-form cloze --context documents --out "$D/qa-documents.jsonl" >/dev/null
$BIN run -m "$QA" --requests "$D/qa-documents.jsonl" --strategy full,fullreuse,fusionrag -n 12 --quiet
# The first of the path questions through `generate`: the prompt's last line
# (the cloze) with the model's greedy answer after it, then the judgement.
$BIN generate -m "$QA" --request "$D/qa.jsonl" --line 1 -n 12 --temp 0 2>&1 | grep -E -- "-> |^answer" | tail -2
# Its copy fine-tuned under dependency attention (depth positions), which
# depcache serves: with subtree reuse, and computing every subtree afresh.
$BIN run -m models/depcache-qa-depth.gguf --requests "$D/qa.jsonl" --strategy depcache -n 12 --quiet
$BIN run -m models/depcache-qa-depth.gguf --requests "$D/qa.jsonl" --strategy depcache --no-reuse -n 12 --quiet
# The copy fine-tuned with sequential positions: computing every subtree
# afresh, then with reuse, which is approximate under sequential positions
# (a cached tree sits at another offset in a later prompt).
$BIN run -m models/depcache-qa-sequential.gguf --requests "$D/qa.jsonl" --strategy depcache --no-reuse -n 12 --quiet
$BIN run -m models/depcache-qa-sequential.gguf --requests "$D/qa.jsonl" --strategy depcache -n 12 --quiet
# The copy fine-tuned with sequential positions and trees that see only
# themselves: reuse re-encodes a moved tree exactly, so it answers as
# computing afresh does (with reuse, then without).
$BIN run -m models/depcache-qa-alone.gguf --requests "$D/qa.jsonl" --strategy depcache -n 12 --quiet
$BIN run -m models/depcache-qa-alone.gguf --requests "$D/qa.jsonl" --strategy depcache --no-reuse -n 12 --quiet
# With the reference material beside the clone, also show a real trained model.
STORIES=../shared/models/stories260K-f32.v1.gguf
if [ -f "$STORIES" ]; then
  $BIN generate -m "$STORIES" -p "Once upon a time" -n 60 --temp 0
fi
