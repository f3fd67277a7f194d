#!/usr/bin/env bash
# Builds the leading C++ engine (llama.cpp, from the source node-llama-cpp
# carries; scripts/fetch_llama_cpp.sh) as a second, independent oracle: its
# llama-bench and llama-tokenize tools, and bench/experiments/oracle/llama_probe.cpp (ids,
# logits and greedy continuation for a file and a text). Not part of the test
# command; bench/experiments/oracle_check.sh and bench/experiments/model_bench.sh --other use it.
# Usage: bench/experiments/llama_cpp.sh   (prints the folder of the binaries)
set -euo pipefail
cd "$(dirname "$0")/../.."

scripts/fetch_llama_cpp.sh >&2
SRC=build/third_party/llama.cpp
OUT=build/third_party/llama.cpp-build
JOBS=${JOBS:-$(nproc)}

cmake -S "$SRC" -B "$OUT" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >&2
nice cmake --build "$OUT" -j "$JOBS" --target llama llama-bench llama-tokenize >&2

# The probe: our own program against the engine's public C API.
libs=$(find "$OUT" -name 'libllama.a' -o -name 'libggml*.a' | sort -r | tr '\n' ' ')
nice g++ -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" bench/experiments/oracle/llama_probe.cpp \
  -Wl,--start-group $libs -Wl,--end-group -fopenmp -lpthread -ldl -lm -o "$OUT/bin/llama_probe" >&2
echo "$OUT/bin"
