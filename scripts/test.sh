#!/usr/bin/env bash
# Runs the whole test suite: installs/builds (idempotent), then runs ctest on
# a Release build and on an AddressSanitizer + UndefinedBehaviorSanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

JOBS=${JOBS:-$(nproc)}
# The Release build is kept free of -Wall -Wextra warnings; -Werror is not
# used, as GCC 12 reports false stringop-overflow warnings under ASan.
echo "== Release build: tests"
ctest --test-dir build --output-on-failure -j "$JOBS"

echo "== Sanitizer build (ASan + UBSan): tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEPCACHE_SANITIZE=ON -DDEPCACHE_BENCH=OFF
cmake --build build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$JOBS"
