// `depcache chunks fuse` as a user runs it: the chunks of a document stream
// fused into a disk tier, found again (not recomputed) by a second fuse, and
// served from there by `run -s fusionrag` with the same tier; a fuse without
// a persistent tier is refused. The random model's answers say nothing of
// fusion's quality: these run without the check (tested on the QA model).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::run_cli;

TEST(ChunksCli, FusesIntoTheDiskTierThatFusionRagReadsFrom) {
  const auto dir = test::temp_path("chunks-cli");
  std::filesystem::create_directories(dir);
  const std::string model = (dir / "m.gguf").string(), requests = (dir / "r.jsonl").string(),
                    cache = (dir / "cache").string();
  auto r = run_cli("model new --preset tiny --seed 4 -o " + model);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::pair<std::string, std::string>> docs = {{"a", "Dogs bark at night and chase cats."},
                                                                 {"b", "Cats purr and sleep in the sun."},
                                                                 {"c", "Owls hunt mice at night."},
                                                                 {"d", "Dogs and owls are awake at night."},
                                                                 {"e", "Cats chase mice in the barn."}};
  {
    std::ofstream out(requests);
    const int picks[][3] = {{0, 1, 2}, {3, 0, 4}, {2, 4, 1}, {1, 3, 0}};
    for (int i = 0; i < 4; ++i) {
      nlohmann::json j{{"id", std::to_string(i)}, {"question", "Who is awake at night?"}};
      for (int k : picks[i]) j["documents"].push_back({{"id", docs[k].first}, {"text", docs[k].second}});
      out << j.dump() << "\n";
    }
  }
  r = run_cli(fmt::format("chunks fuse -m {} --requests {} --check 0 --neighbours 2 --cache-dir {} -t 2",
                          model, requests, cache));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fused 5 chunks (0 already fused)"), std::string::npos) << r.out;
  r = run_cli(fmt::format("chunks fuse -m {} --requests {} --check 0 --neighbours 2 --cache-dir {} -t 2",
                          model, requests, cache));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fused 0 chunks (5 already fused)"), std::string::npos) << r.out;
  // Every chunk of every request is found on disk, fused or plain (the
  // neighbours' plain caches are stored too).
  r = run_cli(fmt::format("run -m {} --requests {} -s fusionrag --cache-dir {} -q -n 2 -t 2", model, requests,
                          cache));
  ASSERT_EQ(r.code, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("matched tokens hot (\\d+) / host \\d+ / disk (\\d+)")))
      << r.out;
  EXPECT_GT(std::stoll(m[2]), 0) << r.out;
  r = run_cli(fmt::format("chunks fuse -m {} --requests {}", model, requests));
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("give --cache-dir, --redis or --redis-cluster"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

// FusionRAG's neighbours from the corpus: a stream of one document has no
// neighbour of its own, but the corpus it came from has; a chunk is never
// its own neighbour.
TEST(ChunksCli, NeighboursComeFromTheCorpusWhenGiven) {
  const auto dir = test::temp_path("chunks-corpus");
  std::filesystem::create_directories(dir);
  const std::string model = (dir / "m.gguf").string(), requests = (dir / "r.jsonl").string(),
                    corpus = (dir / "corpus.jsonl").string();
  auto r = run_cli("model new --preset tiny --seed 4 -o " + model);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::string> texts = {"Dogs bark at night and chase cats.",
                                          "Cats purr and sleep at night.", "Owls hunt mice at night.",
                                          "Dogs and owls are awake at night."};
  {
    std::ofstream out(corpus);
    for (const std::string& t : texts) out << nlohmann::json{{"text", t}}.dump() << "\n";
  }
  nlohmann::json j{{"id", "0"}, {"question", "Who is awake at night?"}};
  j["documents"].push_back({{"id", "0#0"}, {"text", texts[3]}});
  std::ofstream(requests) << j.dump() << "\n";
  const std::string fuse = fmt::format(
      "chunks fuse -m {} --requests {} --check 0 --neighbours 2 -t 2 --cache-dir ", model, requests);
  r = run_cli(fuse + (dir / "alone").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(
      r.out.find(
          "fused 1 chunks (0 already fused) after 0.0 neighbours on average from the stream (1 chunks)"),
      std::string::npos)
      << r.out;
  r = run_cli(fuse + (dir / "corpus").string() + " --corpus " + corpus);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("after 2.0 neighbours on average from " + corpus + " (4 chunks)"), std::string::npos)
      << r.out;
  // --neighbours 4 takes every other chunk of the corpus (3), but not the chunk itself.
  r = run_cli(
      fmt::format("chunks fuse -m {} --requests {} --check 0 --neighbours 4 -t 2 --cache-dir {} --corpus {}",
                  model, requests, (dir / "all").string(), corpus));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("after 3.0 neighbours"), std::string::npos) << r.out;
  r = run_cli(fuse + (dir / "bad").string() + " --corpus " + corpus + " --chunk-tokens 4 --overlap 4");
  EXPECT_EQ(r.code, 3) << r.out;
  std::filesystem::remove_all(dir);
}

