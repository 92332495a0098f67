// The cuBLASLt calls the CUDA backend makes, answered on the host for the emulation
// (emulated_cuda.h), from the cuBLAS documentation's definitions rather than from our GEMM plans
// (so a plan that misreads cuBLASLt disagrees with it):
// - column-major matrices; op(A) is m x k (A stored k x m when TRANSA = T), op(B) k x n;
//   D = alpha op(A) op(B) + beta C, batched with strided offsets;
// - types: fp32 or bf16 operands with fp32 accumulation (D fp32 or bf16); fp32 operands under
//   CUBLAS_COMPUTE_32F_FAST_16BF ("allows down-converting inputs to bfloat16 or TF32": here
//   rounded to bf16, the coarsest it allows, so a tolerance is tried at its worst); FP8 (E4M3,
//   E5M2, never both E5M2) only as "TN", with the scale modes of §3.1.4: a scalar, 128-element 1D
//   blocks
//   ("M-major for A with shape M x L", "N-major for B") or 128 x 128 2D blocks ("K-major", the
//   stride between block columns L rounded up to 4), not 2D on both operands, 16-byte aligned
//   operands and scales, M and N multiples of 4 for the block modes; int8 x int8 -> int32
//   (compute and scale type 32I, TN) summed exactly;
// - every operand, scale and the workspace must lie inside one emulated cudaMalloc allocation;
// - a combination outside these is CUBLAS_STATUS_NOT_SUPPORTED from the heuristic and the
//   matmul, a shape that does not fit CUBLAS_STATUS_INVALID_VALUE.
// The products run as OpenBLAS GEMMs on operands decoded and scaled to fp32, accumulating in
// fp32 as the GPU does (int8 in double: exact, as cuBLASLt's int32 sums): values as cuBLASLt
// defines them, not its summation order. (Summing in double instead moved the GPU training
// comparison's bf16 gradient norms 3-7 times further from the CPU's than two CPU runs with
// different thread counts are from each other: every bf16 rounding of a gradient amplifies
// where the fp32 sums differ.)
#include <cblas.h>
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "emulated_cuda/emulated_cuda.h"

namespace {

// An opaque cuBLASLt object: its attributes as bytes, each of a fixed size.
struct Attributes {
  std::map<int, std::vector<uint8_t>> values;

  template <typename T>
  void define(int attr, T value) {
    std::vector<uint8_t>& bytes = values[attr];
    bytes.resize(sizeof(T));
    std::memcpy(bytes.data(), &value, sizeof(T));
  }
  cublasStatus_t set(int attr, const void* buf, size_t size) {
    const auto it = values.find(attr);
    if (it == values.end() || it->second.size() != size || buf == nullptr) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    std::memcpy(it->second.data(), buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  cublasStatus_t get(int attr, void* buf, size_t size, size_t* written) const {
    const auto it = values.find(attr);
    if (it == values.end() || written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *written = it->second.size();
    if (buf == nullptr && size == 0) return CUBLAS_STATUS_SUCCESS;  // a size query
    if (buf == nullptr || size < it->second.size()) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(buf, it->second.data(), it->second.size());
    return CUBLAS_STATUS_SUCCESS;
  }
  template <typename T>
  T read(int attr) const {
    T value{};
    std::memcpy(&value, values.at(attr).data(), sizeof(T));
    return value;
  }
};

struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch;
  int64_t batch_stride;
};

Layout layout_of(cublasLtMatrixLayout_t l) {
  const Attributes& a = *reinterpret_cast<const Attributes*>(l);
  return {cudaDataType(a.read<uint32_t>(CUBLASLT_MATRIX_LAYOUT_TYPE)),
          a.read<uint64_t>(CUBLASLT_MATRIX_LAYOUT_ROWS),
          a.read<uint64_t>(CUBLASLT_MATRIX_LAYOUT_COLS),
          a.read<int64_t>(CUBLASLT_MATRIX_LAYOUT_LD),
          a.read<int32_t>(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT),
          a.read<int64_t>(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET)};
}

size_t type_bytes(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F:
    case CUDA_R_32I:
      return 4;
    case CUDA_R_16BF:
      return 2;
    default:
      return 1;
  }
}

bool is_fp8(cudaDataType t) {
  return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2;
}

// The formats' definitions (OCP FP8: E4M3 bias 7, no infinities, S.1111.111 NaN; E5M2 bias
// 15, IEEE-style), decoded independently of src/precision.
float decode_fp8(uint8_t code, cudaDataType t) {
  const int mantissa_bits = t == CUDA_R_8F_E4M3 ? 3 : 2, exponent_bits = 7 - mantissa_bits;
  const int bias = t == CUDA_R_8F_E4M3 ? 7 : 15;
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int exponent = (code >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = code & ((1 << mantissa_bits) - 1);
  if (t == CUDA_R_8F_E4M3 && exponent == 15 && mantissa == 7) return std::nanf("");
  if (t == CUDA_R_8F_E5M2 && exponent == 31) {
    return mantissa == 0 ? sign * INFINITY : std::nanf("");
  }
  if (exponent == 0) return sign * std::ldexp(float(mantissa), 1 - bias - mantissa_bits);
  return sign * std::ldexp(float((1 << mantissa_bits) | mantissa), exponent - bias - mantissa_bits);
}

float element(const void* base, int64_t index, cudaDataType t) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(base)[index];
    case CUDA_R_16BF: {
      const uint32_t bits = uint32_t{static_cast<const uint16_t*>(base)[index]} << 16;
      float x;
      std::memcpy(&x, &bits, sizeof x);
      return x;
    }
    case CUDA_R_8I:
      return float(static_cast<const int8_t*>(base)[index]);
    default:
      return decode_fp8(static_cast<const uint8_t*>(base)[index], t);
  }
}

uint16_t round_to_bf16_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if (std::isnan(x)) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest, ties to even
  return uint16_t(bits >> 16);
}

