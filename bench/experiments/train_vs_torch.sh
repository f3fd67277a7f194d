#!/usr/bin/env bash
# Training throughput of the trainer (bench_kernels' train/step benchmarks)
# against Debian's PyTorch on the same model shapes, batches and thread
# count. PyTorch is a benchmark-only dependency: DEPCACHE_BENCH_EXTRAS=1 bash
# scripts/setup.sh installs python3-torch.
#   bash bench/experiments/train_vs_torch.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
echo "CPU: $CPU, 2 threads"
build/bench/bench_kernels --benchmark_filter='^train/' --benchmark_counters_tabular=true
PY=/usr/bin/python3  # Debian's, where python3-torch is installed
"$PY" -c 'import torch' 2>/dev/null || { echo "python3-torch is missing: DEPCACHE_BENCH_EXTRAS=1 bash scripts/setup.sh" >&2; exit 1; }
"$PY" bench/experiments/train_torch.py 128 4 4 352 32 256 2 10
"$PY" bench/experiments/train_torch.py 128 4 4 352 16 160 2 20 4096
"$PY" bench/experiments/train_torch.py 256 6 8 704 16 512 2 5
