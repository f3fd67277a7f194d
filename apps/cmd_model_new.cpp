// `depcache model new`: write a random-weight model of a preset shape.
#include <fmt/format.h>

#include "cli_common.h"
#include "commands.h"
#include "model/model_writer.h"
#include "prompt/chat_template.h"
#include "util/error.h"

namespace depcache::cli {

void add_model_new_command(CLI::App& model) {
  CLI::App* cmd =
      model.add_subcommand("new", "Write a random-weight model (normal, std 0.02, seeded) as GGUF v3");
  static std::string out, preset = "tiny", type_name = "f32", arch, vocab_from;
  static RandomModelOptions o;
  static int layers = 0, embd = 0, heads = 0, heads_kv = 0, ff = 0, ctx = 0, vocab_size = 0;
  static bool tied = false;
  cmd->add_option("-o,--output", out, "Output GGUF path")->required();
  cmd->add_option("--preset", preset, "Shape: " + fmt::format("{}", fmt::join(model_preset_names(), ", ")))
      ->capture_default_str();
  cmd->add_option("--type", type_name, "Type of the weight matrices: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k")
      ->capture_default_str();
  cmd->add_option("--vocab-from", vocab_from, "Copy the tokenizer of this (vocab-only) GGUF file");
  cmd->add_option("--seed", o.seed, "Random seed")->capture_default_str();
  cmd->add_option("--init-std", o.stddev, "Standard deviation of the random weights")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--qk-init-std", o.qk_stddev,
                  "Standard deviation of the attention query and key weights (default: --init-std)")
      ->check(CLI::PositiveNumber);
  cmd->add_option(
      "--arch", arch,
      "Override the architecture: llama, mistral3, qwen2, qwen3, gemma2, gemma3, phi3 or smollm3");
  cmd->add_option("--layers", layers, "Override the number of layers");
  cmd->add_option("--embd", embd, "Override the embedding size");
  cmd->add_option("--heads", heads, "Override the number of attention heads");
  cmd->add_option("--heads-kv", heads_kv, "Override the number of KV heads");
  cmd->add_option("--ff", ff, "Override the feed-forward size");
  cmd->add_option("--ctx", ctx, "Override the training context length");
  static int sliding_window = -1;
  cmd->add_option("--sliding-window", sliding_window,
                  "Override the sliding-window attention span in positions (0: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--vocab-size", vocab_size, "Pad the vocabulary with unused tokens up to this size");
  cmd->add_flag("--tied", tied, "Omit output.weight (logits use the token embedding)");
  cmd->add_option("-t,--threads", o.n_threads, "Threads (default: one per core)");
  cmd->add_option("--position-scheme", o.position_scheme,
                  "Record in the metadata that the model was trained for this position scheme "
                  "(depcache.position_scheme): depth, sequential or stacked")
      ->check(CLI::IsMember({"depth", "sequential", "stacked"}));
  cmd->add_option("--tree-context", o.tree_context,
                  "Record in the metadata what context trees saw when it was trained "
                  "(depcache.tree_context): system or none")
      ->check(CLI::IsMember({"system", "none"}));
  static PromptTemplateOptions prompt;
  add_prompt_template_options(cmd, prompt);
  static std::string chat;
  cmd->add_option(
         "--chat-template", chat,
         "Write a chat template of this family as tokenizer.chat_template (default: the --vocab-from "
         "file's, else none)")
      ->check(CLI::IsMember(chat_family_names()));
  cmd->callback([] {
    if (!chat.empty()) o.chat_template = chat_template_jinja(*chat_family_from_name(chat));
    auto shape = model_preset(preset);
    if (!shape)
      fail(ErrorKind::InvalidInput, "unknown preset '{}' (known: {})", preset,
           fmt::join(model_preset_names(), ", "));
    auto type = dtype_from_name(type_name);
    if (!type) fail(ErrorKind::InvalidInput, "unknown tensor type '{}'", type_name);
    o.type = *type;
    if (!arch.empty()) {
      const std::optional<Arch> a = parse_arch(arch);
      if (!a)
        fail(ErrorKind::InvalidInput,
             "unknown architecture '{}' (llama, mistral3, qwen2, qwen3, gemma2, gemma3, phi3, smollm3)",
             arch);
      shape->arch = *a;
    }
    if (layers) shape->n_layer = layers;
    if (embd) shape->n_embd = embd;
    if (heads) shape->n_head = heads;
    if (heads_kv) shape->n_head_kv = heads_kv;
    if (ff) shape->n_ff = ff;
    if (ctx) shape->n_ctx = ctx;
    if (sliding_window >= 0) shape->sliding_window = sliding_window;
    if (vocab_size) shape->n_vocab = vocab_size;
    if (!vocab_from.empty()) {
      o.vocab_from = vocab_from;
      if (!vocab_size) shape->n_vocab = 0;  // the preset's padding applies to the built-in vocabulary only
    }
    if (tied) shape->tied_embeddings = true;
    o.shape = *shape;
    // Given parts go over the --vocab-from file's template (or the defaults).
    if (prompt.any()) o.prompt = prompt.apply(prompt_template_from(vocab_from));
    const RandomModelReport r = write_random_model(out, o);
    for (const std::string& n : r.notes) fmt::print(stderr, "note: {}\n", n);
    fmt::print("wrote {}: {} layers, {} embd, vocab {}, {:.2f} M params, {:.2f} MiB\n", out, o.shape.n_layer,
               o.shape.n_embd, r.n_vocab, r.n_params / 1e6, r.file_bytes / 1048576.0);
  });
}

}  // namespace depcache::cli
