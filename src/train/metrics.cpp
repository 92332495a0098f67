#include "train/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "util/atomic_file.h"
#include "util/error.h"

namespace gnmr {

void MetricsWriter::open(const std::string& path, int64_t keep_through_step) {
  if (std::filesystem::exists(path)) {
    const std::string old = read_file(path);
    std::istringstream in(old);
    std::string kept, line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;  // a torn last line from a crash
      // Compared as JSON numbers: a hand-edited "step" of another type or past int64's range
      // keeps its line instead of throwing or overflowing a conversion.
      if (j.is_object() && j["step"].is_number() && j["step"] > keep_through_step) continue;
      kept += line + "\n";
    }
    // The lines dropped are the file's last (the steps after the checkpoint, a torn line): the
    // file is cut in place, so that a reader following it (`tail -f`) sees the cut and goes
    // on. Lines kept after a dropped one (a hand-edited file) need a rewrite.
    if (old.compare(0, kept.size(), kept) == 0) {
      if (kept.size() != old.size()) std::filesystem::resize_file(path, kept.size());
    } else {
      write_file_atomic(path, kept);
    }
  }
  path_ = path;
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw Error(ErrorKind::Runtime, "cannot open " + path + " for appending");
}

void MetricsWriter::write(const nlohmann::json& line) {
  // "time": when the line was written, in seconds since the Unix epoch (UTC), to the
  // millisecond: a monitor's clock for elapsed time and stalls.
  nlohmann::json stamped = line;
  const auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
  stamped["time"] =
      double(std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count()) / 1e3;
  write_line(stamped.dump());
}

void MetricsWriter::write_line(const std::string& json_text) {
  if (!file_) return;
  std::string text = json_text + "\n";
  errno = 0;
  const bool written = std::fwrite(text.data(), 1, text.size(), file_) == text.size();
  if (std::fflush(file_) != 0 || !written) {
    const std::string why = errno != 0 ? std::strerror(errno) : "short write";
    std::clearerr(file_);
    throw Error(ErrorKind::Runtime, "write " + path_ + ": " + why +
                                        "; the run stops here (continue with --resume auto once "
                                        "the file can be written)");
  }
}

void MetricsWriter::sync() {
  if (!file_) return;
  if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0) {
    const std::string why = std::strerror(errno);
    std::clearerr(file_);
    throw Error(ErrorKind::Runtime,
                "write " + path_ + ": " + why +
                    "; the run stops here (continue with --resume auto once the file can be "
                    "written)");
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

}  // namespace gnmr
