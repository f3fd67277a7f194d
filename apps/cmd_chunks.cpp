// `depcache chunks fuse`: FusionRAG's offline step over the chunks a request
// stream carries. Each distinct chunk is computed after its most similar
// chunks (BM25 with the chunk as the query) and stored, in a persistent tier,
// as its fused cache; the fusionrag strategy of a later run or server with
// the same tiers finds it before the chunk's plain cache. First a check
// (--check): fused caches that answer worse than plain ones are not stored.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "engine/chunk_fusion.h"
#include "engine/engine.h"
#include "engine_options.h"
#include "eval/fusion_check.h"
#include "kv/radix_index.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "retrieval/bm25.h"
#include "retrieval/corpus.h"
#include "retrieval/rag_request.h"
#include "strategy/chunk_reuse.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/timing.h"

namespace depcache::cli {
namespace {

struct FuseOptions {
  std::string model_path, requests_path, kv_type = "f16", corpus_path, corpus_format = "auto";
  size_t neighbours = 10, limit = 0, check = 16;
  ChunkOptions chunking;
  double cache_mib = 1024;
  int threads = 0;
  TierOptions tiers;
};

// Exit code of a fusion its check refused.
constexpr int kCheckRefused = 7;

// The fusion on the stream's first requests against full attention, with the
// fused caches and with the plain ones; exit 7, storing nothing, when the
// fused answer worse.
void check_before_storing(const std::shared_ptr<const Model>& model, const EngineOptions& eo,
                          const std::vector<RagRequest>& reqs, const Tokenizer& tok,
                          const ChunkFusionOptions& fo, size_t n) {
  FusionCheckOptions co;
  co.requests = n;
  const FusionCheck c = check_fusion(model, eo, reqs, tok, fo, co);
  const auto side = [&](const FusionAgreement& a) {
    return fmt::format("first token {}/{}, {} tokens identical {}/{}, KL {:.3g}", a.first_token, c.requests,
                       co.tokens, a.identical, c.requests, a.kl);
  };
  fmt::print("check against full attention on {} requests: fused {}; plain {}\n", c.requests, side(c.fused),
             side(c.plain));
  std::fflush(stdout);  // the figures before the verdict on a shared terminal
  if (!c.fused_worse()) return;
  fmt::print(stderr,
             "depcache: refused: the fused caches answer worse than the plain ones on this model and stream; "
             "nothing stored (fewer neighbours, another model, or --check 0 to store them anyway)\n");
  throw ExitCode{kCheckRefused};
}

void fuse(const FuseOptions& o) {
  if (o.tiers.cache_dir.empty() && !o.tiers.remote())
    fail(ErrorKind::InvalidInput,
         "fused caches must go to a tier that outlives this process: give --cache-dir, --redis or "
         "--redis-cluster");
  const std::vector<RagRequest> reqs = read_requests(o.requests_path);
  const auto model = Model::load(o.model_path);
  const Tokenizer tok(Vocab::from_gguf(model->file()));
  EngineOptions eo;
  eo.pool_rows = model->config().n_ctx_train > 0 ? model->config().n_ctx_train : 4096;
  eo.kv_type = parse_kv_type(o.kv_type);
  eo.cache_bytes = static_cast<size_t>(o.cache_mib * 1048576.0);
  eo.threads = o.threads;
  ChunkFusionOptions fo;
  fo.neighbours = o.neighbours;
  fo.limit = o.limit;
  if (!o.corpus_path.empty()) {
    // Each chunk of the corpus as the document a request would carry (as
    // `workload generate --corpus` writes them).
    const ChunkIndex index =
        ChunkIndex::build(load_corpus(o.corpus_path, parse_corpus_format(o.corpus_format)), tok, o.chunking);
    for (uint32_t i = 0; i < index.chunks().size(); ++i) {
      RagRequest q;
      q.documents.push_back(index.request_document(i));
      fo.neighbour_pool.push_back(std::move(q));
    }
    if (fo.neighbour_pool.empty()) fail(ErrorKind::InvalidInput, "{}: no chunks", o.corpus_path);
  }
  if (o.check > 0) check_before_storing(model, eo, reqs, tok, fo, o.check);
  Engine engine(model, eo);
  const LowerTiers tiers(engine, o.tiers, "[chunks fuse] ");
  const ChunkFusionReport r =
      fuse_chunks(engine, *model, eo.kv_type, reqs, tok, fo, [](size_t done, size_t total) {
        if (done % 50 == 0 || done == total) fmt::print(stderr, "[chunks fuse] {}/{} chunks\n", done, total);
      });
  engine.persist_cache();
  if (r.too_long > 0)
    fmt::print(stderr, "warning: {} chunks alone exceed the context {}; not fused\n", r.too_long,
               eo.pool_rows);
  fmt::print(
      "{} requests, {} distinct chunks; fused {} chunks ({} already fused) after {:.1f} neighbours on "
      "average from {} ({} chunks); "
      "{} tokens computed in {:.1f} s\n",
      r.requests, r.chunks, r.fused, r.present,
      r.fused ? static_cast<double>(r.neighbours) / static_cast<double>(r.fused) : 0.0,
      o.corpus_path.empty() ? std::string("the stream") : o.corpus_path, r.candidates, r.computed_tokens,
      r.seconds);
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
  add_model_option(*cmd, o.model_path)->required();
  cmd->add_option("--requests", o.requests_path, "Request stream (JSONL) whose chunks to fuse")->required();
  cmd->add_option("--neighbours", o.neighbours, "Similar chunks each chunk is computed after")
      ->capture_default_str()
      ->check(CLI::Range(size_t{0}, size_t{64}));
  cmd->add_option("--limit", o.limit, "Fuse at most this many chunks, in order of first appearance (0: all)")
      ->capture_default_str();
  cmd->add_option("--corpus", o.corpus_path,
                  "Search neighbours among this corpus's chunks, as FusionRAG does (default: among the "
                  "stream's own chunks); chunked as `workload generate` chunks it")
      ->check(CLI::ExistingFile);
  cmd->add_option("--corpus-format", o.corpus_format, "auto, musique, hotpotqa or jsonl")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "musique", "hotpotqa", "jsonl"}));
  cmd->add_option("--chunk-tokens", o.chunking.chunk_tokens, "With --corpus: tokens per chunk")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--overlap", o.chunking.overlap, "With --corpus: tokens shared by neighbouring chunks")
      ->capture_default_str();
  cmd->add_option(
         "--check", o.check,
         "Before storing: fuse the chunks of this many of the stream's first requests and serve them "
         "with the fused and with the plain caches; fused caches that agree less with full attention "
         "are refused (exit 7, nothing stored). 0: no check")
      ->capture_default_str();
  add_kv_storage_options(*cmd, o.kv_type, o.cache_mib, o.tiers);
  add_threads_option(*cmd, o.threads);
  cmd->callback([] { fuse(o); });
}

}  // namespace depcache::cli
