#!/usr/bin/env bash
# Layer-wise preload (Cache-Craft) against whole loads, after a restart: a
# first process serves a Zipf GraphRAG stream with a disk tier and leaves
# every span on disk; then each mode serves the same stream again from its
# own copy of that directory (hot tier large enough that a span is read from
# disk once). Prints one Markdown table per model: TTFT, the time matches
# spent reading (whole spans, or the layers read first) and the time passes
# waited for layers still being read. Every run computes each prompt in one
# pass (--batch-tokens 4096), as a pass placing layered loads always does, so
# the modes differ only in how spans are read.
#   bash bench/experiments/layer_preload.sh [requests]
# COLD=1: the copied span files are dropped from the page cache before each
# run (dd iflag=nocache), so matches read from the device.
# Models (made under build/bench-layer-preload): the tiers benchmark's shape
# (4 layers) and a deeper one (24 layers, qwen2-0.5b's depth and KV width).
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-120}
BIN=./build/depcache
D=build/bench-layer-preload
mkdir -p "$D"
[ -f "$D/shallow.gguf" ] || $BIN model new --preset tiny --layers 4 --embd 256 --heads 4 --heads-kv 2 \
  --ff 768 --ctx 32768 --type f16 --seed 1 -o "$D/shallow.gguf" >/dev/null
[ -f "$D/deep.gguf" ] || $BIN model new --preset tiny --layers 24 --embd 512 --heads 8 --heads-kv 2 \
  --ff 1536 --ctx 32768 --type f16 --seed 1 -o "$D/deep.gguf" >/dev/null
$BIN kg stats --kg "$D/wordnet.dkg" >/dev/null 2>&1 || $BIN kg import --wordnet --out "$D/wordnet.dkg" >/dev/null
REQ="$D/requests-$N.jsonl"
[ -f "$REQ" ] || $BIN workload generate --kg "$D/wordnet.dkg" --pattern zipf --requests "$N" --qa-items 100 \
  --paths-per-entity 10 --seed 1 --out "$REQ" >/dev/null

for model in shallow deep; do
  rm -rf "$D/seed-$model"
  $BIN run --serial -m "$D/$model.gguf" --requests "$REQ" -s depcache --scheme depth -q \
    --cache-dir "$D/seed-$model" >/dev/null 2>&1
  echo "### $model model ($(du -sh "$D/seed-$model" | cut -f1) of spans on disk)"
  echo
  echo "| --layer-preload | TTFT p50 | TTFT p99 | TTFT mean | tokens from disk | spans layer by layer | read in match | waited for layers |"
  echo "|---|---|---|---|---|---|---|---|"
  for mode in off 1 4 24 auto; do
    rm -rf "$D/cache"
    cp -r "$D/seed-$model" "$D/cache"
    if [ "${COLD:-0}" = 1 ]; then
      sync
      for f in "$D"/cache/*; do dd if="$f" iflag=nocache count=0 status=none; done
    fi
    out=$($BIN run --serial -m "$D/$model.gguf" --requests "$REQ" -s depcache --scheme depth -q \
      --cache-dir "$D/cache" --layer-preload "$mode" --batch-tokens 4096 2>/dev/null)
    summary=$(grep -E '^depcache +[0-9]' <<<"$out")
    tiers=$(grep -E '^depcache +tiers:' <<<"$out")
    disk=$(sed -E 's/.* disk ([0-9]+) \/ remote.*/\1/' <<<"$tiers")
    read_ms=$(sed -E 's/.*MiB in ([0-9.]+) ms.*/\1/' <<<"$tiers")
    spans=$(sed -E 's/.*\(([0-9]+) spans layer by layer.*/\1/' <<<"$tiers")
    waited=$(sed -E 's/.*, ([0-9.]+) ms waited for layers.*/\1/' <<<"$tiers")
    awk -v mode="$mode" -v disk="$disk" -v r="$read_ms" -v s="$spans" -v w="$waited" \
      '{ printf "| %s | %s | %s | %s | %s | %s | %s ms | %s ms |\n", mode, $3, $4, $5, disk, s, r, w }' \
      <<<"$summary"
  done
  echo
done
rm -rf "$D/cache"
