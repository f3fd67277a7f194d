// `depcache model probe`: a text's token ids, the logits at every position and
// a greedy continuation, as one JSON object: what bench/experiments/oracle_check.sh
// compares with the leading C++ engine's answer for the same file and text.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "engine/engine.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "prompt/prompt_parts.h"
#include "util/error.h"

namespace depcache::cli {

void add_model_probe_command(CLI::App& model) {
  CLI::App* cmd = model.add_subcommand(
      "probe", "Print a text's token ids, every position's logits and a greedy continuation as JSON");
  static std::string path, kv_type = "f16";
  static int greedy = 16, threads = 0;
  static int64_t ctx = 0;
  static bool no_bos = false;
  add_model_option(*cmd, path)->required();
  cmd->add_option("-n,--greedy", greedy, "Greedy tokens to generate after the text")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--no-bos", no_bos, "Do not prepend the BOS token");
  add_kv_type_option(*cmd, kv_type);
  add_threads_option(*cmd, threads);
  cmd->add_option("-c,--ctx-size", ctx,
                  "The context the model is loaded for (Phi-3's LongRoPE uses its long factors past the "
                  "original context; default: the text, the continuation and 16 more, as "
                  "bench/experiments/oracle/llama_probe.cpp sizes the other engine's)");
  cmd->footer("The text is standard input, byte for byte; special tokens in it are parsed.");
  cmd->callback([] {
    std::string text;
    char buf[1 << 16];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, stdin)) > 0;) text.append(buf, n);
    GgufFile file = GgufFile::open(path);
    const Tokenizer tok(Vocab::from_gguf(file));
    const std::vector<int32_t> ids = tok.encode(text, !no_bos && tok.vocab().add_bos, true);
    if (ids.empty()) fail(ErrorKind::InvalidInput, "the text has no tokens");
    const int64_t n_ctx = std::max<int64_t>(ctx, static_cast<int64_t>(ids.size()) + greedy + 16);
    auto model = Model::from_file(std::move(file), {n_ctx});
    const ModelConfig& c = model->config();
    if (n_ctx > c.n_ctx_train)
      fail(ErrorKind::LimitExceeded, "the text and the continuation need {} positions; the model runs {}",
           n_ctx, c.n_ctx_train);
    // One request through the engine: the text in one pass (every row's
    // logits), then greedy tokens up to the count or an end of generation.
    EngineOptions eo;
    eo.pool_rows = static_cast<int64_t>(ids.size()) + greedy + 1;
    eo.kv_type = parse_kv_type(kv_type);
    eo.cache_bytes = 0;
    eo.batch_tokens = static_cast<int64_t>(ids.size()) + 1;
    eo.threads = threads;
    eo.eog_ids = tok.eog_ids();
    Engine engine(model, eo);
    PromptParts parts;
    parts.text = ids;
    SamplingParams sampling;
    sampling.max_tokens = std::max(greedy, 1);
    sampling.prompt_logits = true;
    const RequestResult& r = engine.wait(engine.submit("full", parts, sampling));
    nlohmann::json out;
    out["ids"] = ids;
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < ids.size(); ++i)
      rows.push_back(std::vector<float>(r.prompt_logits.begin() + static_cast<int64_t>(i) * c.n_vocab,
                                        r.prompt_logits.begin() + static_cast<int64_t>(i + 1) * c.n_vocab));
    out["logits"] = std::move(rows);
    const std::vector<int32_t> gen =
        greedy > 0 ? r.tokens : std::vector<int32_t>{};  // the end-of-generation token included, if any
    out["greedy"] = gen;
    fmt::print("{}\n", out.dump());
  });
}

}  // namespace depcache::cli
