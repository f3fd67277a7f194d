#!/usr/bin/env bash
# End-to-end TTFT of DepCache per replacement policy with a hot tier too small
# for the working set, alone and backed by a host tier, a disk tier or the host
# tier with prefetching. Prints one Markdown table.
#   bash bench/experiments/tiers.sh [requests] [hot-MiB]
# Uses the demo's model shape and WordNet graph (made under build/bench-tiers).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
N=${1:-150}
HOT=${2:-3.6}
D=build/bench-tiers
mkdir -p "$D"
MODEL=$(demo_shape_model)
REQ=$(graphrag_stream "$D" "$N")

run() {  # label, extra options -> one table row
  local label=$1 policy=$2
  shift 2
  rm -rf "$D/cache-dir"
  local out
  out=$($BIN run --serial -m "$MODEL" --requests "$REQ" -s depcache --scheme depth -q --cache-mib "${RUN_HOT:-$HOT}" --policy "$policy" "$@" 2>/dev/null)
  local summary tiers
  summary=$(grep -E '^depcache +[0-9]' <<<"$out")
  tiers=$(grep -E '^depcache +tiers:' <<<"$out" || true)
  awk -v label="$label" -v policy="$policy" -v tiers="$tiers" '{
    n = split(tiers, t, /[ ;]+/); host = disk = "-"
    for (i = 1; i <= n; ++i) { if (t[i] == "host" && host == "-") host = t[i + 1]; if (t[i] == "disk" && disk == "-") disk = t[i + 1] }
    printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", label, policy, $3, $4, $5, $12, host, disk
  }' <<<"$summary"
}

echo "hot tier ${HOT} MiB; $N Zipf requests; working set: see 'run' without --cache-mib"
echo
echo "| tiers | policy | TTFT p50 | TTFT p99 | TTFT mean | hit rate | tokens from host | tokens from disk |"
echo "|---|---|---|---|---|---|---|---|"
for p in lru lfu gdsf pgdsf lacr; do run "hot only" $p; done
for p in lru lfu gdsf pgdsf lacr; do run "hot + host 64 MiB" $p --host-mib 64; done
for p in lru lfu gdsf pgdsf lacr; do run "hot + disk" $p --cache-dir "$D/cache-dir"; done
for p in lru lacr; do run "hot + host + prefetch 2" $p --host-mib 64 --prefetch 2; done
RUN_HOT=4096 run "unbounded hot (reference)" lru
