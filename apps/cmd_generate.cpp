// `depcache generate`: complete a prompt, streaming text to stdout and
// timings to stderr. The prompt is text, or a RAG request built with the
// model's prompt template exactly as `run` and the trainer build it (each
// context piece tokenized on its own), so a QA model sees what it was
// trained on.
#include <fmt/format.h>

#include <cstdio>

#include "cli_common.h"
#include "commands.h"
#include "compute/dtype.h"
#include "engine/engine.h"
#include "eval/answers.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "retrieval/rag_request.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache::cli {

void add_generate_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("generate", "Complete a prompt with a GGUF model");
  static std::string model_path, prompt, request_file, kv_type = "f16";
  static int n_predict = 64, threads = 0, ctx = 0;
  static size_t request_line = 1;
  static bool no_bos = false, ignore_eos = false;
  static SamplerParams sp = [] {
    SamplerParams p;
    p.temperature = 0.8f;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    return p;
  }();
  static int64_t seed = -1;
  cmd->add_option("-m,--model", model_path, "GGUF model file")->required();
  CLI::Option* prompt_opt = cmd->add_option("-p,--prompt", prompt, "Prompt text");
  CLI::Option* request_opt =
      cmd->add_option("--request", request_file,
                      "Instead of --prompt: a RAG request file (JSONL, as `workload generate` writes); the "
                      "prompt is the request's context and question in the model's prompt template, as `run` "
                      "builds it, and with answers in the request the greedy answer is judged on stderr")
          ->excludes(prompt_opt);
  cmd->add_option("--line", request_line, "--request: which request of the file (1: the first)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->needs(request_opt);
  cmd->add_option("-n,--n-predict", n_predict, "Tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temp", sp.temperature, "Sampling temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", sp.top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
  cmd->add_option("--top-p", sp.top_p, "Nucleus sampling mass (1: off)")->capture_default_str();
  cmd->add_option("--min-p", sp.min_p, "Drop tokens below min-p x the top probability (0: off)")
      ->capture_default_str();
  cmd->add_option("--seed", seed, "Sampling seed (default: random)");
  cmd->add_option("-t,--threads", threads, "Threads (default: one per core)");
  cmd->add_option("-c,--ctx-size", ctx, "Context size (default: prompt + n, at most the model's)");
  cmd->add_option("--kv-type", kv_type, "KV cache storage: f16 or f32")->capture_default_str();
  cmd->add_flag("--no-bos", no_bos, "Do not prepend the BOS token");
  cmd->add_flag("--ignore-eos", ignore_eos, "Keep generating after an end-of-generation token");
  cmd->callback([cmd] {
    sp.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
    sp.validate();
    const DType kv = parse_kv_type(kv_type);
    auto model = Model::load(model_path, {ctx});
    const Tokenizer tok(Vocab::from_gguf(model->file()));
    if (cmd->count("--prompt") == 0 && cmd->count("--request") == 0)
      throw CLI::RequiredError("--prompt or --request");
    std::vector<int32_t> ids;
    std::vector<std::string> answers;
    if (request_file.empty()) {
      ids = tok.encode(prompt, !no_bos, true);
    } else {
      std::vector<RagRequest> requests = read_requests(request_file);
      if (request_line > requests.size())
        fail(ErrorKind::InvalidInput, "{} has {} requests; --line {} is beyond them", request_file,
             requests.size(), request_line);
      const RagRequest& req = requests[request_line - 1];
      ids = make_prompt_parts(tok, req, model->config().prompt).flat();
      if (no_bos && !ids.empty() && ids.front() == tok.bos()) ids.erase(ids.begin());
      prompt = tok.decode(ids);
      answers = req.answers;
    }
    if (ids.empty())
      fail(ErrorKind::InvalidInput, "the prompt tokenizes to nothing; give text or drop --no-bos");
    const int64_t want = static_cast<int64_t>(ids.size()) + n_predict;
    const int64_t n_ctx = ctx > 0 ? ctx : std::min<int64_t>(want, model->config().n_ctx_train);
    if (want > n_ctx)
      fail(ErrorKind::LimitExceeded, "prompt of {} tokens + {} to generate exceeds the context size {}",
           ids.size(), n_predict, n_ctx);

    EngineOptions eo;
    eo.pool_rows = n_ctx;
    eo.kv_type = kv;
    eo.cache_bytes = 0;  // one request, nothing to reuse
    eo.threads = threads;
    eo.eog_ids = tok.eog_ids();
    Engine engine(model, eo);
    SamplingParams sampling;
    sampling.sampler = sp;
    sampling.max_tokens = n_predict;
    sampling.stop_at_eog = !ignore_eos;
    PromptParts parts;
    parts.text = ids;  // the prompt as it is: no reuse, no structure

    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    std::fflush(stdout);
    StreamDecoder stream(tok, false, /*starts_text=*/false);  // continues the echoed prompt
    const RequestResult& r = engine.wait(engine.submit("full", parts, sampling, [&](const TokenEvent& e) {
      if (tok.is_eog(e.token)) return;
      const std::string text = stream.push(e.token);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }));
    const std::string rest = stream.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    const double ttft_ms = std::chrono::duration<double, std::milli>(r.first_token - r.submitted).count();
    const double decode_ms = std::chrono::duration<double, std::milli>(r.done - r.first_token).count();
    const double n_gen_after_first = r.tokens.size() > 1 ? double(r.tokens.size() - 1) : 0;
    fmt::print(
        stderr,
        "\nprompt: {} tokens, TTFT {:.1f} ms ({:.1f} tok/s)\ngeneration: {} tokens, {:.1f} tok/s after "
        "the first\n",
        ids.size(), ttft_ms, static_cast<double>(ids.size()) * 1000.0 / std::max(ttft_ms, 1e-9),
        r.tokens.size(), n_gen_after_first > 0 ? n_gen_after_first * 1000.0 / decode_ms : 0.0);
    if (!answers.empty()) {
      const std::string answer = generated_answer(tok, r.tokens);
      fmt::print(stderr, "answer: \"{}\" ({}; expected \"{}\")\n", answer,
                 answer_matches(answer, answers) ? "exact match" : "no match",
                 fmt::join(answers, "\" or \""));
    }
  });
}

}  // namespace depcache::cli
