#!/usr/bin/env bash
# Brings the leading C++ engine's source (llama.cpp, as the npm package
# node-llama-cpp carries it in llama/gitRelease.bundle) into the build folder.
# The tests read its vocabulary test vectors (models/ggml-vocab-*.gguf with
# .inp/.out) and chat templates (models/templates/*.jinja); bench/experiments/llama_cpp.sh
# builds it as a second oracle. Nothing of it is committed.
# Usage: scripts/fetch_llama_cpp.sh [DEST]   (default: build/third_party)
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=3.22.1
DEST=${1:-build/third_party}
SRC="$DEST/llama.cpp"
STAMP="$SRC/.node-llama-cpp-$VERSION"

if [ -f "$STAMP" ]; then exit 0; fi
mkdir -p "$DEST"
tmp=$(mktemp -d "$DEST/fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "fetch_llama_cpp.sh: $*" >&2; exit 1; }
(cd "$tmp" && npm pack --silent "node-llama-cpp@$VERSION" >/dev/null) ||
  fail "npm could not fetch node-llama-cpp@$VERSION from the npm registry"
tar -xzf "$tmp/node-llama-cpp-$VERSION.tgz" -C "$tmp" package/llama/gitRelease.bundle ||
  fail "node-llama-cpp-$VERSION.tgz holds no llama/gitRelease.bundle"
rm -rf "$SRC"
command -v git >/dev/null || fail "git is needed to unpack llama/gitRelease.bundle (scripts/setup.sh installs it)"
git clone --quiet "$tmp/package/llama/gitRelease.bundle" "$SRC" || fail "git could not clone the bundle into $SRC"
touch "$STAMP"
echo "llama.cpp source of node-llama-cpp $VERSION in $SRC"
