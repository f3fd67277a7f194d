# Sourced by the experiment scripts, from the repository root: the binary,
# the CPU's name (said beside every figure), and the models they run,
# written once into build/bench-models/ and shared by every script that
# asks for the same one.
BIN=${BIN:-./build/depcache}
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)

# bench_model NAME [model new options...]: prints build/bench-models/NAME.gguf,
# written with those options first if it is missing.
bench_model() {
  local name=$1
  shift
  local file=build/bench-models/$name.gguf
  mkdir -p build/bench-models
  [ -f "$file" ] || "$BIN" model new "$@" -o "$file" >/dev/null
  echo "$file"
}

# The shapes most experiments run: the qwen2-0.5b preset in F16 (random
# weights), and the demo's small llama (4 layers, 256 embd, 4 heads of 64
# with 2 KV heads, f16).
qwen_model() { bench_model qwen2-0.5b-f16 --preset qwen2-0.5b --type f16; }
demo_shape_model() {
  bench_model demo-shape-f16 --preset tiny --layers 4 --embd 256 --heads 4 --heads-kv 2 --ff 768 --ctx 32768 \
    --type f16 --seed 1
}

# graphrag_stream DIR N: prints DIR/requests-N.jsonl, N Zipf GraphRAG requests
# over WordNet (10 entities x up to 10 two-hop paths each, 100 QA items),
# with the WordNet graph imported into DIR first if it is missing.
graphrag_stream() {
  local dir=$1 n=$2
  mkdir -p "$dir"
  "$BIN" kg stats --kg "$dir/wordnet.dkg" >/dev/null 2>&1 || "$BIN" kg import --wordnet --out "$dir/wordnet.dkg" >/dev/null
  local req="$dir/requests-$n.jsonl"
  [ -f "$req" ] || "$BIN" workload generate --kg "$dir/wordnet.dkg" --pattern zipf --requests "$n" --qa-items 100 \
    --paths-per-entity 10 --seed 1 --out "$req" >/dev/null
  echo "$req"
}
