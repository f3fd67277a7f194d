#include "retrieval/knowledge_graph.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "util/error.h"
#include "util/file_io.h"
#include "util/hash.h"

namespace depcache {

// ---------------------------------------------------------------------------
// Building and queries

EntityId KnowledgeGraph::add_entity(std::string_view name) {
  if (auto it = entity_ids_.find(name); it != entity_ids_.end()) return it->second;
  if (name.empty()) fail(ErrorKind::InvalidInput, "entity name is empty");
  if (entity_names_.size() >= std::numeric_limits<EntityId>::max())
    fail(ErrorKind::LimitExceeded, "too many entities (limit {})", std::numeric_limits<EntityId>::max());
  const auto id = static_cast<EntityId>(entity_names_.size());
  entity_names_.emplace_back(name);
  entity_labels_.emplace_back();
  aliases_.emplace_back();
  entity_ids_.emplace(entity_names_.back(), id);
  finalized_ = false;  // the adjacency has no row for the new entity
  return id;
}

RelationId KnowledgeGraph::add_relation(std::string_view name) {
  if (auto it = relation_ids_.find(name); it != relation_ids_.end()) return it->second;
  if (name.empty()) fail(ErrorKind::InvalidInput, "relation name is empty");
  const auto id = static_cast<RelationId>(relation_names_.size());
  relation_names_.emplace_back(name);
  relation_ids_.emplace(relation_names_.back(), id);
  return id;
}

void KnowledgeGraph::set_label(EntityId e, std::string_view label) {
  if (e >= entity_names_.size()) fail(ErrorKind::Internal, "set_label: entity id {} out of range", e);
  // An empty stored label means "same as the name", which keeps files small.
  entity_labels_[e] = label == entity_names_[e] ? std::string() : std::string(label);
  // The label is never repeated among the aliases.
  auto& list = aliases_[e];
  const std::string_view shown = entity_label(e);
  const auto removed = std::erase_if(list, [&](const std::string& a) { return a == shown; });
  n_aliases_ -= removed;
}

void KnowledgeGraph::add_alias(EntityId e, std::string_view alias) {
  if (e >= entity_names_.size()) fail(ErrorKind::Internal, "add_alias: entity id {} out of range", e);
  if (alias.empty() || alias == entity_label(e)) return;
  auto& list = aliases_[e];
  if (std::find(list.begin(), list.end(), alias) != list.end()) return;
  list.emplace_back(alias);
  ++n_aliases_;
}

void KnowledgeGraph::add_triple(EntityId head, RelationId relation, EntityId tail) {
  if (head >= entity_names_.size() || tail >= entity_names_.size() || relation >= relation_names_.size())
    fail(ErrorKind::Internal, "add_triple: id out of range ({}, {}, {})", head, relation, tail);
  triples_.push_back({head, relation, tail});
  finalized_ = false;
}

void KnowledgeGraph::add_triple(std::string_view head, std::string_view relation, std::string_view tail) {
  const EntityId h = add_entity(head);
  const RelationId r = add_relation(relation);
  const EntityId t = add_entity(tail);
  add_triple(h, r, t);
}

void KnowledgeGraph::finalize() {
  const auto key = [](const Triple& t) { return std::tuple(t.head, t.relation, t.tail); };
  std::sort(triples_.begin(), triples_.end(),
            [&](const Triple& a, const Triple& b) { return key(a) < key(b); });
  triples_.erase(std::unique(triples_.begin(), triples_.end(),
                             [&](const Triple& a, const Triple& b) { return key(a) == key(b); }),
                 triples_.end());
  if (triples_.size() >= std::numeric_limits<uint32_t>::max())
    fail(ErrorKind::LimitExceeded, "too many triples ({}) for 32-bit adjacency offsets", triples_.size());

  const size_t n = entity_names_.size();
  // Out edges: triples are already sorted by head, then (relation, tail).
  out_offsets_.assign(n + 1, 0);
  out_adj_.resize(triples_.size());
  for (const Triple& t : triples_) ++out_offsets_[t.head + 1];
  for (size_t e = 0; e < n; ++e) out_offsets_[e + 1] += out_offsets_[e];
  for (size_t i = 0; i < triples_.size(); ++i) out_adj_[i] = {triples_[i].relation, triples_[i].tail};

  // In edges: a counting sort by tail; walking the triples in (relation, head)
  // order per tail would need a second sort, so sort each row afterwards.
  in_offsets_.assign(n + 1, 0);
  in_adj_.resize(triples_.size());
  for (const Triple& t : triples_) ++in_offsets_[t.tail + 1];
  for (size_t e = 0; e < n; ++e) in_offsets_[e + 1] += in_offsets_[e];
  std::vector<uint32_t> fill(in_offsets_.begin(), in_offsets_.end() - 1);
  for (const Triple& t : triples_) in_adj_[fill[t.tail]++] = {t.relation, t.head};
  for (size_t e = 0; e < n; ++e)
    std::sort(in_adj_.begin() + in_offsets_[e], in_adj_.begin() + in_offsets_[e + 1],
              [](const Edge& a, const Edge& b) {
                return std::pair(a.relation, a.target) < std::pair(b.relation, b.target);
              });
  finalized_ = true;
}

bool KnowledgeGraph::finalized() const { return finalized_; }
size_t KnowledgeGraph::n_entities() const { return entity_names_.size(); }
size_t KnowledgeGraph::n_relations() const { return relation_names_.size(); }
size_t KnowledgeGraph::n_triples() const { return triples_.size(); }
size_t KnowledgeGraph::n_aliases() const { return n_aliases_; }

std::string_view KnowledgeGraph::entity_name(EntityId e) const {
  if (e >= entity_names_.size()) fail(ErrorKind::Internal, "entity id {} out of range", e);
  return entity_names_[e];
}

std::string_view KnowledgeGraph::entity_label(EntityId e) const {
  if (e >= entity_names_.size()) fail(ErrorKind::Internal, "entity id {} out of range", e);
  return entity_labels_[e].empty() ? entity_names_[e] : entity_labels_[e];
}

std::string_view KnowledgeGraph::relation_name(RelationId r) const {
  if (r >= relation_names_.size()) fail(ErrorKind::Internal, "relation id {} out of range", r);
  return relation_names_[r];
}

std::span<const std::string> KnowledgeGraph::aliases(EntityId e) const {
  if (e >= entity_names_.size()) fail(ErrorKind::Internal, "entity id {} out of range", e);
  return aliases_[e];
}

std::optional<EntityId> KnowledgeGraph::find_entity(std::string_view name) const {
  if (auto it = entity_ids_.find(name); it != entity_ids_.end()) return it->second;
  return std::nullopt;
}

std::optional<RelationId> KnowledgeGraph::find_relation(std::string_view name) const {
  if (auto it = relation_ids_.find(name); it != relation_ids_.end()) return it->second;
  return std::nullopt;
}

void KnowledgeGraph::require_finalized(const char* what) const {
  if (!finalized_) fail(ErrorKind::Internal, "KnowledgeGraph::{} called before finalize()", what);
}

std::span<const Edge> KnowledgeGraph::out_edges(EntityId e) const {
  require_finalized("out_edges");
  if (e >= entity_names_.size()) fail(ErrorKind::Internal, "entity id {} out of range", e);
  return std::span<const Edge>(out_adj_).subspan(out_offsets_[e], out_offsets_[e + 1] - out_offsets_[e]);
}

std::span<const Edge> KnowledgeGraph::in_edges(EntityId e) const {
  require_finalized("in_edges");
  if (e >= entity_names_.size()) fail(ErrorKind::Internal, "entity id {} out of range", e);
  return std::span<const Edge>(in_adj_).subspan(in_offsets_[e], in_offsets_[e + 1] - in_offsets_[e]);
}

std::span<const Triple> KnowledgeGraph::triples() const { return triples_; }

// ---------------------------------------------------------------------------
// Binary file
//
// Layout, all integers little-endian:
//   0  char[4] magic "DKG1"
//   4  u32     version
//   8  u64     checksum: XXH3-64 over bytes [16, file end) (version 1: FNV-1a)
//   16 u64     file size in bytes (detects truncation before anything else)
//   24 u64     n_entities, n_relations, n_triples, n_aliases
//   56 entity names, then labels ("" = same as name), then relation names:
//      each string is u32 length + bytes
//      per entity: u32 alias count, then that many strings
//      triples: n_triples x (u32 head, u32 relation, u32 tail)

namespace {

static_assert(std::endian::native == std::endian::little, "the KG file format is little-endian");

constexpr char kKgMagic[4] = {'D', 'K', 'G', '1'};
constexpr uint32_t kVersion = 2;
constexpr size_t kHeaderSize = 56;
constexpr size_t kChecksumStart = 16;

class Writer {
 public:
  void u32(uint32_t v) { buf_.append(reinterpret_cast<const char*>(&v), 4); }
  void u64(uint64_t v) { buf_.append(reinterpret_cast<const char*>(&v), 8); }
  void str(std::string_view s) {
    if (s.size() > std::numeric_limits<uint32_t>::max())
      fail(ErrorKind::LimitExceeded, "string of {} bytes is too long for a KG file", s.size());
    u32(static_cast<uint32_t>(s.size()));
    buf_.append(s);
  }
  std::string& buf() { return buf_; }

