#pragma once
// Cache-Craft: a chunk's KV is stored as computed in the request that first
// had it, after the chunks before it there (a variant keyed by those prefix
// chunks), with attention metadata measured while it was computed: how much
// it attended to each earlier chunk (inter), to itself (intra), and which of
// its tokens attended to earlier chunks most. A later request places the
// variant whose context is most like its own and recomputes the
// ceil(CFO * |chunk|) tokens that depended most on the old context:
//   beta  = share of the old context's inter-attention whose chunks are
//           present now; gamma = Kendall-tau discordance of their order;
//           beta' = beta * (1 - gamma)
//   CCI   = sigmoid(mean over layers of a / mean of b), a = sum over earlier
//           chunks j of inter(j) / (|C| |Cj|), b = intra / |C|^2
//   CFO   = clamp(alpha * CCI * (1 - beta'), 0, 1)
// The variant with the lowest CCI * (1 - beta') is placed; a chunk with no
// variant (or only ones with CFO 1) is computed in full in this request and
// becomes a new variant. While the pass runs, the question's attention to
// each chunk, summed over the layers so far, picks the focused chunks (the
// entropy cut of the paper's Algorithm 1); once that set holds for `window`
// layers, the tokens being recomputed in the other chunks stop there.
//
// Choices the paper leaves open (see docs/cachecraft.md): intra-attention
// includes a token's attention to itself; beta is 1 when neither context
// has earlier chunks and 0 when only the new one has; gamma is 0 with fewer
// than two shared chunks; the focused-chunk cut needs three chunks (fewer:
// all are focused); an exact variant (same earlier chunks in the same
// order) has CFO 0 and is reused as is; a chunk keeps its newest
// `variants` variants' metadata (the KV itself is evicted by the index),
// saved beside a disk tier (kCacheCraftStateFile) for the next process.
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "strategy/strategy.h"

namespace depcache {

// What was measured when a chunk variant was computed.
struct ChunkVariant {
  uint64_t ns = 0;                // where its KV is stored (its chunk's tokens are the key)
  std::vector<uint64_t> context;  // content hashes of the chunks before it, in order
  std::vector<double> inter;      // its attention to each of them, summed over its tokens and the layers
  double cci = 0.5;
  std::vector<int32_t> ranked;  // its token offsets, most attention to earlier chunks first
};

// How a variant fits a new context.
struct VariantFit {
  double beta = 1, gamma = 0, beta_adjusted = 1, cci = 0.5;
  double score = 0;  // CCI * (1 - beta'): lower is better
  double cfo = 0;    // alpha * score, clamped to [0, 1]
};
VariantFit fit_variant(const ChunkVariant& v, std::span<const uint64_t> context, double alpha);

// Algorithm 1's cut: indices of the focused chunks given each chunk's
// cumulative attention from the question.
std::vector<int> focused_chunks(std::span<const double> cumulative);

// The metadata of every chunk's variants, shared by the requests of a
// strategy (thread-safe).
class ChunkVariants {
 public:
  explicit ChunkVariants(size_t per_chunk) : per_chunk_(per_chunk) {}
  std::vector<ChunkVariant> of(uint64_t chunk) const;
  // Replaces a variant with the same ns; beyond per_chunk the oldest goes.
  void add(uint64_t chunk, ChunkVariant v);
  size_t size() const;
  // One JSON line per variant, written whole (a temporary file renamed);
  // load adds what it reads and returns the lines dropped as unreadable. A
  // missing file is an empty store.
  void save(const std::filesystem::path& file) const;
  size_t load(const std::filesystem::path& file);

 private:
  mutable std::mutex mu_;
  size_t per_chunk_;
  std::unordered_map<uint64_t, std::deque<ChunkVariant>> by_chunk_;
};

inline constexpr const char* kCacheCraftStateFile = "cachecraft-variants.jsonl";

std::unique_ptr<Strategy> make_cache_craft(uint64_t model_fingerprint, DType kv_type,
                                           const StrategyOptions& options);

}  // namespace depcache
