#pragma once
// Document collections and QA sets from the multi-hop benchmarks (MuSiQue,
// HotpotQA) or plain JSONL, token-window chunking, and a BM25 index over the
// chunks: the retrieval half of "retrieve, then reuse the chunks' KV caches".
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"
#include "retrieval/bm25.h"
#include "retrieval/rag_request.h"

namespace depcache {

struct Document {
  std::string id;
  std::string title;
  std::string text;
};

struct Corpus {
  std::vector<Document> docs;
};

// Musique: a JSON array of {"title", "text"}; id = the position in the array
// ("0", "1", ...), since titles repeat.
// Hotpotqa: one JSON object, title -> array of sentence strings; text = the
// sentences concatenated as they are (they carry their own leading spaces);
// id = title. File order is kept.
// Jsonl: one {"text", "title"?, "id"?} object per non-blank line; title
// defaults to "", id (string or integer) to the document's 0-based position.
// Auto looks at the content: '[' first -> Musique; a single JSON object whose
// values are all arrays -> Hotpotqa; anything else -> Jsonl.
enum class CorpusFormat { Auto, Musique, Hotpotqa, Jsonl };

// Throws Error: NotFound for a missing file; InvalidInput (naming the file,
// and the line for JSONL) for malformed JSON or a wrong shape.
Corpus load_corpus(const std::filesystem::path& path, CorpusFormat format = CorpusFormat::Auto);

// "auto", "musique", "hotpotqa", "jsonl" (InvalidInput otherwise) and back.
CorpusFormat parse_corpus_format(std::string_view name);
std::string_view corpus_format_name(CorpusFormat format);
// The format Auto resolves to for this file's content (never Auto).
CorpusFormat detect_corpus_format(const std::filesystem::path& path);

struct QaItem {
  std::string id;
  std::string question;
  std::vector<std::string> answers;            // the answer first, then aliases
  std::vector<std::string> supporting_titles;  // distinct, in file order
};

// A JSON array of questions. Each item is read by its keys:
// MuSiQue {id, question, answer, answer_aliases?, paragraphs: [{title, is_supporting}]}
// HotpotQA {_id, question, answer, supporting_facts: [[title, sentence index]]}.
std::vector<QaItem> load_qa(const std::filesystem::path& path);

struct ChunkOptions {
  size_t chunk_tokens = 256;
  size_t overlap = 32;  // tokens shared by consecutive chunks of a document
};

struct Chunk {
  uint32_t doc = 0;  // index into Corpus::docs
  uint32_t index_in_doc = 0;
  std::vector<int32_t> tokens;
  // The window's tokens decoded. A multi-byte character cut by a window edge
  // is left out rather than shown as U+FFFD (the overlapping neighbour
  // usually holds it whole).
  std::string text;
};

// Tokenizes "title\ntext" of each document (no BOS) and cuts it into windows
// of chunk_tokens tokens starting every chunk_tokens - overlap tokens; the
// last window of a document may be shorter, and a document shorter than one
// window is one chunk. Documents that tokenize to nothing give no chunk.
// InvalidInput for chunk_tokens == 0 or overlap >= chunk_tokens.
std::vector<Chunk> chunk_corpus(const Corpus& corpus, const Tokenizer& tokenizer,
                                const ChunkOptions& options);

struct ChunkHit {
  uint32_t chunk = 0;  // index into ChunkIndex::chunks()
  double score = 0;
};

// BM25 results over a ChunkIndex's documents as chunk hits (a staged
// search's intermediate SearchStage::top, say).
std::vector<ChunkHit> to_hits(const std::vector<ScoredDoc>& docs);

// Chunks of a corpus and a BM25 index over their texts (Bm25Index doc id ==
// chunk index). Only a document's first chunk holds its title: repeating the
// title in every chunk was measured to lower recall on MuSiQue and HotpotQA
// (several chunks of one article then crowd the top-k).
class ChunkIndex {
 public:
  static ChunkIndex build(Corpus corpus, const Tokenizer& tokenizer, const ChunkOptions& options = {},
                          Bm25Params params = {});

  std::vector<ChunkHit> search(std::string_view question, size_t k) const;
  // Bm25Index::search_staged over chunk ids (SearchStage::top[i].doc is a chunk index).
  std::vector<ChunkHit> search_staged(std::string_view question, size_t k, size_t n_stages,
                                      const std::function<bool(const SearchStage&)>& on_stage,
                                      StageOrder order = StageOrder::Documents) const;

  const Corpus& corpus() const { return corpus_; }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  const Chunk& chunk(uint32_t i) const { return chunks_.at(i); }
  const Document& doc_of(uint32_t chunk) const { return corpus_.docs[chunks_.at(chunk).doc]; }
  // A chunk as a request carries it: id "doc#index", the document's title,
  // the chunk's text.
  RequestDocument request_document(uint32_t chunk) const;
  const Bm25Index& bm25() const { return bm25_; }
  const ChunkOptions& options() const { return options_; }

 private:
  ChunkIndex() = default;
  Corpus corpus_;
  std::vector<Chunk> chunks_;
  Bm25Index bm25_;
  ChunkOptions options_;
};

}  // namespace depcache
