#include "data/prepare_progress.h"

#include <cstdio>
#include <string>

#include "util/log.h"

namespace gnmr {

namespace {

std::string format_duration(double seconds) {
  if (seconds < 0 || seconds > 1e7) return "--:--";
  const auto total = static_cast<int64_t>(seconds + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof(text), "%ld:%02ld:%02ld", static_cast<long>(total / 3600),
                  static_cast<long>(total / 60 % 60), static_cast<long>(total % 60));
  } else {
    std::snprintf(text, sizeof(text), "%ld:%02ld", static_cast<long>(total / 60),
                  static_cast<long>(total % 60));
  }
  return text;
}

// 1234567 -> "1.23M": progress lines stay short and readable.
std::string human_count(double value) {
  const char* suffixes[] = {"", "k", "M", "G", "T"};
  int unit = 0;
  while (value >= 1000 && unit < 4) {
    value /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f%s" : "%.3g%s", value, suffixes[unit]);
  return text;
}

}  // namespace

PrepareProgress::PrepareProgress(int64_t total_input_bytes, bool enabled)
    : total_input_bytes_(total_input_bytes),
      enabled_(enabled),
      terminal_(stderr_is_terminal()),
      start_(Clock::now()),
      last_draw_(start_) {}

void PrepareProgress::update(int64_t input_bytes_done, int64_t documents, int64_t tokens) {
  if (!enabled_) return;
  const auto now = Clock::now();
  // A terminal line refreshes 5 times a second; a log file gets a line every 10 seconds.
  const auto interval = terminal_ ? std::chrono::milliseconds(200) : std::chrono::seconds(10);
  if (now - last_draw_ < interval) return;
  last_draw_ = now;
  draw(input_bytes_done, documents, tokens, std::chrono::duration<double>(now - start_).count());
}

void PrepareProgress::draw(int64_t input_bytes_done, int64_t documents, int64_t tokens,
                           double seconds) {
  const double mb_done = input_bytes_done / 1e6;
  const double mb_total = total_input_bytes_ / 1e6;
  const double mb_per_s = seconds > 0 ? mb_done / seconds : 0;
  const double tokens_per_s = seconds > 0 ? tokens / seconds : 0;
  const double fraction =
      total_input_bytes_ > 0 ? double(input_bytes_done) / total_input_bytes_ : 0;
  const double eta = mb_per_s > 0 ? (mb_total - mb_done) / mb_per_s : -1;
  char line[256];
  std::snprintf(
      line, sizeof(line),
      "prepare: %5.1f%%  %.1f/%.1f MB  %.2f MB/s  %s tokens/s  %s docs  %s tokens  ETA %s",
      100.0 * fraction, mb_done, mb_total, mb_per_s, human_count(tokens_per_s).c_str(),
      human_count(static_cast<double>(documents)).c_str(),
      human_count(static_cast<double>(tokens)).c_str(), format_duration(eta).c_str());
  if (terminal_) {
    std::fprintf(stderr, "\r%s\033[K", line);
    std::fflush(stderr);
    drawn_ = true;
  } else {
    spdlog::info("{}", line);
  }
}

void PrepareProgress::finish(int64_t input_bytes_done, int64_t documents, int64_t tokens) {
  if (drawn_) {
    draw(input_bytes_done, documents, tokens,
         std::chrono::duration<double>(Clock::now() - start_).count());
    std::fprintf(stderr, "\n");
    std::fflush(stderr);
    drawn_ = false;
  }
}

}  // namespace gnmr
