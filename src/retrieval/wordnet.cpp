#include "retrieval/wordnet.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "util/error.h"

namespace depcache {
namespace {

constexpr std::string_view kInstallHint = "install WordNet with `apt-get install wordnet-base`";

// The four parts of speech, in the order the files are read.
struct PosFile {
  const char* suffix;
  char pos;  // as in index.pos and in entity names
};
constexpr PosFile kFiles[4] = {{"noun", 'n'}, {"verb", 'v'}, {"adj", 'a'}, {"adv", 'r'}};
constexpr int kVerb = 1, kAdj = 2, kAdv = 3;

// Which file a pos letter of a data line or pointer refers to; -1 if none.
int file_of_pos(char c) {
  switch (c) {
    case 'n':
      return 0;
    case 'v':
      return kVerb;
    case 'a':
    case 's':  // adjective satellite
      return kAdj;
    case 'r':
      return kAdv;
    default:
      return -1;
  }
}

std::string_view relation_for(std::string_view symbol, int file) {
  struct Entry {
    std::string_view symbol, name;
  };
  static constexpr Entry kNames[] = {
      {"!", "antonym"},
      {"@", "hypernym"},
      {"@i", "instance hypernym"},
      {"~", "hyponym"},
      {"~i", "instance hyponym"},
      {"#m", "member holonym"},
      {"#s", "substance holonym"},
      {"#p", "part holonym"},
      {"%m", "member meronym"},
      {"%s", "substance meronym"},
      {"%p", "part meronym"},
      {"=", "attribute"},
      {"+", "derivation"},
      {";c", "topic domain"},
      {"-c", "topic domain member"},
      {";r", "region domain"},
      {"-r", "region domain member"},
      {";u", "usage domain"},
      {"-u", "usage domain member"},
      {"*", "entailment"},
      {">", "cause"},
      {"^", "also see"},
      {"$", "verb group"},
      {"&", "similar to"},
      {"<", "participle"},
  };
  // '\' is a pertainym on adjectives but "derived from adjective" on adverbs.
  if (symbol == "\\") return file == kAdv ? "derived from" : "pertainym";
  for (const Entry& e : kNames)
    if (e.symbol == symbol) return e.name;
  return {};
}

std::string read_whole(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail(ErrorKind::NotFound, "WordNet file {} not found; {}", path.string(), kInstallHint);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f)
    fail(ErrorKind::NotFound, "cannot open {}: {}; {}", path.string(), std::strerror(errno), kInstallHint);
  std::string data;
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  if (size > 0) data.resize(static_cast<size_t>(size));
  const size_t got = size > 0 ? std::fread(data.data(), 1, data.size(), f) : 0;
  const bool bad = std::ferror(f) || got != data.size();
  std::fclose(f);
  if (bad) fail(ErrorKind::InvalidInput, "reading {} failed", path.string());
  return data;
}

// The space-separated fields of one line, with errors that name file and line.
class Fields {
 public:
  Fields(std::string_view line, const std::string& file, size_t line_no)
      : line_(line), file_(file), line_no_(line_no) {}

