// `depcache vocab learn`: a BPE vocabulary learned from the text a model will
// be trained on, written as a vocab-only GGUF for `model new --vocab-from`.
#include <fmt/format.h>

#include <fstream>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "model/gguf.h"
#include "model/vocab_learner.h"
#include "prompt/prompt_parts.h"
#include "retrieval/rag_request.h"
#include "train/qa_sequences.h"
#include "util/error.h"

namespace depcache::cli {
namespace {

// Every string the trainer encodes for a request, each on its own.
void append_request_texts(const RagRequest& r, const RagWrapper& tmpl, std::vector<std::string>& out) {
  const PromptTexts t = prompt_texts(r, tmpl);
  out.push_back(t.system);
  for (const PromptTexts::Item& item : t.items) out.insert(out.end(), item.pieces.begin(), item.pieces.end());
  if (!t.text.empty()) out.push_back(t.text);
  out.push_back(t.task);
  // The learned vocabulary prefixes a space, as SentencePiece does.
  for (const std::string& a : r.answers) out.push_back(answer_text(a, true));
}

}  // namespace

void add_vocab_commands(CLI::App& app) {
  CLI::App* vocab = app.add_subcommand("vocab", "Tokenizer vocabularies");
  vocab->require_subcommand(1);
  static std::vector<std::string> requests, texts;
  static std::string out;
  static VocabLearnOptions o;
  CLI::App* learn = vocab->add_subcommand(
      "learn",
      "Learn a SentencePiece-style BPE vocabulary from requests or text; write it as a vocab-only GGUF");
  learn->add_option("--requests", requests,
                    "Request files (JSONL): their prompts as the engine builds them, and their answers");
  learn->add_option("--text", texts, "Plain text files, each line a fragment");
  learn->add_option("--size", o.size, "Tokens in all (3 special + 256 bytes + characters + merges)")
      ->capture_default_str()
      ->check(CLI::Range(260, 1 << 20));
  learn->add_option("--min-count", o.min_pair_count, "Merge no pair seen fewer times")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  learn->add_option("--max-piece-chars", o.max_piece_chars, "No token longer than this many characters")
      ->capture_default_str()
      ->check(CLI::Range(2, 256));
  learn->add_flag("--split-scripts", o.split_scripts,
                  "No token joins letters to digits or to punctuation (each punctuation mark alone), as "
                  "SentencePiece splits by script and number: for text such as CSV rows");
  learn->add_flag("--split-spaces", o.split_spaces,
                  "The space mark is a token of its own: a word is one token whether a space, a comma or a "
                  "line's start comes before it (a name in a CSV row and in a question alike)");
  static RagWrapperOptions prompt;
  add_rag_wrapper_options(learn, prompt);
  add_output_option(*learn, out, "The vocabulary (GGUF with tokenizer.* keys only)")->required();
  learn->callback([] {
    if (requests.empty() && texts.empty())
      fail(ErrorKind::InvalidInput, "nothing to learn from: give --requests or --text");
    // The prompts as a model made from this vocabulary will build them: it
    // inherits the template (model new --vocab-from).
    const RagWrapper tmpl = prompt.apply({});
    std::vector<std::string> fragments;
    for (const std::string& path : requests)
      for (const RagRequest& r : read_requests(path)) append_request_texts(r, tmpl, fragments);
    for (const std::string& path : texts) {
      std::ifstream in(path);
      if (!in) fail(ErrorKind::NotFound, "cannot open {}", path);
      for (std::string line; std::getline(in, line);) fragments.push_back(line + "\n");
    }
    VocabLearnReport rep;
    const Vocab v = learn_bpe_vocab(fragments, o, &rep);
    std::vector<std::pair<std::string, GgufValue>> md;
    v.append_gguf_metadata(md);
    for (auto& kv : tmpl.metadata()) md.push_back(std::move(kv));
    GgufWriter w;
    w.set("general.name", GgufValue::string("depcache-bpe"));
    for (auto& [k, value] : md) w.set(k, std::move(value));
    w.write(out);
    fmt::print("wrote {}: {} tokens ({} characters, {} merges) from {} fragments ({} characters)\n", out,
               v.n_tokens(), rep.n_chars, rep.n_merges, rep.n_fragments, rep.n_chars_seen);
    if (v.n_tokens() < o.size)
      fmt::print(stderr, "note: the text ran out of pairs seen {} times or more before {} tokens\n",
                 o.min_pair_count, o.size);
  });
}

}  // namespace depcache::cli
