#pragma once
// The index's lower tiers (engine/engine_tiers.h) as command-line options,
// shared by run, serve and chunks fuse.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "engine/engine_tiers.h"

namespace depcache::cli {

// Declares the tier options on `cmd`.
void add_tier_options(CLI::App& cmd, TierOptions& o);

}  // namespace depcache::cli
