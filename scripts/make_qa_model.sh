#!/usr/bin/env bash
# Makes the question-answering model from scratch: synthetic knowledge-graph
# worlds (made-up names, so the model must read its context), questions of 1
# and 2 hops over each entity's relation paths and over the same facts as
# documents, a BPE vocabulary learned from that text, a Llama trained under
# causal self-attention (with a detour through dependency attention, which
# is where it learns to read relation paths, and a curriculum of one-entity
# documents, where it learns to read sentences), then fine-tuned under dependency
# attention for each position scheme, and for sequential positions once more
# with trees that see only themselves (reused exactly wherever they move).
# Evaluates every model on held-out worlds with `run`
# (exact match per strategy, eval.md). Every stage is skipped when its output exists
# and training resumes from its checkpoint, so an interrupted run continues:
# run it again.
#   bash scripts/make_qa_model.sh            (hours on 2 cores; nice it)
# Environment: OUT (work folder, default build/qa-model), STEPS (causal
# steps, 45000), FT_STEPS (fine-tuning steps per scheme, 6000), WORLDS
# (training worlds, 9000), MORE_STEPS (a second causal phase, continuing
# from the first with the learning rate warmed up again, 8000; 0 skips it),
# DETOUR_STEPS (then dependency attention with sequential positions, 6000;
# 0 skips the detour), RETURN_STEPS (then causal attention again, 3000),
# CURRICULUM_STEPS (then documents of one entity's facts alone, 4000; 0
# skips the curriculum), CURRICULUM_WORLDS (the training worlds it draws
# from, 2000), MIX_STEPS (then every training request again, 3000),
# MORE_WORLDS (its worlds: 0, the default, the first phase's again, in
# another order; N: N fresh worlds), MORE_LR (its learning rate, 1e-3),
# NAME_POOL (names every world draws from), VOCAB (vocabulary size),
# DATA_ONLY=1 (make the training and held-out requests, then stop; heldout:
# the held-out requests only), CONTEXTS (context forms trained and
# evaluated, default "paths documents"; add csv for the subgraph as
# G-Retriever CSV, the form SubGCache serves, asked in words), QUESTIONS (questions asked
# over each training context, trained as one sequence; default 1),
# QUESTION_FORM (cloze, the default: the asked fact in the context's
# notation up to the answer, "A -r->" or "The r of A is", and a model whose
# prompt template has no text around it; words: "What is the r of A?"
# between "Question: " and "\nAnswer:"), LOSS (answer, the default: the loss
# on the answers alone; all: on every token), LR (causal learning rate,
# 1e-3), BATCH (32), LAYERS, EMBD, FF (the model's shape, 2 x 64, ff 176),
# SEED (of its initial weights, 2), THREADS, BIN. The defaults are the
# shipped models' recipe (models/depcache-qa.gguf is its causal.gguf,
# models/depcache-qa-depth.gguf its dep-depth.gguf,
# models/depcache-qa-sequential.gguf its dep-sequential.gguf,
# models/depcache-qa-alone.gguf its dep-alone.gguf and
# models/depcache-qa-gaps.gguf its dep-gaps.gguf; that one was fine-tuned
# from the shipped causal model on the first 1500 training worlds' requests,
# as GAP_WORLDS=1500 does). POSITION_GAP (the gaps copy's largest gap before
# each tree, 128), GAP_WORLDS (its training worlds: 0, the default, those of
# the fine-tunings above).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/depcache}
OUT=${OUT:-build/qa-model}
STEPS=${STEPS:-45000}
FT_STEPS=${FT_STEPS:-6000}
WORLDS=${WORLDS:-9000}
MORE_WORLDS=${MORE_WORLDS:-0}
MORE_STEPS=${MORE_STEPS:-8000}
DETOUR_STEPS=${DETOUR_STEPS:-6000}
RETURN_STEPS=${RETURN_STEPS:-3000}
CURRICULUM_STEPS=${CURRICULUM_STEPS:-4000}
CURRICULUM_WORLDS=${CURRICULUM_WORLDS:-2000}
MIX_STEPS=${MIX_STEPS:-3000}
NAME_POOL=${NAME_POOL:-1000}
VOCAB=${VOCAB:-4096}
THREADS=${THREADS:-2}
CONTEXTS=${CONTEXTS:-paths documents}
QUESTIONS=${QUESTIONS:-1}
QUESTION_FORM=${QUESTION_FORM:-cloze}
LOSS=${LOSS:-answer}
LR=${LR:-1e-3}
BATCH=${BATCH:-32}
LAYERS=${LAYERS:-2}
EMBD=${EMBD:-64}
FF=${FF:-176}
mkdir -p "$OUT/data"
D=$OUT/data
log() { echo "[$(date +%H:%M:%S)] $*"; }