 private:
  std::string buf_;
};

// Bounds-checked cursor: every read names the file and what ran out.
class Reader {
 public:
  Reader(const std::string& data, size_t pos, const std::string& file)
      : data_(data), pos_(pos), file_(file) {}

  uint32_t u32(const char* what) {
    need(4, what);
    uint32_t v;
    std::memcpy(&v, data_.data() + pos_, 4);
    pos_ += 4;
    return v;
  }
  std::string str(const char* what) {
    const uint32_t n = u32(what);
    need(n, what);
    std::string s(data_.data() + pos_, n);
    pos_ += n;
    return s;
  }
  // A count of items that each take at least min_bytes must fit in what is
  // left, so a corrupt count can never trigger a huge allocation.
  void check_count(uint64_t count, size_t min_bytes, const char* what) const {
    if (count > remaining() / min_bytes)
      fail(ErrorKind::InvalidInput, "{}: corrupt KG file: {} {} do not fit in the {} bytes left", file_,
           count, what, remaining());
  }
  size_t remaining() const { return data_.size() - pos_; }
  size_t pos() const { return pos_; }

 private:
  void need(size_t n, const char* what) const {
    if (n > remaining())
      fail(ErrorKind::InvalidInput, "{}: corrupt KG file: {} runs past the end at offset {}", file_, what,
           pos_);
  }
  const std::string& data_;
  size_t pos_;
  const std::string& file_;
};

std::string read_file(const std::filesystem::path& path, const char* what) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(ErrorKind::NotFound, "{} not found: {}", what, path.string());
  if (std::filesystem::is_directory(path, ec))
    fail(ErrorKind::InvalidInput, "{} is a directory, not a {}", path.string(), what);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(ErrorKind::NotFound, "cannot open {} {}: {}", what, path.string(), std::strerror(errno));
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  const bool bad = std::ferror(f);
  std::fclose(f);
  if (bad) fail(ErrorKind::InvalidInput, "reading {} failed", path.string());
  return data;
}

uint64_t u64_at(const std::string& data, size_t off) {
  uint64_t v;
  std::memcpy(&v, data.data() + off, 8);
  return v;
}

// The header's magic, version, declared size and checksum.
void check_kg_header(const std::string& data, const std::string& file) {
  if (data.empty()) fail(ErrorKind::InvalidInput, "{}: empty file, not a depcache KG file", file);
  if (data.size() < sizeof kKgMagic && std::memcmp(data.data(), kKgMagic, data.size()) == 0)
    fail(ErrorKind::InvalidInput, "{}: truncated KG file: {} bytes", file, data.size());
  if (data.size() < sizeof kKgMagic || std::memcmp(data.data(), kKgMagic, sizeof kKgMagic) != 0)
    fail(ErrorKind::InvalidInput, "{}: not a depcache KG file (bad magic)", file);
  if (data.size() < kHeaderSize)
    fail(ErrorKind::InvalidInput, "{}: truncated KG file: {} bytes, the header alone is {}", file,
         data.size(), kHeaderSize);
  uint32_t version;
  std::memcpy(&version, data.data() + 4, 4);
  if (version != kVersion)
    fail(ErrorKind::InvalidInput,
         "{}: unsupported KG file version {} (this build reads version {}; import the graph again with `kg "
         "import`)",
         file, version, kVersion);
  const uint64_t declared_size = u64_at(data, 16);
  if (declared_size > data.size())
    fail(ErrorKind::InvalidInput, "{}: truncated KG file: header says {} bytes, file has {}", file,
         declared_size, data.size());
  if (declared_size < data.size())
    fail(ErrorKind::InvalidInput, "{}: corrupt KG file: header says {} bytes, file has {} (trailing data?)",
         file, declared_size, data.size());
  const uint64_t stored_sum = u64_at(data, 8);
  const uint64_t sum = hash_bytes(data.data() + kChecksumStart, data.size() - kChecksumStart);
  if (sum != stored_sum)
    fail(ErrorKind::InvalidInput, "{}: corrupt KG file: checksum mismatch (stored {:016x}, computed {:016x})",
         file, stored_sum, sum);
}

struct KgCounts {
  uint64_t n_entities, n_relations, n_triples, n_aliases;
};

// The header's item counts, each checked against the bytes after the header.
KgCounts read_kg_counts(const std::string& data, const Reader& r, const std::string& file) {
  const KgCounts n{u64_at(data, 24), u64_at(data, 32), u64_at(data, 40), u64_at(data, 48)};
  // Minimum bytes per item: a name and a label length plus an alias count per
  // entity; a length per relation; 12 bytes per triple; a length per alias.
  r.check_count(n.n_entities, 12, "entities");
  r.check_count(n.n_relations, 4, "relations");
  r.check_count(n.n_triples, 12, "triples");
  r.check_count(n.n_aliases, 4, "aliases");
  if (n.n_entities > std::numeric_limits<EntityId>::max() ||
      n.n_relations > std::numeric_limits<RelationId>::max())
    fail(ErrorKind::InvalidInput, "{}: corrupt KG file: {} entities / {} relations exceed 32-bit ids", file,
         n.n_entities, n.n_relations);
  return n;
}

// n names (read as `what`), each non-empty and unique; ids maps each to its
// index. `noun` names the kind in errors.
template <typename NameMap>
void read_kg_names(Reader& r, uint64_t n, const char* what, std::string_view noun, const std::string& file,
                   std::vector<std::string>& names, NameMap& ids) {
  names.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    std::string name = r.str(what);
    if (name.empty())
      fail(ErrorKind::InvalidInput, "{}: corrupt KG file: {} {} has an empty name", file, noun, i);
    names.push_back(std::move(name));
    if (!ids.emplace(names.back(), static_cast<uint32_t>(i)).second)
      fail(ErrorKind::InvalidInput, "{}: corrupt KG file: duplicate {} name '{}'", file, noun, names.back());
  }
}

// Each entity's aliases; they must add up to the header's n_aliases.
std::vector<std::vector<std::string>> read_kg_aliases(Reader& r, uint64_t n_entities, uint64_t n_aliases,
                                                      const std::string& file) {
  std::vector<std::vector<std::string>> aliases(n_entities);
  uint64_t n_read_aliases = 0;
  for (uint64_t i = 0; i < n_entities; ++i) {
    const uint32_t count = r.u32("alias count");
    n_read_aliases += count;
    if (n_read_aliases > n_aliases)
      fail(ErrorKind::InvalidInput, "{}: corrupt KG file: more aliases than the {} the header declares", file,
           n_aliases);
    auto& list = aliases[i];
    list.reserve(count);
    for (uint32_t k = 0; k < count; ++k) list.push_back(r.str("alias"));
  }
  if (n_read_aliases != n_aliases)
    fail(ErrorKind::InvalidInput, "{}: corrupt KG file: {} aliases, the header declares {}", file,
         n_read_aliases, n_aliases);
  return aliases;
}

// The triples, every id within the header's counts.
std::vector<Triple> read_kg_triples(Reader& r, const KgCounts& n, const std::string& file) {
  r.check_count(n.n_triples, 12, "triples");
  std::vector<Triple> triples(n.n_triples);
  for (uint64_t i = 0; i < n.n_triples; ++i) {
    Triple& t = triples[i];
    t.head = r.u32("triple");
    t.relation = r.u32("triple");
    t.tail = r.u32("triple");
    if (t.head >= n.n_entities || t.tail >= n.n_entities || t.relation >= n.n_relations)
      fail(ErrorKind::InvalidInput,
           "{}: corrupt KG file: triple {} ({}, {}, {}) has an id out of range ({} entities, {} relations)",
           file, i, t.head, t.relation, t.tail, n.n_entities, n.n_relations);
  }
  return triples;
}

}  // namespace

void KnowledgeGraph::save(const std::filesystem::path& path) const {
  Writer w;
  w.buf().append(kKgMagic, 4);
  w.u32(kVersion);
  w.u64(0);  // checksum, patched below
  w.u64(0);  // file size, patched below
  w.u64(entity_names_.size());
  w.u64(relation_names_.size());
  w.u64(triples_.size());
  w.u64(n_aliases_);
  for (const auto& s : entity_names_) w.str(s);
  for (const auto& s : entity_labels_) w.str(s);
  for (const auto& s : relation_names_) w.str(s);
  for (const auto& list : aliases_) {
    w.u32(static_cast<uint32_t>(list.size()));
    for (const auto& a : list) w.str(a);
  }
  // Saved in finalized order when finalized; load() finalizes either way.
  for (const Triple& t : triples_) {
    w.u32(t.head);
    w.u32(t.relation);
    w.u32(t.tail);
  }
  std::string& buf = w.buf();
  const uint64_t size = buf.size();
  std::memcpy(buf.data() + 16, &size, 8);
  const uint64_t sum = hash_bytes(buf.data() + kChecksumStart, buf.size() - kChecksumStart);
  std::memcpy(buf.data() + 8, &sum, 8);

  if (const auto failure = write_file_atomic(path, buf)) {
    const bool missing_dir = failure->stage == WriteFailure::Stage::Open && failure->error == ENOENT;
    fail(missing_dir ? ErrorKind::NotFound : ErrorKind::InvalidInput, "{}", failure->message);
  }
}

KnowledgeGraph KnowledgeGraph::load(const std::filesystem::path& path) {
  return parse(read_file(path, "KG file"), path.string());
}

KnowledgeGraph KnowledgeGraph::parse(const std::string& data, const std::string& file) {
  check_kg_header(data, file);
  Reader r(data, kHeaderSize, file);
  const KgCounts n = read_kg_counts(data, r, file);

  KnowledgeGraph g;
  g.entity_ids_.reserve(n.n_entities);
  read_kg_names(r, n.n_entities, "entity name", "entity", file, g.entity_names_, g.entity_ids_);
  g.entity_labels_.reserve(n.n_entities);
  for (uint64_t i = 0; i < n.n_entities; ++i) g.entity_labels_.push_back(r.str("entity label"));
  read_kg_names(r, n.n_relations, "relation name", "relation", file, g.relation_names_, g.relation_ids_);
  g.aliases_ = read_kg_aliases(r, n.n_entities, n.n_aliases, file);
  g.n_aliases_ = n.n_aliases;
  g.triples_ = read_kg_triples(r, n, file);
  if (r.remaining() != 0)
    fail(ErrorKind::InvalidInput, "{}: corrupt KG file: {} unexpected bytes after the triples", file,
         r.remaining());
  g.finalize();
  return g;
}

// ---------------------------------------------------------------------------
// Text triples

