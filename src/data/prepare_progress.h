// Progress of `gnmr prepare`: a live line (rate, ETA) when stderr is a terminal, periodic
// spdlog info lines otherwise, nothing when disabled.
#pragma once

#include <chrono>
#include <cstdint>

namespace gnmr {

class PrepareProgress {
 public:
  // total_input_bytes: the size on disk of all inputs (compressed for .gz), for the ETA.
  PrepareProgress(int64_t total_input_bytes, bool enabled);

  // Cheap to call often; draws at most a few times a second.
  void update(int64_t input_bytes_done, int64_t documents, int64_t tokens);
  // Draws the final state on the live line (if any) and ends it.
  void finish(int64_t input_bytes_done, int64_t documents, int64_t tokens);

 private:
  void draw(int64_t input_bytes_done, int64_t documents, int64_t tokens, double seconds);

  using Clock = std::chrono::steady_clock;
  int64_t total_input_bytes_;
  bool enabled_;
  bool terminal_;
  bool drawn_ = false;
  Clock::time_point start_;
  Clock::time_point last_draw_;
};

}  // namespace gnmr