  std::string_view next(std::string_view what) {
    while (pos_ < line_.size() && line_[pos_] == ' ') ++pos_;
    if (pos_ >= line_.size()) bad(fmt::format("line ends before the {}", what));
    const size_t start = pos_;
    while (pos_ < line_.size() && line_[pos_] != ' ') ++pos_;
    return line_.substr(start, pos_ - start);
  }
  uint32_t decimal(std::string_view what) { return number(next(what), 10, what); }
  uint32_t hex(std::string_view what) { return number(next(what), 16, what); }
  uint32_t number(std::string_view s, int base, std::string_view what) const {
    if (s.empty() || s.size() > 8) bad(fmt::format("bad {} '{}'", what, s));
    uint32_t v = 0;
    for (const char c : s) {
      int d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (base == 16 && c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (base == 16 && c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        bad(fmt::format("bad {} '{}'", what, s));
      v = v * static_cast<uint32_t>(base) + static_cast<uint32_t>(d);
    }
    return v;
  }
  [[noreturn]] void bad(std::string_view msg) const {
    fail(ErrorKind::InvalidInput, "{}:{}: {}", file_, line_no_, msg);
  }

 private:
  std::string_view line_;
  size_t pos_ = 0;
  const std::string& file_;
  size_t line_no_;
};

// Calls fn(line, line_number) for every line that is not license header.
template <typename Fn>
void for_each_record(std::string_view data, Fn&& fn) {
  size_t pos = 0, line_no = 0;
  while (pos < data.size()) {
    size_t end = data.find('\n', pos);
    if (end == std::string_view::npos) end = data.size();
    std::string_view line = data.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.starts_with("  ") || line.find_first_not_of(' ') == std::string_view::npos) continue;
    fn(line, line_no);
  }
}

// "galore(ip)" -> "galore": adjective syntactic markers are not part of the word.
std::string_view strip_marker(std::string_view word) {
  if (word.size() > 2 && word.back() == ')') {
    const size_t open = word.rfind('(');
    if (open != std::string_view::npos && open > 0) return word.substr(0, open);
  }
  return word;
}

std::string index_form(std::string_view word) {
  std::string s(strip_marker(word));
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

std::string display_form(std::string_view word) {
  std::string s(strip_marker(word));
  std::replace(s.begin(), s.end(), '_', ' ');
  return s;
}

// index.pos: lemma -> its synset offsets in sense order.
struct SenseIndex {
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> lemmas;  // (first, count) in offsets
  std::vector<uint32_t> offsets;
};

void parse_index(std::string_view data, const std::string& file, char pos, SenseIndex& index) {
  for_each_record(data, [&](std::string_view line, size_t line_no) {
    Fields f(line, file, line_no);
    const std::string_view lemma = f.next("lemma");
    const std::string_view p = f.next("pos");
    if (p.size() != 1 || p[0] != pos) f.bad(fmt::format("pos '{}' in an index of '{}' words", p, pos));
    const uint32_t synset_cnt = f.decimal("synset_cnt");
    const uint32_t p_cnt = f.decimal("p_cnt");
    for (uint32_t i = 0; i < p_cnt; ++i) f.next("pointer symbol");
    f.decimal("sense_cnt");
    f.decimal("tagsense_cnt");
    const auto first = static_cast<uint32_t>(index.offsets.size());
    for (uint32_t i = 0; i < synset_cnt; ++i) index.offsets.push_back(f.decimal("synset_offset"));
    if (!index.lemmas.emplace(lemma, std::pair(first, synset_cnt)).second)
      f.bad(fmt::format("lemma '{}' listed twice", lemma));
  });
}

struct Pointer {
  std::string_view symbol;
  uint32_t target_offset;
  int target_file;
  bool lexical;
};

struct Synset {
  uint32_t offset;
  uint32_t line_no;
  int file;
  uint32_t first_word, n_words;        // into words
  uint32_t first_pointer, n_pointers;  // into pointers
};

struct DataFiles {
  std::vector<Synset> synsets;
  std::vector<std::string_view> words;
  std::vector<Pointer> pointers;
};

void parse_data(std::string_view data, const std::string& file, int file_idx, DataFiles& out) {
  for_each_record(data, [&](std::string_view line, size_t line_no) {
    Fields f(line, file, line_no);
    Synset s{};
    s.file = file_idx;
    s.line_no = static_cast<uint32_t>(line_no);
    s.offset = f.decimal("synset_offset");
    f.decimal("lex_filenum");
    const std::string_view ss_type = f.next("ss_type");
    if (ss_type.size() != 1 || file_of_pos(ss_type[0]) != file_idx)
      f.bad(fmt::format("synset type '{}' does not belong in data.{}", ss_type, kFiles[file_idx].suffix));
    s.n_words = f.hex("w_cnt");
    if (s.n_words == 0) f.bad("synset without words");
    s.first_word = static_cast<uint32_t>(out.words.size());
    for (uint32_t i = 0; i < s.n_words; ++i) {
      const std::string_view word = f.next("word");
      if (strip_marker(word).empty()) f.bad(fmt::format("empty word '{}'", word));
      out.words.push_back(word);
      f.hex("lex_id");
    }
    s.n_pointers = f.decimal("p_cnt");
    s.first_pointer = static_cast<uint32_t>(out.pointers.size());
    for (uint32_t i = 0; i < s.n_pointers; ++i) {
      Pointer p{};
      p.symbol = f.next("pointer symbol");
      if (relation_for(p.symbol, file_idx).empty())
        f.bad(fmt::format("unknown pointer symbol '{}'", p.symbol));
      p.target_offset = f.decimal("pointer synset_offset");
      const std::string_view pos = f.next("pointer pos");
      p.target_file = pos.size() == 1 ? file_of_pos(pos[0]) : -1;
      if (p.target_file < 0) f.bad(fmt::format("bad pointer pos '{}'", pos));
      const std::string_view st = f.next("pointer source/target");
      if (st.size() != 4) f.bad(fmt::format("bad pointer source/target '{}'", st));
      const uint32_t source = f.number(st.substr(0, 2), 16, "pointer source");
      const uint32_t target = f.number(st.substr(2, 2), 16, "pointer target");
      if (source > s.n_words)
        f.bad(fmt::format("pointer source word {} of a {}-word synset", source, s.n_words));
      p.lexical = source != 0 || target != 0;
      out.pointers.push_back(p);
    }
    std::string_view bar = f.next("'|' and gloss");
    if (bar != "|" && file_idx == kVerb) {  // verb frames: f_cnt (+ f_num w_num)...
      const uint32_t f_cnt = f.number(bar, 10, "frame count");
      for (uint32_t i = 0; i < f_cnt; ++i) {
        if (f.next("frame") != "+") f.bad("expected '+' before a verb frame");
        f.decimal("frame number");
        f.hex("frame word number");
      }
      bar = f.next("'|' and gloss");
    }
    if (bar != "|") f.bad(fmt::format("expected '|' before the gloss, found '{}'", bar));
    out.synsets.push_back(s);
  });
}

// The eight files, kept in memory: words and symbols are views into them.
struct WordnetTexts {
  std::string index_text[4], data_text[4];
  std::string index_name[4], data_name[4];
};

void read_wordnet_texts(const std::filesystem::path& dir, WordnetTexts& t) {
  for (int i = 0; i < 4; ++i) {
    const std::filesystem::path ip = dir / fmt::format("index.{}", kFiles[i].suffix);
    const std::filesystem::path dp = dir / fmt::format("data.{}", kFiles[i].suffix);
    t.index_name[i] = ip.string();
    t.data_name[i] = dp.string();
    t.index_text[i] = read_whole(ip);
    t.data_text[i] = read_whole(dp);
  }
}

// (file, offset) -> entity, for resolving pointers.
using OffsetMaps = std::unordered_map<uint32_t, EntityId>[4];

// One entity per synset, named lemma.pos.sense after its first word; the
// other words are aliases.
void add_synset_entities(const DataFiles& files, const SenseIndex (&index)[4], const WordnetTexts& texts,
                         KnowledgeGraph& g, OffsetMaps& by_offset) {
  size_t n_per_file[4] = {};
  for (const Synset& s : files.synsets) ++n_per_file[s.file];
  for (int i = 0; i < 4; ++i) by_offset[i].reserve(n_per_file[i]);
  for (const Synset& s : files.synsets) {
    const Fields f({}, texts.data_name[s.file], s.line_no);  // for errors only
    const std::string_view first = files.words[s.first_word];
    const std::string lemma = index_form(first);
    const SenseIndex& idx = index[s.file];
    const auto it = idx.lemmas.find(lemma);
    size_t sense = 0;
    if (it != idx.lemmas.end()) {
      const auto [begin, count] = it->second;
      for (uint32_t k = 0; k < count; ++k)
        if (idx.offsets[begin + k] == s.offset) sense = k + 1;
    }
    if (sense == 0)
      f.bad(fmt::format("synset {:08d} (first word '{}') is not listed under '{}' in {}", s.offset, first,
                        lemma, texts.index_name[s.file]));
    const std::string name = fmt::format("{}.{}.{:02d}", lemma, kFiles[s.file].pos, sense);
    const size_t before = g.n_entities();
    const EntityId e = g.add_entity(name);
    if (g.n_entities() == before) f.bad(fmt::format("second synset named {}", name));
    if (!by_offset[s.file].emplace(s.offset, e).second)
      f.bad(fmt::format("synset offset {:08d} appears twice", s.offset));
    g.set_label(e, display_form(first));
    for (uint32_t w = 1; w < s.n_words; ++w) g.add_alias(e, display_form(files.words[s.first_word + w]));
  }
}

// A triple per pointer. Lexical pointers (word to word) become
// synset-to-synset triples too. Returns how many were lexical.
size_t add_pointer_triples(const DataFiles& files, const WordnetTexts& texts, const OffsetMaps& by_offset,
                           KnowledgeGraph& g) {
  size_t n_lexical = 0;
  for (const Synset& s : files.synsets) {
    const EntityId head = by_offset[s.file].at(s.offset);
    for (uint32_t k = 0; k < s.n_pointers; ++k) {
      const Pointer& p = files.pointers[s.first_pointer + k];
      const auto it = by_offset[p.target_file].find(p.target_offset);
      if (it == by_offset[p.target_file].end())
        Fields({}, texts.data_name[s.file], s.line_no)
            .bad(fmt::format("pointer '{}' to synset {:08d} which {} does not have", p.symbol,
                             p.target_offset, texts.data_name[p.target_file]));
      g.add_triple(head, g.add_relation(relation_for(p.symbol, s.file)), it->second);
      n_lexical += p.lexical;
    }
  }
  return n_lexical;
}

// Counts, with the relations by triple count (most first, then by name).
WordnetImportStats import_stats(const KnowledgeGraph& g, const DataFiles& files, size_t n_lexical) {
  WordnetImportStats stats{};
  stats.n_synsets = files.synsets.size();
  stats.n_triples = g.n_triples();
  stats.n_pointers = files.pointers.size();
  stats.n_lexical_pointers = n_lexical;
  stats.n_relations = g.n_relations();
  std::vector<size_t> counts(g.n_relations(), 0);
  for (const Triple& t : g.triples()) ++counts[t.relation];
  for (RelationId r = 0; r < counts.size(); ++r)
    stats.per_relation.emplace_back(std::string(g.relation_name(r)), counts[r]);
  std::sort(stats.per_relation.begin(), stats.per_relation.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  return stats;
}

}  // namespace

KnowledgeGraph import_wordnet(const std::filesystem::path& dir, WordnetImportStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    fail(ErrorKind::NotFound, "WordNet directory {} not found; {}", dir.string(), kInstallHint);

  WordnetTexts texts;
  read_wordnet_texts(dir, texts);
  SenseIndex index[4];
  DataFiles files;
  for (int i = 0; i < 4; ++i) {
    parse_index(texts.index_text[i], texts.index_name[i], kFiles[i].pos, index[i]);
    parse_data(texts.data_text[i], texts.data_name[i], i, files);
  }

  KnowledgeGraph g;
  OffsetMaps by_offset;
  add_synset_entities(files, index, texts, g, by_offset);
  const size_t n_lexical = add_pointer_triples(files, texts, by_offset, g);
  g.finalize();

  if (stats) {
    *stats = import_stats(g, files, n_lexical);
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return g;
}

}  // namespace depcache
