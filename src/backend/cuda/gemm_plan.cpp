// The GEMM plan of every role and path (gemm_plan.h has the table it implements).
#include "backend/cuda/gemm_plan.h"

#include "precision/scale_layout.h"

namespace gnmr {

namespace {

GemmOperand operand(const char* tensor, GemmOperandType type, int64_t rows, int64_t cols,
                    bool transposed_copy) {
  GemmOperand o;
  o.tensor = tensor;
  o.type = type;
  o.rows = rows;
  o.cols = cols;
  o.transposed_copy = transposed_copy;
  return o;
}

void set_scales(GemmOperand& o, ScaleMode mode) {
  // Under TN the reduction dimension is the operand's innermost (cols).
  o.scale_mode = mode;
  o.scale_count = mode == ScaleMode::kVec128 ? vec128_scale_count(o.rows, o.cols)
                                             : blk128_scale_count(o.rows, o.cols);
}

// Why a fine-grained fp path cannot run on cuBLASLt's block-scaled FP8 GEMM; "" if it can.
std::string fp8_block_refusal(const PathSpec& path, const GpuTarget& target, int64_t m, int64_t n,
                              int64_t k) {
  if (target.compute_capability != 90) {
    return "sm_" + std::to_string(target.compute_capability) +
           " has no block-scaled FP8 GEMM (Hopper, sm_90, only)";
  }
  if (path.format == FpFormat::kE5M2) {
    return "e5m2 x e5m2 is not an FP8 type pair cuBLASLt takes";
  }
  if (path.tile != kScaleBlock) {
    return "tile " + std::to_string(path.tile) + ": cuBLASLt's block scales are 128 wide";
  }
  for (int64_t d : {m, n, k}) {
    if (d % 16 != 0) {
      return "dimension " + std::to_string(d) + " of " + std::to_string(m) + " x " +
             std::to_string(n) + " x " + std::to_string(k) +
             " is not a multiple of 16 (FP8 needs 16-byte aligned rows)";
    }
  }
  return "";
}

// Why the int8 forward cannot run on cuBLASLt's IMMA GEMM; "" if it can. Its rules for the
// regular (column-major) order: TN, m and k multiples of 4 (so are the leading dimensions).
std::string int8_gemm_refusal(int64_t m, int64_t k, bool accumulate) {
  if (accumulate) return "an int8 GEMM writes int32 sums: it cannot accumulate into fp32";
  for (int64_t d : {m, k}) {
    if (d % 4 != 0) {
      return "dimension " + std::to_string(d) + " of m " + std::to_string(m) + " x k " +
             std::to_string(k) + " is not a multiple of 4 (int8 IMMA GEMMs need it)";
    }
  }
  if (k > kInt8GemmMaxK) {
    return "k " + std::to_string(k) + " could overflow the int32 sums (at most " +
           std::to_string(kInt8GemmMaxK) + ")";
  }
  return "";
}

GemmImpl unscaled_impl(GemmPrecision precision) {
  return precision == GemmPrecision::BF16 ? GemmImpl::kBf16 : GemmImpl::kFp32;
}

GemmOperandType input_type(GemmImpl impl) {
  return impl == GemmImpl::kBf16 ? GemmOperandType::kBF16 : GemmOperandType::kF32;
}

}  // namespace

const char* gemm_role_name(GemmRole role) {
  switch (role) {
    case GemmRole::kForward:
      return "forward";
    case GemmRole::kInputGradient:
      return "input_gradient";
    case GemmRole::kWeightGradient:
      return "weight_gradient";
  }
  return "?";
}

int64_t gemm_operand_bytes(GemmOperandType type) {
  switch (type) {
    case GemmOperandType::kF32:
    case GemmOperandType::kS32:
      return 4;
    case GemmOperandType::kBF16:
      return 2;
    case GemmOperandType::kE4M3:
    case GemmOperandType::kE5M2:
    case GemmOperandType::kS8:
      return 1;
  }
  return 1;
}

const char* gemm_impl_name(GemmImpl impl) {
  switch (impl) {
    case GemmImpl::kFp32:
      return "fp32";
    case GemmImpl::kBf16:
      return "bf16";
    case GemmImpl::kFp8Block:
      return "fp8_block";
    case GemmImpl::kInt8:
      return "int8";
    case GemmImpl::kEmulated:
      return "emulated";
  }
  return "?";
}

GemmPlan plan_gemm(GemmRole role, int64_t tokens, int64_t in, int64_t out, const PathSpec& path,
                   GemmPrecision backend_precision, const GpuTarget& target, bool accumulate) {
  GemmPlan p;
  p.role = role;
  switch (role) {
    case GemmRole::kForward:
      p.m = out, p.n = tokens, p.k = in;
      break;
    case GemmRole::kInputGradient:
      p.m = in, p.n = tokens, p.k = out;
      break;
    case GemmRole::kWeightGradient:
      p.m = in, p.n = out, p.k = tokens;
      accumulate = true;
      break;
  }
  p.ldc = p.m;
  p.beta = accumulate ? 1.0f : 0.0f;

  switch (path.kind) {
    case PathKind::kBackendGemm:
    case PathKind::kSavedIntGroupwise:
      p.impl = unscaled_impl(backend_precision);
      break;
    case PathKind::kBf16Gemm:
      p.impl = GemmImpl::kBf16;
      break;
    case PathKind::kFineGrainedFp:
      p.emulated_because = fp8_block_refusal(path, target, p.m, p.n, p.k);
      p.impl = p.emulated_because.empty() ? GemmImpl::kFp8Block : GemmImpl::kEmulated;
      break;
    case PathKind::kInt8Gemm:
      if (role == GemmRole::kWeightGradient) {
        p.impl = GemmImpl::kBf16;  // the recipe's weight gradient is a bf16 GEMM
      } else if (role == GemmRole::kForward) {
        p.emulated_because = int8_gemm_refusal(p.m, p.k, accumulate);
        p.impl = p.emulated_because.empty() ? GemmImpl::kInt8 : GemmImpl::kEmulated;
      } else {
        p.impl = GemmImpl::kEmulated;
        p.emulated_because =
            "the int8 input gradient runs as int8 fake quantization + an fp32 GEMM (its "
            "per-channel weight scales lie along its reduction dimension)";
      }
      break;
  }

  if (p.impl == GemmImpl::kFp8Block) {
    // TN with transposed copies; every operand e4m3 codes (fp6 / fp4 formats are stored as
    // e4m3 codes, precision/fp_format.h).
    const GemmOperandType e4m3 = GemmOperandType::kE4M3;
    p.transa = true, p.transb = false;
    switch (role) {
      case GemmRole::kForward:
        p.a = operand("W", e4m3, out, in, false);
        p.b = operand("x", e4m3, tokens, in, false);
        set_scales(p.a, ScaleMode::kBlk128x128);
        set_scales(p.b, ScaleMode::kVec128);
        break;
      case GemmRole::kInputGradient:
        p.a = operand("W^T", e4m3, in, out, true);
        p.b = operand("dy", e4m3, tokens, out, false);
        set_scales(p.a, ScaleMode::kBlk128x128);
        set_scales(p.b, ScaleMode::kVec128);
        break;
      case GemmRole::kWeightGradient:
        p.a = operand("x^T", e4m3, in, tokens, true);
        p.b = operand("dy^T", e4m3, out, tokens, true);
        set_scales(p.a, ScaleMode::kVec128);
        set_scales(p.b, ScaleMode::kVec128);
        break;
    }
  } else if (p.impl == GemmImpl::kInt8) {
    // The forward only: TN on the tensors as stored, one scale per row of each.
    p.transa = true, p.transb = false;
    p.a = operand("W", GemmOperandType::kS8, out, in, false);
    p.b = operand("x", GemmOperandType::kS8, tokens, in, false);
    for (GemmOperand* o : {&p.a, &p.b}) {
      o->scale_mode = ScaleMode::kRowAfterGemm;
      o->scale_count = o->rows;
    }
    p.d_type = GemmOperandType::kS32;
  } else {
    // The tensors as stored; the transposes go into the descriptor.
    const GemmOperandType t = input_type(p.impl);
    switch (role) {
      case GemmRole::kForward:  // TN
        p.transa = true, p.transb = false;
        p.a = operand("W", t, out, in, false);
        p.b = operand("x", t, tokens, in, false);
        break;
      case GemmRole::kInputGradient:  // NN: W [out, in] is column-major in x out already
        p.transa = false, p.transb = false;
        p.a = operand("W", t, out, in, false);
        p.b = operand("dy", t, tokens, out, false);
        break;
      case GemmRole::kWeightGradient:  // NT: x column-major in x N, dy column-major out x N
        p.transa = false, p.transb = true;
        p.a = operand("x", t, tokens, in, false);
        p.b = operand("dy", t, tokens, out, false);
        break;
    }
  }
  p.lda = p.a.cols;
  p.ldb = p.b.cols;
  return p;
}

}  // namespace gnmr
