#!/usr/bin/env bash
# The QA model's hard part in isolation: one entity, nine one-hop facts
# ("A -r-> B", made-up names from the shared pool), "What is the r of A?".
# Nothing but the relation tells the facts apart, so greedy exact match shows
# whether a model looks an answer up by its relation (100%) or only copies
# one of the entity's neighbours (1/k with k facts). Trains a fresh model of
# the shipped model's shape (its vocabulary) on contexts of K_MIN..9 facts
# (each request keeps a random k of the entity's facts, the asked one among
# them), then reports exact match on held-out worlds with 1, 3 and 9 facts.
#   bash bench/experiments/qa_lookup.sh [steps]         (default 1500; ~6 steps/s on 2 cores)
# Environment: K_MIN (fewest facts per training context, default 1; 9 trains
# on full contexts only), WORLDS (training worlds of 200 entities, 300),
# LR (3e-3), LOSS=answer (loss on the answer alone), SEED (of the fresh
# model's initial weights, 1), INIT (the model to start from instead of a
# fresh one: another shape, or `model new --qk-init-std`), LAYERS, EMBD, FF
# (the fresh model's shape: 4, 128, 352), QUESTION_FORM (words, or cloze:
# "A -r->", with a fresh model whose prompt template has no text around the
# question), ENTITIES (entities per context, 1; with more, each fact's key is
# its entity and relation together), QUESTIONS (questions asked over each
# training context, 1; more ask about every entity's other facts too, and the
# trainer packs them after the context as one sequence with every answer in
# the loss), THREADS, OUT (build/bench-qa-lookup).
# The training log is OUT/lookup.log.jsonl (held-out loss and teacher-forced
# exact match on 3-fact contexts every 250 steps).
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${1:-1500}
BIN=./build/depcache
OUT=${OUT:-build/bench-qa-lookup}
K_MIN=${K_MIN:-1}
WORLDS=${WORLDS:-300}
LR=${LR:-3e-3}
THREADS=${THREADS:-2}
QUESTION_FORM=${QUESTION_FORM:-words}
ENTITIES=${ENTITIES:-1}
mkdir -p "$OUT/worlds"
world() {  # world $1: 200 entities, 9 facts each (one per relation, 12 relations)
  [ -f "$OUT/worlds/$1.dkg" ] || "$BIN" kg import --synthetic --entities 200 --relations 12 \
    --facts-per-entity 9 --name-pool 1000 --seed "$1" -o "$OUT/worlds/$1.dkg" >/dev/null
}
ask() {  # world $1, $2 facts per entity, every entity asked once (or $4 questions per context), into $3
  world "$1"
  local pattern=(--pattern dataset)
  [ "${4:-1}" -gt 1 ] && pattern=(--pattern uniform --requests "$((200 * $4))" --questions-per-context "$4")
  "$BIN" workload generate --kg "$OUT/worlds/$1.dkg" "${pattern[@]}" --qa-items 200 \
    --entities-per-request "$ENTITIES" --paths-per-entity "$2" --min-paths 1 --hops 1 --question-hops 1 \
    --context paths --question-form "$QUESTION_FORM" --seed "$((100 * $1 + $2))" --out "$3" >/dev/null
}
export -f world ask
QUESTIONS=${QUESTIONS:-1}
export BIN OUT ENTITIES QUESTION_FORM QUESTIONS
FORM=$QUESTION_FORM-e$ENTITIES
TRAIN=$OUT/train-k$K_MIN-$WORLDS-$FORM-q$QUESTIONS.jsonl
if [ ! -f "$TRAIN" ]; then
  # World w gives contexts of k = K_MIN + w mod (10 - K_MIN) facts: every k equally often.
  seq 1 "$WORLDS" | xargs -P "$THREADS" -I{} bash -c \
    'k=$(( '"$K_MIN"' + {} % (10 - '"$K_MIN"') )); ask {} "$k" "$OUT/worlds/{}-'"$FORM-q$QUESTIONS"'.jsonl" "$QUESTIONS"'
  for w in $(seq 1 "$WORLDS"); do cat "$OUT/worlds/$w-$FORM-q$QUESTIONS.jsonl"; done >"$TRAIN.part"
  mv "$TRAIN.part" "$TRAIN"
fi
for k in 1 3 9; do [ -f "$OUT/held-$k-$FORM.jsonl" ] || ask 9001 "$k" "$OUT/held-$k-$FORM.jsonl"; done
SEED=${SEED:-1}
LAYERS=${LAYERS:-4} EMBD=${EMBD:-128} FF=${FF:-352}
TEMPLATE=()
[ "$QUESTION_FORM" = cloze ] && TEMPLATE=(--prompt-task-prefix "" --prompt-task-suffix "")
MODEL=${INIT:-$OUT/init-l$LAYERS-w$EMBD-f$FF-s$SEED-$QUESTION_FORM.gguf}
[ -n "${INIT:-}" ] || [ -f "$MODEL" ] || "$BIN" model new --preset tiny --tied --layers "$LAYERS" --embd "$EMBD" \
  --heads 4 --heads-kv 4 --ff "$FF" --ctx 1024 --vocab-from models/depcache-qa.gguf --seed "$SEED" \
  "${TEMPLATE[@]}" -o "$MODEL" >/dev/null
LOSS_OPT=()
[ "${LOSS:-all}" = answer ] && LOSS_OPT=(--answer-loss-only)
[ "$QUESTIONS" -gt 1 ] && LOSS_OPT+=(--pack-shared-context)
rm -f "$OUT/lookup.gguf" "$OUT/lookup.gguf.ckpt" "$OUT/lookup.gguf.ckpt.optim" "$OUT/lookup.log.jsonl"
"$BIN" train --init "$MODEL" --requests "$TRAIN" --eval "$OUT/held-3-$FORM.jsonl" --eval-limit 200 \
  -o "$OUT/lookup.gguf" --steps "$STEPS" --batch 32 --lr "$LR" --warmup 100 -t "$THREADS" \
  --log "$OUT/lookup.log.jsonl" --log-every 50 --eval-every 250 --checkpoint-every 1000 "${LOSS_OPT[@]}"
echo "| facts in the context | 1 | 3 | 9 |"
echo "|---|---|---|---|"
line="| greedy exact match after $STEPS steps |"
for k in 1 3 9; do
  em=$("$BIN" run -m "$OUT/lookup.gguf" --requests "$OUT/held-$k-$FORM.jsonl" -s full -n 4 -t "$THREADS" -q 2>/dev/null |
    sed -n 's/.*answers: .* exact (\(.*%\)).*/\1/p')
  line="$line ${em:-?} |"
done
echo "$line"
echo "| picking one of the entity's neighbours at random | 100% | 33.3% | 11.1% |"
