// `depcache model quantize`: rewrite a model's weight matrices in another type.
#include <fmt/format.h>

#include "cli_common.h"
#include "commands.h"
#include "model/model_writer.h"
#include "util/error.h"

namespace depcache::cli {

void add_model_quantize_command(CLI::App& model) {
  CLI::App* cmd = model.add_subcommand("quantize", "Rewrite a GGUF model's weight matrices in another type");
  static std::string in, out, type_name;
  static int threads = 0;
  add_model_option(*cmd, in, "Input GGUF model")->required();
  add_output_option(*cmd, out, "Output GGUF path")->required();
  cmd->add_option("--type", type_name, "Type of the weight matrices: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k")
      ->required();
  add_threads_option(*cmd, threads);
  cmd->callback([] {
    const auto type = dtype_from_name(type_name);
    if (!type) fail(ErrorKind::InvalidInput, "unknown tensor type '{}'", type_name);
    if (std::filesystem::exists(out) && std::filesystem::equivalent(in, out))
      fail(ErrorKind::InvalidInput, "--output {} is the input file", out);
    const QuantizeReport r = quantize_model(in, out, *type, threads);
    if (!r.notes.empty())
      fmt::print(stderr, "note: {} matrices kept in a fallback type, e.g. {}\n", r.notes.size(),
                 r.notes.front());
    fmt::print("wrote {}: {} matrices as {}, {:.2f} MiB\n", out, r.n_converted, dtype_info(*type).name,
               r.file_bytes / 1048576.0);
  });
}

}  // namespace depcache::cli
