// Quantizer ops of the precision recipes (src/precision/recipe.h) over raw host arrays.
// Each calls the src/precision function of the same name, whose per-element code the CUDA
// twins share: kernels/quantize_int_groupwise.cu, kernels/dequantize_int_groupwise.cu,
// kernels/fake_quantize_fp_blockwise.cu and kernels/fake_quantize_int8_per_row.cu (to come).
// Rows are independent, so results do not depend on the thread count.
#include "backend/cpu/ops.h"
#include "precision/fake_quantize_int.h"
#include "precision/quantize_fine_grained.h"

namespace gnmr {
namespace cpu {

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
  gnmr::fake_quantize_fp_blockwise(x, rows, cols, block_rows, block_cols, format, out);
}

void fake_quantize_int8_per_row(const float* x, int64_t rows, int64_t cols, float* out) {
  fake_quantize_int_per_row(x, rows, cols, 8, out);
}

}  // namespace cpu
}  // namespace gnmr
