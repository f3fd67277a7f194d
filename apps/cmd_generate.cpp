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

namespace {

struct GenerateCliOptions {
  std::string model_path, prompt, request_file, kv_type = "f16";
  int n_predict = 64, threads = 0, ctx = 0;
  size_t request_line = 1;
  bool no_bos = false, ignore_eos = false;
  SamplerParams sp = [] {
    SamplerParams p;
    p.temperature = 0.8f;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    return p;
  }();
  int64_t seed = -1;
};

void add_generate_options(CLI::App* cmd, GenerateCliOptions& o) {
  add_model_option(*cmd, o.model_path)->required();
  CLI::Option* prompt_opt = cmd->add_option("-p,--prompt", o.prompt, "Prompt text");
  CLI::Option* request_opt =
      cmd->add_option("--request", o.request_file,
                      "Instead of --prompt: a RAG request file (JSONL, as `workload generate` writes); the "
                      "prompt is the request's context and question in the model's prompt template, as `run` "
                      "builds it, and with answers in the request the greedy answer is judged on stderr")
          ->excludes(prompt_opt);
  cmd->add_option("--line", o.request_line, "--request: which request of the file (1: the first)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->needs(request_opt);
  cmd->add_option("-n,--n-predict", o.n_predict, "Tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temp", o.sp.temperature, "Sampling temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", o.sp.top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
  cmd->add_option("--top-p", o.sp.top_p, "Nucleus sampling mass (1: off)")->capture_default_str();
  cmd->add_option("--min-p", o.sp.min_p, "Drop tokens below min-p x the top probability (0: off)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Sampling seed (default: random)");
  add_threads_option(*cmd, o.threads);
  cmd->add_option("-c,--ctx-size", o.ctx, "Context size (default: prompt + n, at most the model's)");
  add_kv_type_option(*cmd, o.kv_type);
  cmd->add_flag("--no-bos", o.no_bos, "Do not prepend the BOS token");
  cmd->add_flag("--ignore-eos", o.ignore_eos, "Keep generating after an end-of-generation token");
}

// The prompt's tokens and its text (echoed before the completion), and the
// request's answers when the prompt is a RAG request.
struct GeneratePrompt {
  std::vector<int32_t> ids;
  std::string text;
  std::vector<std::string> answers;
};

GeneratePrompt prompt_of(const GenerateCliOptions& o, const Tokenizer& tok, const Model& model) {
  GeneratePrompt p;
  if (o.request_file.empty()) {
    p.ids = tok.encode(o.prompt, !o.no_bos, true);
    p.text = o.prompt;
  } else {
    std::vector<RagRequest> requests = read_requests(o.request_file);
    if (o.request_line > requests.size())
      fail(ErrorKind::InvalidInput, "{} has {} requests; --line {} is beyond them", o.request_file,
           requests.size(), o.request_line);
    const RagRequest& req = requests[o.request_line - 1];
    p.ids = make_prompt_parts(tok, req, model.config().prompt).flat();
    if (o.no_bos && !p.ids.empty() && p.ids.front() == tok.bos()) p.ids.erase(p.ids.begin());
    p.text = tok.decode(p.ids);
    p.answers = req.answers;
  }
  if (p.ids.empty())
    fail(ErrorKind::InvalidInput, "the prompt tokenizes to nothing; give text or drop --no-bos");
  return p;
}

// Timings on stderr, and the greedy answer judged when the request has answers.
void report(const Tokenizer& tok, const GeneratePrompt& p, const RequestResult& r) {
  const double ttft_ms = std::chrono::duration<double, std::milli>(r.first_token - r.submitted).count();
  const double decode_ms = std::chrono::duration<double, std::milli>(r.done - r.first_token).count();
  const double n_gen_after_first = r.tokens.size() > 1 ? double(r.tokens.size() - 1) : 0;
  fmt::print(stderr,
             "\nprompt: {} tokens, TTFT {:.1f} ms ({:.1f} tok/s)\ngeneration: {} tokens, {:.1f} tok/s after "
             "the first\n",
             p.ids.size(), ttft_ms, static_cast<double>(p.ids.size()) * 1000.0 / std::max(ttft_ms, 1e-9),
             r.tokens.size(), n_gen_after_first > 0 ? n_gen_after_first * 1000.0 / decode_ms : 0.0);
  if (!p.answers.empty()) {
    const std::string answer = generated_answer(tok, r.tokens);
    fmt::print(stderr, "answer: \"{}\" ({}; expected \"{}\")\n", answer,
               answer_matches(answer, p.answers) ? "exact match" : "no match",
               fmt::join(p.answers, "\" or \""));
  }
}

// prompt_given: --prompt or --request was on the command line (an empty
// --prompt is refused later, as tokenizing to nothing).
void run_generate(const GenerateCliOptions& o, bool prompt_given) {
  SamplingParams sampling;
  sampling.sampler = o.sp;
  sampling.sampler.seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : std::random_device{}();
  sampling.sampler.validate();
  sampling.max_tokens = o.n_predict;
  sampling.stop_at_eog = !o.ignore_eos;
  const DType kv = parse_kv_type(o.kv_type);
  auto model = Model::load(o.model_path, {o.ctx});
  const Tokenizer tok(Vocab::from_gguf(model->file()));
  if (!prompt_given) throw CLI::RequiredError("--prompt or --request");
  const GeneratePrompt p = prompt_of(o, tok, *model);
  const int64_t want = static_cast<int64_t>(p.ids.size()) + o.n_predict;
  const int64_t n_ctx = o.ctx > 0 ? o.ctx : std::min<int64_t>(want, model->config().n_ctx_train);
  if (want > n_ctx)
    fail(ErrorKind::LimitExceeded, "prompt of {} tokens + {} to generate exceeds the context size {}",
         p.ids.size(), o.n_predict, n_ctx);

  EngineOptions eo;
  eo.pool_rows = n_ctx;
  eo.kv_type = kv;
  eo.cache_bytes = 0;  // one request, nothing to reuse
  eo.threads = o.threads;
  eo.eog_ids = tok.eog_ids();
  Engine engine(model, eo);
  PromptParts parts;
  parts.text = p.ids;  // the prompt as it is: no reuse, no structure

  std::fwrite(p.text.data(), 1, p.text.size(), stdout);
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
  report(tok, p, r);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("generate", "Complete a prompt with a GGUF model");
  static GenerateCliOptions o;
  add_generate_options(cmd, o);
  cmd->callback([cmd] { run_generate(o, cmd->count("--prompt") > 0 || cmd->count("--request") > 0); });
}

}  // namespace depcache::cli
