#!/usr/bin/env bash
# Runs the whole test suite: installs/builds (idempotent), then runs ctest on
# a Release build, the fuzz targets for a short while, ctest on an
# AddressSanitizer + UndefinedBehaviorSanitizer build, and the threaded tests
# on a ThreadSanitizer build.
# After each run it prints how many tests were skipped and why. With
# DEPCACHE_STRICT=1 (as .ci/run sets it) a test that cannot find what it needs
# (../shared, Redis, WordNet) fails instead of skipping, and a run with any
# skipped test fails, except tests skipped because this CPU lacks an
# instruction set (reason tagged "(cpu)"): no setup can add one.
set -euo pipefail
cd "$(dirname "$0")/.."

# Minutes since the start, printed with each stage: the builds are most of
# the time, and the log shows which one grew.
since_start() { printf '%d:%02d' $((SECONDS / 60)) $((SECONDS % 60)); }

bash scripts/setup.sh

JOBS=${JOBS:-$(nproc)}
STRICT=${DEPCACHE_STRICT:-0}
export DEPCACHE_STRICT=$STRICT

# ctest in build dir $1, labelled $2 (further arguments go to ctest); then
# the skip report.
run_ctest() {
  local dir=$1 label=$2 status=0
  shift 2
  ctest --test-dir "$dir" --output-on-failure -j "$JOBS" --output-junit junit.xml "$@" || status=$?
  local skipped
  if [ ! -f "$dir/junit.xml" ]; then
    echo "$label: ctest wrote no junit.xml; cannot tell what ran" >&2
    return 1
  fi
  skipped=$(grep -o 'skipped="[0-9]*"' "$dir/junit.xml" | head -1 | grep -o '[0-9]*')
  echo "== $label: $skipped tests skipped"
  grep -h '^\[skip-reason\]' "$dir/Testing/Temporary/LastTest.log" 2>/dev/null | sort -u | sed 's/^/   /' || true
  if [ "$status" -ne 0 ]; then return "$status"; fi
  # Tests skipped for want of a CPU feature, counted once each.
  local cpu
  # (grep finding nothing is not an error here: set -e with pipefail would
  # end the script silently.)
  cpu=$({ grep -h '^\[skip-reason\] .*: (cpu) ' "$dir/Testing/Temporary/LastTest.log" 2>/dev/null || true; } |
    sed 's/^\[skip-reason\] \(.*\): (cpu) .*/\1/' | sort -u | wc -l)
  [ "$cpu" = 0 ] || echo "== $label: $cpu of them for want of a CPU feature (not counted by strict mode)"
  if [ "$STRICT" != 0 ] && [ "$((skipped - cpu))" -gt 0 ]; then
    echo "strict mode: $((skipped - cpu)) tests skipped; every test must run" >&2
    return 1
  fi
}

# The Release build is kept free of -Wall -Wextra warnings; -Werror is not
# used, as GCC 12 reports false stringop-overflow warnings under ASan.
echo "== $(since_start) Release build (setup and build done): tests"
run_ctest build "Release"

# One clang build, build-asan/, with AddressSanitizer, UndefinedBehaviorSanitizer
# and libFuzzer's coverage serves both the tests and the fuzz targets
# (scripts/asan_build.sh): the library is compiled once for both.
echo "== $(since_start) Sanitizer build (clang: ASan + UBSan + fuzzing coverage)"
bash scripts/asan_build.sh

# Each fuzz target runs FUZZ_SECONDS from its checked-in seeds; any crash,
# leak, hang or broken property fails the stage.
echo "== $(since_start) Fuzz targets: ${FUZZ_SECONDS:-10}s each"
FUZZ_BUILD=0 bash scripts/fuzz.sh --ci "${FUZZ_SECONDS:-10}"

echo "== $(since_start) ASan + UBSan: tests"
# allocator_may_return_null: an allocation too large for memory throws
# std::bad_alloc, as it does without ASan (the KV assembly turns it into a
# clear error), instead of ASan aborting the process.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build-asan "ASan+UBSan"

# Threaded code under ThreadSanitizer: the build-tsan/ tree has one test
# binary, test_threaded, of the test files of threaded code
# (DEPCACHE_THREADED_TESTS in tests/CMakeLists.txt), and runs every test in it
# but the hostile chat template's, which is left to the other two builds: it
# bounds one render's memory and time, which ThreadSanitizer's shadow memory
# multiplies (60 MB of string took 1.7 s to write on a 2-core machine, and
# its server's RSS passed 1.2 GiB with 256 MiB of values), and the render
# runs on one thread.
echo "== $(since_start) ThreadSanitizer build"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON -DDEPCACHE_TSAN=ON \
  -DDEPCACHE_BENCH=OFF
cmake --build build-tsan --target depcache test_threaded
echo "== $(since_start) TSan: threaded tests"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1 \
  run_ctest build-tsan "TSan" -E '^ServerHostile\.AChatTemplateThatHoardsMemoryOrTimeGetsA400$'
echo "== $(since_start) all stages passed"
