#!/usr/bin/env bash
# Configures and builds build-asan/: one clang build with AddressSanitizer,
# UndefinedBehaviorSanitizer and libFuzzer's coverage, which serves both the
# test suite under the sanitizers and the fuzz targets (fuzz/), so the library
# is compiled once for both.
#
#   scripts/asan_build.sh [TARGET...]   build these targets (default: all)
#
# Unity build (CMake batches of sources in one unit): the headers every file
# includes (fmt, JSON, CLI11, GoogleTest) are parsed once per batch.
set -euo pipefail
cd "$(dirname "$0")/.."

# A tree configured earlier with another compiler cannot switch in place.
if [ -f build-asan/CMakeCache.txt ] && ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++' build-asan/CMakeCache.txt; then
  rm -rf build-asan
fi
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON \
  -DDEPCACHE_SANITIZE=ON -DDEPCACHE_FUZZ=ON -DDEPCACHE_BENCH=OFF >/dev/null
if [ $# -gt 0 ]; then
  cmake --build build-asan --target "$@"
else
  cmake --build build-asan
fi
