// The tensor-core flash kernels a pass runs, chosen by their bits and their time (docs/DESIGN.md
// §6). Each pass (the forward; the backward's dQ and dK/dV passes, chosen together) runs on
// mma.sync or, on sm_90a, wgmma, and the forward (and the dQ pass at head dim 64) at query tiles
// of 64 or 128 rows. An instruction's two tiles give the same bits (tested), so which runs is a
// matter of speed alone, and that depends on the GPU and the shape. Whether wgmma's products sum
// as mma.sync's do is the hardware's to say: under model.attention=auto the backend runs both on
// the shape's first call and offers wgmma to the timing only where it left mma.sync's bits (the
// bits digest, src/backend/bits_digest.h). So a start that picks another variant trains to the
// same bits, and a wgmma kernel that reads its operands otherwise than the code intends is never
// run for training.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/attention_ops.cuh"

namespace gnmr::cuda {

// One way to run a tensor-core flash pass.
struct FlashVariant {
  FlashMmaInstruction instruction = FlashMmaInstruction::MmaSync;
  int64_t tile = 64;  // query rows a block (the dK/dV pass ignores it)
};

// "wgmma, 128-row query tiles".
std::string flash_variant_text(const FlashVariant& variant);

// The two query tiles, `default_tile` (64 or 128) first.
std::vector<int64_t> flash_query_tiles(int64_t default_tile);

// Every instruction at every tile, in order of preference (ties in time go to the earlier): the
// first instruction's tiles in the order given, then the next instruction's. Empty lists are a
// programming error (GNMR_CHECK).
std::vector<FlashVariant> flash_variants(const std::vector<FlashMmaInstruction>& instructions,
                                         const std::vector<int64_t>& tiles);

// What timing the variants found: the index of the variant to run and each one's best time.
struct FlashVariantTiming {
  size_t chosen = 0;
  std::vector<float> best_ms;  // the least of kFlashVariantTimedRuns runs each; empty: untimed
};

constexpr int kFlashVariantTimedRuns = 3;

// Runs run(0) ... run(count - 1) once each unmeasured (module loading, caches), then
// kFlashVariantTimedRuns rounds of all, each run between two CUDA events on `stream`; the index
// of the least time (the lower index on a tie). A single variant is run once and not timed.
// Waits for the stream. `run` launches on `stream` and must leave the same results at every
// index (each run overwrites what the last wrote), so the last run leaves them.
FlashVariantTiming time_flash_variants(cudaStream_t stream, size_t count,
                                       const std::function<void(size_t)>& run);

// "wgmma, 128-row query tiles (0.412 ms; mma.sync, 128 rows: 0.455 ms; ...)": the choice for a
// log line, the other variants' times after it.
std::string flash_variant_timing_text(const std::vector<FlashVariant>& variants,
                                      const FlashVariantTiming& timing);

}  // namespace gnmr::cuda
