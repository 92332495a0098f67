// metrics.jsonl: one JSON object per line, flushed per line so a crash loses at most one.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace gnmr {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Opens PATH for appending. On resume, lines of steps after `keep_through_step` (written
  // by the interrupted run after its last checkpoint) are dropped first, so the file reads
  // as if the run had never stopped: cut in place where they are its last lines.
  void open(const std::string& path, int64_t keep_through_step);
  // Writes LINE with a "time" field added (seconds since the Unix epoch).
  // A line that cannot be written whole (a full disk) is an Error(Runtime) naming the file:
  // the run stops there, so the metrics never have a silent gap (a resume cuts them back to
  // its checkpoint, torn line included, and writes them again).
  void write(const nlohmann::json& line);
  void write_line(const std::string& json_text);  // an already serialised object
  // fsync: the lines written so far survive a machine crash (before each checkpoint). An
  // Error(Runtime) naming the file when the disk reports a failed write.
  void sync();
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace gnmr
