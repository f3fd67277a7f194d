#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) in the clang sanitizer build,
# build-asan/ (scripts/asan_build.sh), and runs them, each from its checked-in
# seeds in fuzz/corpus/<name>/.
#
#   scripts/fuzz.sh [SECONDS] [NAME...]   run each target SECONDS (default 120); inputs that
#                                         add coverage are kept in build-asan/fuzz/corpus/<name>/
#   scripts/fuzz.sh --ci [SECONDS]        the test command's stage: SECONDS each (default 20), new
#                                         inputs in a temporary folder, checked-in seeds untouched
#
# NAME is a target without "_fuzz" (gguf, tokenizer, pretokenizer, chat_template, jinja, openai,
# span_record, requests, kg, cluster_slots, kv_events); default all. FUZZ_BUILD=0 skips the build, FUZZ_BUILD=only
# builds and stops. FUZZ_RUNS=N also stops each target after N executions (whichever comes first);
# FUZZ_JOBS=N runs N targets at a time (default: one per core). Findings (crash-*, leak-*, timeout-*, oom-* inputs) go to
# build-asan/fuzz/findings/<name>/; reproduce one with `build-asan/fuzz/<name>_fuzz FILE`. Ends
# with executions and findings per target, and fails if any target found something.
set -euo pipefail
cd "$(dirname "$0")/.."

CI=0
if [ "${1:-}" = --ci ]; then
  CI=1
  shift
fi
SECONDS_PER_TARGET=${1:-$([ "$CI" = 1 ] && echo 20 || echo 120)}
[ $# -gt 0 ] && shift
ALL=(gguf tokenizer pretokenizer chat_template jinja openai span_record requests kg cluster_slots kv_events)
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=("${ALL[@]}")

if [ "${FUZZ_BUILD:-1}" != 0 ]; then
  bash scripts/asan_build.sh fuzz_targets
fi
[ "${FUZZ_BUILD:-1}" != only ] || exit 0

# Longest input per target: enough for the structures each one reads, small
# enough to keep executions fast.
max_len() {
  case $1 in
    gguf) echo 65536 ;;
    tokenizer | pretokenizer | chat_template | jinja) echo 4096 ;;
    *) echo 16384 ;;
  esac
}

# The tokenizer targets read real vocabularies from ../shared/tokenizers
# (DEPCACHE_SHARED overrides): without them they are skipped, or in strict
# mode (DEPCACHE_STRICT=1, as CI runs) they fail.
SHARED=${DEPCACHE_SHARED:-../shared}
needs_shared() { [ "$1" = pretokenizer ] || [ "$1" = chat_template ]; }

# What fails a run: crashes, leaks, timeouts and out-of-memory inputs.
# libFuzzer's slow-unit-* inputs are kept beside them to look at, not
# counted: their time is wall time, which a niced run behind other work inflates.
count_findings() {
  find "$1" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l
}

SCRATCH=""
[ "$CI" = 1 ] && SCRATCH=$(mktemp -d)
OUT=build-asan/fuzz
mkdir -p $OUT/logs
JOBS=${FUZZ_JOBS:-$(nproc)}
RESULTS=$(mktemp -d)
trap 'rm -rf "$RESULTS" ${SCRATCH:+"$SCRATCH"}' EXIT

# Runs one target; writes its summary line to $RESULTS/<name>.line, what it
# found to $RESULTS/<name>.found, and "failed" to $RESULTS/<name>.failed if it
# failed. Targets run side by side (FUZZ_JOBS, default one per core): each
# libFuzzer process uses one core.
run_target() {
  local name=$1 exe=$OUT/${1}_fuzz seeds=fuzz/corpus/$1 work findings log before status=0 execs rate new
  if needs_shared "$name" && [ ! -d "$SHARED/tokenizers" ]; then
    printf '%-16s %12s %8s %6s %s\n' "$name" - - - "not run: no $SHARED/tokenizers" >"$RESULTS/$name.line"
    [ "${DEPCACHE_STRICT:-0}" = 0 ] || echo failed >"$RESULTS/$name.failed"
    return 0
  fi
  if [ "$CI" = 1 ]; then work=$SCRATCH/$name; else work=$OUT/corpus/$name; fi
  findings=$OUT/findings/$name
  mkdir -p "$work" "$findings"
  local dict=() runs=()
  [ -f "fuzz/dict/$name.dict" ] && dict=(-dict="fuzz/dict/$name.dict")
  [ -z "${FUZZ_RUNS:-}" ] || runs=(-runs="$FUZZ_RUNS")
  log=$OUT/logs/$name.log
  before=$(count_findings "$findings")
  # New inputs go to the first folder; the checked-in seeds are only read.
  "$exe" -max_total_time="$SECONDS_PER_TARGET" "${runs[@]}" -max_len="$(max_len "$name")" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$findings/" "${dict[@]}" "$work" "$seeds" >"$log" 2>&1 || status=$?
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || true)
  # After a crash libFuzzer prints no final stats: the last progress line.
  [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#' || true)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  new=$(($(count_findings "$findings") - before))
  printf '%-16s %12s %8s %6s %s\n' "$name" "${execs:-?}" "${rate:--}" "$new" \
    "$([ "$status" = 0 ] || echo "exit $status")" >"$RESULTS/$name.line"
  if [ "$status" != 0 ] || [ "$new" != 0 ]; then
    echo failed >"$RESULTS/$name.failed"
    { echo "== ${name}_fuzz found something (log: $log):"
      grep -E '^==[0-9]+==ERROR|fuzz property violated|SUMMARY|Test unit written|threw' "$log" | head -20 | sed 's/^/   /' || true
    } >"$RESULTS/$name.found"
  fi
}

for name in "${NAMES[@]}"; do
  if [ ! -x "$OUT/${name}_fuzz" ] || [ ! -d "fuzz/corpus/$name" ]; then
    echo "no fuzz target or seed corpus named '$name' (targets: ${ALL[*]})" >&2
    exit 2
  fi
done
echo "== ${#NAMES[@]} targets, ${SECONDS_PER_TARGET}s each, $JOBS at a time (logs: $OUT/logs/)"
for name in "${NAMES[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  run_target "$name" &
done
wait
failed=0
echo "== fuzzing: ${SECONDS_PER_TARGET}s per target"
printf '%-16s %12s %8s %6s\n' target executions exec/s findings
for name in "${NAMES[@]}"; do
  cat "$RESULTS/$name.line" 2>/dev/null || printf '%-16s %12s %8s %6s %s\n' "$name" ? - - "no result"
  [ ! -f "$RESULTS/$name.found" ] || cat "$RESULTS/$name.found" >&2
  if [ -f "$RESULTS/$name.failed" ] || [ ! -f "$RESULTS/$name.line" ]; then failed=1; fi
done
exit $failed
