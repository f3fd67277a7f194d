#include "retrieval/corpus.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/error.h"
#include "util/json_error.h"

namespace depcache {
namespace {

namespace fs = std::filesystem;
// Ordered: a HotpotQA corpus is an object, and its documents should keep file order.
using Json = nlohmann::ordered_json;

std::string read_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(ErrorKind::NotFound, "{}: no such file", path.string());
  if (fs::is_directory(path, ec))
    fail(ErrorKind::InvalidInput, "{}: is a directory, not a file", path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::InvalidInput, "{}: cannot open for reading", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(ErrorKind::InvalidInput, "{}: read error", path.string());
  return std::move(ss).str();
}

Json parse_json(const std::string& data, const fs::path& path) {
  try {
    return Json::parse(data);
  } catch (const Json::exception& e) {
    fail(ErrorKind::InvalidInput, "{}: malformed JSON: {}", path.string(), json_error_message(e));
  }
}

// Position of the first byte that is not whitespace (or a UTF-8 BOM).
size_t content_start(const std::string& data) {
  size_t i = data.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
  while (i < data.size() && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r')) ++i;
  return i;
}

bool is_hotpot_shape(const Json& j) {
  return j.is_object() && std::all_of(j.begin(), j.end(), [](const Json& v) { return v.is_array(); });
}

// Resolves Auto; when the content had to be parsed to decide, it is kept in `parsed`.
CorpusFormat detect(const std::string& data, Json& parsed) {
  const size_t start = content_start(data);
  if (start < data.size() && data[start] == '[') return CorpusFormat::Musique;
  if (start < data.size() && data[start] == '{') {
    // A JSONL file with several lines fails this parse quickly, at its second object.
    Json j = Json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && is_hotpot_shape(j)) {
      parsed = std::move(j);
      return CorpusFormat::Hotpotqa;
    }
  }
  return CorpusFormat::Jsonl;
}

const std::string* string_member(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
}

Corpus parse_musique(const Json& j, const fs::path& path) {
  if (!j.is_array())
    fail(ErrorKind::InvalidInput, "{}: a MuSiQue corpus must be a JSON array of {{\"title\", \"text\"}}",
         path.string());
  Corpus corpus;
  corpus.docs.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const Json& item = j[i];
    const std::string* title = item.is_object() ? string_member(item, "title") : nullptr;
    const std::string* text = item.is_object() ? string_member(item, "text") : nullptr;
    if (!title || !text)
      fail(ErrorKind::InvalidInput, "{}: item {}: expected an object with string \"title\" and \"text\"",
           path.string(), i);
    corpus.docs.push_back({std::to_string(i), *title, *text});
  }
  return corpus;
}

Corpus parse_hotpotqa(const Json& j, const fs::path& path) {
  if (!j.is_object())
    fail(ErrorKind::InvalidInput, "{}: a HotpotQA corpus must be a JSON object of title -> [sentences]",
         path.string());
  Corpus corpus;
  corpus.docs.reserve(j.size());
  for (const auto& [title, sentences] : j.items()) {
    if (!sentences.is_array())
      fail(ErrorKind::InvalidInput, "{}: \"{}\": expected an array of sentence strings", path.string(),
           title);
    Document doc{title, title, {}};
    for (const Json& s : sentences) {
      if (!s.is_string())
        fail(ErrorKind::InvalidInput, "{}: \"{}\": expected an array of sentence strings", path.string(),
             title);
      doc.text += s.get_ref<const std::string&>();
    }
    corpus.docs.push_back(std::move(doc));
  }
  return corpus;
}

Corpus parse_jsonl(const std::string& data, const fs::path& path) {
  Corpus corpus;
  size_t line_no = 0;
  for (size_t pos = 0; pos < data.size();) {
    size_t end = data.find('\n', pos);
    if (end == std::string::npos) end = data.size();
    std::string_view line(data.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line_no == 1 && line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank lines are allowed

    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::exception& e) {
      fail(ErrorKind::InvalidInput, "{}:{}: malformed JSON: {}", path.string(), line_no,
           json_error_message(e));
    }
    if (!j.is_object())
      fail(ErrorKind::InvalidInput, "{}:{}: expected a JSON object", path.string(), line_no);
    const std::string* text = string_member(j, "text");
    if (!text) fail(ErrorKind::InvalidInput, "{}:{}: missing string \"text\"", path.string(), line_no);
    Document doc;
    doc.text = *text;
    if (const auto it = j.find("title"); it != j.end()) {
      if (!it->is_string())
        fail(ErrorKind::InvalidInput, "{}:{}: \"title\" must be a string", path.string(), line_no);
      doc.title = it->get<std::string>();
    }
    if (const auto it = j.find("id"); it != j.end()) {
      if (it->is_string())
        doc.id = it->get<std::string>();
      else if (it->is_number_integer())
        doc.id = it->dump();
      else
        fail(ErrorKind::InvalidInput, "{}:{}: \"id\" must be a string or an integer", path.string(), line_no);
    } else {
      doc.id = std::to_string(corpus.docs.size());
    }
    corpus.docs.push_back(std::move(doc));
  }
  return corpus;
}

// Appends s unless it is already there (supporting titles are few per question).
void add_distinct(std::vector<std::string>& v, const std::string& s) {
  if (std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
}

[[noreturn]] void qa_fail(const fs::path& path, size_t item, std::string_view what) {
  fail(ErrorKind::InvalidInput, "{}: item {}: {}", path.string(), item, what);
}

QaItem parse_qa_item(const Json& item, size_t i, const fs::path& path) {
  const auto bad = [&](std::string_view what) { qa_fail(path, i, what); };
  if (!item.is_object()) bad("expected a JSON object");
  const bool musique = item.contains("paragraphs");
  if (!musique && !item.contains("supporting_facts"))
    bad("neither a MuSiQue question (\"paragraphs\") nor a HotpotQA one (\"supporting_facts\")");

  QaItem qa;
  const std::string* id = string_member(item, musique ? "id" : "_id");
  if (!id) bad(musique ? "missing string \"id\"" : "missing string \"_id\"");
  qa.id = *id;
  const std::string* question = string_member(item, "question");
  if (!question) bad("missing string \"question\"");
  qa.question = *question;
  if (const auto it = item.find("answer"); it != item.end()) {
    if (!it->is_string()) bad("\"answer\" must be a string");
    qa.answers.push_back(it->get<std::string>());
  }

  if (musique) {
    if (const auto it = item.find("answer_aliases"); it != item.end()) {
      if (!it->is_array()) bad("\"answer_aliases\" must be an array of strings");
      for (const Json& a : *it) {
        if (!a.is_string()) bad("\"answer_aliases\" must be an array of strings");
        add_distinct(qa.answers, a.get<std::string>());
      }
    }
    const Json& paragraphs = item["paragraphs"];
    if (!paragraphs.is_array()) bad("\"paragraphs\" must be an array");
    for (const Json& p : paragraphs) {
      const std::string* title = p.is_object() ? string_member(p, "title") : nullptr;
      if (!title) bad("each paragraph needs a string \"title\"");
      const auto sup = p.find("is_supporting");
      if (sup != p.end() && !sup->is_boolean()) bad("\"is_supporting\" must be true or false");
      if (sup != p.end() && sup->get<bool>()) add_distinct(qa.supporting_titles, *title);
    }
  } else {
    const Json& facts = item["supporting_facts"];
    if (!facts.is_array()) bad("\"supporting_facts\" must be an array of [title, sentence index]");
    for (const Json& f : facts) {
      if (!f.is_array() || f.empty() || !f[0].is_string())
        bad("\"supporting_facts\" must be an array of [title, sentence index]");
      add_distinct(qa.supporting_titles, f[0].get<std::string>());
    }
  }
  return qa;
}

// The valid UTF-8 text of a window's bytes. A character cut by either window
// edge is dropped rather than shown as U+FFFD, which BM25 would otherwise read
// as part of a word.
std::string window_text(std::string bytes) {
  size_t lead = 0;
  while (lead < bytes.size() && lead < 3 && (static_cast<unsigned char>(bytes[lead]) & 0xC0) == 0x80) ++lead;
  bytes.erase(0, lead);
  std::string text;
  drain_utf8(bytes, text, /*final=*/false);  // an incomplete tail stays in `bytes`
  return text;
}

}  // namespace

CorpusFormat parse_corpus_format(std::string_view name) {
  if (name == "auto") return CorpusFormat::Auto;
  if (name == "musique") return CorpusFormat::Musique;
  if (name == "hotpotqa") return CorpusFormat::Hotpotqa;
  if (name == "jsonl") return CorpusFormat::Jsonl;
  fail(ErrorKind::InvalidInput, "unknown corpus format '{}' (auto, musique, hotpotqa, jsonl)", name);
}

std::string_view corpus_format_name(CorpusFormat format) {
  switch (format) {
    case CorpusFormat::Auto:
      return "auto";
    case CorpusFormat::Musique:
      return "musique";
    case CorpusFormat::Hotpotqa:
      return "hotpotqa";
    case CorpusFormat::Jsonl:
      return "jsonl";
  }
  return "?";
}

CorpusFormat detect_corpus_format(const fs::path& path) {
  Json unused;
  return detect(read_file(path), unused);
}

Corpus load_corpus(const fs::path& path, CorpusFormat format) {
  const std::string data = read_file(path);
  Json parsed;
  if (format == CorpusFormat::Auto) format = detect(data, parsed);
  Corpus corpus;
  switch (format) {
    case CorpusFormat::Musique:
      corpus = parse_musique(parse_json(data, path), path);
      break;
    case CorpusFormat::Hotpotqa:
      corpus = parse_hotpotqa(parsed.is_null() ? parse_json(data, path) : parsed, path);
      break;
    case CorpusFormat::Jsonl:
    case CorpusFormat::Auto:
      corpus = parse_jsonl(data, path);
      break;
  }
  if (corpus.docs.size() > std::numeric_limits<uint32_t>::max())
    fail(ErrorKind::LimitExceeded, "{}: {} documents is more than the index can address", path.string(),
         corpus.docs.size());
  return corpus;
}

std::vector<QaItem> load_qa(const fs::path& path) {
  const Json j = parse_json(read_file(path), path);
  if (!j.is_array())
    fail(ErrorKind::InvalidInput, "{}: a QA file must be a JSON array of questions", path.string());
  std::vector<QaItem> items;
  items.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) items.push_back(parse_qa_item(j[i], i, path));
  return items;
}

