// The tensor-core flash kernels' query tiles, chosen by timing (docs/DESIGN.md §6). The forward
// runs 64- or 128-row query tiles (and the dQ pass, at head dim 64, either too); both give the
// same bits, so which runs is a matter of speed alone, and that depends on the GPU (registers
// against occupancy, L2 traffic per mma) and the shape. The cuda backend times both on each
// attention shape's first forward (and backward) and runs the faster from then on; a start
// that picks the other tile trains to the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>

namespace gnmr::cuda {

// What timing two query tiles found: the tile to run and each tile's best time.
struct FlashTileTiming {
  int64_t tile = 0;             // 64 or 128
  float ms_64 = 0, ms_128 = 0;  // the least of kFlashTileTimedRuns runs each
};

constexpr int kFlashTileTimedRuns = 3;

// Runs run(64) and run(128) once each unmeasured (module loading, caches), then
// kFlashTileTimedRuns rounds of both, each run between two CUDA events on `stream`; the tile
// whose least time is lower (64 on a tie). Waits for the stream. `run` launches on `stream`
// and must leave the same results at either tile (each run overwrites what the last wrote).
FlashTileTiming time_query_tiles(cudaStream_t stream, const std::function<void(int64_t)>& run);

// "128 rows (0.412 ms; 64: 0.455 ms)": the choice for a log line.
std::string flash_tile_timing_text(const FlashTileTiming& timing);

}  // namespace gnmr::cuda
