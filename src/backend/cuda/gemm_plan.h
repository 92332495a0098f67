// GemmPlan: how one projection GEMM maps onto a cuBLASLt matmul, as plain data from a pure
// host function, so that every layout rule is tested on a machine without a GPU (the CUDA
// backend only turns a plan into descriptors). docs/DESIGN.md §6.
//
// cuBLASLt is column-major: D (m x n) = op(A) op(B) (+ beta C). A row-major tensor X[r, c] is a
// column-major c x r matrix with leading dimension c. With N tokens, x [N, in], W [out, in],
// dy [N, out], our three GEMMs are (D column-major m x n = the row-major result):
//
//   role             result           m    n    k    FP8 (TN)  A stored      B stored
//   forward          y  [N, out]      out  N    in   T N       W   [out,in]  x    [N,in]
//   input gradient   dx [N, in]       in   N    out  T N       W^T [in,out]  dy   [N,out]
//   weight gradient  dW [out, in] +=  in   out  N    T N       x^T [in,N]    dy^T [out,N]
//
// FP8 block-scaled GEMMs must be TN (cuBLAS docs §3.4.17), so the input and weight gradients
// need transposed copies (made by the quantize kernels); BF16 and FP32 take the tensors as
// stored and put the transposes in the descriptor (forward TN, input gradient NN, weight
// gradient NT). Scale modes, per operand: weights BLK128x128, activations and output gradients
// VEC128 (precision/scale_layout.h); the scales are dequantization multipliers, passed as is.
// The int8 recipe's forward is an exact int8 x int8 -> int32 GEMM (TN, as cuBLASLt's IMMA
// kernels require), W's codes with one scale per output channel and x's with one per token;
// cuBLASLt writes the int32 sums into the fp32 output's memory and a kernel scales them in
// place (int8_gemm_output.h). What cuBLASLt cannot take runs emulated (fake-quantize into
// fp32, then an fp32 GEMM, as the CPU does), and the plan says why.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "precision/recipe.h"

namespace gnmr {

enum class GemmRole { kForward, kInputGradient, kWeightGradient };
// How the GEMM runs: fp32 inputs (no TF32), bf16 inputs, FP8 codes with block scales, int8
// codes with int32 sums scaled per row and column after the GEMM, or emulated (inputs
// fake-quantized into fp32, then an fp32 GEMM).
enum class GemmImpl { kFp32, kBf16, kFp8Block, kInt8, kEmulated };
enum class GemmOperandType { kF32, kBF16, kE4M3, kE5M2, kS8, kS32 };
// kRowAfterGemm: one fp32 scale per stored row, applied to the int32 sums by our kernel, not
// by cuBLASLt.
enum class ScaleMode { kNone, kVec128, kBlk128x128, kRowAfterGemm };

const char* gemm_role_name(GemmRole role);  // "forward", "input_gradient", "weight_gradient"
// "fp32", "bf16", "fp8_block", "int8", "emulated"
const char* gemm_impl_name(GemmImpl impl);
int64_t gemm_operand_bytes(GemmOperandType type);  // bytes an element: 4, 2 or 1

struct GemmOperand {
  std::string tensor;  // what is stored: "W", "W^T", "x", "x^T", "dy", "dy^T"
  GemmOperandType type = GemmOperandType::kF32;
  int64_t rows = 0, cols = 0;    // row-major storage [rows, cols]; leading dimension = cols
  bool transposed_copy = false;  // not the tensor as the model holds it: a kernel makes it
  ScaleMode scale_mode = ScaleMode::kNone;
  int64_t scale_count = 0;  // fp32 scales, padding included
};

struct GemmPlan {
  GemmRole role = GemmRole::kForward;
  GemmImpl impl = GemmImpl::kFp32;
  std::string emulated_because;  // empty unless impl == kEmulated
  int64_t m = 0, n = 0, k = 0;
  bool transa = false, transb = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  float beta = 0.0f;  // 1 when D accumulates (the weight gradient, dx +=)
  GemmOperand a, b;
  // D, column-major m x n, ldc = m: fp32, or kS32 (kInt8) in the fp32 output's own memory.
  GemmOperandType d_type = GemmOperandType::kF32;
};

// The most k an int8 GEMM takes: every |code| <= 127, so |sum| <= 127^2 k fits an int32.
constexpr int64_t kInt8GemmMaxK = (int64_t{1} << 31) / (127 * 127);

// What the device can do: compute capability as 10 * major + minor (80 = A100, 90 = H100/H200).
struct GpuTarget {
  int compute_capability = 90;
};

// The plan of one GEMM of a projection [tokens, in] -> [tokens, out] on `path` (backend-precision
// paths use `backend_precision`). accumulate: D += (the weight gradient always accumulates).
GemmPlan plan_gemm(GemmRole role, int64_t tokens, int64_t in, int64_t out, const PathSpec& path,
                   GemmPrecision backend_precision, const GpuTarget& target, bool accumulate);

}  // namespace gnmr
