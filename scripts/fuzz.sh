#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for SECONDS (default 120).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-120}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEPCACHE_FUZZ=ON \
  -DDEPCACHE_TESTS=OFF -DDEPCACHE_BENCH=OFF
cmake --build build-fuzz --target gguf_fuzz tokenizer_fuzz
mkdir -p build-fuzz/corpus/gguf build-fuzz/corpus/tokenizer
# Seed the GGUF corpus with a small valid model.
[ -f build-fuzz/corpus/gguf/seed.gguf ] || ./build/depcache model new --preset tiny --layers 1 -o build-fuzz/corpus/gguf/seed.gguf >/dev/null
for t in gguf tokenizer; do
  echo "== ${t}_fuzz for ${SECONDS_PER_TARGET}s"
  ./build-fuzz/fuzz/${t}_fuzz -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 -print_final_stats=1 build-fuzz/corpus/$t
done
