// Timing the tensor-core flash kernels' variants (flash_kernel_choice.h).
#include "backend/cuda/flash_kernel_choice.h"

#include <cstdio>
#include <limits>

#include "kernels/cuda_check.cuh"
#include "util/error.h"

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

const char* instruction_name(FlashMmaInstruction instruction) {
  return instruction == FlashMmaInstruction::Wgmma ? "wgmma" : "mma.sync";
}

}  // namespace

std::string flash_variant_text(const FlashVariant& variant) {
  return std::string(instruction_name(variant.instruction)) + ", " + std::to_string(variant.tile) +
         "-row query tiles";
}

std::vector<int64_t> flash_query_tiles(int64_t default_tile) {
  GNMR_CHECK(default_tile == 64 || default_tile == 128, "flash_query_tiles: 64 or 128 rows");
  return {default_tile, default_tile == 64 ? int64_t{128} : int64_t{64}};
}

std::vector<FlashVariant> flash_variants(const std::vector<FlashMmaInstruction>& instructions,
                                         const std::vector<int64_t>& tiles) {
  GNMR_CHECK(!instructions.empty() && !tiles.empty(), "flash_variants: nothing to choose from");
  std::vector<FlashVariant> variants;
  for (FlashMmaInstruction instruction : instructions) {
    for (int64_t tile : tiles) variants.push_back(FlashVariant{instruction, tile});
  }
  return variants;
}

FlashVariantTiming time_flash_variants(cudaStream_t stream, size_t count,
                                       const std::function<void(size_t)>& run) {
  GNMR_CHECK(count > 0, "time_flash_variants: nothing to time");
  FlashVariantTiming timing;
  if (count == 1) {
    run(0);
    GNMR_CUDA_CHECK(cudaStreamSynchronize(stream));
    return timing;
  }
  TimingEvents e;
  GNMR_CUDA_CHECK(cudaEventCreate(&e.start));
  GNMR_CUDA_CHECK(cudaEventCreate(&e.stop));
  for (size_t i = 0; i < count; ++i) run(i);
  timing.best_ms.assign(count, std::numeric_limits<float>::infinity());
  for (int round = 0; round < kFlashVariantTimedRuns; ++round) {
    for (size_t i = 0; i < count; ++i) {
      GNMR_CUDA_CHECK(cudaEventRecord(e.start, stream));
      run(i);
      GNMR_CUDA_CHECK(cudaEventRecord(e.stop, stream));
      GNMR_CUDA_CHECK(cudaEventSynchronize(e.stop));
      float ms = 0.0f;
      GNMR_CUDA_CHECK(cudaEventElapsedTime(&ms, e.start, e.stop));
      if (ms < timing.best_ms[i]) timing.best_ms[i] = ms;
    }
  }
  for (size_t i = 1; i < count; ++i) {
    if (timing.best_ms[i] < timing.best_ms[timing.chosen]) timing.chosen = i;
  }
  return timing;
}

std::string flash_variant_timing_text(const std::vector<FlashVariant>& variants,
                                      const FlashVariantTiming& timing) {
  std::string text = flash_variant_text(variants.at(timing.chosen));
  if (timing.best_ms.empty()) return text + " (the only one offered)";
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.3f ms", double(timing.best_ms.at(timing.chosen)));
  text += std::string(" (") + ms;
  for (size_t i = 0; i < variants.size(); ++i) {
    if (i == timing.chosen) continue;
    std::snprintf(ms, sizeof ms, "%.3f ms", double(timing.best_ms.at(i)));
    text += std::string("; ") + instruction_name(variants[i].instruction) + ", " +
            std::to_string(variants[i].tile) + " rows: " + ms;
  }
  return text + ")";
}

}  // namespace gnmr::cuda
