#!/usr/bin/env bash
# What a fully cached request costs against prefilling its question alone.
# A warm-up request caches a context of about 1k or 8k tokens (documents in
# front of the question); then 8 requests ask new questions over the same
# context (prefix reuse: everything but the question is cached). Their TTFT
# p50 is set against `bench-model`'s prefill of as many tokens as each
# computed, on an empty cache: the goal is a ratio of at most 1.1.
#   bash bench/experiments/cached_request.sh [contexts] [kv types]   (defaults: "1000 8000" "f16 q8_0")
# Model: the qwen2-0.5b preset in F16 (random weights, build/bench-models).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/experiments/common.sh
CONTEXTS=${1:-"1000 8000"}
KVS=${2:-"f16 q8_0"}
D=build/bench-cached-request
mkdir -p "$D"
MODEL=$(qwen_model)

# Documents of made-up words about `tokens` long (the preset's byte-level
# vocabulary gives about a token per 1.45 characters of these words).
make_requests() {  # tokens -> warm-up file and 8 request files
  local tokens=$1
  python3 - "$tokens" "$D" <<'PY'
import json, random, sys
tokens, d = int(sys.argv[1]), sys.argv[2]
rng = random.Random(tokens)
syll = ["ka", "lo", "mi", "ren", "tas", "vor", "du", "pel", "sin", "mar", "go", "ti"]
def word(): return "".join(rng.choice(syll) for _ in range(rng.randint(1, 3)))
docs = []
chars = int(tokens * 1.45)
n_docs = max(1, chars // 2000)
for i in range(n_docs):
    text = " ".join(word() for _ in range(chars // n_docs // 6))
    docs.append({"id": f"d{i}", "title": f"Doc {i}", "text": text})
def req(i, q):
    return {"id": f"q{i}", "question": q, "documents": docs}
qs = [f"What does {word()} say about {word()} and {word()} in the {word()}?" for _ in range(9)]
with open(f"{d}/warm-{tokens}.jsonl", "w") as f:
    f.write(json.dumps(req(0, qs[0])) + "\n")
with open(f"{d}/ask-{tokens}.jsonl", "w") as f:
    for i in range(1, 9):
        f.write(json.dumps(req(i, qs[i])) + "\n")
PY
}

echo "CPU: $CPU; model $MODEL; 8 requests over a cached context, one at a time, prefix reuse"
echo
echo "| context | KV | prompt tokens | computed | reused | cached TTFT p50 | question alone | ratio |"
echo "|---|---|---|---|---|---|---|---|"
for ctx in $CONTEXTS; do
  make_requests "$ctx"
  for kv in $KVS; do
    json="$D/rows-$ctx-$kv.jsonl"
    out=$($BIN run --serial -m "$MODEL" -s prefix --requests "$D/ask-$ctx.jsonl" --warmup "$D/warm-$ctx.jsonl" \
      --kv-type "$kv" -c $((ctx * 2 + 512)) --json "$json" -q 2>/dev/null)
    read -r prompt computed reused < <(python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(int(statistics.median(r["prompt_tokens"] for r in rows)), int(statistics.median(r["computed_tokens"] for r in rows)),
      int(statistics.median(r["reused_tokens"] for r in rows)))' "$json")
    p50=$(grep -E '^prefix +[0-9]' <<<"$out" | awk '{print $3}' | tr -d 'ms')
    # The question alone: a prefill of as many tokens on an empty cache (ms = 1000 * tokens / (tokens/s)).
    tps=$($BIN bench-model -m "$MODEL" -p "$computed" -n 0 -r 5 --kv-type "$kv" --json | python3 -c '
import json, sys
print([json.loads(l) for l in sys.stdin][0]["avg_ts"])')
    alone=$(python3 -c "print(f'{1000 * $computed / $tps:.1f}')")
    ratio=$(python3 -c "print(f'{$p50 / $alone:.2f}')")
    echo "| $ctx | $kv | $prompt | $computed | $reused | $p50 ms | $alone ms | ${ratio}x |"
  done
done