struct Problem {
  int32_t compute, scale_type, transa, transb, a_mode, b_mode;
  const float *a_scales, *b_scales;
  Layout a, b, c, d;
  int64_t m, n, k;
};

Problem problem_of(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                   cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D) {
  const Attributes& o = *reinterpret_cast<const Attributes*>(desc);
  Problem p{};
  p.compute = o.read<int32_t>(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE);
  p.scale_type = o.read<int32_t>(CUBLASLT_MATMUL_DESC_SCALE_TYPE);
  p.transa = o.read<int32_t>(CUBLASLT_MATMUL_DESC_TRANSA);
  p.transb = o.read<int32_t>(CUBLASLT_MATMUL_DESC_TRANSB);
  p.a_mode = o.read<int32_t>(CUBLASLT_MATMUL_DESC_A_SCALE_MODE);
  p.b_mode = o.read<int32_t>(CUBLASLT_MATMUL_DESC_B_SCALE_MODE);
  p.a_scales = o.read<const float*>(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER);
  p.b_scales = o.read<const float*>(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER);
  p.a = layout_of(A);
  p.b = layout_of(B);
  p.c = layout_of(C);
  p.d = layout_of(D);
  p.m = int64_t(p.d.rows);
  p.n = int64_t(p.d.cols);
  p.k = int64_t(p.transa == CUBLAS_OP_T ? p.a.rows : p.a.cols);
  return p;
}

bool block_mode(int32_t mode) {
  return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ||
         mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

int64_t block_count(int64_t extent) {
  return (extent + 127) / 128;
}

// How many scales an operand of `outer` rows (m or n) under `mode` reads.
int64_t scale_count(int32_t mode, int64_t outer, int64_t k) {
  if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) return outer * block_count(k);
  if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) {
    return (block_count(k) + 3) / 4 * 4 * block_count(outer);
  }
  return 1;
}

// The dequantization multiplier of op(X)[outer, kk] (X = A with outer = i, or B with outer = j).
float scale_of(int32_t mode, const float* scales, int64_t outer, int64_t outer_count, int64_t kk,
               int64_t k) {
  if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) {
    return scales[outer + kk / 128 * outer_count];
  }
  if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) {
    return scales[kk / 128 + outer / 128 * ((block_count(k) + 3) / 4 * 4)];
  }
  return scales ? scales[0] : 1.0f;
}

bool shapes_fit(const Problem& p) {
  const bool ta = p.transa == CUBLAS_OP_T, tb = p.transb == CUBLAS_OP_T;
  const uint64_t m = uint64_t(p.m), n = uint64_t(p.n), k = uint64_t(p.k);
  const bool a_ok = ta ? (p.a.rows == k && p.a.cols == m) : (p.a.rows == m && p.a.cols == k);
  const bool b_ok = tb ? (p.b.rows == n && p.b.cols == k) : (p.b.rows == k && p.b.cols == n);
  const bool c_ok = p.c.rows == m && p.c.cols == n;
  bool ld_ok = true;
  for (const Layout* l : {&p.a, &p.b, &p.c, &p.d}) {
    ld_ok = ld_ok && l->ld >= int64_t(l->rows) && l->ld > 0 && l->batch >= 1;
  }
  const bool batch_ok = p.a.batch == p.d.batch && p.b.batch == p.d.batch && p.c.batch == p.d.batch;
  return a_ok && b_ok && c_ok && ld_ok && batch_ok && p.m > 0 && p.n > 0 && p.k > 0;
}

