#!/usr/bin/env bash
# Makes the question-answering model that reads knowledge-graph subgraphs as
# G-Retriever's CSV (node rows "id,name", then edge rows "src,relation,dst"),
# the form SubGCache prompts its model with: models/depcache-qa-csv.gguf.
# A fact in CSV is reached through lookups in a chain (the question's name
# gives its id, the id and relation give an edge row, the edge's target id
# gives the answer's name); the model has six layers of 64. Its vocabulary
# keeps ids, names, relation words and commas apart (`vocab learn
# --split-scripts`) and the space mark alone (`--split-spaces`), so a name is
# one and the same token in its row, in the question and in the answer. The
# prompt template puts nothing around the question, and the loss is on the
# answers alone. On synthetic worlds (made-up names from a shared pool, so
# the model must read its context), eight stages (docs/training.md says what
# each was for and what it measured):
#   1-3  drills of one link and of two (scripts/csv_drills.py), packed after
#        the request's question over one entity's direct facts, then over
#        1 to 4 entities: the links are learned where the drills ask them,
#        the question's chain is not (about 33%, a random neighbour);
#   4    the question alone, over 600,000 one-entity contexts: the answer
#        comes from the context's names, still a random neighbour's;
#   5    what broke the plateau: contexts with the asked edge as their only
#        edge row (scripts/csv_variants.py), so the target id -> name link
#        is learned alone (100% within 500 steps), with two and three edge
#        rows beside them;
#   6    the same with the question's shorter forms ("r?", "r of A?"): the
#        relation picks its row (one-entity held-out 95% greedy);
#   7-8  contexts of 1 to 4 entities, as SubGCache's per-query subgraphs and
#        their clusters' unions hold them, with half their edge rows, the
#        "r of A?" form and edge-row drills beside the whole question; then
#        also contexts where every source has one edge row of the asked
#        relation, so that only the asked name's id picks the row. Several
#        entities are read less well than one (docs/training.md).
# Questions are 1-hop, in words ("What is the r of A?"). Every stage is
# skipped when its output exists and training resumes from its checkpoint:
# an interrupted run continues when run again.
#   nice bash scripts/make_csv_qa_model.sh     (~2.5 h on 2 Zen 3 cores)
# Environment: OUT (work folder, default build/qa-csv-model), WORLDS (3000),
# STEPS_ONE (stage 1, 4000), STEPS_CHAINS (2, 3000), STEPS_DRILLS_MANY (3,
# 1400), STEPS_QUESTION (4, 18000), STEPS_THIN (5, 5000), STEPS_FORMS (6,
# 3500), STEPS_MANY (7, 3500), STEPS (8, 8000), LAYERS (6), EMBD (64), FF
# (176), VOCAB (6144 at most), THREADS (2), BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/depcache}
OUT=${OUT:-build/qa-csv-model}
WORLDS=${WORLDS:-3000}
STEPS_ONE=${STEPS_ONE:-4000}
STEPS_CHAINS=${STEPS_CHAINS:-3000}
STEPS_DRILLS_MANY=${STEPS_DRILLS_MANY:-1400}
STEPS_QUESTION=${STEPS_QUESTION:-18000}
STEPS_THIN=${STEPS_THIN:-5000}
STEPS_FORMS=${STEPS_FORMS:-3500}
STEPS_MANY=${STEPS_MANY:-3500}
STEPS=${STEPS:-8000}
LAYERS=${LAYERS:-6}
EMBD=${EMBD:-64}
FF=${FF:-176}
VOCAB=${VOCAB:-6144}
THREADS=${THREADS:-2}
D=$OUT/data
mkdir -p "$D/part"
log() { echo "[$(date +%H:%M:%S)] $*"; }

# World $1, as make_qa_model.sh's training worlds (200 entities).
world() { [ -f "$D/world$1.dkg" ] || "$BIN" kg import --synthetic --entities 200 --relations 12 \
  --facts-per-entity 3 --name-pool 1000 --seed "$1" -o "$D/world$1.dkg" >/dev/null; }