// A request file of one question over these documents, in this order.
void write_request(const std::string& path, const std::vector<std::string>& texts) {
  nlohmann::json j{{"id", "0"}, {"question", "Who is awake at night?"}};
  for (size_t k = 0; k < texts.size(); ++k)
    j["documents"].push_back({{"id", std::to_string(k)}, {"text", texts[k]}});
  std::ofstream(path) << j.dump() << "\n";
}

// run --warmup: the warm-up requests go through each strategy's engine
// first, unmeasured, so the stream's first request already finds its chunks
// (here: the same documents in another order); a missing file is exit 4.
TEST(ChunksCli, AWarmUpFillsTheCachesTheStreamStartsFrom) {
  const auto dir = test::temp_path("warmup-cli");
  std::filesystem::create_directories(dir);
  const std::string model = (dir / "m.gguf").string(), warm = (dir / "w.jsonl").string(),
                    stream = (dir / "s.jsonl").string(), rows = (dir / "rows.jsonl").string();
  ASSERT_EQ(run_cli("model new --preset tiny --seed 4 -o " + model).code, 0);
  write_request(warm,
                {"Dogs bark at night and chase cats.", "Cats purr and sleep in the sun.", "Owls hunt mice."});
  write_request(stream,
                {"Owls hunt mice.", "Dogs bark at night and chase cats.", "Cats purr and sleep in the sun."});
  for (const char* warmup : {"", "--warmup "}) {
    const std::string cmd =
        fmt::format("run -m {} --requests {} -s fullreuse,cachecraft,prefix -q -n 1 -t 2 --json {}{}", model,
                    stream, rows, *warmup ? " --warmup " + warm : "");
    const auto r = run_cli(cmd);
    ASSERT_EQ(r.code, 0) << r.out;
    std::ifstream in(rows);
    int n = 0;
    for (std::string line; std::getline(in, line); ++n) {
      const auto j = nlohmann::json::parse(line);
      const auto reused = j["reused_tokens"].get<int64_t>();
      if (!*warmup || j["strategy"] == "prefix") {
        EXPECT_LT(reused, 40) << j.dump();  // the system prompt at most
      } else {
        EXPECT_GT(reused, 60) << j.dump();  // every chunk
      }
    }
    EXPECT_EQ(n, 3);
  }
  EXPECT_EQ(run_cli(fmt::format("run -m {} --requests {} -q --warmup {}", model, stream,
                                (dir / "none.jsonl").string()))
                .code,
            4);
  std::filesystem::remove_all(dir);
}

// cachecraft with a disk tier: the next process finds the variants' KV on
// disk and their metadata beside it, so chunks met again in another order
// are placed and fixed rather than recomputed; without the metadata file
// only variants of the very same context could be used.
TEST(ChunksCli, CacheCraftVariantsOutliveTheProcess) {
  const auto dir = test::temp_path("cachecraft-cli");
  std::filesystem::create_directories(dir);
  const std::string model = (dir / "m.gguf").string(), first = (dir / "a.jsonl").string(),
                    second = (dir / "b.jsonl").string(), rows = (dir / "rows.jsonl").string(),
                    cache = (dir / "cache").string();
  ASSERT_EQ(run_cli("model new --preset tiny --seed 4 -o " + model).code, 0);
  write_request(first,
                {"Dogs bark at night and chase cats.", "Cats purr and sleep in the sun.", "Owls hunt mice."});
  write_request(second,
                {"Owls hunt mice.", "Cats purr and sleep in the sun.", "Dogs bark at night and chase cats."});
  const auto reused = [&](const std::string& requests) {
    const auto r =
        run_cli(fmt::format("run -m {} --requests {} -s cachecraft -q -n 1 -t 2 --cache-dir {} --json {}",
                            model, requests, cache, rows));
    EXPECT_EQ(r.code, 0) << r.out;
    std::ifstream in(rows);
    std::string line;
    std::getline(in, line);
    return nlohmann::json::parse(line)["reused_tokens"].get<int64_t>();
  };
  EXPECT_LT(reused(first), 40);  // nothing but the system prompt could be there
  ASSERT_TRUE(std::filesystem::exists(std::filesystem::path(cache) / "cachecraft-variants.jsonl"));
  const int64_t with_metadata = reused(second);
  // Again from the first process's state, without its metadata.
  std::filesystem::remove_all(cache);
  reused(first);
  std::filesystem::remove(std::filesystem::path(cache) / "cachecraft-variants.jsonl");
  const int64_t without = reused(second);
  EXPECT_GT(with_metadata, without + 40) << with_metadata << " vs " << without;
  std::filesystem::remove_all(dir);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache
