#include "eval/plot.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>

#include "util/error.h"

namespace depcache {
namespace {

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) fail(ErrorKind::InvalidInput, "cannot write {}", path.string());
}

}  // namespace

bool gnuplot_available() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

bool plot_png(const std::filesystem::path& png, const std::string& data, const std::string& commands) {
  if (!gnuplot_available()) {
    fmt::print(stderr, "note: gnuplot not found; no plot written\n");
    return false;
  }
  const std::filesystem::path dat = std::filesystem::path(png).replace_extension(".dat");
  const std::filesystem::path gp = std::filesystem::path(png).replace_extension(".gp");
  write_file(dat, data);
  std::string script = commands;
  const std::string quoted = fmt::format("'{}'", dat.string());
  for (size_t at = script.find("$DATA"); at != std::string::npos;
       at = script.find("$DATA", at + quoted.size()))
    script.replace(at, 5, quoted);
  write_file(gp,
             fmt::format("set terminal pngcairo size 1400,600; set output '{}'; {}\n", png.string(), script));
  std::filesystem::remove(png);
  if (std::system(fmt::format("gnuplot '{}' 2>/dev/null", gp.string()).c_str()) != 0 ||
      !std::filesystem::exists(png))
    return false;
  fmt::print("wrote {}\n", png.string());
  return true;
}

}  // namespace depcache