std::vector<Chunk> chunk_corpus(const Corpus& corpus, const Tokenizer& tokenizer,
                                const ChunkOptions& options) {
  if (options.chunk_tokens == 0) fail(ErrorKind::InvalidInput, "chunk size must be at least 1 token");
  if (options.overlap >= options.chunk_tokens)
    fail(ErrorKind::InvalidInput, "chunk overlap ({} tokens) must be smaller than the chunk size ({} tokens)",
         options.overlap, options.chunk_tokens);
  const size_t step = options.chunk_tokens - options.overlap;

  std::vector<Chunk> chunks;
  for (size_t d = 0; d < corpus.docs.size(); ++d) {
    const Document& doc = corpus.docs[d];
    const std::string full = doc.title.empty() ? doc.text : doc.title + "\n" + doc.text;
    const std::vector<int32_t> ids = tokenizer.encode(full, /*add_bos=*/false, /*parse_special=*/false);
    const size_t n = ids.size();
    for (size_t start = 0, index = 0; start < n; start += step, ++index) {
      const size_t end = std::min(start + options.chunk_tokens, n);
      Chunk c;
      c.doc = static_cast<uint32_t>(d);
      c.index_in_doc = static_cast<uint32_t>(index);
      c.tokens.assign(ids.begin() + static_cast<ptrdiff_t>(start), ids.begin() + static_cast<ptrdiff_t>(end));
      c.text = window_text(tokenizer.decode(c.tokens));
      chunks.push_back(std::move(c));
      if (end == n) break;  // a further window would lie inside this one's overlap
    }
  }
  return chunks;
}

