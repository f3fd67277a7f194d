#!/usr/bin/env bash
# Each seed system at its own defaults (strategy/profile.h) against all of
# them at one policy (LRU, FIFO, no host tier), side by side on one GraphRAG
# stream under a tight hot tier, where the replacement policy decides what
# is reused: WordNet, Zipf, N requests of 10 entities x <= 10 two-hop paths,
# the demo's model shape (llama, 4 layers, 256 embd, f16), one request at a
# time, 4 generated tokens each.
#   bash bench/experiments/profiles.sh [N] [CACHE_MIB]     (default: 120 requests, 4 MiB)
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
N=${1:-120}
MIB=${2:-4}
D=build/bench-profiles
mkdir -p "$D"
MODEL=$(demo_shape_model)
$BIN kg stats --kg "$D/wordnet.dkg" >/dev/null 2>&1 || $BIN kg import --wordnet --out "$D/wordnet.dkg" >/dev/null
[ -f "$D/requests-$N.jsonl" ] || $BIN workload generate --kg "$D/wordnet.dkg" --pattern zipf --requests "$N" \
  --qa-items 100 --paths-per-entity 10 --seed 1 --out "$D/requests-$N.jsonl" >/dev/null
echo "CPU: $CPU, 2 threads; $N requests; hot tier $MIB MiB"
STRATEGIES=full,prefix,ragcache,depcache,cachecraft
RUN=($BIN run -m "$MODEL" --requests "$D/requests-$N.jsonl" -s "$STRATEGIES" -t 2 -n 4 --serial
  --cache-mib "$MIB")
ROWS="^\\[|^strategy|^(full|prefix|ragcache|depcache|cachecraft) +$N "
echo "## each system at its own defaults"
"${RUN[@]}" -q 2>/dev/null | grep -E "$ROWS"
echo "## every system at LRU, FIFO, no host tier"
"${RUN[@]}" -q --policy lru --scheduler fifo --host-mib 0 2>/dev/null | grep -E "$ROWS"