# World $1 with $2 entities, 12 of the 20 relation words, 3 facts each. Names
# come from one pool shared by every world (held-out ones too), so the
# vocabulary learns each as one token, while which name stands for what is new
# in every world: the model must read its context. (Names made up per world
# took 2-3 tokens each and the model learned far slower.)
world() { [ -f "$D/world$1.dkg" ] || "$BIN" kg import --synthetic --entities "$2" --relations 12 \
  --facts-per-entity 3 --name-pool "$NAME_POOL" --seed "$1" -o "$D/world$1.dkg" >/dev/null; }
# Requests over world $1: $2 hops asked, $3 = paths|documents|csv, $4 entities
# per request, $5 requests (0: every QA item once), $6 QA items, into $7; $8
# questions asked over each context (default 1). CONTEXT_HOPS (hops of the
# paths each entity's context holds, 2) and ASK_SEED (the generator's seed,
# else one drawn from the world, hops and entity count) may be set for a call.
# CSV has no notation a cloze could follow: its questions are in words.
form() { if [ "$1" = csv ]; then echo words; else echo "$QUESTION_FORM"; fi; }
ask() {
  local pattern=(--pattern uniform --requests "$5" --questions-per-context "${8:-1}")
  [ "$5" = 0 ] && pattern=(--pattern dataset)
  "$BIN" workload generate --kg "$D/world$1.dkg" "${pattern[@]}" --qa-items "$6" --entities-per-request "$4" \
    --paths-per-entity 9 --min-paths 1 --hops "${CONTEXT_HOPS:-2}" --question-hops "$2" --context "$3" \
    --question-form "$(form "$3")" --seed "${ASK_SEED:-$((1000 * $1 + 100 * $2 + 10 * $4))}" --out "$7" >/dev/null
}

# The requests of training world $1 (8 contexts per hop count, form and
# entity count, each asked QUESTIONS questions, at most one per entity), into
# $D/part/$1.jsonl.
world_requests() {
  local w=$1 f="$D/part/$1.jsonl"
  [ -f "$f" ] && return
  world "$w" 200
  : >"$f.part"
  for hops in 1 2; do for ctx in $CONTEXTS; do for e in 1 2 3; do
    local q=$((QUESTIONS < e ? QUESTIONS : e))
    ask "$w" "$hops" "$ctx" "$e" "$((8 * q))" 200 "$f.$hops$ctx$e" "$q"
    cat "$f.$hops$ctx$e" >>"$f.part"
    rm "$f.$hops$ctx$e"
  done; done; done
  mv "$f.part" "$f"
}
# The held-out worlds' seeds; training skips them.
HELD_OUT_WORLDS="9001 9002"
# Training worlds $2..$3 (but the held-out ones) into $1, made $THREADS at a
# time, concatenated in order.
training_set() {
  [ -f "$1" ] && return
  log "training worlds $2..$3"
  mkdir -p "$D/part"
  export -f world form ask world_requests
  export BIN D NAME_POOL CONTEXTS QUESTIONS QUESTION_FORM
  local worlds
  worlds=$(seq "$2" "$3" | grep -vxF -f <(tr ' ' '\n' <<<"$HELD_OUT_WORLDS") || true)
  xargs -P "$THREADS" -I{} bash -c 'set -euo pipefail; world_requests {}' <<<"$worlds"
  for w in $worlds; do cat "$D/part/$w.jsonl"; done >"$1.part"
  mv "$1.part" "$1"  # the trainer draws batches from its own permutation
}
# Held-out worlds: 2 x 250 distinct questions per (hops, form), 3 entities per request.
for hops in 1 2; do for ctx in $CONTEXTS; do
  f="$D/heldout-$hops-hop-$ctx.jsonl"
  [ -f "$f" ] && continue
  : >"$f.part"
  for w in $HELD_OUT_WORLDS; do
    world "$w" 300
    ask "$w" "$hops" "$ctx" 3 0 250 "$D/tmp.jsonl"
    cat "$D/tmp.jsonl" >>"$f.part"
  done
  mv "$f.part" "$f"