# $5 requests over world $1 into $6: $2 entities per request, contexts of $3
# hops, $4 QA items (0 requests: each item once), data seed salt $7.
ask() {
  local pattern=(--pattern uniform --requests "$5" --questions-per-context 1)
  [ "$5" = 0 ] && pattern=(--pattern dataset)
  "$BIN" workload generate --kg "$D/world$1.dkg" "${pattern[@]}" --qa-items "$4" --entities-per-request "$2" \
    --paths-per-entity 9 --min-paths 1 --hops "$3" --question-hops 1 --context csv --question-form words \
    --seed "$((1000 * $1 + 10 * ${7:-0} + $2))" --out "$6" >/dev/null
}
# Training world $1: 8 one-entity requests into part/$1.one; 4 requests each
# of 1, 2, 3 and 4 entities into part/$1.many (direct facts as context).
world_requests() {
  [ -f "$D/part/$1.many" ] && return
  world "$1"
  ask "$1" 1 1 200 8 "$D/part/$1.one"
  for e in 1 2 3 4; do ask "$1" "$e" 1 200 4 "$D/part/$1.$e" 1; done
  cat "$D/part/$1".[1234] >"$D/part/$1.many.part"
  rm "$D/part/$1".[1234]
  mv "$D/part/$1.many.part" "$D/part/$1.many"
}
# Training world $1, each of its 200 entities asked once: one-entity
# contexts into qpart/one/$1.jsonl; contexts of 1 + ($1 mod 4) entities into
# qpart/many/$1.jsonl.
world_questions() {
  [ -f "$D/qpart/many/$1.jsonl" ] && return
  local e=$((1 + $1 % 4)) pattern=(--pattern dataset --qa-items 200 --paths-per-entity 9 --min-paths 1 --hops 1
    --question-hops 1 --context csv --question-form words)
  "$BIN" workload generate --kg "$D/world$1.dkg" "${pattern[@]}" --entities-per-request 1 --seed "$((7000 + $1))" \
    --out "$D/qpart/one/$1.jsonl" >/dev/null
  "$BIN" workload generate --kg "$D/world$1.dkg" "${pattern[@]}" --entities-per-request "$e" \
    --seed "$((8000 + $1))" --out "$D/qpart/many/$1.part" >/dev/null
  mv "$D/qpart/many/$1.part" "$D/qpart/many/$1.jsonl"
}
if [ ! -f "$D/many.jsonl" ]; then
  log "training worlds 1..$WORLDS"
  export -f world ask world_requests
  export BIN D
  seq 1 "$WORLDS" | xargs -P "$THREADS" -I{} bash -c 'set -euo pipefail; world_requests {}'
  for w in $(seq 1 "$WORLDS"); do cat "$D/part/$w.one"; done >"$D/one.jsonl"
  for w in $(seq 1 "$WORLDS"); do cat "$D/part/$w.many"; done >"$D/many.jsonl.part"
  mv "$D/many.jsonl.part" "$D/many.jsonl"
fi
# Held out: worlds 9001 and 9002 (the ones make_qa_model.sh holds out), 100
# requests each per set.
for set in one many; do
  f=$D/heldout-$set.jsonl
  [ -f "$f" ] && continue
  : >"$f.part"
  for w in 9001 9002; do
    world "$w"
    if [ "$set" = one ]; then ask "$w" 1 1 200 100 "$D/tmp.jsonl"; else ask "$w" 3 1 200 100 "$D/tmp.jsonl"; fi
    cat "$D/tmp.jsonl" >>"$f.part"
  done
  rm -f "$D/tmp.jsonl"
  mv "$f.part" "$f"
