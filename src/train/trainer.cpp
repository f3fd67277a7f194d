#include "train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "model/gguf.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache {
namespace {

std::filesystem::path optim_path(const std::filesystem::path& model) {
  return std::filesystem::path(model.string() + ".optim");
}

constexpr const char* kStepKey = "depcache.train.step";
constexpr const char* kTotalStepsKey = "depcache.train.total_steps";

}  // namespace

Trainer::Trainer(ParamSet params, TrainerOptions options, ThreadPool& pool)
    : params_(std::move(params)), o_(std::move(options)), pool_(pool), opt_(params_, o_.adam), graph_(pool) {
  if (o_.batch_size == 0) fail(ErrorKind::InvalidInput, "the batch size must be at least 1");
}

bool Trainer::checkpoint_exists() const {
  return !o_.checkpoint.empty() && std::filesystem::exists(o_.checkpoint) &&
         std::filesystem::exists(optim_path(o_.checkpoint));
}

void Trainer::save_checkpoint() const {
  if (o_.checkpoint.empty()) return;
  const std::filesystem::path model = o_.checkpoint, optim = optim_path(model);
  const auto partial = [](const std::filesystem::path& p) {
    return std::filesystem::path(p.string() + ".partial");
  };
  auto md = o_.metadata;
  md.emplace_back(kStepKey, GgufValue::u64(static_cast<uint64_t>(opt_.step())));
  md.emplace_back(kTotalStepsKey, GgufValue::u64(static_cast<uint64_t>(o_.adam.total_steps)));
  params_.write_gguf(partial(model), o_.model_name, DType::F32, md);
  GgufWriter w;
  w.set(kStepKey, GgufValue::u64(static_cast<uint64_t>(opt_.step())));
  for (const auto& [prefix, moments] :
       {std::pair<const char*, const ParamSet*>{"adam_m.", &opt_.m()}, {"adam_v.", &opt_.v()}})
    for (size_t i = 0; i < params_.tensors().size(); ++i) {
      const ModelTensor& t = params_.tensors()[i];
      const float* src = moments->data(i);
      w.add_tensor(prefix + t.name, DType::F32,
                   t.matrix ? std::vector<int64_t>{t.n_in, t.n_out} : std::vector<int64_t>{t.n_in},
                   [src](uint8_t* dst, size_t n) { std::memcpy(dst, src, n); });
    }
  w.write(partial(optim));
  // The optimizer state first: a model file always has its state beside it.
  std::filesystem::rename(partial(optim), optim);
  std::filesystem::rename(partial(model), model);
}

void Trainer::resume() {
  const std::filesystem::path model_path = o_.checkpoint, optim = optim_path(model_path);
  const auto model = Model::load(model_path);
  ParamSet loaded = ParamSet::from_model(*model);
  if (loaded.size() != params_.size() || loaded.tensors().size() != params_.tensors().size())
    fail(ErrorKind::InvalidInput, "checkpoint {} holds a model of another shape", model_path.string());
  const GgufFile state = GgufFile::open(optim);
  const int64_t step = model->file().get_int(kStepKey);
  if (state.get_int(kStepKey) != step)
    fail(ErrorKind::InvalidInput, "checkpoint {} and its optimizer state are of different steps ({} and {})",
         model_path.string(), step, state.get_int(kStepKey));
  for (const auto& [prefix, moments] :
       {std::pair<const char*, ParamSet*>{"adam_m.", &opt_.m()}, {"adam_v.", &opt_.v()}})
    for (size_t i = 0; i < params_.tensors().size(); ++i) {
      const ModelTensor& t = params_.tensors()[i];
      const GgufTensor* g = state.find_tensor(prefix + t.name);
      if (!g || g->type != DType::F32 || g->n_elements() != t.size())
        fail(ErrorKind::InvalidInput, "{} lacks {}{} of {} values", optim.string(), prefix, t.name, t.size());
      std::memcpy(moments->data(i), g->data, g->n_bytes);
    }
  params_ = std::move(loaded);
  opt_.set_step(step);
  resumed_total_ = model->file().get_int_or(kTotalStepsKey).value_or(0);
}