ChunkIndex ChunkIndex::build(Corpus corpus, const Tokenizer& tokenizer, const ChunkOptions& options,
                             Bm25Params params) {
  ChunkIndex index;
  index.chunks_ = chunk_corpus(corpus, tokenizer, options);
  index.corpus_ = std::move(corpus);
  index.options_ = options;
  index.bm25_ = Bm25Index(params);
  for (const Chunk& c : index.chunks_) index.bm25_.add(c.text);
  index.bm25_.finalize();
  return index;
}

std::vector<ChunkHit> to_hits(const std::vector<ScoredDoc>& docs) {
  std::vector<ChunkHit> hits;
  hits.reserve(docs.size());
  for (const ScoredDoc& d : docs) hits.push_back({d.doc, d.score});
  return hits;
}

std::vector<ChunkHit> ChunkIndex::search(std::string_view question, size_t k) const {
  return to_hits(bm25_.search(question, k));
}

std::vector<ChunkHit> ChunkIndex::search_staged(std::string_view question, size_t k, size_t n_stages,
                                                const std::function<bool(const SearchStage&)>& on_stage,
                                                StageOrder order) const {
  return to_hits(bm25_.search_staged(question, k, n_stages, on_stage, order));
}

RequestDocument ChunkIndex::request_document(uint32_t chunk) const {
  const Chunk& c = this->chunk(chunk);
  const Document& d = doc_of(chunk);
  return {fmt::format("{}#{}", d.id, c.index_in_doc), d.title, c.text};
}

}  // namespace depcache
