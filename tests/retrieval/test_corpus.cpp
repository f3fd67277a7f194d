// Corpus and QA loaders on small hand-written files and the real benchmark
// files, token-window chunking, and chunk retrieval quality on MuSiQue/HotpotQA.
#include <gtest/gtest.h>

#include <fstream>

#include "model/tokenizer.h"
#include "model/vocab.h"
#include "retrieval/corpus.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

// A temp file with the given content, removed when the test ends.
struct TempFile {
  explicit TempFile(const std::string& content, const std::string& ext = ".json")
      : path(test::temp_path("corpus") += ext) {
    std::ofstream(path, std::ios::binary) << content;
  }
  ~TempFile() { std::filesystem::remove(path); }
  std::filesystem::path path;
};

// Runs fn, expecting an Error of `kind` whose message contains every needle.
template <typename Fn>
void expect_error(Fn&& fn, ErrorKind kind, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const std::string& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(Corpus, Jsonl) {
  const TempFile f(
      "{\"id\": \"a\", \"title\": \"Alpha\", \"text\": \"first text\"}\n"
      "\n"
      "{\"id\": 42, \"text\": \"second\"}\r\n"
      "  {\"title\": \"Gamma\", \"text\": \"third\"}\n",
      ".jsonl");
  for (const CorpusFormat fmt : {CorpusFormat::Auto, CorpusFormat::Jsonl}) {
    const Corpus c = load_corpus(f.path, fmt);
    ASSERT_EQ(c.docs.size(), 3u);
    EXPECT_EQ(c.docs[0].id, "a");
    EXPECT_EQ(c.docs[0].title, "Alpha");
    EXPECT_EQ(c.docs[0].text, "first text");
    EXPECT_EQ(c.docs[1].id, "42");
    EXPECT_EQ(c.docs[1].title, "");
    EXPECT_EQ(c.docs[2].id, "2") << "without an id, the document's position";
    EXPECT_EQ(c.docs[2].title, "Gamma");
  }
  EXPECT_EQ(detect_corpus_format(f.path), CorpusFormat::Jsonl);

  // One line is a single JSON object, but not title -> sentences: still JSONL.
  const TempFile one("{\"id\": \"x\", \"text\": \"only\"}\n", ".jsonl");
  EXPECT_EQ(detect_corpus_format(one.path), CorpusFormat::Jsonl);
  EXPECT_EQ(load_corpus(one.path).docs.at(0).text, "only");

  const TempFile empty("", ".jsonl");
  EXPECT_TRUE(load_corpus(empty.path).docs.empty());
}

TEST(Corpus, JsonlErrorsNameFileAndLine) {
  const auto check = [](const std::string& content, const std::string& needle) {
    const TempFile f(content, ".jsonl");
    expect_error([&] { load_corpus(f.path); }, ErrorKind::InvalidInput, {f.path.string() + ":2:", needle});
  };
  check("{\"text\": \"ok\"}\n{\"text\": \"broken\"\n", "malformed JSON");
  check("{\"text\": \"ok\"}\n{\"title\": \"no text\"}\n", "\"text\"");
  check("{\"text\": \"ok\"}\n[1, 2]\n", "object");
  check("{\"text\": \"ok\"}\n{\"text\": \"x\", \"id\": 1.5}\n", "\"id\"");
  check("{\"text\": \"ok\"}\n{\"text\": \"x\", \"title\": 3}\n", "\"title\"");
}

TEST(Corpus, Musique) {
  const TempFile f(R"([{"title": "Paris", "text": "Paris is the capital of France."},
                      {"title": "Paris", "text": "Paris is also a city in Texas."},
                      {"title": "Rome", "text": "Rome is in Italy."}])");
  EXPECT_EQ(detect_corpus_format(f.path), CorpusFormat::Musique);
  const Corpus c = load_corpus(f.path);
  ASSERT_EQ(c.docs.size(), 3u);
  EXPECT_EQ(c.docs[1].id, "1") << "ids are positions: titles repeat";
  EXPECT_EQ(c.docs[1].title, "Paris");
  EXPECT_EQ(c.docs[2].text, "Rome is in Italy.");

  const TempFile bad(R"([{"title": "A", "text": "a"}, {"title": "B"}])");
  expect_error([&] { load_corpus(bad.path); }, ErrorKind::InvalidInput, {bad.path.string(), "item 1"});
  const TempFile broken("[{\"title\": \"A\",\n \"text\": }]");
  expect_error([&] { load_corpus(broken.path); }, ErrorKind::InvalidInput,
               {broken.path.string(), "malformed JSON", "line 2"});
}

