// `depcache model info|new|quantize`: inspect a GGUF file; write a random-weight
// model; requantize a model.
#include <fmt/format.h>

#include "commands.h"
#include "model/gguf.h"

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

}  // namespace

void add_model_new_command(CLI::App& model);
void add_model_quantize_command(CLI::App& model);

void add_model_commands(CLI::App& app) {
  CLI::App* model = app.add_subcommand("model", "Inspect or create GGUF model files");
  model->require_subcommand(1);

  CLI::App* info = model->add_subcommand("info", "Print a GGUF file's metadata and tensor table");
  static std::string info_path;
  static bool show_tensors = false;
  info->add_option("file", info_path, "GGUF file")->required();
  info->add_flag("--tensors", show_tensors, "List every tensor");
  add_model_new_command(*model);
  add_model_quantize_command(*model);
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
  });
}

}  // namespace depcache::cli
