#include "util/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <vector>

#include "util/error.h"

namespace gnmr {

void init_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("gnmr");
  logger->set_pattern("%Y-%m-%d %H:%M:%S %^%l%$ %v");
  auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    throw Error(
        ErrorKind::Usage,
        "log level \"" + level + "\" is not one of trace, debug, info, warn, error, critical, off");
  }
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
}

namespace {

// The log.txt sinks add_log_file added, for log_error_to_files.
std::vector<spdlog::sink_ptr>& file_sinks() {
  static std::vector<spdlog::sink_ptr> sinks;
  return sinks;
}

}  // namespace

void add_log_file(const std::string& path) {
  auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, false);
  sink->set_pattern("%Y-%m-%d %H:%M:%S %l %v");
  spdlog::default_logger()->sinks().push_back(sink);
  spdlog::default_logger()->flush_on(spdlog::level::info);  // a crash keeps the log
  file_sinks().push_back(sink);
}

void log_error_to_files(const std::string& message) {
  if (file_sinks().empty()) return;
  spdlog::logger files("gnmr-files", file_sinks().begin(), file_sinks().end());
  files.error("{}", message);
  files.flush();
}

bool stderr_is_terminal() {
  return isatty(STDERR_FILENO) == 1;
}

}  // namespace gnmr