done; done
rm -f "$D/tmp.jsonl"
# Out of distribution: WordNet's real names and relations, 1-hop questions
# over relation paths (words of several tokens, relations it never saw).
if [ ! -f "$D/ood-wordnet-1-hop-paths.jsonl" ]; then
  [ -f "$D/wordnet.dkg" ] || "$BIN" kg import --wordnet -o "$D/wordnet.dkg" >/dev/null
  "$BIN" workload generate --kg "$D/wordnet.dkg" --pattern dataset --qa-items 250 --entities-per-request 3 \
    --paths-per-entity 9 --min-paths 1 --hops 2 --question-hops 1 --context paths --seed 9003 \
    --question-form "$QUESTION_FORM" \
    --out "$D/ood-wordnet-1-hop-paths.jsonl" >/dev/null
fi
[ "${DATA_ONLY:-0}" = heldout ] && exit 0
training_set "$D/train.jsonl" 1 "$WORLDS"
# The second phase's requests, which fine-tuning also draws from (without a
# second phase, or with MORE_WORLDS=0, the first phase's).
MORE_DATA=$D/train.jsonl
if [ "$MORE_STEPS" -gt 0 ] && [ "$MORE_WORLDS" -gt 0 ]; then
  MORE_DATA=$D/train2.jsonl
  training_set "$MORE_DATA" "$((WORLDS + 1))" "$((WORLDS + MORE_WORLDS))"
fi
# Evaluated while training: every fifth held-out request (400).
[ -f "$D/eval.jsonl" ] || awk 'FNR % 5 == 0' "$D"/heldout-*.jsonl >"$D/eval.jsonl"
# The documents curriculum: one entity's three facts as a document (1-hop
# contexts), 8 questions in each of the first CURRICULUM_WORLDS training
# worlds (at most WORLDS); evaluated on 200 such requests of the first
# held-out world.
if [ "$CURRICULUM_STEPS" -gt 0 ] && [ ! -f "$D/curriculum.jsonl" ]; then
  for w in $(seq 1 "$((CURRICULUM_WORLDS < WORLDS ? CURRICULUM_WORLDS : WORLDS))" | grep -vxF -f <(tr ' ' '\n' <<<"$HELD_OUT_WORLDS") || true); do
    CONTEXT_HOPS=1 ASK_SEED=$((1000 * w + 1)) ask "$w" 1 documents 1 8 200 "$D/tmp.jsonl"
    cat "$D/tmp.jsonl"
  done >"$D/curriculum.jsonl.part"
  rm -f "$D/tmp.jsonl"
  mv "$D/curriculum.jsonl.part" "$D/curriculum.jsonl"
fi
[ -f "$D/eval-curriculum.jsonl" ] ||
  CONTEXT_HOPS=1 ASK_SEED=5 ask "${HELD_OUT_WORLDS%% *}" 1 documents 1 0 200 "$D/eval-curriculum.jsonl"
log "data: $(cat "$D"/train*.jsonl | wc -l) training requests; held-out sets of $(wc -l <"$D/heldout-1-hop-paths.jsonl")"
[ "${DATA_ONLY:-0}" = 0 ] || exit 0

# A cloze ends where the answer starts: no text between them. The vocabulary
# carries the template to the model made from it, and on to every model
# trained from that.
TEMPLATE=()
[ "$QUESTION_FORM" = cloze ] && TEMPLATE=(--prompt-task-prefix "" --prompt-task-suffix "")
[ -f "$OUT/vocab.gguf" ] || "$BIN" vocab learn --requests "$D/train.jsonl" --size "$VOCAB" "${TEMPLATE[@]}" \
  -o "$OUT/vocab.gguf"
[ -f "$OUT/init.gguf" ] || "$BIN" model new --preset tiny --tied --layers "$LAYERS" --embd "$EMBD" --heads 4 \
  --heads-kv 4 --ff "$FF" --ctx 1024 --vocab-from "$OUT/vocab.gguf" --seed "${SEED:-2}" -o "$OUT/init.gguf"

