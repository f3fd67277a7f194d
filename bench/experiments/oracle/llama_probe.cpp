// A probe of the leading C++ engine (llama.cpp, linked as a library) that
// prints, as one JSON object, what depcache's `model probe` prints for the
// same GGUF file and text: the token ids, every position's logits and a
// greedy continuation. bench/experiments/llama_cpp.sh builds it against that engine's
// source; bench/oracle_check.py compares the two outputs.
// Usage: llama_probe MODEL.gguf N_GREEDY [--no-bos] [--ctx N] < text
// (--ctx: the context size to create, which picks Phi-3's long RoPE factors
// past the original context)
#include <llama.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

void quiet(ggml_log_level, const char*, void*) {}

void print_ids(const char* name, const std::vector<llama_token>& ids) {
  std::printf("\"%s\":[", name);
  for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? ",%d" : "%d", ids[i]);
  std::printf("]");
}

// Decodes `ids` at positions [pos0, pos0 + n), asking for logits at every one.
bool decode(llama_context* ctx, const std::vector<llama_token>& ids, int pos0) {
  llama_batch batch = llama_batch_init(static_cast<int32_t>(ids.size()), 0, 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = pos0 + static_cast<int>(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = static_cast<int32_t>(ids.size());
  const bool ok = llama_decode(ctx, batch) == 0;
  llama_batch_free(batch);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf N_GREEDY [--no-bos] [--ctx N] < text\n", argv[0]);
    return 2;
  }
  const int n_greedy = std::atoi(argv[2]);
  bool add_bos = true;
  uint32_t n_ctx = 0;  // 0: the text and the continuation
  for (int i = 3; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-bos") == 0) add_bos = false;
    if (std::strcmp(argv[i], "--ctx") == 0 && i + 1 < argc)
      n_ctx = static_cast<uint32_t>(std::atoi(argv[++i]));
  }
  const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());

  if (!std::getenv("LLAMA_PROBE_VERBOSE")) llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "llama_probe: cannot load %s\n", argv[1]);
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::vector<llama_token> ids(text.size() + 8);
  const int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                               static_cast<int32_t>(ids.size()), add_bos, /*parse_special=*/true);
  if (n < 0) {
    std::fprintf(stderr, "llama_probe: tokenization failed\n");
    return 1;
  }
  ids.resize(n);

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = std::max(n_ctx, static_cast<uint32_t>(n + n_greedy + 16));
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;
  cp.n_threads = cp.n_threads_batch = 2;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx || n == 0 || !decode(ctx, ids, 0)) {
    std::fprintf(stderr, "llama_probe: decode failed\n");
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(vocab);
  std::printf("{");
  print_ids("ids", ids);
  std::printf(",\"logits\":[");
  for (int i = 0; i < n; ++i) {
    const float* row = llama_get_logits_ith(ctx, i);
    std::printf(i ? ",[" : "[");
    for (int v = 0; v < n_vocab; ++v) std::printf(v ? ",%.6g" : "%.6g", row[v]);
    std::printf("]");
  }
  std::printf("]");
  std::vector<llama_token> greedy;
  llama_token last = -1;
  for (int step = 0; step < n_greedy; ++step) {
    const float* row = llama_get_logits_ith(ctx, -1);
    int best = 0;
    for (int v = 1; v < n_vocab; ++v)
      if (row[v] > row[best]) best = v;
    greedy.push_back(best);
    last = best;
    if (llama_vocab_is_eog(vocab, last) || step + 1 == n_greedy) break;
    if (!decode(ctx, {last}, n + step)) return 1;
  }
  std::printf(",");
  print_ids("greedy", greedy);
  std::printf("}\n");
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
