#!/usr/bin/env bash
# The remote tier's fetch time per MiB: one Redis against a Redis Cluster of
# three masters (Debian's redis-server, loopback, no persistence), 64 blocks
# of 16 KiB and of 256 KiB fetched together (bench_kernels
# --benchmark_filter=remote_fetch). Prints the benchmark table and ms per MiB.
#   bash bench/experiments/redis_cluster.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
D=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$D"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() {  # port, extra options...
  local p=$1
  shift
  redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$D" "$@" >"$D/redis-$p.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && return; sleep 0.05; done
}
SINGLE=$(port)
start "$SINGLE"
NODES=()
for i in 1 2 3; do
  p=$(port)
  start "$p" --cluster-enabled yes --cluster-config-file "$D/nodes-$p.conf" --cluster-port "$(port)"
  NODES+=("127.0.0.1:$p")
done
redis-cli --cluster create "${NODES[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
for _ in $(seq 1 100); do
  redis-cli -p "${NODES[0]#*:}" cluster info | grep -q cluster_state:ok && break
  sleep 0.1
done
echo "CPU: $CPU"
DEPCACHE_BENCH_REDIS="127.0.0.1:$SINGLE" DEPCACHE_BENCH_REDIS_CLUSTER=$(IFS=,; echo "${NODES[*]}") \
  build/bench/bench_kernels --benchmark_filter=remote_fetch --benchmark_min_time=1 \
  --benchmark_counters_tabular=true | tee "$D/out.txt"
# Time of one fetch of 64 blocks of ARG bytes, per MiB fetched.
awk '/^BM_remote_fetch/ { split($1, p, "/"); mib = 64 * p[2] / 1048576; printf "%s: %.2f ms per MiB\n", $1, $2 / mib }' "$D/out.txt"