TEST(Corpus, Hotpotqa) {
  const TempFile f(R"({"Zeta": ["Zeta is a letter.", " It comes last."],
                      "Alpha": ["Alpha is first."]})");
  EXPECT_EQ(detect_corpus_format(f.path), CorpusFormat::Hotpotqa);
  const Corpus c = load_corpus(f.path);
  ASSERT_EQ(c.docs.size(), 2u);
  EXPECT_EQ(c.docs[0].title, "Zeta") << "file order is kept";
  EXPECT_EQ(c.docs[0].id, "Zeta");
  EXPECT_EQ(c.docs[0].text, "Zeta is a letter. It comes last.");
  EXPECT_EQ(c.docs[1].title, "Alpha");

  const TempFile bad(R"({"Zeta": ["ok", 7]})");
  expect_error([&] { load_corpus(bad.path, CorpusFormat::Hotpotqa); }, ErrorKind::InvalidInput,
               {bad.path.string(), "Zeta"});
}

TEST(Corpus, ExplicitFormatMustMatch) {
  const TempFile jsonl("{\"text\": \"a\"}\n{\"text\": \"b\"}\n", ".jsonl");
  expect_error([&] { load_corpus(jsonl.path, CorpusFormat::Musique); }, ErrorKind::InvalidInput,
               {jsonl.path.string()});
  const TempFile musique(R"([{"title": "A", "text": "a"}])");
  expect_error([&] { load_corpus(musique.path, CorpusFormat::Hotpotqa); }, ErrorKind::InvalidInput,
               {musique.path.string()});
  expect_error([&] { load_corpus(musique.path, CorpusFormat::Jsonl); }, ErrorKind::InvalidInput,
               {musique.path.string() + ":1:"});
  EXPECT_EQ(parse_corpus_format("hotpotqa"), CorpusFormat::Hotpotqa);
  EXPECT_THROW(parse_corpus_format("csv"), Error);
}

TEST(Corpus, MissingFileIsNotFound) {
  expect_error([] { load_corpus("/nonexistent/corpus.json"); }, ErrorKind::NotFound,
               {"/nonexistent/corpus.json"});
  expect_error([] { load_qa("/nonexistent/qa.json"); }, ErrorKind::NotFound, {"/nonexistent/qa.json"});
}

TEST(Qa, MusiqueAndHotpotqa) {
  const TempFile musique(
      R"([{"id": "2hop_1", "question": "Who?", "answer": "Ann", "answer_aliases": ["Anne", "Ann"],
                              "paragraphs": [{"title": "T1", "is_supporting": false},
                                             {"title": "T2", "is_supporting": true},
                                             {"title": "T3", "is_supporting": true},
                                             {"title": "T2", "is_supporting": true}]}])");
  const auto m = load_qa(musique.path);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].id, "2hop_1");
  EXPECT_EQ(m[0].question, "Who?");
  EXPECT_EQ(m[0].answers, (std::vector<std::string>{"Ann", "Anne"}));
  EXPECT_EQ(m[0].supporting_titles, (std::vector<std::string>{"T2", "T3"}));

  const TempFile hotpot(R"([{"_id": "5a7", "question": "What?", "answer": "yes",
                             "supporting_facts": [["B", 0], ["A", 2], ["B", 1]], "context": []}])");
  const auto h = load_qa(hotpot.path);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].id, "5a7");
  EXPECT_EQ(h[0].answers, (std::vector<std::string>{"yes"}));
  EXPECT_EQ(h[0].supporting_titles, (std::vector<std::string>{"B", "A"}));

  const TempFile neither(R"([{"id": "x", "question": "q?"}])");
  expect_error([&] { load_qa(neither.path); }, ErrorKind::InvalidInput, {neither.path.string(), "item 0"});
  const TempFile no_question(R"([{"_id": "x", "supporting_facts": []}])");
  expect_error([&] { load_qa(no_question.path); }, ErrorKind::InvalidInput, {"\"question\""});
  const TempFile object(R"({"questions": []})");
  expect_error([&] { load_qa(object.path); }, ErrorKind::InvalidInput, {object.path.string()});
}

class Chunking : public ::testing::Test {
 protected:
  Tokenizer tok_{Vocab::builtin_bytes()};
};

