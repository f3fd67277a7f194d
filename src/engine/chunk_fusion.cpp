#include "engine/chunk_fusion.h"

#include <algorithm>
#include <map>
#include <string>

#include "prompt/prompt_parts.h"
#include "retrieval/bm25.h"
#include "strategy/chunk_reuse.h"
#include "util/hash.h"
#include "util/timing.h"

namespace depcache {
namespace {

// A distinct chunk of the stream: the system prompt it comes after, its
// tokens, and its text (what neighbours are found by).
struct StreamChunk {
  std::vector<int32_t> system;
  ContextItem item;
  std::string text;
};

std::vector<StreamChunk> distinct_chunks(const std::vector<RagRequest>& reqs, const Tokenizer& tok,
                                         const RagWrapper& tmpl) {
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

}  // namespace

ChunkFusionReport fuse_chunks(Engine& engine, const Model& model, DType kv_type,
                              const std::vector<RagRequest>& reqs, const Tokenizer& tok,
                              const ChunkFusionOptions& o,
                              const std::function<void(size_t done, size_t total)>& progress) {
  ChunkFusionReport r;
  r.requests = reqs.size();
  const std::vector<StreamChunk> chunks = distinct_chunks(reqs, tok, model.config().prompt);
  r.chunks = chunks.size();
  const std::vector<StreamChunk> pool = o.neighbour_pool.empty()
                                            ? std::vector<StreamChunk>{}
                                            : distinct_chunks(o.neighbour_pool, tok, model.config().prompt);
  const std::vector<StreamChunk>& candidates = o.neighbour_pool.empty() ? chunks : pool;
  r.candidates = candidates.size();
  Bm25Index bm25;
  for (const StreamChunk& c : candidates) bm25.add(c.text);
  bm25.finalize();
  const int64_t n_ctx = engine.pool().n_rows();
  const RadixIndex& index = engine.index();
  SamplingParams one;
  one.max_tokens = 1;
  const size_t n = o.limit > 0 ? std::min(o.limit, chunks.size()) : chunks.size();
  const auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    const StreamChunk& c = chunks[i];
    PromptParts parts;
    parts.system = c.system;
    for (const ScoredDoc& hit : bm25.search(c.text, o.neighbours + 1)) {
      const StreamChunk& n = candidates[hit.doc];
      if (n.text == c.text || n.system != c.system) continue;
      if (parts.items.size() == o.neighbours) break;
      parts.items.push_back(n.item);
    }
    parts.items.push_back(c.item);
    // Neighbours beyond the context are left out, the least similar first.
    while (parts.n_flat_tokens() > n_ctx && parts.items.size() > 1) parts.items.erase(parts.items.end() - 2);
    if (parts.n_flat_tokens() > n_ctx) {
      ++r.too_long;
    } else if (const CacheRun run =
                   fused_run(parts, parts.items.size() - 1, engine.cache_fingerprint(), kv_type);
               index.peek(run.ns, run.tokens).length == static_cast<int64_t>(run.tokens.size())) {
      ++r.present;
    } else {
      const RequestId id = engine.submit_plan(fusion_plan(parts, engine.cache_fingerprint(), kv_type), one);
      r.computed_tokens += engine.wait(id).report.computed_tokens;
      engine.forget(id);
      r.neighbours += static_cast<int64_t>(parts.items.size()) - 1;
      ++r.fused;
    }
    if (progress) progress(i + 1, n);
  }
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace depcache
