// `depcache tokenize -m FILE`: the token ids of stdin, as a GGUF file's tokenizer sees them.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "util/error.h"

namespace depcache::cli {
namespace {

// All of stdin, byte for byte: a trailing newline is part of the text.
std::string read_stdin() {
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) data.append(buf, n);
  if (std::ferror(stdin)) fail(ErrorKind::InvalidInput, "reading standard input failed");
  return data;
}

// Pieces may hold spaces, newlines or parts of a character: escape them so
// each pair stays on one readable line.
std::string escape(const std::string& s) {
  std::string valid, rest = s;
  drain_utf8(rest, valid, true);
  const bool escape_high = valid != s;  // a byte-fallback piece: show its bytes
  std::string out;
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c < 0x20 || c == 0x7F || (c >= 0x80 && escape_high))
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of standard input");
  static std::string model_path;
  static bool bos = false;
  static bool no_parse_special = false;
  static bool pieces = false;
  add_model_option(*cmd, model_path, "GGUF file with tokenizer metadata")->required();
  cmd->add_flag("--bos", bos, "Prepend BOS (and append EOS if the vocab asks for it)");
  cmd->add_flag("--no-parse-special", no_parse_special,
                "Treat special token strings such as <s> as plain text");
  cmd->add_flag("--pieces", pieces, "Print one id:piece pair per line (pieces escaped) instead of ids");
  cmd->callback([] {
    const Tokenizer tok(Vocab::from_gguf(GgufFile::open(model_path)));
    const std::vector<int32_t> ids = tok.encode(read_stdin(), bos, !no_parse_special);
    if (pieces) {
      for (int32_t id : ids)
        fmt::print("{}:{}\n", id, escape(tok.token_to_piece(id, /*render_special=*/true)));
    } else {
      fmt::print("{}\n", fmt::join(ids, " "));
    }
  });
}

}  // namespace depcache::cli
