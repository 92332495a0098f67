// The check behind kernels/fp_storage_conversion.cuh: 32-bit patterns taken as quotients, each
// coded by fp_storage_codes_by_instruction and by the codec (encode_fp_storage_fast of the
// canonical quotient: quantize_fp_element's code, src/precision/quantize_fine_grained.h, itself
// checked against the codecs for every float by tests/precision). A GPU takes all 2^32 in
// milliseconds, so the instructions are held to the codec on the hardware itself; the emulation
// runs the conversions' host versions (cuda_fp8.h) on a stride of them.
// One thread per run of consecutive patterns, writing its count and its first difference:
// no atomics, the host sums.
#include <vector>

#include "kernels/cuda_check.cuh"
#include "kernels/fp_storage_conversion.cuh"
#include "kernels/quantize.cuh"
#include "precision/fp_format_dispatch.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocks = 1024;
constexpr uint64_t kNone = ~uint64_t{0};

template <FpFormat kFormat>
__device__ uint8_t codec_code_of_quotient(float q) {
  return encode_fp_storage_fast<kFormat>(canonical_nan(q));
}

// Patterns first + stride * i for i < count (mod 2^32), taken in pairs (i, i + 1).
template <FpFormat kFormat>
__global__ void __launch_bounds__(kThreads)
    fp_storage_conversion_check_kernel(uint64_t first, uint64_t stride, uint64_t count,
                                       uint64_t* differences, uint64_t* first_difference) {
  const uint64_t threads = uint64_t{gridDim.x} * kThreads;
  const uint64_t thread = blockIdx.x * uint64_t{kThreads} + threadIdx.x;
  const uint64_t pairs = (count + 1) / 2;
  const uint64_t begin = pairs * thread / threads, end = pairs * (thread + 1) / threads;
  uint64_t found = 0, earliest = kNone;
  for (uint64_t p = begin; p < end; ++p) {
    const uint64_t i = 2 * p, j = i + 1 < count ? i + 1 : i;
    const float q0 = float_from_bits(static_cast<uint32_t>(first + stride * i));
    const float q1 = float_from_bits(static_cast<uint32_t>(first + stride * j));
    const uint16_t pair = fp_storage_codes_by_instruction<kFormat>(q0, q1);
    const bool differ0 = (pair & 0xFFu) != codec_code_of_quotient<kFormat>(q0);
    const bool differ1 = (pair >> 8) != codec_code_of_quotient<kFormat>(q1);
    if (differ0 || (differ1 && j != i)) {
      found += uint64_t{differ0} + uint64_t{differ1 && j != i};
      if (earliest == kNone) earliest = differ0 ? i : j;
    }
  }
  differences[thread] = found;
  first_difference[thread] = earliest;
}

}  // namespace

FpConversionCheck check_fp_storage_conversion(FpFormat format, uint64_t first, uint64_t stride,
                                              uint64_t count) {
  FpConversionCheck result;
  bool converts = false;
  dispatch_fp_format(format,
                     [&](auto f) { converts = kFpConvertsByInstruction<decltype(f)::value>; });
  GNMR_CHECK(converts, "check_fp_storage_conversion: the format has no conversion instruction");
  const size_t threads = size_t{kBlocks} * kThreads;
  uint64_t* device = nullptr;
  GNMR_CUDA_CHECK(cudaMalloc(&device, 2 * threads * sizeof(uint64_t)));
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    if constexpr (kFpConvertsByInstruction<kFormat>) {
      fp_storage_conversion_check_kernel<kFormat>
          <<<kBlocks, kThreads>>>(first, stride, count, device, device + threads);
    }
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
  std::vector<uint64_t> host(2 * threads);
  GNMR_CUDA_CHECK(
      cudaMemcpy(host.data(), device, host.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  GNMR_CUDA_CHECK(cudaFree(device));
  bool have_first = false;  // threads hold consecutive runs: the first with one has the lowest i
  for (size_t t = 0; t < threads; ++t) {
    result.differences += host[t];
    if (host[threads + t] != kNone && !have_first) {
      result.first_difference_bits = static_cast<uint32_t>(first + stride * host[threads + t]);
      have_first = true;
    }
  }
  return result;
}

}  // namespace gnmr::cuda
