// `depcache train`: trains (or fine-tunes) a model on QA requests under the
// attention the engine serves with: causal self-attention over the flat
// prompt, or dependency attention over the DepPrompt with a position scheme.
#include <fmt/format.h>

#include <csignal>

#include "cli_common.h"
#include "commands.h"
#include "model/tokenizer.h"
#include "retrieval/rag_request.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/thread_pool.h"
#include "util/timing.h"

namespace depcache::cli {
namespace {

struct TrainCliOptions {
  std::string init, requests, eval, out, checkpoint, log, attention = "causal", scheme = "sequential",
                                                          tree_context = "system";
  bool answer_loss_only = false, resume = false, pack = false;
  size_t eval_limit = 500;
  int32_t position_gap = 0;
  int threads = 0;
};

// With pack, consecutive requests over the same context share a sequence.
std::vector<QaSequence> sequences(const Tokenizer& tok, const std::vector<RagRequest>& requests,
                                  const QaSequenceOptions& o, int64_t n_ctx, const std::string& what,
                                  bool pack = false) {
  std::vector<QaSequence> out;
  size_t too_long = 0;
  for (size_t begin = 0, end = 0; begin < requests.size(); begin = end) {
    end = begin + 1;
    while (pack && end < requests.size() && same_context(requests[begin], requests[end])) ++end;
    // Position gaps are drawn per request; ids repeat across concatenated
    // files, so the index seeds them too.
    QaSequenceOptions oi = o;
    oi.position_gap_seed += begin;
    QaSequence s = qa_sequence(tok, std::span(requests).subspan(begin, end - begin), oi);
    if (static_cast<int64_t>(s.sequence.tokens.size()) > n_ctx) {
      too_long += end - begin;
      continue;
    }
    out.push_back(std::move(s));
  }
  if (too_long)
    fmt::print(stderr, "warning: {} of {} {} requests exceed the model's context of {} tokens: left out\n",
               too_long, requests.size(), what, n_ctx);
  return out;
}

// Set by SIGINT/SIGTERM: the loop writes a checkpoint after the step it is
// in and stops, so an interrupted run loses nothing but that step's time.
volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

// The data and the attention trained under.
void add_data_options(CLI::App* cmd, TrainCliOptions& c) {
  cmd->add_option("--init", c.init, "Model to start from (`model new` for a fresh one, or a trained one)")
      ->required();
  cmd->add_option("--requests", c.requests,
                  "Training requests (JSONL with answers, as `workload generate` writes)")
      ->required();
  cmd->add_option("--eval", c.eval, "Held-out requests: loss and exact match of the answer while training");
  cmd->add_option("--eval-limit", c.eval_limit, "Evaluate on at most this many held-out requests")
      ->capture_default_str();
  add_output_option(*cmd, c.out, "The trained model (GGUF, f32)")->required();
  cmd->add_option("--attention", c.attention,
                  "causal: the flat prompt; dependency: one tree per context item, as depcache serves it")
      ->capture_default_str()
      ->check(CLI::IsMember({"causal", "dependency"}));
  cmd->add_option("--scheme", c.scheme, "Position scheme under dependency attention")
      ->capture_default_str()
      ->check(CLI::IsMember({"sequential", "depth"}));
  cmd->add_option("--tree-context", c.tree_context,
                  "What a context tree sees besides itself under dependency attention: system (the system "
                  "text) or none (a tree moved to another offset is then reused exactly under sequential "
                  "positions too); written into the model")
      ->capture_default_str()
      ->check(CLI::IsMember({"system", "none"}));
  cmd->add_option(
         "--position-gap", c.position_gap,
         "Under dependency attention, move each context tree and what follows it by a further random "
         "0..N positions (drawn per request from --seed), so that trees are trained at the varying "
         "distances from the system text that reuse at other offsets gives them; the held-out "
         "requests keep the served positions")
      ->capture_default_str()
      ->check(CLI::Range(0, 65536));
  cmd->add_flag("--answer-loss-only", c.answer_loss_only, "Loss on the answer alone (default: every token)");
  cmd->add_flag("--pack-shared-context", c.pack,
                "Consecutive training requests over the same context form one sequence: the context once, "
                "then each question and answer in turn (`workload generate --questions-per-context`)");
}

// The optimizer, its schedule, logging and checkpoints.
void add_optimizer_options(CLI::App* cmd, TrainCliOptions& c, TrainerOptions& t) {
  cmd->add_option("--steps", t.adam.total_steps, "Optimizer steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch", t.batch_size, "Sequences per step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--lr", t.adam.lr, "Peak learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", t.adam.warmup_steps, "Linear warmup steps")->capture_default_str();
  cmd->add_option("--min-lr-ratio", t.adam.min_lr_ratio, "Where the cosine decay ends, relative to --lr")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--weight-decay", t.adam.weight_decay, "AdamW weight decay (2-D weights)")
      ->capture_default_str();
  cmd->add_option("--clip", t.adam.clip_norm, "Clip the gradient's global norm to this (0: off)")
      ->capture_default_str();
  cmd->add_option("--seed", t.seed, "Seed of the order of the examples")->capture_default_str();
  add_threads_option(*cmd, c.threads);
  cmd->add_option("--log", c.log, "Append a JSON line per logged step (loss, learning rate, evaluation)");
  cmd->add_option("--log-every", t.log_every, "Steps between log lines")->capture_default_str();
  cmd->add_option("--eval-every", t.eval_every, "Steps between evaluations")->capture_default_str();
  cmd->add_option("--checkpoint", c.checkpoint, "Checkpoint file (default: OUTPUT.ckpt)");
  cmd->add_option("--checkpoint-every", t.checkpoint_every, "Steps between checkpoints")
      ->capture_default_str();
  cmd->add_flag("--resume", c.resume, "Continue from the checkpoint when there is one");
}

QaSequenceOptions sequence_options(const TrainCliOptions& c, const Model& init) {
  QaSequenceOptions qo;
  qo.attention = c.attention == "dependency" ? TrainAttention::Dependency : TrainAttention::Causal;
  qo.scheme = c.scheme == "depth" ? PositionScheme::Depth : PositionScheme::Sequential;
  qo.tree_context = *parse_tree_context(c.tree_context);
  qo.loss_on_prompt = !c.answer_loss_only;
  qo.prompt = init.config().prompt;
  return qo;
}

// The training sequences' options: sequence_options with the position gaps.
QaSequenceOptions training_options(const TrainCliOptions& c, const TrainerOptions& t, QaSequenceOptions qo) {
  if (c.position_gap > 0 && qo.attention != TrainAttention::Dependency)
    fail(ErrorKind::InvalidInput, "--position-gap moves context trees: it needs --attention dependency");
  qo.max_position_gap = c.position_gap;
  qo.position_gap_seed = t.seed;
  return qo;
}

// Resumes from the checkpoint when asked and there is one, saying so.
void resume_if_asked(const TrainCliOptions& c, const TrainerOptions& t, Trainer& trainer) {
  if (!c.resume || !trainer.checkpoint_exists()) return;
  trainer.resume();
  fmt::print(stderr, "resumed from {} at step {}\n", t.checkpoint.string(), trainer.step());
  if (trainer.resumed_total_steps() != 0 && trainer.resumed_total_steps() != t.adam.total_steps)
    fmt::print(stderr,
               "note: the checkpoint's run was of {} steps, this one is of {}: the learning rate schedule "
               "changes from here\n",
               trainer.resumed_total_steps(), t.adam.total_steps);
}

// Trains until done or stopped by SIGINT/SIGTERM (then exits 128 + the
// signal after the checkpoint).
void train_until_done_or_stopped(Trainer& trainer, const TrainerOptions& t,
                                 const std::vector<QaSequence>& train, const std::vector<QaSequence>& eval) {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  const bool finished = trainer.train(
      train, eval, [](const std::string& line) { fmt::print(stderr, "{}\n", line); },
      [] { return g_stop_signal != 0; });
  if (finished) return;
  const int sig = g_stop_signal;
  fmt::print(stderr, "{} at step {}: checkpoint {} written; the same command with --resume continues\n",
             sig == SIGINT ? "SIGINT" : "SIGTERM", trainer.step(), t.checkpoint.string());
  throw ExitCode{128 + sig};
}

void run_train(const TrainCliOptions& c, TrainerOptions t) {
  const auto t0 = Clock::now();
  const auto init = Model::load(c.init);
  const Tokenizer tok(Vocab::from_gguf(init->file()));
  const QaSequenceOptions qo = sequence_options(c, *init);
  const int64_t n_ctx = init->config().n_ctx_train;
  const std::vector<QaSequence> train =
      sequences(tok, read_requests(c.requests), training_options(c, t, qo), n_ctx, "training", c.pack);
  std::vector<RagRequest> eval_requests = c.eval.empty() ? std::vector<RagRequest>{} : read_requests(c.eval);
  if (eval_requests.size() > c.eval_limit) eval_requests.resize(c.eval_limit);
  const std::vector<QaSequence> eval = sequences(tok, eval_requests, qo, n_ctx, "held-out");
  if (train.empty()) fail(ErrorKind::InvalidInput, "no training sequence fits the model's context");

  for (const auto& [k, v] : init->file().metadata())
    if (inherited_metadata_key(k)) t.metadata.emplace_back(k, v);
  if (qo.attention == TrainAttention::Dependency) {
    t.metadata.emplace_back(kPositionSchemeKey, GgufValue::string(c.scheme));
    t.metadata.emplace_back(kTreeContextKey, GgufValue::string(c.tree_context));
  }
  t.checkpoint = c.checkpoint.empty() ? c.out + ".ckpt" : c.checkpoint;
  t.log = c.log;
  ThreadPool pool(c.threads);
  Trainer trainer(ParamSet::from_model(*init), t, pool);
  resume_if_asked(c, t, trainer);
  int64_t n_tokens = 0;
  for (const QaSequence& s : train) n_tokens += static_cast<int64_t>(s.sequence.tokens.size());
  fmt::print(stderr,
             "training on {} sequences ({:.1f} tokens each), {} held out; {} attention{}; {} steps of {}\n",
             train.size(), static_cast<double>(n_tokens) / static_cast<double>(train.size()), eval.size(),
             c.attention,
             qo.attention == TrainAttention::Dependency
                 ? ", " + c.scheme + " positions, trees see " +
                       (c.tree_context == "none" ? "only themselves" : "the system text") +
                       (c.position_gap > 0 ? fmt::format(", gaps of 0..{} before each tree", c.position_gap)
                                           : std::string())
                 : "",
             t.adam.total_steps, t.batch_size);
  train_until_done_or_stopped(trainer, t, train, eval);
  const std::string name = init->file().get_string_or("general.name").value_or("depcache-trained");
  const RandomModelReport r = trainer.params().write_gguf(c.out, name, DType::F32, t.metadata);
  fmt::print("wrote {}: {:.2f} M params, {:.2f} MiB, in {:.1f} s\n", c.out, r.n_params / 1e6,
             r.file_bytes / 1048576.0, seconds_since(t0));
}

}  // namespace

void add_train_command(CLI::App& app) {
  static TrainCliOptions c;
  static TrainerOptions t;
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train or fine-tune a model on QA requests (causal or dependency attention), with checkpoints");
  add_data_options(cmd, c);
  add_optimizer_options(cmd, c, t);
  cmd->callback([] { run_train(c, t); });
}

}  // namespace depcache::cli