done
if [ ! -f "$D/question-many.jsonl" ]; then
  log "question sets over worlds 1..$WORLDS"
  mkdir -p "$D/qpart/one" "$D/qpart/many"
  export -f world_questions
  export BIN D
  seq 1 "$WORLDS" | xargs -P "$THREADS" -I{} bash -c 'set -euo pipefail; world_questions {}'
  cat "$D"/qpart/one/*.jsonl | shuf --random-source=<(yes) >"$D/question-one.jsonl"
  cat "$D"/qpart/many/*.jsonl | shuf --random-source=<(yes 3) >"$D/question-many.jsonl.part"
  mv "$D/question-many.jsonl.part" "$D/question-many.jsonl"
fi
variants() {  # $1 input, $2 output, $3 variants, $4 seed
  [ -f "$D/$2" ] || python3 scripts/csv_variants.py "$D/$1" "$D/$2" --variants "$3" --seed "$4"
}
variants question-one.jsonl thin.jsonl 1,2,all 11
variants question-one.jsonl forms.jsonl 1+short,2+short,all+short,1+mid,2+mid,all+mid,1,2,all 12
variants question-many.jsonl many-mix.jsonl half,all+mid,all+edge,all 13
variants question-many.jsonl many-src.jsonl src,half,src+mid,all+edge,all 16
log "data: $(wc -l <"$D/one.jsonl") + $(wc -l <"$D/many.jsonl") requests with drills, \
$(wc -l <"$D/question-one.jsonl") + $(wc -l <"$D/question-many.jsonl") with questions alone"

[ -f "$OUT/vocab.gguf" ] || "$BIN" vocab learn --requests "$D/many.jsonl" "$D/one.jsonl" --size "$VOCAB" \
  --split-scripts --split-spaces -o "$OUT/vocab.gguf"
[ -f "$OUT/init.gguf" ] || "$BIN" model new --preset tiny --tied --layers "$LAYERS" --embd "$EMBD" --heads 4 \
  --heads-kv 4 --ff "$FF" --ctx 1024 --vocab-from "$OUT/vocab.gguf" --prompt-system '' --prompt-task-prefix '' \
  --prompt-task-suffix '' --seed 2 -o "$OUT/init.gguf"
# Each request followed by drills over its context: single links (4 node
# rows, 3 edge rows, 2 names) for the first stage; then fewer of them and
# two-link drills, the halves of the question's chain.
[ -f "$D/one-drills.jsonl" ] || python3 scripts/csv_drills.py "$D/one.jsonl" "$D/one-drills.jsonl" --ids 2
[ -f "$D/one-chains.jsonl" ] || python3 scripts/csv_drills.py "$D/one.jsonl" "$D/one-chains.jsonl" --ids 1 \
  --nodes 2 --edges 2 --chains 2 --seed 11
[ -f "$D/many-chains.jsonl" ] || python3 scripts/csv_drills.py "$D/many.jsonl" "$D/many-chains.jsonl" --ids 2 \
  --nodes 3 --edges 2 --chains 3 --seed 12
train() {  # $1 output, $2 init, $3 steps, $4 requests, $5 held-out requests, then trainer options
  local out=$1 init=$2 steps=$3 requests=$4 eval=$5
  shift 5
  [ -f "$OUT/$out" ] && return
  log "training $out ($steps steps)"
  "$BIN" train --init "$init" --requests "$requests" --eval "$eval" --eval-limit 200 -o "$OUT/$out" \
    --steps "$steps" --batch 32 -t "$THREADS" --log "$OUT/$out.log.jsonl" --log-every 20 --eval-every 250 \
    --checkpoint-every 200 --resume --answer-loss-only --attention causal --lr 1e-3 "$@"
}
P=--pack-shared-context
train one.gguf "$OUT/init.gguf" "$STEPS_ONE" "$D/one-drills.jsonl" "$D/heldout-one.jsonl" $P --warmup 100 --seed 5
train chains.gguf "$OUT/one.gguf" "$STEPS_CHAINS" "$D/one-chains.jsonl" "$D/heldout-one.jsonl" $P --warmup 100 \
  --seed 6
train drills-many.gguf "$OUT/chains.gguf" "$STEPS_DRILLS_MANY" "$D/many-chains.jsonl" "$D/heldout-many.jsonl" $P \
  --warmup 50 --seed 3
# One request a sequence from here.
train question.gguf "$OUT/drills-many.gguf" "$STEPS_QUESTION" "$D/question-one.jsonl" "$D/heldout-one.jsonl" \
  --warmup 100 --seed 7
train thin.gguf "$OUT/question.gguf" "$STEPS_THIN" "$D/thin.jsonl" "$D/heldout-one.jsonl" --warmup 100 --seed 12
train forms.gguf "$OUT/thin.gguf" "$STEPS_FORMS" "$D/forms.jsonl" "$D/heldout-one.jsonl" --warmup 100 --seed 14
train many.gguf "$OUT/forms.gguf" "$STEPS_MANY" "$D/many-mix.jsonl" "$D/heldout-many.jsonl" --warmup 100 --seed 15
train csv.gguf "$OUT/many.gguf" "$STEPS" "$D/many-src.jsonl" "$D/heldout-many.jsonl" --warmup 100 --seed 17

# Exact match on the held-out worlds, full attention, 12 greedy tokens.
for set in one many; do
  "$BIN" run -m "$OUT/csv.gguf" --requests "$D/heldout-$set.jsonl" -s full -n 12 -t "$THREADS" -q |
    sed -n "s/.*answers: \(.*\)/$set: \1/p"
done | tee "$OUT/eval.md"
log "done: $OUT/csv.gguf (models/depcache-qa-csv.gguf), exact match in $OUT/eval.md"
