// gnmr::Error — the one exception type for user-facing failures.
// Each error carries a kind that maps to the process exit code (README "Exit codes"),
// and a message that names the thing that is wrong and, where possible, the fix.
#pragma once

#include <stdexcept>
#include <string>

namespace gnmr {

enum class ErrorKind : int {
  Runtime = 1,     // anything else (I/O failure, internal invariant)
  Usage = 2,       // bad command line
  Config = 3,      // config file or --set override invalid
  Data = 4,        // tokenizer, corpus or token shard missing/corrupt/mismatched
  Checkpoint = 5,  // checkpoint missing/corrupt/mismatched, run dir already holds a run
  Diverged = 6,    // training stopped after repeated non-finite steps
  NotBuilt = 7,    // subcommand or backend not available in this build
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return static_cast<int>(kind_); }

 private:
  ErrorKind kind_;
};

// Internal invariant check: throws a Runtime error carrying file and line.
[[noreturn]] void fail_check(const char* expr, const char* file, int line, const std::string& hint);

}  // namespace gnmr

#define GNMR_CHECK(cond, hint)                                          \
  do {                                                                  \
    if (!(cond)) ::gnmr::fail_check(#cond, __FILE__, __LINE__, (hint)); \
  } while (0)
