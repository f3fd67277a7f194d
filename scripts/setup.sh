#!/usr/bin/env bash
# Installs what depcache needs on Debian 12, then configures and builds it.
# Safe to run again: apt-get skips what is present and CMake rebuilds only what changed.
set -euo pipefail

cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  clang libclang-rt-14-dev      # libFuzzer and sanitizer runtimes
  libpcre2-dev                  # Unicode-aware pre-tokenizer regexes (\p{L}, \p{N}, look-ahead)
  nlohmann-json3-dev            # JSON output (bench --json) and request files
  libcli11-dev                  # command-line parsing
  libfmt-dev                    # formatting
  libgtest-dev libgmock-dev     # tests
  libbenchmark-dev              # kernel micro-benchmarks
  wordnet-base                  # WordNet 3.0 database: the real knowledge graph `kg import --wordnet` reads
  gnuplot-nox                   # the PNG plot of `simulate --grid`
  libhiredis-dev                # Redis client for the shared remote KV tier
  libboost-dev                  # Boost.CRC: the CRC16 that maps a key to its Redis Cluster slot
  libssl-dev                    # libcrypto's HMAC-SHA256: span records in the shared tiers are keyed
  libxxhash-dev                 # XXH3: model fingerprints, content keys, record and file checksums
  redis-server                  # a real Redis for the remote tier's tests (started on a loopback port)
  haproxy                       # the proxy in front of serve replicas (depcache route writes its config and Lua hook)
  linux-perf                    # bench/experiments/profile.sh: where the time of a run goes
  libcpp-httplib-dev            # HTTP/1.1 server of `depcache serve` (threads, chunked streaming)
  libopenblas-dev               # matrix products of the trainer (forward and backward)
  curl                          # a real HTTP client for the server's tests
  git                           # unpacks the leading C++ engine's source (scripts/fetch_llama_cpp.sh)
  nodejs                        # runs the official `openai` client in the server's tests (tests/client)
  python3-jinja2                # renders real chat templates, the chat tests' independent oracle
)

# Benchmark-only: PyTorch, to compare the trainer's throughput with
# (bench/experiments/train_vs_torch.sh).
if [ "${DEPCACHE_BENCH_EXTRAS:-0}" != 0 ]; then PACKAGES+=(python3-torch); fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm comes with Debian's nodejs in its own package, but inside other builds of
# nodejs (which conflict with Debian's npm): ask for it only when it is absent.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The official OpenAI client for the server's tests, at the version the lock
# file names, into tests/client/node_modules (again only when the lock changed).
if [ ! -f tests/client/node_modules/.package-lock.json ] ||
  [ tests/client/package-lock.json -nt tests/client/node_modules/.package-lock.json ]; then
  (cd tests/client && npm ci --no-audit --no-fund --loglevel=error)
fi

# The leading C++ engine's source (from the npm package node-llama-cpp), whose
# vocabulary test vectors and chat templates the tests read; not committed.
scripts/fetch_llama_cpp.sh

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR"
