#pragma once
// PNG plots of report data, drawn by gnuplot (Debian's gnuplot-nox).
#include <filesystem>
#include <string>

namespace depcache {

// Whether gnuplot can be run.
bool gnuplot_available();

// Writes the plot's data (.dat) and gnuplot script (.gp) beside `png` (same
// stem) and runs gnuplot to draw it. `commands` are gnuplot commands after
// the output settings; '$DATA' in them stands for the data file. False when
// gnuplot is missing or drew nothing; InvalidInput when a file cannot be
// written.
bool plot_png(const std::filesystem::path& png, const std::string& data, const std::string& commands);

}  // namespace depcache
