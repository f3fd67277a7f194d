// Speed: throughput within an SLO (RAGCache, Cache-Craft) and the engine's
// prompt and generation speed by weight type.
#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "compute/dtype.h"
#include "eval/engine_bench.h"
#include "eval/experiments.h"
#include "eval/report.h"
#include "model/model_writer.h"

namespace depcache::experiments {

namespace fs = std::filesystem;

void throughput(EvalContext& c) {
  EvalReport& r = c.report;
  r.section("Throughput within an SLO (RAGCache, Cache-Craft)");
  const size_t n = c.n(24, 60);
  const DocStream stream = warm_document_stream(c, n, 512);
  // RAGCache's definition: the rate whose mean TTFT stays under 5x that at
  // the lowest rate. One threshold for every system, full's (its sweep sets
  // it), so that the rates compare.
  double slo = 0;
  std::vector<std::vector<std::string>> rows, points;
  std::map<std::string, RateSweep> sweeps;
  for (const std::string s : {"full", "prefix", "ragcache", "cachecraft"}) {
    stage(fmt::format("throughput: {} rate sweep, {} requests", s, n));
    const RateSweep sweep = sweep_rate(
        stream.requests, slo, 3,
        [&](const std::vector<RagRequest>& at, bool serial) {
          return serve(s, at, c.speed, c.args(), 1, serial, nullptr, nullptr, stream.warmup);
        },
        SloStatistic::Mean);
    slo = sweep.slo;
    sweeps[s] = sweep;
    rows.push_back({s, r.num(sweep.unloaded.mean), r.num(sweep.unloaded.p50), r.num(sweep.unloaded.p99),
                    r.num(sweep.best_rate, 2), r.num(sweep.best_served, 2)});
    for (const RateSweep::Point& p : sweep.points)
      points.push_back({s, r.num(p.rate, 2), r.num(p.mean), r.num(p.p50), r.num(p.p99), r.num(p.served, 2),
                        sweep.within(p) ? "yes" : "no"});
  }
  r.text(fmt::format(
      "{} requests of {}, `{}`; as RAGCache defines throughput: the Poisson rates whose mean TTFT stays "
      "within {:.0f} ms (5x full prefill's unloaded mean), and the most requests completed per second at "
      "them (the throughput compared; the search stops doubling the rate once the completed rate stops "
      "growing); each system at its own defaults, its caches warmed by {} other requests of the stream.",
      n, stream.what, c.speed_path, slo, stream.warmup.size()));
  r.table({"system", "unloaded TTFT mean ms", "p50 ms", "p99 ms",
           "highest offered req/s found within the SLO", "completed req/s"},
          rows);
  r.text(
      "Every rate tried. The p99 of a few dozen requests is their slowest one: a request whose chunks no "
      "earlier one brought computes its whole prompt (under Cache-Craft also scoring every chunk's attention "
      "for its later reuse), and two of them close together set the p99 at any rate:");
  r.table(
      {"system", "offered req/s", "TTFT mean ms", "p50 ms", "p99 ms", "completed req/s", "within the SLO"},
      points);
  auto gain = [&](const std::string& a, const std::string& b) {
    const double base = sweeps[b].best_served;
    return base > 0 ? r.ratio(sweeps[a].best_served, base)
                    : std::string("- (baseline broke the SLO at every rate)");
  };
  r.versus(
      {{"RAGCache vs no reuse", "1.3-2.1x vLLM (Fig. 15)", gain("ragcache", "full"),
        "two chunks per request here; the paper's prompts are ~7,400 tokens of documents"},
       {"Cache-Craft vs prefix caching", "1.6x (Fig. 22, 30% recomputed)", gain("cachecraft", "prefix"),
        fmt::format("unloaded, Cache-Craft's slowest requests (p99 {} ms against prefix caching's {} ms) "
                    "are those whose chunks no earlier request brought: it computes them whole and scores "
                    "their attention for later reuse; the paper's trace reorders 5 chunks of a "
                    "proprietary corpus",
                    r.num(sweeps["cachecraft"].unloaded.p99), r.num(sweeps["prefix"].unloaded.p99))}});
}

void engine_table(EvalContext& c) {
  EvalReport& r = c.report;
  r.section("The engine: prompt and generation speed by weight type");
  const int pp = static_cast<int>(c.n(256, 512)), tg = static_cast<int>(c.n(16, 64)),
            reps = static_cast<int>(c.n(1, 3));
  std::vector<std::vector<std::string>> rows;
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K}) {
    const std::string name = std::string(dtype_info(t).name);
    fs::path path = c.speed_path;
    if (t != DType::F16) {
      // Beside the speed model, named after it: speed-f16.gguf -> speed-Q8_0.gguf.
      std::string stem = fs::path(c.speed_path).stem().string();
      if (stem.ends_with("-f16")) stem.resize(stem.size() - 4);
      path = fs::path(c.speed_path).parent_path() / fmt::format("{}-{}.gguf", stem, name);
      if (!fs::exists(path)) quantize_model(c.speed_path, path, t, c.o.threads);
    }
    stage(fmt::format("engine: {} pp{} tg{}", name, pp, tg));
    const auto model = Model::load(path);
    EngineBenchOptions eo;
    eo.threads = c.o.threads;
    EngineBench bench(model, eo);
    auto tps = [&](const std::function<double()>& run, int tokens) {
      run();  // warm-up
      double sum = 0;
      for (int i = 0; i < reps; ++i) sum += tokens / run();
      return sum / reps;
    };
    const double p = tps([&] { return bench.pp(pp); }, pp), g = tps([&] { return bench.tg(tg); }, tg);
    rows.push_back({model_description(*model), r.num(p), r.num(g)});
  }
  r.text(fmt::format(
      "`bench-model`'s runs (random tokens, no reuse, through the engine), mean of {} after a warm-up; the "
      "speed model and its copies in each weight type. Against the other engine on the same files: "
      "docs/performance.md.",
      reps));
  r.table({"model", fmt::format("pp{} tokens/s", pp), fmt::format("tg{} tokens/s", tg)}, rows);
}

}  // namespace depcache::experiments
