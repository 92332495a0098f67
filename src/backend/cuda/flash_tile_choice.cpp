// Timing the flash kernels' two query tiles (flash_tile_choice.h).
#include "backend/cuda/flash_tile_choice.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "kernels/cuda_check.cuh"

namespace gnmr::cuda {
namespace {

// The two events of the timing, released on every path.
struct TimingEvents {
  cudaEvent_t start = nullptr, stop = nullptr;
  // Release calls have nothing actionable to report from a destructor.
  ~TimingEvents() {
    if (stop) cudaEventDestroy(stop);
    if (start) cudaEventDestroy(start);
  }
};

}  // namespace

FlashTileTiming time_query_tiles(cudaStream_t stream, const std::function<void(int64_t)>& run) {
  TimingEvents e;
  GNMR_CUDA_CHECK(cudaEventCreate(&e.start));
  GNMR_CUDA_CHECK(cudaEventCreate(&e.stop));
  const int64_t tiles[2] = {64, 128};
  for (int64_t tile : tiles) run(tile);
  float best[2] = {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity()};
  for (int round = 0; round < kFlashTileTimedRuns; ++round) {
    for (int i = 0; i < 2; ++i) {
      GNMR_CUDA_CHECK(cudaEventRecord(e.start, stream));
      run(tiles[i]);
      GNMR_CUDA_CHECK(cudaEventRecord(e.stop, stream));
      GNMR_CUDA_CHECK(cudaEventSynchronize(e.stop));
      float ms = 0.0f;
      GNMR_CUDA_CHECK(cudaEventElapsedTime(&ms, e.start, e.stop));
      best[i] = std::min(best[i], ms);
    }
  }
  FlashTileTiming timing;
  timing.ms_64 = best[0];
  timing.ms_128 = best[1];
  timing.tile = best[1] < best[0] ? 128 : 64;
  return timing;
}

std::string flash_tile_timing_text(const FlashTileTiming& timing) {
  const bool wide = timing.tile == 128;
  char text[96];
  std::snprintf(text, sizeof text, "%lld rows (%.3f ms; %d: %.3f ms)",
                static_cast<long long>(timing.tile), wide ? timing.ms_128 : timing.ms_64,
                wide ? 64 : 128, wide ? timing.ms_64 : timing.ms_128);
  return text;
}

}  // namespace gnmr::cuda