namespace {

constexpr std::string_view kAliasRelation = "@alias";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Calls fn(line, line_number) for each line, without the newline or a CR before it.
template <typename Fn>
void for_each_line(std::string_view data, Fn&& fn) {
  size_t pos = 0, line_no = 0;
  while (pos < data.size()) {
    size_t end = data.find('\n', pos);
    if (end == std::string_view::npos) end = data.size();
    std::string_view line = data.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    fn(line, ++line_no);
    pos = end + 1;
  }
}

class TripleSink {
 public:
  explicit TripleSink(const std::string& file) : file_(file) {}

  // One row of TSV or CSV, or a JSONL triple.
  void row(std::string_view head, std::string_view relation, std::string_view tail, size_t line) {
    if (head.empty() || relation.empty() || tail.empty())
      fail(ErrorKind::InvalidInput, "{}:{}: empty {} field", file_, line,
           head.empty()       ? "head"
           : relation.empty() ? "relation"
                              : "tail");
    if (relation == kAliasRelation) {
      g_.add_alias(g_.add_entity(head), tail);
    } else {
      g_.add_triple(head, relation, tail);
    }
  }
  KnowledgeGraph& graph() { return g_; }

 private:
  const std::string& file_;
  KnowledgeGraph g_;
};

void parse_tsv(std::string_view data, TripleSink& sink, const std::string& file) {
  for_each_line(data, [&](std::string_view line, size_t line_no) {
    if (trim(line).empty() || line.front() == '#') return;
    std::string_view fields[3];
    size_t n = 0, pos = 0;
    while (true) {
      const size_t tab = line.find('\t', pos);
      const std::string_view field = line.substr(pos, tab == std::string_view::npos ? line.npos : tab - pos);
      if (n < 3) fields[n] = trim(field);
      ++n;
      if (tab == std::string_view::npos) break;
      pos = tab + 1;
    }
    if (n != 3)
      fail(ErrorKind::InvalidInput, "{}:{}: expected 3 tab-separated fields (head, relation, tail), found {}",
           file, line_no, n);
    sink.row(fields[0], fields[1], fields[2], line_no);
  });
}

// RFC 4180: fields separated by commas, optionally in double quotes; inside
// quotes a doubled quote is a quote, and commas and newlines are literal.
void parse_csv(std::string_view data, TripleSink& sink, const std::string& file) {
  size_t pos = 0, line_no = 1;
  bool first_record = true;
  std::vector<std::string> fields;
  while (pos < data.size()) {
    const size_t record_line = line_no;
    fields.clear();
    fields.emplace_back();
    bool any_quoted = false;
    // One record.
    while (true) {
      std::string& field = fields.back();
      if (pos < data.size() && data[pos] == '"') {
        any_quoted = true;
        ++pos;
        while (true) {
          if (pos >= data.size())
            fail(ErrorKind::InvalidInput, "{}:{}: unterminated quoted field", file, record_line);
          const char c = data[pos++];
          if (c == '"') {
            if (pos < data.size() && data[pos] == '"') {
              field += '"';
              ++pos;
            } else {
              break;
            }
          } else {
            if (c == '\n') ++line_no;
            field += c;
          }
        }
        if (pos < data.size() && data[pos] == '\r') ++pos;
        if (pos < data.size() && data[pos] != ',' && data[pos] != '\n')
          fail(ErrorKind::InvalidInput, "{}:{}: unexpected character '{}' after a closing quote", file,
               line_no, data[pos]);
      } else {
        while (pos < data.size() && data[pos] != ',' && data[pos] != '\n') {
          if (data[pos] == '"')
            fail(ErrorKind::InvalidInput, "{}:{}: quote inside an unquoted field (quote the whole field)",
                 file, line_no);
          if (data[pos] != '\r') field += data[pos];
          ++pos;
        }
      }
      if (pos < data.size() && data[pos] == ',') {
        ++pos;
        fields.emplace_back();
        continue;
      }
      if (pos < data.size()) {  // newline
        ++pos;
        ++line_no;
      }
      break;
    }
    const bool blank = fields.size() == 1 && trim(fields[0]).empty() && !any_quoted;
    if (blank) continue;
    const bool header = first_record && fields.size() == 3 && trim(fields[0]) == "head" &&
                        trim(fields[1]) == "relation" && trim(fields[2]) == "tail";
    first_record = false;
    if (header) continue;
    if (fields.size() != 3)
      fail(ErrorKind::InvalidInput,
           "{}:{}: expected 3 comma-separated fields (head, relation, tail), found {}", file, record_line,
           fields.size());
    sink.row(trim(fields[0]), trim(fields[1]), trim(fields[2]), record_line);
  }
}

void parse_jsonl(std::string_view data, TripleSink& sink, const std::string& file) {
  for_each_line(data, [&](std::string_view line, size_t line_no) {
    if (trim(line).empty()) return;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) fail(ErrorKind::InvalidInput, "{}:{}: invalid JSON", file, line_no);
    if (!j.is_object()) fail(ErrorKind::InvalidInput, "{}:{}: expected a JSON object", file, line_no);
    const auto str = [&](const char* key) -> std::string {
      const auto it = j.find(key);
      if (it == j.end()) fail(ErrorKind::InvalidInput, "{}:{}: missing key \"{}\"", file, line_no, key);
      if (!it->is_string())
        fail(ErrorKind::InvalidInput, "{}:{}: \"{}\" must be a string", file, line_no, key);
      return it->get<std::string>();
    };
    if (j.contains("head") || j.contains("relation") || j.contains("tail")) {
      sink.row(str("head"), str("relation"), str("tail"), line_no);
      return;
    }
    if (!j.contains("entity"))
      fail(ErrorKind::InvalidInput, "{}:{}: expected keys \"head\", \"relation\", \"tail\" or \"entity\"",
           file, line_no);
    const std::string name = str("entity");
    if (name.empty()) fail(ErrorKind::InvalidInput, "{}:{}: empty \"entity\"", file, line_no);
    KnowledgeGraph& g = sink.graph();
    const EntityId e = g.add_entity(name);
    if (j.contains("label")) g.set_label(e, str("label"));
    if (const auto it = j.find("aliases"); it != j.end()) {
      if (!it->is_array())
        fail(ErrorKind::InvalidInput, "{}:{}: \"aliases\" must be an array of strings", file, line_no);
      for (const auto& a : *it) {
        if (!a.is_string())
          fail(ErrorKind::InvalidInput, "{}:{}: \"aliases\" must be an array of strings", file, line_no);
        g.add_alias(e, a.get<std::string>());
      }
    }
  });
}

