// `depcache model new`: write a random-weight model of a preset shape.
#include <fmt/format.h>

#include "cli_common.h"
#include "commands.h"
#include "model/model_writer.h"
#include "prompt/chat_template.h"
#include "util/error.h"

namespace depcache::cli {

namespace {

struct ModelNewOptions {
  std::string out, preset = "tiny", type_name = "f32", arch, vocab_from, chat;
  RandomModelOptions model;
  // Shape overrides (0, or -1 for the sliding window: the preset's).
  int layers = 0, embd = 0, heads = 0, heads_kv = 0, ff = 0, ctx = 0, vocab_size = 0, sliding_window = -1;
  bool tied = false;
  RagWrapperOptions prompt;
};

// The preset and what overrides its shape.
void add_shape_options(CLI::App* cmd, ModelNewOptions& o) {
  cmd->add_option("--preset", o.preset, "Shape: " + fmt::format("{}", fmt::join(model_preset_names(), ", ")))
      ->capture_default_str();
  cmd->add_option("--type", o.type_name,
                  "Type of the weight matrices: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k")
      ->capture_default_str();
  cmd->add_option("--vocab-from", o.vocab_from, "Copy the tokenizer of this (vocab-only) GGUF file");
  cmd->add_option("--seed", o.model.seed, "Random seed")->capture_default_str();
  cmd->add_option("--init-std", o.model.stddev, "Standard deviation of the random weights")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--qk-init-std", o.model.qk_stddev,
                  "Standard deviation of the attention query and key weights (default: --init-std)")
      ->check(CLI::PositiveNumber);
  cmd->add_option(
      "--arch", o.arch,
      "Override the architecture: llama, mistral3, qwen2, qwen3, gemma2, gemma3, phi3 or smollm3");
  cmd->add_option("--layers", o.layers, "Override the number of layers");
  cmd->add_option("--embd", o.embd, "Override the embedding size");
  cmd->add_option("--heads", o.heads, "Override the number of attention heads");
  cmd->add_option("--heads-kv", o.heads_kv, "Override the number of KV heads");
  cmd->add_option("--ff", o.ff, "Override the feed-forward size");
  cmd->add_option("--ctx", o.ctx, "Override the training context length");
  cmd->add_option("--sliding-window", o.sliding_window,
                  "Override the sliding-window attention span in positions (0: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--vocab-size", o.vocab_size, "Pad the vocabulary with unused tokens up to this size");
  cmd->add_flag("--tied", o.tied, "Omit output.weight (logits use the token embedding)");
}

// What the file records besides its weights: positions and tree context it
// was trained for, prompt and chat templates.
void add_metadata_options(CLI::App* cmd, ModelNewOptions& o) {
  cmd->add_option("--position-scheme", o.model.position_scheme,
                  "Record in the metadata that the model was trained for this position scheme "
                  "(depcache.position_scheme): depth, sequential or stacked")
      ->check(CLI::IsMember({"depth", "sequential", "stacked"}));
  cmd->add_option("--tree-context", o.model.tree_context,
                  "Record in the metadata what context trees saw when it was trained "
                  "(depcache.tree_context): system or none")
      ->check(CLI::IsMember({"system", "none"}));
  add_rag_wrapper_options(cmd, o.prompt);
  cmd->add_option(
         "--chat-template", o.chat,
         "Write a chat template of this family as tokenizer.chat_template (default: the --vocab-from "
         "file's, else none)")
      ->check(CLI::IsMember(chat_family_names()));
}

// The preset's shape; fails on an unknown preset.
ModelShape preset_shape(const std::string& preset) {
  auto shape = model_preset(preset);
  if (!shape)
    fail(ErrorKind::InvalidInput, "unknown preset '{}' (known: {})", preset,
         fmt::join(model_preset_names(), ", "));
  return *shape;
}

// The overrides given, over the preset's shape.
void apply_shape_overrides(const ModelNewOptions& o, ModelShape& shape) {
  if (!o.arch.empty()) {
    const std::optional<Arch> a = parse_arch(o.arch);
    if (!a)
      fail(ErrorKind::InvalidInput,
           "unknown architecture '{}' (llama, mistral3, qwen2, qwen3, gemma2, gemma3, phi3, smollm3)",
           o.arch);
    shape.arch = *a;
  }
  if (o.layers) shape.n_layer = o.layers;
  if (o.embd) shape.n_embd = o.embd;
  if (o.heads) shape.n_head = o.heads;
  if (o.heads_kv) shape.n_head_kv = o.heads_kv;
  if (o.ff) shape.n_ff = o.ff;
  if (o.ctx) shape.n_ctx = o.ctx;
  if (o.sliding_window >= 0) shape.sliding_window = o.sliding_window;
  if (o.vocab_size) shape.n_vocab = o.vocab_size;
  // The preset's padding applies to the built-in vocabulary only.
  if (!o.vocab_from.empty() && !o.vocab_size) shape.n_vocab = 0;
  if (o.tied) shape.tied_embeddings = true;
}

void write_new_model(const ModelNewOptions& o) {
  RandomModelOptions m = o.model;
  if (!o.chat.empty()) m.chat_template = chat_template_jinja(*chat_family_from_name(o.chat));
  // Checked in this order: the preset's name, the type's, the architecture's.
  m.shape = preset_shape(o.preset);
  auto type = dtype_from_name(o.type_name);
  if (!type) fail(ErrorKind::InvalidInput, "unknown tensor type '{}'", o.type_name);
  m.type = *type;
  apply_shape_overrides(o, m.shape);
  if (!o.vocab_from.empty()) m.vocab_from = o.vocab_from;
  // Given parts go over the --vocab-from file's template (or the defaults).
  if (o.prompt.any()) m.prompt = o.prompt.apply(rag_wrapper_from(o.vocab_from));
  const RandomModelReport r = write_random_model(o.out, m);
  for (const std::string& n : r.notes) fmt::print(stderr, "note: {}\n", n);
  fmt::print("wrote {}: {} layers, {} embd, vocab {}, {:.2f} M params, {:.2f} MiB\n", o.out, m.shape.n_layer,
             m.shape.n_embd, r.n_vocab, r.n_params / 1e6, r.file_bytes / 1048576.0);
}

}  // namespace

void add_model_new_command(CLI::App& model) {
  CLI::App* cmd =
      model.add_subcommand("new", "Write a random-weight model (normal, std 0.02, seeded) as GGUF v3");
  static ModelNewOptions o;
  add_output_option(*cmd, o.out, "Output GGUF path")->required();
  add_shape_options(cmd, o);
  add_threads_option(*cmd, o.model.n_threads);
  add_metadata_options(cmd, o);
  cmd->callback([] { write_new_model(o); });
}

}  // namespace depcache::cli
