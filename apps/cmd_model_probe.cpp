// `depcache model probe`: a text's token ids, the logits at every position and
// a greedy continuation, as one JSON object: what bench/oracle_check.sh
// compares with the leading C++ engine's answer for the same file and text.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "exec/forward.h"
#include "exec/kv_assembly.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache::cli {

void add_model_probe_command(CLI::App& model) {
  CLI::App* cmd = model.add_subcommand(
      "probe", "Print a text's token ids, every position's logits and a greedy continuation as JSON");
  static std::string path, kv_type = "f16";
  static int greedy = 16, threads = 0;
  static int64_t ctx = 0;
  static bool no_bos = false;
  cmd->add_option("-m,--model", path, "GGUF model file")->required();
  cmd->add_option("-n,--greedy", greedy, "Greedy tokens to generate after the text")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--no-bos", no_bos, "Do not prepend the BOS token");
  cmd->add_option("--kv-type", kv_type, "KV cache storage: f16 or f32")->capture_default_str();
  cmd->add_option("-t,--threads", threads, "Threads (default: one per core)");
  cmd->add_option("-c,--ctx-size", ctx,
                  "The context the model is loaded for (Phi-3's LongRoPE uses its long factors past the "
                  "original context; default: the text, the continuation and 16 more, as "
                  "bench/oracle/llama_probe.cpp sizes the other engine's)");
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
    ThreadPool pool(threads);
    Forward fwd(model, pool);
    KvAssembly kv(c, static_cast<int64_t>(ids.size()) + greedy + 1, parse_kv_type(kv_type));
    std::vector<float> logits;
    fwd.eval(ids, kv, Logits::All, logits);
    nlohmann::json out;
    out["ids"] = ids;
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < ids.size(); ++i)
      rows.push_back(
          std::vector<float>(logits.begin() + i * c.n_vocab, logits.begin() + (i + 1) * c.n_vocab));
    out["logits"] = std::move(rows);
    std::vector<int32_t> gen;
    std::vector<float> last(logits.end() - c.n_vocab, logits.end());
    for (int step = 0; step < greedy; ++step) {
      const int32_t best = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
      gen.push_back(best);
      if (tok.is_eog(best) || step + 1 == greedy) break;
      fwd.eval(std::span(&best, 1), kv, Logits::Last, last);
    }
    out["greedy"] = gen;
    fmt::print("{}\n", out.dump());
  });
}

}  // namespace depcache::cli
