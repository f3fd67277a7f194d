#!/usr/bin/env bash
# Where the time of a bench-model run goes, by kernel family: perf samples
# (cpu-clock, both threads) of one run, grouped as matmul (panel kernels and
# activation quantization), attention, model loading (packing, page
# clearing), thread pool (waiting between loops) and the rest.
#
#   bench/experiments/profile.sh MODEL.gguf [bench-model options, default: -p 512 -n 0]
#   e.g. bench/experiments/profile.sh build/bench-models/qwen2-0.5b-f16.gguf -p 2048 -n 0
#
# Needs perf (Debian's linux-perf, installed by scripts/setup.sh). For
# instruction counts that do not depend on machine load, run the same
# command under valgrind --tool=callgrind instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 2; }
model=$1
shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-p 512 -n 0)
command -v perf >/dev/null || { echo "profile.sh: perf not found (apt-get install linux-perf)" >&2; exit 4; }
data=$(mktemp)
trap 'rm -f "$data"' EXIT
perf record -q -e cpu-clock -o "$data" -- ./build/depcache bench-model -m "$model" -t 2 -r 1 "${args[@]}"
perf report -i "$data" --no-children --sort symbol --stdio 2>/dev/null | awk '
  /^ +[0-9.]+%/ {
    pct = $1; sub(/%/, "", pct); sym = $0
    if (sym ~ /tile|panel_kernel|quantize_activations|matmul/) g = "matmul"
    else if (sym ~ /attend_lanes|attention/) g = "attention"
    else if (sym ~ /PackedMatrix|clear_page|pack_|GgufFile|page_fault|folio/) g = "loading"
    else if (sym ~ /ThreadPool|sched_yield|pvm_irq/) g = "thread pool"
    else g = "other"
    share[g] += pct
    if (g == "other" && pct >= 0.5) top = top sprintf("    %6.2f%%  %s\n", pct, substr(sym, index(sym, "]") + 2, 70))
  }
  END {
    run = 100 - share["loading"]
    printf "share of samples (and of the run without loading):\n"
    n = split("matmul attention thread\\ pool other loading", order, " ")
    split("matmul,attention,thread pool,other,loading", names, ",")
    for (i = 1; i <= 5; i++) {
      g = names[i]
      printf "  %-12s %6.2f%%", g, share[g]
      if (g != "loading" && run > 0) printf "  (%5.1f%%)", 100 * share[g] / run
      printf "\n"
    }
    if (top != "") printf "largest others:\n%s", top
  }'