bool supported(const Problem& p) {
  const bool ta = p.transa == CUBLAS_OP_T, tb = p.transb == CUBLAS_OP_T;
  if (p.c.type != p.d.type) return false;
  if (p.compute == CUBLAS_COMPUTE_32I) {
    return p.scale_type == CUDA_R_32I && p.a.type == CUDA_R_8I && p.b.type == CUDA_R_8I &&
           p.d.type == CUDA_R_32I && ta && !tb && p.a_mode == 0 && p.b_mode == 0;
  }
  if (p.compute == CUBLAS_COMPUTE_32F_FAST_16BF) {
    return p.scale_type == CUDA_R_32F && p.a.type == CUDA_R_32F && p.b.type == CUDA_R_32F &&
           p.d.type == CUDA_R_32F && p.a_mode == 0 && p.b_mode == 0;
  }
  if (p.compute != CUBLAS_COMPUTE_32F || p.scale_type != CUDA_R_32F) return false;
  if (p.d.type != CUDA_R_32F && p.d.type != CUDA_R_16BF) return false;
  if (is_fp8(p.a.type) || is_fp8(p.b.type)) {
    if (!is_fp8(p.a.type) || !is_fp8(p.b.type) || !ta || tb) return false;
    if (p.a.type == CUDA_R_8F_E5M2 && p.b.type == CUDA_R_8F_E5M2) return false;
    const bool blocks = block_mode(p.a_mode) || block_mode(p.b_mode);
    if (blocks) {
      if (!block_mode(p.a_mode) || !block_mode(p.b_mode)) return false;
      if (p.a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F &&
          p.b_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) {
        return false;
      }
      if (p.m % 4 != 0 || p.n % 4 != 0) return false;
    }
    for (const Layout* l : {&p.a, &p.b, &p.c, &p.d}) {
      if ((l->ld * int64_t(type_bytes(l->type))) % 16 != 0) return false;
    }
    return true;
  }
  if (p.a_mode != 0 || p.b_mode != 0) return false;
  if (p.a.type != p.b.type) return false;
  if (p.a.type == CUDA_R_32F) return p.d.type == CUDA_R_32F;
  return p.a.type == CUDA_R_16BF;
}

