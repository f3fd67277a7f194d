#pragma once
// Documents the chunk-strategy tests build requests from: short animal facts
// (for random-weight models) and five one-line stories in the register the
// trained stories260K model knows.
#include <string>
#include <vector>

#include "retrieval/rag_request.h"

namespace depcache::test {

inline const RequestDocument kBark{"d1", "Dogs", "Dogs bark at night and chase cats through the garden."};
inline const RequestDocument kPurr{"d2", "Cats", "Cats purr when they are content and sleep in the sun."};
inline const RequestDocument kHoot{"d3", "Owls", "Owls hunt mice at night and sleep through the day."};
inline const RequestDocument kSwim{"d4", "Fish", "Fish swim in schools and sleep with their eyes open."};

inline const std::vector<RequestDocument> kStories = {
    {"a", "", "Lily had a red ball. She liked to throw it to her dog Max in the park."},
    {"b", "", "Tom was sad because it rained all day. His mom made him a warm cup of milk."},
    {"c", "", "The little bird could not fly. A kind girl found it and gave it some water."},
    {"d", "", "Ben and Sue built a big castle of sand. Then a wave came and took it away."},
    {"e", "", "One day a cat saw a fish in the pond. The cat wanted the fish very much."}};

inline RagRequest doc_request(std::vector<RequestDocument> docs, const std::string& question) {
  RagRequest r;
  r.documents = std::move(docs);
  r.question = question;
  return r;
}

}  // namespace depcache::test
