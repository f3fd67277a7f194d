// `depcache model info|new|quantize|probe`: inspect a GGUF file; write a random-weight
// model; requantize a model.
#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "commands.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "prompt/chat_template.h"
#include "util/error.h"

namespace depcache::cli {
namespace {

std::string value_summary(const GgufValue& v) {
  switch (v.type) {
    case GgufType::String: {
      const std::string& s = std::get<std::string>(v.data);
      return s.size() > 80 ? fmt::format("\"{}...\" ({} bytes)", s.substr(0, 77), s.size())
                           : fmt::format("\"{}\"", s);
    }
    case GgufType::Array:
      return fmt::format("[{} x {}]", std::get<std::vector<GgufValue>>(v.data).size(),
                         gguf_type_name(v.elem_type));
    case GgufType::Bool:
      return std::get<bool>(v.data) ? "true" : "false";
    case GgufType::F32:
    case GgufType::F64:
      return fmt::format("{}", std::get<double>(v.data));
    default:
      return fmt::format("{}", v.as_int("value"));
  }
}

// What the file needs, part by part, and whether this engine runs it: the
// same checks as loading (strict: an unknown key or tensor is named).
void print_support(const std::string& path) {
  fmt::print("support:\n");
  auto part = [](std::string_view what, const std::function<std::string()>& check) {
    try {
      fmt::print("  {:<14} {}\n", what, check());
      return true;
    } catch (const Error& e) {
      fmt::print("  {:<14} NOT SUPPORTED: {}\n", what, e.what());
      return false;
    }
  };
  const GgufFile f = GgufFile::open(path);
  bool ok = part("tokenizer", [&] {
    const Tokenizer tok(Vocab::from_gguf(f));
    const Vocab& v = tok.vocab();
    const char* kind = v.kind == VocabKind::Spm   ? "SentencePiece"
                       : v.kind == VocabKind::Bpe ? "byte-level BPE"
                                                  : "SentencePiece-style BPE";
    return fmt::format("{}{}, {} tokens", kind,
                       v.kind == VocabKind::Spm ? "" : " (pre-tokenizer " + v.pre + ")", v.n_tokens());
  });
  // The server runs the template as it is; one it cannot read needs --chat-template
  // for chats, but the model still runs.
  part("chat template", [&] {
    const std::string jinja = f.get_string_or("tokenizer.chat_template").value_or("");
    if (jinja.empty()) return std::string("none (serve --chat-template NAME formats chats)");
    try {
      ChatFormat::from_jinja(jinja);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("{}; serve needs --chat-template NAME for chats", e.what()));
    }
    return fmt::format("Jinja2, {} bytes, run as it is", jinja.size());
  });
  if (!f.find("general.architecture")) {
    fmt::print("  {:<14} none (a vocabulary-only file)\n", "model");
    return;
  }
  ok &= part("model", [&] {
    const auto m = Model::from_file(GgufFile::open(path));
    const ModelConfig& c = m->config();
    std::vector<std::string> needs;
    needs.push_back(fmt::format("{} {}L {}d, {} heads ({} KV) of {}", c.arch_name, c.n_layer, c.n_embd,
                                c.n_head, c.n_head_kv, c.head_dim));
    needs.push_back(fmt::format("RoPE {} base {}{}", c.rope_style == RopeStyle::Neox ? "neox" : "normal",
                                c.rope_base, c.rope_divisors.empty() ? "" : ", frequency scaling"));
    if (c.qkv_bias) needs.push_back("Q/K/V biases");
    if (c.qk_norm) needs.push_back("per-head Q/K norms");
    if (c.post_norms) needs.push_back("post-attention and post-FFN norms");
    if (c.ffn_act == Activation::GeluTanh) needs.push_back("GeGLU");
    if (c.embd_scale != 1) needs.push_back(fmt::format("embeddings x {:.4g}", c.embd_scale));
    if (c.final_softcap > 0) needs.push_back(fmt::format("logit soft-cap {}", c.final_softcap));
    if (c.attn_softcap > 0) needs.push_back(fmt::format("attention soft-cap {}", c.attn_softcap));
    if (c.rope_scaling != "none") needs.push_back(fmt::format("{} RoPE scaling", c.rope_scaling));
    if (c.attn_temp_scale != 0)
      needs.push_back(
          fmt::format("attention temperature {} per {} positions", c.attn_temp_scale, c.attn_temp_length));
    if (c.fused_qkv) needs.push_back("fused QKV and gate-up");
    if (c.sliding_window > 0) {
      const auto n = std::count(c.layer_windowed.begin(), c.layer_windowed.end(), 1);
      needs.push_back(
          fmt::format("sliding window {} on {} of {} layers{}", c.sliding_window, n, c.n_layer,
                      c.rope_base_local > 0 ? fmt::format(" (RoPE base {})", c.rope_base_local) : ""));
    }
    if (!c.layer_no_rope.empty())
      needs.push_back(fmt::format("{} layers without RoPE",
                                  std::count(c.layer_no_rope.begin(), c.layer_no_rope.end(), 1)));
    needs.push_back(fmt::format("context {}", c.n_ctx_train));
    return fmt::format("{}", fmt::join(needs, "; "));
  });
  fmt::print("  {:<14} {}\n", "verdict", ok ? "runs" : "refused (see above)");
  if (!ok) throw Error(ErrorKind::InvalidInput, fmt::format("{}: not supported by this engine", path));
}

}  // namespace

void add_model_new_command(CLI::App& model);
void add_model_quantize_command(CLI::App& model);
void add_model_probe_command(CLI::App& model);

void add_model_commands(CLI::App& app) {
  CLI::App* model = app.add_subcommand("model", "Inspect or create GGUF model files");
  model->require_subcommand(1);

  CLI::App* info = model->add_subcommand(
      "info", "Print a GGUF file's metadata, tensor table and what of it this engine supports");
  static std::string info_path;
  static bool show_tensors = false;
  info->add_option("file", info_path, "GGUF file")->required();
  info->add_flag("--tensors", show_tensors, "List every tensor");
  add_model_new_command(*model);
  add_model_quantize_command(*model);
  add_model_probe_command(*model);
  info->callback([] {
    const GgufFile f = GgufFile::open(info_path);
    fmt::print("file: {}\nGGUF version: {}\nalignment: {}\ntensors: {}\n", info_path, f.version(),
               f.alignment(), f.tensors().size());
    for (const auto& [k, v] : f.metadata())
      fmt::print("  {:<40} {:<7} {}\n", k, gguf_type_name(v.type), value_summary(v));
    if (show_tensors)
      for (const GgufTensor& t : f.tensors())
        fmt::print("  {:<32} {:<5} [{}] {} bytes\n", t.name, dtype_info(t.type).name, fmt::join(t.dims, ", "),
                   t.n_bytes);
    print_support(info_path);
  });
}

}  // namespace depcache::cli
