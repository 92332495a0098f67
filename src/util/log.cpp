#include "util/log.h"

#include <spdlog/details/log_msg_buffer.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "util/error.h"

namespace gnmr {

namespace {

// The lines logged before add_log_file, for log.txt: a run's start-up lines (the data and
// controller warnings, said before the run directory may be touched) belong in its log.
// The first kMaxLines are kept; a command that opens no log file drops them at exit.
class StartupLinesSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  static constexpr size_t kMaxLines = 2000;

  // The lines kept, and how many came after them.
  std::vector<spdlog::details::log_msg_buffer> take(size_t& dropped) {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped = dropped_;
    return std::move(lines_);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (lines_.size() < kMaxLines) {
      lines_.emplace_back(msg);
    } else {
      ++dropped_;
    }
  }
  void flush_() override {}

 private:
  std::vector<spdlog::details::log_msg_buffer> lines_;
  size_t dropped_ = 0;
};

std::shared_ptr<StartupLinesSink>& startup_lines() {
  static std::shared_ptr<StartupLinesSink> sink;
  return sink;
}

// The log.txt sinks add_log_file added, for log_error_to_files.
std::vector<spdlog::sink_ptr>& file_sinks() {
  static std::vector<spdlog::sink_ptr> sinks;
  return sinks;
}

}  // namespace

void init_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("gnmr");
  startup_lines() = std::make_shared<StartupLinesSink>();
  logger->sinks().push_back(startup_lines());
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

void add_log_file(const std::string& path) {
  auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, false);
  sink->set_pattern("%Y-%m-%d %H:%M:%S %l %v");
  auto& sinks = spdlog::default_logger()->sinks();
  if (const std::shared_ptr<StartupLinesSink> startup = startup_lines()) {
    size_t dropped = 0;
    for (const auto& line : startup->take(dropped)) sink->log(line);
    if (dropped > 0) {
      spdlog::logger("gnmr-file", sink)
          .warn("{} more start-up lines were logged to stderr only", dropped);
    }
    sink->flush();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), startup), sinks.end());
    startup_lines().reset();
  }
  sinks.push_back(sink);
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