std::vector<size_t> Trainer::batch_of(int64_t step, size_t n) const {
  // Example k of the whole run is the (k mod n)-th of epoch k / n's own
  // permutation, so the batches depend on the step alone.
  std::vector<size_t> out;
  std::vector<size_t> order;
  int64_t epoch = -1;
  for (size_t b = 0; b < o_.batch_size; ++b) {
    const uint64_t k = static_cast<uint64_t>(step) * o_.batch_size + b;
    const auto e = static_cast<int64_t>(k / n);
    if (e != epoch) {
      epoch = e;
      order.resize(n);
      for (size_t i = 0; i < n; ++i) order[i] = i;
      std::mt19937_64 rng(o_.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
      std::shuffle(order.begin(), order.end(), rng);
    }
    out.push_back(order[k % n]);
  }
  return out;
}

EvalResult Trainer::evaluate(const std::vector<QaSequence>& eval) {
  EvalResult r;
  double loss = 0;
  int64_t answer_tokens = 0;
  size_t correct = 0;
  for (size_t begin = 0; begin < eval.size(); begin += o_.batch_size) {
    const size_t end = std::min(eval.size(), begin + o_.batch_size);
    std::vector<TrainSequence> batch;
    for (size_t i = begin; i < end; ++i) {
      TrainSequence s = eval[i].sequence;
      // Only the answer is scored: the context is made-up names.
      for (int64_t t = 0; t + 1 < eval[i].answer_begin; ++t) s.targets[t] = -1;
      batch.push_back(std::move(s));
    }
    const LossSum l = graph_.run(params_, batch, nullptr);
    loss += l.sum;
    answer_tokens += l.n_targets;
    int64_t row = 0;
    for (const TrainSequence& s : batch) {
      bool all = true;
      for (size_t t = 0; t < s.tokens.size(); ++t)
        if (s.targets[t] >= 0) all = all && graph_.correct()[row + static_cast<int64_t>(t)];
      correct += all;
      row += static_cast<int64_t>(s.tokens.size());
    }
  }
  r.n = eval.size();
  r.loss = answer_tokens ? loss / static_cast<double>(answer_tokens) : 0.0;
  r.exact_match = r.n ? static_cast<double>(correct) / static_cast<double>(r.n) : 0.0;
  return r;
}

void Trainer::log(const std::string& line, const std::function<void(const std::string&)>& progress) const {
  if (!o_.log.empty()) std::ofstream(o_.log, std::ios::app) << line << "\n";
  if (progress) progress(line);
}

bool Trainer::train(const std::vector<QaSequence>& train, const std::vector<QaSequence>& eval,
                    const std::function<void(const std::string&)>& progress,
                    const std::function<bool()>& stop) {
  if (train.empty()) fail(ErrorKind::InvalidInput, "no training examples");
  const int64_t total = o_.adam.total_steps;
  double loss_sum = 0;
  int64_t tokens = 0, targets = 0;
  auto since = Clock::now();
  while (opt_.step() < total) {
    const int64_t step = opt_.step();
    std::vector<TrainSequence> batch;
    for (size_t i : batch_of(step, train.size())) {
      batch.push_back(train[i].sequence);
      tokens += static_cast<int64_t>(train[i].sequence.tokens.size());
    }
    ParamSet grads(params_.shape());
    const LossSum l = graph_.run(params_, batch, &grads);
    if (!std::isfinite(l.sum))
      fail(ErrorKind::InvalidInput, "the loss is not finite at step {} (lower the learning rate?)", step);
    const double norm = opt_.update(params_, grads);
    loss_sum += l.sum;
    targets += l.n_targets;
    const bool last = opt_.step() == total;
    if (opt_.step() % std::max<int64_t>(o_.log_every, 1) == 0 || last) {
      const double s = seconds_since(since);
      nlohmann::json j = {{"step", opt_.step()},
                          {"lr", learning_rate(o_.adam, step)},
                          {"loss", targets ? loss_sum / static_cast<double>(targets) : 0.0},
                          {"grad_norm", norm},
                          {"tokens_per_s", s > 0 ? static_cast<double>(tokens) / s : 0.0}};
      if (!eval.empty() && ((o_.eval_every > 0 && opt_.step() % o_.eval_every == 0) || last)) {
        const EvalResult e = evaluate(eval);
        j["eval_loss"] = e.loss;
        j["eval_exact_match"] = e.exact_match;
      }
      log(j.dump(), progress);
      loss_sum = 0, targets = 0, tokens = 0;
      since = Clock::now();
    }
    const bool stopping = !last && stop && stop();
    if ((o_.checkpoint_every > 0 && opt_.step() % o_.checkpoint_every == 0) || last || stopping)
      save_checkpoint();
    if (stopping) return false;
  }
  return true;
}

}  // namespace depcache