TEST_F(Chunking, WindowsAndOverlapAreExact) {
  Corpus c;
  c.docs.push_back(
      {"0", "Long", "The quick brown fox jumps over the lazy dog, again and again, until it is tired."});
  c.docs.push_back({"1", "Short", "Hi."});
  const std::vector<int32_t> ids = tok_.encode("Long\n" + c.docs[0].text, false, false);
  const std::vector<int32_t> short_ids = tok_.encode("Short\nHi.", false, false);
  ASSERT_GT(ids.size(), 20u);
  const size_t window = 10, step = 6;
  ASSERT_LT(short_ids.size(), window);

  const std::vector<Chunk> chunks = chunk_corpus(c, tok_, {.chunk_tokens = window, .overlap = window - step});
  // Windows start every `step` tokens until one reaches the end.
  size_t n_long = 0;
  for (size_t start = 0;; start += step) {
    ++n_long;
    if (start + window >= ids.size()) break;
  }
  ASSERT_GT(n_long, 2u);
  ASSERT_EQ(chunks.size(), n_long + 1);
  for (size_t i = 0; i < n_long; ++i) {
    const size_t start = i * step, end = std::min(start + window, ids.size());
    EXPECT_EQ(chunks[i].doc, 0u);
    EXPECT_EQ(chunks[i].index_in_doc, i);
    EXPECT_EQ(chunks[i].tokens, std::vector<int32_t>(ids.begin() + start, ids.begin() + end))
        << "chunk " << i;
    EXPECT_EQ(chunks[i].text, tok_.decode(chunks[i].tokens)) << "ASCII: decode as is";
  }
  EXPECT_EQ(chunks[n_long - 1].tokens.back(), ids.back());
  const Chunk& last = chunks.back();
  EXPECT_EQ(last.doc, 1u);
  EXPECT_EQ(last.index_in_doc, 0u);
  EXPECT_EQ(last.tokens, short_ids) << "a short document is one chunk";
  EXPECT_EQ(last.text, "Short\nHi.");

  // Without overlap the windows partition the document.
  const std::vector<Chunk> disjoint = chunk_corpus(c, tok_, {.chunk_tokens = 6, .overlap = 0});
  std::vector<int32_t> joined;
  for (const Chunk& ch : disjoint)
    if (ch.doc == 0) joined.insert(joined.end(), ch.tokens.begin(), ch.tokens.end());
  EXPECT_EQ(joined, ids);
}

TEST_F(Chunking, TitleLineOnlyWhenThereIsATitle) {
  Corpus c;
  c.docs.push_back({"0", "", "no title here"});
  c.docs.push_back({"1", "", ""});  // nothing to chunk
  const auto chunks = chunk_corpus(c, tok_, {});
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].tokens, tok_.encode("no title here", false, false));
  EXPECT_EQ(chunks[0].text, "no title here");
}

TEST_F(Chunking, CutCharactersAreDroppedNotGarbled) {
  // Non-ASCII text falls back to byte tokens, so small windows cut characters.
  Corpus c;
  c.docs.push_back({"0", "日本", "東京は日本の首都です。Ελληνικά café"});
  for (size_t n = 2; n <= 7; ++n) {
    for (const Chunk& ch : chunk_corpus(c, tok_, {.chunk_tokens = n, .overlap = 1})) {
      std::string valid, rest = ch.text;
      drain_utf8(rest, valid, true);
      EXPECT_EQ(valid, ch.text) << "chunk text is valid UTF-8";
      EXPECT_EQ(ch.text.find("\xEF\xBF\xBD"), std::string::npos) << "no U+FFFD: " << ch.text;
    }
  }
}

TEST_F(Chunking, BadOptions) {
  Corpus c;
  c.docs.push_back({"0", "t", "x"});
  expect_error([&] { chunk_corpus(c, tok_, {.chunk_tokens = 0, .overlap = 0}); }, ErrorKind::InvalidInput,
               {"chunk"});
  expect_error([&] { chunk_corpus(c, tok_, {.chunk_tokens = 8, .overlap = 8}); }, ErrorKind::InvalidInput,
               {"overlap"});
}

TEST_F(Chunking, ChunkIndexFindsTheRightDocument) {
  Corpus c;
  c.docs.push_back({"a", "Volcano", "Mount Etna is an active volcano on the island of Sicily."});
  c.docs.push_back({"b", "Glacier", "The Aletsch Glacier is the largest glacier in the Alps."});
  c.docs.push_back({"c", "Desert", "The Atacama is a desert plateau in South America, very dry."});
  const ChunkIndex idx = ChunkIndex::build(c, tok_, {.chunk_tokens = 12, .overlap = 4});
  EXPECT_EQ(idx.corpus().docs.size(), 3u);
  EXPECT_GT(idx.chunks().size(), 3u);
  EXPECT_EQ(idx.bm25().size(), idx.chunks().size());
  const auto hits = idx.search("Which glacier is the largest in the Alps?", 3);
  ASSERT_FALSE(hits.empty());
  EXPECT_EQ(idx.doc_of(hits[0].chunk).title, "Glacier");
  const auto staged = idx.search_staged("Which glacier is the largest in the Alps?", 3, 4, nullptr);
  ASSERT_EQ(staged.size(), hits.size());
  for (size_t i = 0; i < hits.size(); ++i) {
    EXPECT_EQ(staged[i].chunk, hits[i].chunk);
    EXPECT_EQ(staged[i].score, hits[i].score);
  }
}

