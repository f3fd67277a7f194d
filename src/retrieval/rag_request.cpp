#include "retrieval/rag_request.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/file_io.h"
#include "util/json_error.h"

namespace depcache {
namespace {

using nlohmann::json;

std::string get_string(const json& j, const char* key, const std::string& where, bool required) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) fail(ErrorKind::InvalidInput, "{}: missing \"{}\"", where, key);
    return {};
  }
  if (it->is_number_integer() && std::string_view(key) == "id")
    return it->dump();  // numeric ids are common; dump() keeps unsigned ones exact
  if (!it->is_string()) fail(ErrorKind::InvalidInput, "{}: \"{}\" must be a string", where, key);
  return it->get<std::string>();
}

std::vector<std::string> get_strings(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_array()) fail(ErrorKind::InvalidInput, "{}: \"{}\" must be an array of strings", where, key);
  std::vector<std::string> out;
  for (const json& v : *it) {
    if (!v.is_string()) fail(ErrorKind::InvalidInput, "{}: \"{}\" must be an array of strings", where, key);
    out.push_back(v.get<std::string>());
  }
  return out;
}

const json* get_array(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  if (!it->is_array()) fail(ErrorKind::InvalidInput, "{}: \"{}\" must be an array", where, key);
  return &*it;
}

}  // namespace

bool same_context(const RagRequest& a, const RagRequest& b) {
  return a.text == b.text && a.documents == b.documents && a.entities == b.entities;
}

json request_to_json(const RagRequest& r) {
  json j;
  j["id"] = r.id;
  j["arrival_s"] = r.arrival_s;
  j["question"] = r.question;
  if (!r.answers.empty()) j["answers"] = r.answers;
  if (!r.text.empty()) j["text"] = r.text;
  if (!r.documents.empty()) {
    json docs = json::array();
    for (const RequestDocument& d : r.documents)
      docs.push_back({{"id", d.id}, {"title", d.title}, {"text", d.text}});
    j["documents"] = std::move(docs);
  }
  if (!r.entities.empty()) {
    json ents = json::array();
    for (const RequestEntity& e : r.entities)
      ents.push_back({{"name", e.name}, {"label", e.label}, {"paths", e.paths}});
    j["entities"] = std::move(ents);
  }
  return j;
}

RagRequest request_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) fail(ErrorKind::InvalidInput, "{}: a request must be a JSON object", where);
  RagRequest r;
  r.id = get_string(j, "id", where, false);
  if (const auto it = j.find("arrival_s"); it != j.end() && !it->is_null()) {
    if (!it->is_number()) fail(ErrorKind::InvalidInput, "{}: \"arrival_s\" must be a number", where);
    r.arrival_s = it->get<double>();
    if (!std::isfinite(r.arrival_s) || r.arrival_s < 0)
      fail(ErrorKind::InvalidInput, "{}: \"arrival_s\" must be a finite number >= 0", where);
  }
  r.question = get_string(j, "question", where, false);
  r.text = get_string(j, "text", where, false);
  r.answers = get_strings(j, "answers", where);
  if (const json* docs = get_array(j, "documents", where)) {
    for (size_t i = 0; i < docs->size(); ++i) {
      const std::string at = fmt::format("{}: documents[{}]", where, i);
      if (!(*docs)[i].is_object()) fail(ErrorKind::InvalidInput, "{}: must be an object", at);
      r.documents.push_back({get_string((*docs)[i], "id", at, true),
                             get_string((*docs)[i], "title", at, false),
                             get_string((*docs)[i], "text", at, true)});
    }
  }
  if (const json* ents = get_array(j, "entities", where)) {
    for (size_t i = 0; i < ents->size(); ++i) {
      const std::string at = fmt::format("{}: entities[{}]", where, i);
      if (!(*ents)[i].is_object()) fail(ErrorKind::InvalidInput, "{}: must be an object", at);
      RequestEntity e{get_string((*ents)[i], "name", at, true), get_string((*ents)[i], "label", at, false),
                      get_strings((*ents)[i], "paths", at)};
      // The name keys the entity's cached context: an empty one would be
      // every unnamed entity's.
      if (e.name.empty()) fail(ErrorKind::InvalidInput, "{}: \"name\" is empty", at);
      if (e.label.empty()) e.label = e.name;
      for (const std::string& p : e.paths)
        if (p.empty()) fail(ErrorKind::InvalidInput, "{}: empty path", at);
      r.entities.push_back(std::move(e));
    }
  }
  const int n_kinds = !r.text.empty() + !r.documents.empty() + !r.entities.empty();
  if (n_kinds > 1)
    fail(ErrorKind::InvalidInput, "{}: give one of \"text\", \"documents\" or \"entities\", not several",
         where);
  if (r.question.empty() && r.text.empty())
    fail(ErrorKind::InvalidInput, "{}: missing \"question\" (or \"text\")", where);
  return r;
}

std::vector<RagRequest> read_requests(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::NotFound, "cannot open request file {}", path.string());
  return read_requests(in, path.string());
}

std::vector<RagRequest> read_requests(std::istream& in, const std::string& source_name) {
  std::vector<RagRequest> out;
  std::string line;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", source_name, line_no);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {  // parse errors and out-of-range numbers
      fail(ErrorKind::InvalidInput, "{}: invalid JSON: {}", where, json_error_message(e));
    }
    out.push_back(request_from_json(j, where));
    if (out.back().id.empty()) out.back().id = std::to_string(out.size() - 1);
  }
  if (in.bad()) fail(ErrorKind::InvalidInput, "reading {} failed", source_name);
  if (out.empty()) fail(ErrorKind::InvalidInput, "{}: no requests in the file", source_name);
  return out;
}

void write_requests(const std::filesystem::path& path, const std::vector<RagRequest>& requests) {
  std::string text;
  for (const RagRequest& r : requests) {
    text += request_to_json(r).dump(-1, ' ', false, json::error_handler_t::replace);
    text += '\n';
  }
  if (const auto failure = write_file_atomic(path, text))
    fail(failure->stage == WriteFailure::Stage::Write ? ErrorKind::LimitExceeded : ErrorKind::NotFound, "{}",
         failure->message);
}

}  // namespace depcache