# Several questions over one context are trained as one sequence.
TRAIN_OPTS=()
[ "$QUESTIONS" -gt 1 ] && TRAIN_OPTS=(--pack-shared-context)
[ "$LOSS" = answer ] && TRAIN_OPTS+=(--answer-loss-only)
train() {  # $1 output, $2 init, $3 steps, $4 training requests, then trainer options (EVAL: held-out requests)
  local out=$1 init=$2 steps=$3 requests=$4
  shift 4
  [ -f "$OUT/$out" ] && return
  log "training $out ($steps steps)"
  "$BIN" train --init "$init" --requests "$requests" --eval "${EVAL:-$D/eval.jsonl}" --eval-limit 400 \
    -o "$OUT/$out" --steps "$steps" --batch "$BATCH" -t "$THREADS" --log "$OUT/$out.log.jsonl" --log-every 20 \
    --eval-every 250 --checkpoint-every 100 --resume "${TRAIN_OPTS[@]}" "$@"
}
train causal1.gguf "$OUT/init.gguf" "$STEPS" "$D/train.jsonl" --attention causal --lr "$LR" --warmup 200
# The second phase warms the learning rate up again where the first one's
# cosine ended, while the held-out loss was still falling: with 9000 worlds a
# second pass does not memorise them (with 400 or 1000 worlds it did, and
# fresh worlds were needed). Its own data seed draws another order.
if [ "$MORE_STEPS" -gt 0 ]; then
  train causal2.gguf "$OUT/causal1.gguf" "$MORE_STEPS" "$MORE_DATA" --attention causal --lr "${MORE_LR:-1e-3}" \
    --warmup 200 --seed 3
else
  [ -f "$OUT/causal2.gguf" ] || cp "$OUT/causal1.gguf" "$OUT/causal2.gguf"
fi
# The detour. Under causal attention the model stalls at reading the
# context (a third of 1-hop path questions right, however long the second
# phase: 24,000 steps did no better than 8000); under dependency attention,
# where a tree sees only itself and the system text, it learns to within
# 1500-2500 steps, and back under causal attention it keeps what it learnt
# (99.8% at 1 hop from 33.8%).
if [ "$DETOUR_STEPS" -gt 0 ]; then
  train dep-warm.gguf "$OUT/causal2.gguf" "$DETOUR_STEPS" "$MORE_DATA" --attention dependency \
    --scheme sequential --lr 1e-3 --warmup 50
  # Its depth-positions twin, for DepCache Fig. 14 from a model that only
  # ever saw self-attention (eval.md's first table).
  train dep-warm-depth.gguf "$OUT/causal2.gguf" "$DETOUR_STEPS" "$MORE_DATA" --attention dependency \
    --scheme depth --lr 1e-3 --warmup 50
  train causal3.gguf "$OUT/dep-warm.gguf" "$RETURN_STEPS" "$MORE_DATA" --attention causal --lr 1e-3 \
    --warmup 50 --seed 4
else
  [ -f "$OUT/causal3.gguf" ] || cp "$OUT/causal2.gguf" "$OUT/causal3.gguf"
fi
# The documents curriculum. In "The r of A is B" the entity sits next to the
# answer and the relation three tokens further back; the model learns to find
# A's sentences and then picks one of A's three relations at random (a third
# right, however long it trains on full contexts). On documents of one
# entity's three facts the entity tells nothing, so the relation must: it
# learns to read it within ~1000 steps (100% on held-out worlds), forgetting
# the rest for a while; mixed training then brings paths back and keeps the
# relation for documents (1-hop documents 31 -> 99%).
if [ "$CURRICULUM_STEPS" -gt 0 ]; then
  EVAL=$D/eval-curriculum.jsonl train docs-warm.gguf "$OUT/causal3.gguf" "$CURRICULUM_STEPS" \
    "$D/curriculum.jsonl" --attention causal --lr 1e-3 --warmup 50 --seed 6
  train causal.gguf "$OUT/docs-warm.gguf" "$MIX_STEPS" "$MORE_DATA" --attention causal --lr 1e-3 --warmup 50 \
    --seed 7
else
  [ -f "$OUT/causal.gguf" ] || cp "$OUT/causal3.gguf" "$OUT/causal.gguf"
fi
# DepCache's fine-tuning (trees see the system text) for both schemes, and
# sequential positions with trees alone.
for scheme in depth sequential; do
  train "dep-$scheme.gguf" "$OUT/causal.gguf" "$FT_STEPS" "$MORE_DATA" --attention dependency \
    --scheme "$scheme" --lr 1e-3 --warmup 50
done
train dep-alone.gguf "$OUT/causal.gguf" "$FT_STEPS" "$MORE_DATA" --attention dependency --scheme sequential \
  --tree-context none --lr 1e-3 --warmup 50
# DepCache's layout again, each tree moved by a random gap from the system
# text (and the trees before it), as reuse at another offset moves it.
GAP_DATA=$MORE_DATA
if [ "${GAP_WORLDS:-0}" -gt 0 ]; then
  GAP_DATA=$D/train-gaps.jsonl
  training_set "$GAP_DATA" 1 "$GAP_WORLDS"