// Mean over questions of the share of supporting titles among the top-k chunks' documents.
double recall_at_k(const ChunkIndex& idx, const std::vector<QaItem>& qa, size_t k) {
  double sum = 0;
  size_t n = 0;
  for (const QaItem& q : qa) {
    if (q.supporting_titles.empty()) continue;
    const auto hits = idx.search(q.question, k);
    size_t found = 0;
    for (const std::string& t : q.supporting_titles)
      for (const ChunkHit& h : hits)
        if (idx.doc_of(h.chunk).title == t) {
          ++found;
          break;
        }
    sum += static_cast<double>(found) / static_cast<double>(q.supporting_titles.size());
    ++n;
  }
  return n ? sum / static_cast<double>(n) : 0;
}

TEST(RealData, MusiqueLoadsAndRetrieves) {
  DEPCACHE_REQUIRE_SHARED(corpus_path, "data/musique/musique_train_corpus.json");
  DEPCACHE_REQUIRE_SHARED(qa_path, "data/musique/musique_train.json");
  EXPECT_EQ(detect_corpus_format(corpus_path), CorpusFormat::Musique);
  Corpus corpus = load_corpus(corpus_path);
  ASSERT_EQ(corpus.docs.size(), 1890u);
  EXPECT_EQ(corpus.docs[0].title, "Journal of Mathematical Physics");
  const std::vector<QaItem> qa = load_qa(qa_path);
  ASSERT_EQ(qa.size(), 100u);
  EXPECT_EQ(qa[0].id, "2hop__150763_14904");
  EXPECT_EQ(qa[0].answers.at(0), "G. Stanley Hall");
  // Multi-hop, but two supporting paragraphs may share a title.
  for (const QaItem& q : qa) EXPECT_FALSE(q.supporting_titles.empty()) << q.id;

  const ChunkIndex idx = ChunkIndex::build(std::move(corpus), Tokenizer(Vocab::builtin_bytes()));
  const double recall = recall_at_k(idx, qa, 5);
  std::printf("[check] MuSiQue BM25 recall@5 of supporting titles: %.3f over %zu chunks\n", recall,
              idx.chunks().size());
  EXPECT_GT(recall, 0.45);  // measured 0.533
}

TEST(RealData, HotpotqaLoadsAndRetrieves) {
  DEPCACHE_REQUIRE_SHARED(corpus_path, "data/hotpotqa/hotpotqa_train_corpus.json");
  DEPCACHE_REQUIRE_SHARED(qa_path, "data/hotpotqa/hotpotqa_train.json");
  EXPECT_EQ(detect_corpus_format(corpus_path), CorpusFormat::Hotpotqa);
  Corpus corpus = load_corpus(corpus_path);
  ASSERT_EQ(corpus.docs.size(), 994u);
  EXPECT_EQ(corpus.docs[0].title, "Demon Dice");
  EXPECT_EQ(corpus.docs[0].text.rfind("Demon Dice, originally published as Chaos Progenitus", 0), 0u);
  EXPECT_NE(corpus.docs[0].text.find("Tim Brown. In it,"), std::string::npos)
      << "sentences keep their spaces";
  const std::vector<QaItem> qa = load_qa(qa_path);
  ASSERT_EQ(qa.size(), 100u);
  EXPECT_EQ(qa[0].id, "5a77ec115542992a6e59dff7");
  EXPECT_EQ(qa[0].supporting_titles, (std::vector<std::string>{"Alû", "Lilu (mythology)"}));

  const ChunkIndex idx = ChunkIndex::build(std::move(corpus), Tokenizer(Vocab::builtin_bytes()));
  const double recall = recall_at_k(idx, qa, 5);
  std::printf("[check] HotpotQA BM25 recall@5 of supporting titles: %.3f over %zu chunks\n", recall,
              idx.chunks().size());
  EXPECT_GT(recall, 0.65);  // measured 0.775
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache
