// `gnmr version`: version and the features compiled into this binary.
#include <iostream>

#include "cli/commands.h"

namespace gnmr {

CommandAction add_version_command(CLI::App&) {
  return [] {
    std::cout << "gnmr " << GNMR_VERSION << "\n";
#ifdef GNMR_WITH_CUDA
    std::cout << "backends: cpu cuda\n";
#else
    std::cout << "backends: cpu\n";
#endif
  };
}

}  // namespace gnmr
