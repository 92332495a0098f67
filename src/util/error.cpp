#include "util/error.h"

namespace gnmr {

void fail_check(const char* expr, const char* file, int line, const std::string& hint) {
  throw Error(ErrorKind::Runtime, std::string("internal check failed: ") + expr + " at " + file +
                                      ":" + std::to_string(line) +
                                      (hint.empty() ? "" : " — " + hint));
}

}  // namespace gnmr
