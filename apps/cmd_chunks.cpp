// `depcache chunks fuse`: FusionRAG's offline step over the chunks a request
// stream carries. Each distinct chunk is computed after its most similar
// chunks (BM25 with the chunk as the query) and stored, in a persistent tier,
// as its fused cache; the fusionrag strategy of a later run or server with
// the same tiers finds it before the chunk's plain cache.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "engine/engine.h"
#include "kv/radix_index.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "retrieval/bm25.h"
#include "retrieval/rag_request.h"
#include "strategy/chunk_reuse.h"
#include "tier_options.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/timing.h"

namespace depcache::cli {
namespace {

struct FuseOptions {
  std::string model_path, requests_path, kv_type = "f16";
  size_t neighbours = 10, limit = 0;
  double cache_mib = 1024;
  int threads = 0;
  TierOptions tiers;
};

// A distinct chunk of the stream: the system prompt it comes after, its
// tokens, and its text (what neighbours are found by).
struct StreamChunk {
  std::vector<int32_t> system;
  ContextItem item;
  std::string text;
};

std::vector<StreamChunk> distinct_chunks(const std::vector<RagRequest>& reqs, const Tokenizer& tok,
                                         const PromptTemplate& tmpl) {
  std::vector<StreamChunk> out;
  std::map<uint64_t, size_t> seen;
  for (const RagRequest& r : reqs) {
    const PromptParts parts = make_prompt_parts(tok, r, tmpl);
    const PromptTexts texts = prompt_texts(r, tmpl);
    for (size_t i = 0; i < parts.items.size(); ++i) {
      uint64_t key = hash_bytes(parts.system.data(), parts.system.size() * sizeof(int32_t));
      for (const auto& p : parts.items[i].paths) key = hash_bytes(p.data(), p.size() * sizeof(int32_t), key);
      if (!seen.emplace(key, out.size()).second) continue;
      std::string text;
      // Items whose every piece encodes to nothing are dropped from parts.
      for (const PromptTexts::Item& t : texts.items)
        if (t.label == parts.items[i].label) {
          for (const std::string& piece : t.pieces) text += piece;
          break;
        }
      out.push_back({parts.system, parts.items[i], std::move(text)});
    }
  }
  return out;
}

void fuse(const FuseOptions& o) {
  if (o.tiers.cache_dir.empty() && o.tiers.redis.empty())
    fail(ErrorKind::InvalidInput,
         "fused caches must go to a tier that outlives this process: give --cache-dir or --redis");
  const std::vector<RagRequest> reqs = read_requests(o.requests_path);
  const auto model = Model::load(o.model_path);
  const Tokenizer tok(Vocab::from_gguf(model->file()));
  const DType kv_type = parse_kv_type(o.kv_type);
  const auto t0 = Clock::now();
  const std::vector<StreamChunk> chunks = distinct_chunks(reqs, tok, model->config().prompt);
  Bm25Index bm25;
  for (const StreamChunk& c : chunks) bm25.add(c.text);
  bm25.finalize();
  fmt::print("{} requests, {} distinct chunks ({:.2f} s)\n", reqs.size(), chunks.size(), seconds_since(t0));

  const int64_t n_ctx = model->config().n_ctx_train > 0 ? model->config().n_ctx_train : 4096;
  EngineOptions eo;
  eo.pool_rows = n_ctx;
  eo.kv_type = kv_type;
  eo.cache_bytes = static_cast<size_t>(o.cache_mib * 1048576.0);
  eo.threads = o.threads;
  Engine engine(model, eo);
  RadixIndex& index = engine.index();
  const LowerTiers tiers(index, o.tiers, "[chunks fuse] ");
  SamplingParams one;
  one.max_tokens = 1;
  const size_t n = o.limit > 0 ? std::min(o.limit, chunks.size()) : chunks.size();
  size_t fused = 0, present = 0;
  int64_t neighbour_sum = 0, computed = 0;
  const auto t1 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    const StreamChunk& c = chunks[i];
    PromptParts parts;
    parts.system = c.system;
    for (const ScoredDoc& hit : bm25.search(c.text, o.neighbours + 1)) {
      if (hit.doc == i || chunks[hit.doc].system != c.system) continue;
      if (parts.items.size() == o.neighbours) break;
      parts.items.push_back(chunks[hit.doc].item);
    }
    parts.items.push_back(c.item);
    // Neighbours beyond the context are left out, the least similar first.
    while (parts.n_flat_tokens() > n_ctx && parts.items.size() > 1) parts.items.erase(parts.items.end() - 2);
    if (parts.n_flat_tokens() > n_ctx) {
      fmt::print(stderr, "warning: chunk {} alone ({} tokens) exceeds the context {}; not fused\n", i,
                 parts.n_flat_tokens(), n_ctx);
      continue;
    }
    const CacheRun run = fused_run(parts, parts.items.size() - 1, model->fingerprint(), kv_type);
    if (index.peek(run.ns, run.tokens).length == static_cast<int64_t>(run.tokens.size())) {
      ++present;
      continue;
    }
    const RequestId id = engine.submit_plan(fusion_plan(parts, model->fingerprint(), kv_type), one);
    computed += engine.wait(id).report.computed_tokens;
    engine.forget(id);
    neighbour_sum += static_cast<int64_t>(parts.items.size()) - 1;
    ++fused;
    if (fused % 50 == 0) fmt::print(stderr, "[chunks fuse] {}/{} chunks\n", i + 1, n);
  }
  index.persist();
  fmt::print(
      "fused {} chunks ({} already fused) after {:.1f} neighbours on average; {} tokens computed in {:.1f} "
      "s\n",
      fused, present, fused ? static_cast<double>(neighbour_sum) / static_cast<double>(fused) : 0.0, computed,
      seconds_since(t1));
}

}  // namespace

void add_chunks_commands(CLI::App& app) {
  CLI::App* chunks = app.add_subcommand("chunks", "Chunk caches prepared ahead of requests");
  chunks->require_subcommand(1);
  static FuseOptions o;
  CLI::App* cmd = chunks->add_subcommand(
      "fuse",
      "FusionRAG's offline step: compute each chunk of a request stream after its most similar chunks and "
      "store it as its fused cache in a persistent tier (the fusionrag strategy finds it there)");
  cmd->add_option("-m,--model", o.model_path, "GGUF model file")->required();
  cmd->add_option("--requests", o.requests_path, "Request stream (JSONL) whose chunks to fuse")->required();
  cmd->add_option("--neighbours", o.neighbours, "Similar chunks each chunk is computed after")
      ->capture_default_str()
      ->check(CLI::Range(size_t{0}, size_t{64}));
  cmd->add_option("--limit", o.limit, "Fuse at most this many chunks, in order of first appearance (0: all)")
      ->capture_default_str();
  cmd->add_option("--kv-type", o.kv_type, "KV storage (as the runs that will use them): f16 or f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "f32"}));
  cmd->add_option("--cache-mib", o.cache_mib, "Hot tier of the index while fusing (MiB)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1048576.0));
  cmd->add_option("-t,--threads", o.threads, "Threads (default: one per core)");
  add_tier_options(*cmd, o.tiers);
  cmd->callback([] { fuse(o); });
}

}  // namespace depcache::cli
