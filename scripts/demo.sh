#!/usr/bin/env bash
# The main job on an embedded default: installs and builds depcache, then
# serves the question-answering model the project trains and ships behind
# the OpenAI-compatible API, sends it questions about a world it never saw
# (a knowledge graph made here; each question with its entities' relation
# paths, or with their documents, in the API's RAG extension) with
# `depcache loadgen`, and shows the answers, whether each is right, and per
# workload what each strategy cost: TTFT, tokens computed, KV reused.
# Then, on a larger prompt (random weights: look at the speed, not the text),
# full prefill against prefix caching and DepCache. Everything it writes is
# under build/demo/; the report is build/demo/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
D=build/demo
mkdir -p "$D"
START=$SECONDS
stage() { printf '[%2d:%02d] %s\n' $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)) "$*"; }

# The build is the long stage: a progress bar from the build's own [done/total].
stage "installing what depcache needs and building it (scripts/setup.sh; log: $D/setup.log)"
bash scripts/setup.sh >"$D/setup.log" 2>&1 &
SETUP=$!
if [ -t 1 ]; then
  while kill -0 "$SETUP" 2>/dev/null; do
    step=$(grep -oE '^\[[0-9]+/[0-9]+\]' "$D/setup.log" 2>/dev/null | tail -1 | tr -d '[]' || true)
    if [ -n "$step" ]; then
      done_=${step%/*} total=${step#*/}
      filled=$((30 * done_ / total))
      printf '\r        building [%-30s] %d/%d' "$(printf '#%.0s' $(seq 1 $filled) 2>/dev/null)" "$done_" "$total"
    fi
    sleep 1
  done
  printf '\r%60s\r' ""
fi
if ! wait "$SETUP"; then
  tail -30 "$D/setup.log"
  echo "demo: scripts/setup.sh failed; its log is $D/setup.log" >&2
  exit 1
fi
BIN=./build/depcache

stage "making a world the model never saw: 300 entities and their facts (kg import --synthetic)"
[ -f "$D/world.dkg" ] || $BIN kg import --synthetic --entities 300 --name-pool 1000 --seed 9101 \
  -o "$D/world.dkg" >/dev/null
# 60 one-hop questions, each over three entities' facts: as relation paths
# (GraphRAG), and as documents of sentences, one per entity (chunk RAG).
ASK=(--pattern dataset --qa-items 60 --entities-per-request 3 --paths-per-entity 9 --min-paths 1 --hops 2
  --question-hops 1 --seed 77 --question-form cloze)
[ -f "$D/graph.jsonl" ] || $BIN workload generate --kg "$D/world.dkg" "${ASK[@]}" --out "$D/graph.jsonl" >/dev/null
[ -f "$D/documents.jsonl" ] || $BIN workload generate --kg "$D/world.dkg" "${ASK[@]}" --context documents \
  --out "$D/documents.jsonl" >/dev/null
MODEL=models/depcache-qa-alone.gguf
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
stage "starting depcache serve on 127.0.0.1:$PORT with $MODEL (log: $D/serve.log)"
$BIN serve -m "$MODEL" --host 127.0.0.1 --port "$PORT" >"$D/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$D/serve.log"; echo "demo: the server did not start" >&2; exit 1; }
  sleep 0.1
done

# One workload through the API per strategy: 60 questions, greedy answers
# of up to 12 tokens, one client at a time (so TTFT is each request's own).
ask() {  # workload, request file, strategy, loadgen options...
  local workload=$1 requests=$2 strategy=$3
  shift 3
  $BIN loadgen --url "http://127.0.0.1:$PORT" --requests "$requests" -s "$strategy" -n 12 --stop-at-eos \
    --concurrency 1 --json "$D/$workload-$strategy.jsonl" "$@" >"$D/$workload-$strategy.log" 2>&1 ||
    { cat "$D/$workload-$strategy.log"; echo "demo: loadgen failed" >&2; exit 1; }
}
stage "knowledge graph: 60 questions over relation paths, as full prefill, prefix caching and DepCache"
for s in full prefix depcache; do ask graph "$D/graph.jsonl" "$s"; done
stage "documents: the same 60 questions over the entities' documents, as full prefill, each document's cache reused as computed alone (fullreuse) and FusionRAG"
for s in full fullreuse fusionrag; do ask documents "$D/documents.jsonl" "$s"; done

