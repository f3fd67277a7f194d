#pragma once
// The training loop: batches drawn in a seeded order that depends only on
// the step (so a resumed run continues exactly), AdamW updates, evaluation
// on held-out sequences (loss and exact match of the answer), a JSON line
// per logged step, and checkpoints that resume: the model itself (a GGUF
// the engine loads) and its optimizer state beside it.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "train/optimizer.h"
#include "train/qa_sequences.h"
#include "train/train_graph.h"

namespace depcache {

class ThreadPool;

struct TrainerOptions {
  AdamWOptions adam;
  size_t batch_size = 32;
  uint64_t seed = 1;                 // the order of the examples
  int64_t log_every = 10;            // steps between log lines
  int64_t eval_every = 100;          // steps between evaluations (0: only at the end)
  int64_t checkpoint_every = 200;    // steps between checkpoints (0: only at the end)
  std::filesystem::path checkpoint;  // MODEL.gguf (+ MODEL.gguf.optim); empty: none
  std::filesystem::path log;         // JSON lines; empty: none
  std::string model_name = "depcache-trained";
  // tokenizer.* and other keys every written model carries.
  std::vector<std::pair<std::string, GgufValue>> metadata;
};

struct EvalResult {
  double loss = 0;         // mean over answer tokens
  double exact_match = 0;  // share of sequences whose every answer token is the argmax
  size_t n = 0;
};

class Trainer {
 public:
  Trainer(ParamSet params, TrainerOptions options, ThreadPool& pool);

  // Continues from the checkpoint at options.checkpoint: the model, the
  // optimizer's moments and the step. InvalidInput when it does not match.
  void resume();
  // The step count of the run the checkpoint was written by (its learning
  // rate schedule); 0 before resume() or for a checkpoint without it.
  int64_t resumed_total_steps() const { return resumed_total_; }
  bool checkpoint_exists() const;

  // Trains up to adam.total_steps; `progress` (optional) gets each log
  // line. `stop` (optional) is asked after each step: when it says so, a
  // checkpoint is written and false returned (true: all steps done).
  bool train(const std::vector<QaSequence>& train, const std::vector<QaSequence>& eval,
             const std::function<void(const std::string&)>& progress = {},
             const std::function<bool()>& stop = {});

  EvalResult evaluate(const std::vector<QaSequence>& eval);
  void save_checkpoint() const;

  const ParamSet& params() const { return params_; }
  int64_t step() const { return opt_.step(); }

 private:
  std::vector<size_t> batch_of(int64_t step, size_t n_examples) const;
  void log(const std::string& line, const std::function<void(const std::string&)>& progress) const;

  ParamSet params_;
  TrainerOptions o_;
  ThreadPool& pool_;
  AdamW opt_;
  TrainGraph graph_;
  int64_t resumed_total_ = 0;
};

}  // namespace depcache
