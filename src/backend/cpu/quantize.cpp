// Quantizer ops of the precision recipes (src/precision/recipe.h) over raw host arrays.
// Each calls the src/precision function of the same name, whose per-element code the CUDA
// kernels in kernels/ share (quantize.cuh lists them and their twins; the fp quantizers there
// write real codes and scales where this file fake-quantizes).
// Rows are independent, so results do not depend on the thread count.
#include <omp.h>

#include <vector>

#include "backend/cpu/isa_clones.h"
#include "backend/cpu/ops.h"
#include "precision/fake_quantize_int.h"
#include "precision/quantize_fine_grained.h"

namespace gnmr {
namespace cpu {

namespace {

// The fp fake quantizer is most of an fp8mix step outside the GEMMs: it runs ~1.9x faster with
// AVX-512 than with the baseline's SSE2 (README "Build").
GNMR_ISA_CLONES void fake_quantize_fp_band_range(const float* x, int64_t rows, int64_t cols,
                                                 int64_t block_rows, int64_t block_cols,
                                                 FpFormat format, int64_t band_begin,
                                                 int64_t band_end, float* block_scales,
                                                 float* out) {
  gnmr::fake_quantize_fp_bands(x, rows, cols, block_rows, block_cols, format, band_begin, band_end,
                               block_scales, out);
}

}  // namespace

void quantize_int_groupwise(const float* x, int64_t rows, int64_t cols, const GroupwiseSpec& spec,
                            uint8_t* packed, float* scales, const RngKey& key) {
  gnmr::quantize_int_groupwise(x, rows, cols, spec, packed, scales, key);
}

void dequantize_int_groupwise(const uint8_t* packed, const float* scales, int64_t rows,
                              int64_t cols, const GroupwiseSpec& spec, float* out) {
  gnmr::dequantize_int_groupwise(packed, scales, rows, cols, spec, out);
}

void fake_quantize_fp_blockwise(const float* x, int64_t rows, int64_t cols, FpFormat format,
                                int64_t block_rows, int64_t block_cols, float* out) {
  std::vector<float> block_scales(fp_blockwise_scale_count(rows, cols, block_rows, block_cols));
  const int64_t bands = (rows + block_rows - 1) / block_rows;
  for_each_thread_range(bands, omp_get_max_threads(), [&](int64_t begin, int64_t end) {
    fake_quantize_fp_band_range(x, rows, cols, block_rows, block_cols, format, begin, end,
                                block_scales.data(), out);
  });
}

void fake_quantize_int8_per_row(const float* x, int64_t rows, int64_t cols, float* out) {
  fake_quantize_int_per_row(x, rows, cols, 8, out);
}

}  // namespace cpu
}  // namespace gnmr