// Bytes from a matrix's first element to one past its last, over all batches.
size_t extent_bytes(const Layout& l) {
  const int64_t elements =
      (int64_t(l.cols) - 1) * l.ld + int64_t(l.rows) + int64_t(l.batch - 1) * l.batch_stride;
  return size_t(elements) * type_bytes(l.type);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

cublasLtMatrixLayout_t new_layout(cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
  Attributes* a = new Attributes;
  a->define<uint32_t>(CUBLASLT_MATRIX_LAYOUT_TYPE, uint32_t(type));
  a->define<int32_t>(CUBLASLT_MATRIX_LAYOUT_ORDER, CUBLASLT_ORDER_COL);
  a->define<uint64_t>(CUBLASLT_MATRIX_LAYOUT_ROWS, rows);
  a->define<uint64_t>(CUBLASLT_MATRIX_LAYOUT_COLS, cols);
  a->define<int64_t>(CUBLASLT_MATRIX_LAYOUT_LD, ld);
  a->define<int32_t>(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 1);
  a->define<int64_t>(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, 0);
  return reinterpret_cast<cublasLtMatrixLayout_t>(a);
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  // One BLAS thread, as the CPU backend sets (cpu_backend.cpp): the emulation runs everything
  // else on one thread, its GEMMs are small, and between them OpenBLAS's idle threads spin on
  // sched_yield (455,000 calls in one emulated training step of the tiny GPU model, half its
  // time in the kernel), taking the cores from the tests ctest runs beside it.
  openblas_set_num_threads(1);
  *lightHandle = reinterpret_cast<cublasLtHandle_t>(new int(0));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  delete reinterpret_cast<int*>(lightHandle);
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "CUBLAS_STATUS (emulated: unnamed)";
  }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType) {
  Attributes* a = new Attributes;
  a->define<int32_t>(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, computeType);
  a->define<int32_t>(CUBLASLT_MATMUL_DESC_SCALE_TYPE, scaleType);
  a->define<int32_t>(CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_HOST);
  a->define<int32_t>(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_N);
  a->define<int32_t>(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  a->define<uint32_t>(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
  a->define<int8_t>(CUBLASLT_MATMUL_DESC_FAST_ACCUM, 0);
  for (const int attr :
       {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
        CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER}) {
    a->define<const void*>(attr, nullptr);
  }
  for (const int attr : {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                         CUBLASLT_MATMUL_DESC_C_SCALE_MODE, CUBLASLT_MATMUL_DESC_D_SCALE_MODE}) {
    a->define<int32_t>(attr, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
  }
  *matmulDesc = reinterpret_cast<cublasLtMatmulDesc_t>(a);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  delete reinterpret_cast<Attributes*>(matmulDesc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t sizeInBytes) {
  return reinterpret_cast<Attributes*>(matmulDesc)->set(attr, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, void* buf,
                                              size_t sizeInBytes, size_t* sizeWritten) {
  return reinterpret_cast<Attributes*>(matmulDesc)->get(attr, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *matLayout = new_layout(type, rows, cols, ld);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  delete reinterpret_cast<Attributes*>(matLayout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes) {
  return reinterpret_cast<Attributes*>(matLayout)->set(attr, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                size_t sizeInBytes, size_t* sizeWritten) {
  return reinterpret_cast<Attributes*>(matLayout)->get(attr, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  Attributes* a = new Attributes;
  a->define<uint32_t>(CUBLASLT_MATMUL_PREF_SEARCH_MODE, 0);
  a->define<uint64_t>(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, 0);
  for (const int attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    a->define<uint32_t>(attr, 256);
  }
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(a);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete reinterpret_cast<Attributes*>(pref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t sizeInBytes) {
  return reinterpret_cast<Attributes*>(pref)->set(attr, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  *returnAlgoCount = 0;
  if (requestedAlgoCount < 1) return CUBLAS_STATUS_INVALID_VALUE;
  const Problem p = problem_of(operationDesc, Adesc, Bdesc, Cdesc, Ddesc);
  if (!shapes_fit(p)) return CUBLAS_STATUS_INVALID_VALUE;
  if (!supported(p)) return CUBLAS_STATUS_NOT_SUPPORTED;
  // Two algorithms, as cuBLASLt ranks several: the first sums each k in one pass, the second
  // (data[0] = 1, asked for only by LtGemmRunner::ranked_algorithms) in two halves added at the
  // end, a split-K's other summation order, so that a caller comparing algorithms sees bits
  // differ as they may on a GPU. int8 sums are exact either way.
  const int count = std::min(requestedAlgoCount, p.k >= 2 ? 2 : 1);
  for (int i = 0; i < count; ++i) {
    heuristicResultsArray[i] = cublasLtMatmulHeuristicResult_t{};
    heuristicResultsArray[i].algo.data[0] = uint64_t(i);
    heuristicResultsArray[i].state = CUBLAS_STATUS_SUCCESS;
    heuristicResultsArray[i].wavesCount = 1.0f;
  }
  *returnAlgoCount = count;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                              cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t) {
  using gnmr::cuda::emulated_is_device_range;
  const Problem p = problem_of(computeDesc, Adesc, Bdesc, Cdesc, Ddesc);
  if (!shapes_fit(p)) return CUBLAS_STATUS_INVALID_VALUE;
  if (!supported(p)) return CUBLAS_STATUS_NOT_SUPPORTED;
  // Operands in device memory, whole; FP8 operands and scales 16-byte aligned.
  if (!emulated_is_device_range(A, extent_bytes(p.a)) ||
      !emulated_is_device_range(B, extent_bytes(p.b)) ||
      !emulated_is_device_range(C, extent_bytes(p.c)) ||
      !emulated_is_device_range(D, extent_bytes(p.d)) ||
      (workspaceSizeInBytes > 0 && !emulated_is_device_range(workspace, workspaceSizeInBytes))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool fp8 = is_fp8(p.a.type);
  if (fp8) {
    for (const void* ptr :
         {A, B, static_cast<const void*>(C), static_cast<const void*>(D),
          static_cast<const void*>(p.a_scales), static_cast<const void*>(p.b_scales)}) {
      if (ptr != nullptr && !aligned16(ptr)) return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (const auto& [mode, scales, outer] :
         {std::tuple{p.a_mode, p.a_scales, p.m}, std::tuple{p.b_mode, p.b_scales, p.n}}) {
      if (block_mode(mode) && scales == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
      if (scales != nullptr &&
          !emulated_is_device_range(scales, size_t(scale_count(mode, outer, p.k)) * 4)) {
        return CUBLAS_STATUS_INVALID_VALUE;
      }
    }
  }
  const bool ta = p.transa == CUBLAS_OP_T, tb = p.transb == CUBLAS_OP_T;
  const int64_t m = p.m, n = p.n, k = p.k;
  const bool int8 = p.compute == CUBLAS_COMPUTE_32I;
  const bool to_bf16 = p.compute == CUBLAS_COMPUTE_32F_FAST_16BF;
  const size_t ab = type_bytes(p.a.type), bb = type_bytes(p.b.type), db = type_bytes(p.d.type);
  std::vector<double> a_op(size_t(m * k)), b_op(size_t(k * n)), acc(size_t(m * n));
  std::vector<float> a_f32, b_f32, acc_f32;
  for (int32_t batch = 0; batch < p.d.batch; ++batch) {
    const char* a_base = static_cast<const char*>(A) + batch * p.a.batch_stride * int64_t(ab);
    const char* b_base = static_cast<const char*>(B) + batch * p.b.batch_stride * int64_t(bb);
    const char* c_base = static_cast<const char*>(C) + batch * p.c.batch_stride * int64_t(db);
    char* d_base = static_cast<char*>(D) + batch * p.d.batch_stride * int64_t(db);
    // op(A) [m, k] and op(B) [k, n] row-major, decoded and scaled (in double: every decoded
    // value and its scaled product exact until the one rounding to the GEMM's type).
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t kk = 0; kk < k; ++kk) {
        const int64_t index = ta ? kk + i * p.a.ld : i + kk * p.a.ld;
        a_op[size_t(i * k + kk)] =
            double(element(a_base, index, p.a.type)) *
            (int8 ? 1.0 : double(scale_of(p.a_mode, p.a_scales, i, m, kk, k)));
      }
    }
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t index = tb ? j + kk * p.b.ld : kk + j * p.b.ld;
        b_op[size_t(kk * n + j)] =
            double(element(b_base, index, p.b.type)) *
            (int8 ? 1.0 : double(scale_of(p.b_mode, p.b_scales, j, n, kk, k)));
      }
    }
    if (int8) {
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k), 1.0,
                  a_op.data(), int(k), b_op.data(), int(n), 0.0, acc.data(), int(n));
    } else {
      a_f32.assign(a_op.begin(), a_op.end());
      b_f32.assign(b_op.begin(), b_op.end());
      if (to_bf16) {  // each fp32 operand rounded to bf16 (RN-even), the product in fp32
        for (std::vector<float>* op : {&a_f32, &b_f32}) {
          for (float& x : *op) {
            const uint16_t bits16 = round_to_bf16_bits(x);
            const uint32_t bits = uint32_t{bits16} << 16;
            std::memcpy(&x, &bits, sizeof x);
          }
        }
      }
      acc_f32.assign(size_t(m * n), 0.0f);
      const bool split_k = algo != nullptr && algo->data[0] == 1 && k >= 2;
      const int64_t k_first = split_k ? k / 2 : k;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k_first), 1.0f,
                  a_f32.data(), int(k), b_f32.data(), int(n), 0.0f, acc_f32.data(), int(n));
      if (split_k) {  // the second half on its own, then added: the other summation order
        std::vector<float> rest(size_t(m * n), 0.0f);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k - k_first),
                    1.0f, a_f32.data() + k_first, int(k), b_f32.data() + k_first * n, int(n), 0.0f,
                    rest.data(), int(n));
        for (size_t i = 0; i < rest.size(); ++i) acc_f32[i] += rest[i];
      }
      acc.assign(acc_f32.begin(), acc_f32.end());
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        const int64_t c_index = i + j * p.c.ld, d_index = i + j * p.d.ld;
        const double sum = acc[size_t(i * n + j)];
        if (int8) {
          const int32_t a32 = *static_cast<const int32_t*>(alpha);
          const int32_t b32 = *static_cast<const int32_t*>(beta);
          const int64_t c = b32 == 0 ? 0 : reinterpret_cast<const int32_t*>(c_base)[c_index];
          reinterpret_cast<int32_t*>(d_base)[d_index] = int32_t(a32 * int64_t(sum) + b32 * c);
          continue;
        }
        const float alpha32 = *static_cast<const float*>(alpha);
        const float beta32 = *static_cast<const float*>(beta);
        // beta == 0: C is not read (it may hold NaN), as cuBLAS defines.
        const float c = beta32 == 0.0f ? 0.0f : element(c_base, c_index, p.c.type);
        const float value = alpha32 * float(sum) + (beta32 == 0.0f ? 0.0f : beta32 * c);
        if (p.d.type == CUDA_R_32F) {
          reinterpret_cast<float*>(d_base)[d_index] = value;
        } else {
          reinterpret_cast<uint16_t*>(d_base)[d_index] = round_to_bf16_bits(value);
        }
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
