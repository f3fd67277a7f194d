#pragma once
// A RAG request as the engine receives it: a question plus its retrieved
// context, which is plain text, a list of documents (chunk RAG) or relation
// paths per entity (GraphRAG). Stored one JSON object per line.
#include <filesystem>
#include <iosfwd>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace depcache {

struct RequestDocument {
  std::string id;  // stable key: the same id always means the same text
  std::string title;
  std::string text;
  bool operator==(const RequestDocument&) const = default;
};

struct RequestEntity {
  std::string name;                // unique entity key
  std::string label;               // display text
  std::vector<std::string> paths;  // serialized relation paths, root first
  bool operator==(const RequestEntity&) const = default;
};

struct RagRequest {
  std::string id;
  double arrival_s = 0;  // offset from the start of the trace
  std::string question;
  std::vector<std::string> answers;  // accepted answers, when known
  std::string text;                  // a plain prompt, when there is no retrieval
  std::vector<RequestDocument> documents;
  std::vector<RequestEntity> entities;
};

// Whether two requests carry the same context (text, documents, entities, in
// the same order), whatever they ask.
bool same_context(const RagRequest& a, const RagRequest& b);

nlohmann::json request_to_json(const RagRequest& r);
// InvalidInput error naming `where` (e.g. "file.jsonl:12") for a malformed object.
RagRequest request_from_json(const nlohmann::json& j, const std::string& where);

std::vector<RagRequest> read_requests(const std::filesystem::path& path);
// The same from a stream (one request per line); errors name `source_name`.
std::vector<RagRequest> read_requests(std::istream& in, const std::string& source_name);
// Atomic: written to path.partial, then renamed.
void write_requests(const std::filesystem::path& path, const std::vector<RagRequest>& requests);

}  // namespace depcache
