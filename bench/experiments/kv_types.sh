#!/usr/bin/env bash
# f16 against q8_0 KV on the GraphRAG Zipf stream (DepCache, one request at a
# time) under a fixed hot-tier budget, alone and over a disk or a Redis tier:
# TTFT, hit rate, tokens and bytes read from the lower tier, bytes it holds
# per request. Prints one Markdown table.
#   bash bench/experiments/kv_types.sh [requests] [hot-MiB]
# Uses the demo's model shape and WordNet graph (made under build/bench-kv-types);
# Redis runs on a free loopback port for the Redis rows.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
N=${1:-150}
HOT=${2:-3.6}
D=build/bench-kv-types
mkdir -p "$D"
MODEL=$(demo_shape_model)
REQ=$(graphrag_stream "$D" "$N")

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$D/redis.log" 2>&1 &
REDIS_PID=$!
trap 'kill $REDIS_PID 2>/dev/null || true' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

run() {  # tier label, kv type, extra options -> one table row
  local tier=$1 kv=$2
  shift 2
  rm -rf "$D/cache-dir"
  redis-cli -p "$PORT" flushall >/dev/null
  SENT_BEFORE=$(redis-cli -p "$PORT" info stats | awk -F: '/^total_net_output_bytes:/ {print $2+0}')
  local out held
  out=$($BIN run --serial -m "$MODEL" --requests "$REQ" -s depcache --scheme depth -q --cache-mib "$HOT" \
    --kv-type "$kv" "$@" 2>/dev/null)
  local sent=-1
  case $tier in
    disk) held=$(du -sb "$D/cache-dir" | cut -f1) ;;
    Redis)
      held=$(redis-cli -p "$PORT" info memory | awk -F: '/^used_memory_dataset:/ {print $2+0}')
      # What the clients read: the bytes Redis sent, less this script's own commands' replies (small).
      sent=$(redis-cli -p "$PORT" info stats | awk -F: '/^total_net_output_bytes:/ {print $2+0}')
      sent=$((sent - SENT_BEFORE))
      ;;
    *) held=0 ;;
  esac
  local summary tiers
  summary=$(grep -E '^depcache +[0-9]' <<<"$out")
  tiers=$(grep -E '^depcache +tiers:' <<<"$out" || true)
  awk -v tier="$tier" -v kv="$kv" -v tiers="$tiers" -v held="$held" -v sent="$sent" -v n="$N" '{
    lower = "-"; mib = "-"
    if (tiers != "") {
      split(tiers, t, /[ ;\/]+/)
      for (i = 1; t[i] != ""; ++i) {
        if ((t[i] == "disk" || t[i] == "remote") && lower == "-" && t[i + 1] ~ /^[0-9]+$/ && t[i + 1] > 0) lower = t[i + 1]
        if (t[i] == "loaded") mib = t[i + 1]
      }
    }
    read = (mib == "-") ? "-" : sprintf("%.1f", mib * 1024 / n)
    if (sent >= 0) read = sprintf("%.1f", sent / 1024 / n)
    printf "| %s | %s | %s | %s | %s | %s | %s | %.1f |\n", tier, kv, $3, $4, $12, lower, read, held / 1024 / n
  }' <<<"$summary"
}

echo "CPU: $CPU; hot tier ${HOT} MiB; $N Zipf GraphRAG requests, depcache, one at a time; model $MODEL"
echo
echo "| lower tier | KV | TTFT p50 | TTFT p99 | hit rate | tokens from lower tier | KiB read/req | KiB held/req |"
echo "|---|---|---|---|---|---|---|---|"
for kv in f16 q8_0; do run none "$kv"; done
for kv in f16 q8_0; do run disk "$kv" --cache-dir "$D/cache-dir"; done
for kv in f16 q8_0; do run Redis "$kv" --redis "127.0.0.1:$PORT"; done
