// The FP quantizer kernels' storage codes on the conversion instructions of sm_89 and later
// (cvt.rn.satfinite.{e4m3x2,e5m2x2}, through cuda_fp8.h, whose host versions the CUDA emulation
// runs): two codes an instruction, where the integer encoder (encode_fp_storage_non_nan,
// src/precision/quantize_fine_grained.h) takes some fifteen instructions an element. The
// quantizers were issue-bound on it: on an H200 they issued in 61-71% of their cycles and moved
// 31-38% of the memory bandwidth (ncu, docs/GPU-PERFORMANCE.md).
// - e4m3: the quotient's own conversion (RN, saturating at 448), a NaN first made the
//   canonical NaN, whose code is 0x7F.
// - e3m2 (fp6): its values are e5m2's times 2^12 over the whole e3m2 range (e5m2's smallest
//   normal 2^-14 and subnormal step 2^-16 are e3m2's 2^-2 and 2^-4 at that scale, both with two
//   mantissa bits), so the quotient times 2^-12 (exact, or under e3m2's half step) rounds
//   through the e5m2 conversion as e3m2 rounds it; the e5m2 codes widen exactly to f16, times
//   2^12 back (exact), are clamped to +-28 (a NaN made +28, e3m2's code for NaN: the fp6 and fp4
//   formats saturate it) and narrow exactly to e4m3 codes, the storage.
// - e2m3 (fp6): the same with e4m3 and 2^6 (e4m3's 2^-6 and 2^-9 are e2m3's 1 and 2^-3), clamp
//   7.5.
// - e5m2, e2m1: no instruction fits (e5m2 is a GEMM-less low format, e2m1 has one mantissa bit
//   before sm_100): the integer encoder.
// The same code as quantize_fp_element for every float quotient (tests/gpu: every 32-bit
// pattern on a GPU, a stride of them on the emulation).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "precision/fp_format.h"
#include "precision/quantize_fine_grained.h"

namespace gnmr::cuda {

template <FpFormat kFormat>
constexpr bool kFpConvertsByInstruction =
    kFormat == FpFormat::kE4M3 || kFormat == FpFormat::kE3M2 || kFormat == FpFormat::kE2M3;

// The storage codes of two quotients of a tile (what quantize_fp_element gives for x / scale
// = q0, q1), q0's in the low byte. Only for kFpConvertsByInstruction formats.
template <FpFormat kFormat>
__host__ __device__ inline uint16_t fp_storage_codes_by_instruction(float q0, float q1) {
  static_assert(kFpConvertsByInstruction<kFormat>, "no conversion instruction for this format");
  if constexpr (kFormat == FpFormat::kE4M3) {
    const float nan = float_from_bits(0x7FC00000u);
    const float2 q = make_float2(q0 == q0 ? q0 : nan, q1 == q1 ? q1 : nan);
    return __nv_cvt_float2_to_fp8x2(q, __NV_SATFINITE, __NV_E4M3);
  } else {
    // The format as a hardware fp8 kind, its values times 2^12 or 2^6 (the top of the file).
    constexpr bool e3m2 = kFormat == FpFormat::kE3M2;
    constexpr __nv_fp8_interpretation_t kind = e3m2 ? __NV_E5M2 : __NV_E4M3;
    constexpr float max = e3m2 ? 28.0f : 7.5f;
    constexpr float down = e3m2 ? 0x1p-12f : 0x1p-6f;
    constexpr float up = e3m2 ? 4096.0f : 64.0f;
    const __half2_raw widened = __nv_cvt_fp8x2_to_halfraw2(
        __nv_cvt_float2_to_fp8x2(make_float2(q0 * down, q1 * down), __NV_SATFINITE, kind), kind);
    // Saturated after the rounding, as the codec does (a value rounds within the kind's binades,
    // which are the format's, then anything past max is max), on pairs of halves: the products
    // past f16's range are infinities, which saturate too, and a NaN is +max (min(NaN, max) is
    // max on the GPU and in cuda_fp16.h's host version), the NaN code of a saturating format.
    const __half2 limit = __float2half2_rn(max);
    const __half2 value =
        __hmax2(__hmin2(__hmul2(__half2(widened), __float2half2_rn(up)), limit), __hneg2(limit));
    return __nv_cvt_halfraw2_to_fp8x2(__half2_raw(value), __NV_SATFINITE, __NV_E4M3);
  }
}

// Four codes as one word, the first in the low byte (little-endian: as they lie in memory).
__host__ __device__ inline uint32_t code_word(const uint8_t* codes) {
  return uint32_t{codes[0]} | uint32_t{codes[1]} << 8 | uint32_t{codes[2]} << 16 |
         uint32_t{codes[3]} << 24;
}

// quantize_fp_tile_elements (src/precision/quantize_fine_grained.h), the same codes, four to a
// word (code_word's order): by the conversion instructions where the format has them and the
// tile a reciprocal, else as there. Words, not bytes: two instructions' pairs make a word in
// one more, where bytes split from them and packed again took ten.
template <FpFormat kFormat, int kCount>
__host__ __device__ inline void quantize_fp_tile_code_words(const float (&x)[kCount], TileDivisor d,
                                                            uint32_t (&words)[kCount / 4]) {
  static_assert(kCount % 4 == 0, "whole quads");
  if constexpr (kFpConvertsByInstruction<kFormat>) {
    if (d.reciprocal != 0.0f) {
      for (int w = 0; w < kCount / 4; ++w) {
        const uint32_t low = fp_storage_codes_by_instruction<kFormat>(
            quotient_by_reciprocal(x[4 * w], d), quotient_by_reciprocal(x[4 * w + 1], d));
        const uint32_t high = fp_storage_codes_by_instruction<kFormat>(
            quotient_by_reciprocal(x[4 * w + 2], d), quotient_by_reciprocal(x[4 * w + 3], d));
        words[w] = low | high << 16;
      }
      return;
    }
  }
  uint8_t codes[kCount];
  quantize_fp_tile_elements<kFormat>(x, d, codes);
  for (int w = 0; w < kCount / 4; ++w) words[w] = code_word(codes + 4 * w);
}

}  // namespace gnmr::cuda
