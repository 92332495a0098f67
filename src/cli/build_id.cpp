#include "cli/build_id.h"

#include "gnmr_git_commit.h"  // generated: src/cli/git_commit.cmake

namespace gnmr {

const char* gnmr_build_id() {
  return GNMR_VERSION " (git " GNMR_GIT_COMMIT ")";
}

}  // namespace gnmr