stage "stopping the server (SIGTERM: it drains and exits)"
kill -TERM "$SERVER"
status=0
wait "$SERVER" || status=$?
trap - EXIT
[ "$status" = 0 ] || { tail -20 "$D/serve.log"; echo "demo: the server exited with $status" >&2; exit 1; }

python3 - "$D" <<'PY' | tee "$D/report.md"
import json, statistics, sys
d = sys.argv[1]
def rows(workload, strategy):
    return [json.loads(l) for l in open(f"{d}/{workload}-{strategy}.jsonl")]
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]
questions = {json.loads(l)["id"]: json.loads(l) for l in open(f"{d}/graph.jsonl")}
print("\nA few of the questions (graph workload, DepCache), the model's answer and the expected one:\n")
for r in rows("graph", "depcache")[:5]:
    q = questions[r["id"]]
    mark = "right" if r.get("exact_match") else "wrong"
    print(f'  {q["question"]!r:42} -> {r.get("answer", "")!r:14} ({mark}; expected {q["answers"][0]!r})')
for workload, strategies, what in [
    ("graph", ["full", "prefix", "depcache"], "questions over relation paths sent with each request"),
    ("documents", ["full", "fullreuse", "fusionrag"], "questions over documents sent with each request"),
]:
    print(f"\n{workload}: 60 {what}\n")
    print("| strategy | TTFT p50 | TTFT p99 | tokens computed | KV reused | exact match |")
    print("|---|---|---|---|---|---|")
    for s in strategies:
        rs = rows(workload, s)
        ttft = [r["ttft_token_ms"] if r["ttft_token_ms"] >= 0 else r["ttft_ms"] for r in rs]
        prompt = sum(r["prompt_tokens"] for r in rs)
        computed = sum(r["computed_tokens"] for r in rs)
        reused = sum(r["reused_tokens"] for r in rs)
        em = sum(1 for r in rs if r.get("exact_match"))
        print(f"| {s} | {pct(ttft, 50):.1f} ms | {pct(ttft, 99):.1f} ms | {computed} of {prompt} | "
              f"{100 * reused / max(prompt, 1):.1f}% | {em}/{len(rs)} |")
PY

stage "speed on a larger prompt: 30 GraphRAG requests over WordNet, 10 entities x 10 relation paths each (random weights: the text means nothing; look at TTFT and reuse)"
[ -f "$D/model.gguf" ] || $BIN model new --preset tiny --layers 4 --embd 256 --heads 4 --heads-kv 2 --ff 768 \
  --ctx 32768 --type f16 --seed 1 -o "$D/model.gguf" >/dev/null
$BIN kg stats --kg "$D/wordnet.dkg" >/dev/null 2>&1 || $BIN kg import --wordnet --out "$D/wordnet.dkg" >/dev/null
[ -f "$D/requests.jsonl" ] || $BIN workload generate --kg "$D/wordnet.dkg" --pattern zipf --requests 30 \
  --qa-items 100 --paths-per-entity 10 --seed 1 --out "$D/requests.jsonl" >/dev/null
$BIN run -m "$D/model.gguf" --requests "$D/requests.jsonl" --strategy full,prefix,depcache --serial --quiet \
  2>/dev/null | grep -E '^strategy|^(full|prefix|depcache) +[0-9]' | tee -a "$D/report.md"

stage "done"
cat <<EOF

The report: $D/report.md; every request's row: $D/<workload>-<strategy>.jsonl;
the server's log: $D/serve.log. What the tables mean: docs/demo.md.
Next: serve your own GGUF model (README, "Serving"); each seed paper's
headline results re-measured on this machine: build/depcache eval --quick
(a few minutes; docs/eval.md); the whole test suite: bash scripts/test.sh;
every command: build/depcache --help.
EOF
