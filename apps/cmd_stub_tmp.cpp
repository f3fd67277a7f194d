#include "commands.h"
namespace depcache::cli {}
