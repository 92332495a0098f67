// Logging: spdlog to stderr (human, coloured on a terminal) and, once a run directory
// exists, also to RUN_DIR/log.txt. Every module logs through spdlog's default logger.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace gnmr {

// Sets up the default logger to stderr. level: "trace"…"off".
void init_logging(const std::string& level);

// Adds RUN_DIR/log.txt (appending) to the default logger, starting with the lines logged since
// init_logging (the first add_log_file of the process only).
void add_log_file(const std::string& path);

// Writes MESSAGE as an error line to the log files only (not stderr): the error that ends a
// command, which main prints to stderr itself, so that log.txt says why the run stopped.
void log_error_to_files(const std::string& message);

// True when stderr is a terminal (progress bars are drawn only then).
bool stderr_is_terminal();

}  // namespace gnmr