fi
train dep-gaps.gguf "$OUT/causal.gguf" "$FT_STEPS" "$GAP_DATA" --attention dependency --scheme sequential \
  --position-gap "${POSITION_GAP:-128}" --lr 1e-3 --warmup 50

# Exact match on the held-out worlds (DepCache Fig. 14 and reuse), as
# Markdown tables: one row per (model, strategy, options), one column per set.
SETS="$(for ctx in $CONTEXTS; do echo "heldout-1-hop-$ctx heldout-2-hop-$ctx"; done | tr '\n' ' ')ood-wordnet-1-hop-paths"
row() {  # $1 label, $2 model, $3 strategy, then run options
  local model=$2 strategy=$3 line="| $1 |"
  shift 3
  for set in $SETS; do
    em=$("$BIN" run -m "$OUT/$model" --requests "$D/$set.jsonl" -s "$strategy" -n 12 -t "$THREADS" -q "$@" |
      sed -n 's/.*answers: .* exact (\(.*%\)).*/\1/p')
    line="$line ${em:-?} |"
  done
  echo "$line"
}
header() {
  echo "| $1 | $(echo $SETS | sed 's/ / | /g; s/heldout-//g; s/ood-wordnet-/WordNet (OOD) /') |"
  echo "|---|$(for _ in $SETS; do printf -- '---|'; done)"
}
{
  echo "Self-attention after the stages before the last (the last is the shipped causal.gguf, below):"
  echo
  header "stage"
  row "causal phases (causal2.gguf)" causal2.gguf full
  [ "$DETOUR_STEPS" -eq 0 ] || row "after the detour (causal3.gguf)" causal3.gguf full
  [ "$CURRICULUM_STEPS" -eq 0 ] || row "documents curriculum (docs-warm.gguf)" docs-warm.gguf full
  echo
  if [ "$DETOUR_STEPS" -gt 0 ]; then
    echo "DepCache Fig. 14 from the model before the detour (causal2.gguf, self-attention only):"
    echo
    header "model, attention"
    row "self-attention (full)" causal2.gguf full
    row "dependency, no fine-tuning, depth" causal2.gguf depcache --scheme depth
    row "dependency, no fine-tuning, sequential" causal2.gguf depcache --scheme sequential
    row "dependency + fine-tuning, depth" dep-warm-depth.gguf depcache
    row "dependency + fine-tuning, sequential, no reuse" dep-warm.gguf depcache --no-reuse
    row "dependency + fine-tuning, sequential, reuse" dep-warm.gguf depcache
    row "dependency + fine-tuning, sequential, reuse, no realignment" dep-warm.gguf depcache --no-realign
    echo
    echo "The shipped models (causal.gguf and its fine-tuned copies):"
    echo
  fi
  header "model, attention"
  row "self-attention (causal model, full)" causal.gguf full
  row "self-attention, prefix reuse" causal.gguf prefix
  row "dependency, no fine-tuning, depth" causal.gguf depcache --scheme depth
  row "dependency, no fine-tuning, sequential" causal.gguf depcache --scheme sequential
  row "dependency + fine-tuning, depth" dep-depth.gguf depcache --scheme depth
  row "dependency + fine-tuning, depth, no reuse" dep-depth.gguf depcache --scheme depth --no-reuse
  row "dependency + fine-tuning, sequential" dep-sequential.gguf depcache --scheme sequential
  row "dependency + fine-tuning, sequential, no reuse" dep-sequential.gguf depcache --scheme sequential --no-reuse
  row "dependency + fine-tuning, sequential, no realignment" dep-sequential.gguf depcache --scheme sequential --no-realign
  row "dependency (trees alone), no fine-tuning, sequential" causal.gguf depcache --scheme sequential \
    --tree-context none
  row "dependency (trees alone) + fine-tuning, sequential" dep-alone.gguf depcache
  row "dependency (trees alone) + fine-tuning, sequential, no reuse" dep-alone.gguf depcache --no-reuse
  row "dependency + fine-tuning with position gaps, sequential" dep-gaps.gguf depcache
  row "dependency + fine-tuning with position gaps, sequential, no reuse" dep-gaps.gguf depcache --no-reuse
} | tee "$OUT/eval.md"
log "done: models and logs in $OUT, exact match in $OUT/eval.md"
