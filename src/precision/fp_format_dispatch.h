// The FP quantizers' format as a template argument: one instance per format (a GPU kernel, a
// CPU band loop, a test), so each element's code is its own format's encoder alone. With the format
// a runtime argument, every inlined quantize_fp_element held all five formats' encoders: in the
// unrolled dy quantizer (quantize_fp_tile_1x128_and_transposed.cu) that came to ~39,000 SASS
// instructions, far past the instruction cache, and the kernel ran ~20x slower than its bytes on an
// H200 (docs/GPU-PERFORMANCE.md, run 2).
//   dispatch_fp_format(format, [&](auto f) {
//     constexpr FpFormat kFormat = decltype(f)::value;
//     kernel<kFormat><<<grid, threads, 0, stream>>>(...);   // or any use of kFormat
//   });
#pragma once

#include "precision/fp_format.h"

namespace gnmr {

template <FpFormat kFormat>
struct FpFormatConstant {
  static constexpr FpFormat value = kFormat;
};

template <typename Launch>
void dispatch_fp_format(FpFormat format, Launch&& launch) {
  switch (format) {
    case FpFormat::kE4M3:
      return launch(FpFormatConstant<FpFormat::kE4M3>{});
    case FpFormat::kE5M2:
      return launch(FpFormatConstant<FpFormat::kE5M2>{});
    case FpFormat::kE3M2:
      return launch(FpFormatConstant<FpFormat::kE3M2>{});
    case FpFormat::kE2M3:
      return launch(FpFormatConstant<FpFormat::kE2M3>{});
    case FpFormat::kE2M1:
      return launch(FpFormatConstant<FpFormat::kE2M1>{});
  }
}

}  // namespace gnmr