TripleFormat format_from_extension(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".tsv" || ext == ".txt") return TripleFormat::Tsv;
  if (ext == ".csv") return TripleFormat::Csv;
  if (ext == ".jsonl" || ext == ".json") return TripleFormat::Jsonl;
  fail(ErrorKind::InvalidInput,
       "{}: cannot tell the triple format from the extension '{}' (expected .tsv, .txt, .csv, .jsonl or "
       ".json; "
       "or name the format explicitly)",
       path.string(), ext);
}

}  // namespace

KnowledgeGraph load_triples(const std::filesystem::path& path, TripleFormat format) {
  const std::string file = path.string();
  std::string data = read_file(path, "triples file");
  if (data.starts_with("\xEF\xBB\xBF")) data.erase(0, 3);  // a UTF-8 byte order mark, as spreadsheets write
  if (format == TripleFormat::Auto) format = format_from_extension(path);
  TripleSink sink(file);
  switch (format) {
    case TripleFormat::Tsv:
      parse_tsv(data, sink, file);
      break;
    case TripleFormat::Csv:
      parse_csv(data, sink, file);
      break;
    case TripleFormat::Jsonl:
    case TripleFormat::Auto:
      parse_jsonl(data, sink, file);
      break;
  }
  KnowledgeGraph& g = sink.graph();
  if (g.n_triples() == 0) fail(ErrorKind::InvalidInput, "{}: no triples found", file);
  g.finalize();
  return std::move(g);
}

}  // namespace depcache
