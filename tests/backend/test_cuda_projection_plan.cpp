// The CUDA projection executor's rules, checked on the CPU: how each GEMM operand of each path
// is prepared (projection_plan.h), which preparations a call may find made, the buffers a
// projection's two paths need, and the out-of-memory report (device_memory_report.h).
#include <gtest/gtest.h>

#include "backend/cuda/device_memory_report.h"
#include "backend/cuda/projection_plan.h"
#include "precision/quantize_groupwise.h"
#include "precision/scale_layout.h"

namespace gnmr {
namespace {

PathSpec path_of(PathKind kind, FpFormat format = FpFormat::kE4M3) {
  PathSpec p;
  p.kind = kind;
  p.format = format;
  p.saved = GroupwiseSpec{4, 128, false};
  return p;
}

// N = 256 tokens, in = 384, out = 512: every FP8 rule holds (multiples of 128).
const ProjectionShape kShape{256, 384, 512, false};
constexpr size_t kN = 256, kIn = 384, kOut = 512;

// A leader of an input for ProjectionShape's input_leader and saved_input_leader: the plan only
// asks whether there is one.
struct SomeLeader final : ProjectionState {
  bool reads_forward_input(const PathSpec&) const override { return true; }
  size_t saved_bytes(const PathSpec&) const override { return 0; }
  size_t planned_saved_bytes() const override { return 0; }
};

ProjectionGemm gemm(GemmRole role, const PathSpec& path, int sm = 90,
                    GemmPrecision precision = GemmPrecision::FP32) {
  return plan_projection_gemm(role, kShape, path, precision, GpuTarget{sm}, false);
}

TEST(CudaProjectionPlan, Fp8OnHopperQuantizesEveryOperandToCodes) {
  const PathSpec fp8 = path_of(PathKind::kFineGrainedFp);
  for (GemmRole role : {GemmRole::kForward, GemmRole::kInputGradient, GemmRole::kWeightGradient}) {
    const ProjectionGemm g = gemm(role, fp8);
    EXPECT_EQ(g.plan.impl, GemmImpl::kFp8Block) << gemm_role_name(role);
    EXPECT_EQ(g.a, OperandPrep::kFp8Codes);
    EXPECT_EQ(g.b, OperandPrep::kFp8Codes);
  }
  const ProjectionBuffers b = projection_buffers(kShape, fp8, fp8, GemmPrecision::FP32, {90});
  EXPECT_EQ(b.weight_fp8_codes, 2 * kOut * kIn);  // W and W^T
  // BLK128x128: W [512, 384] 4 row blocks x round_up(3, 4); W^T [384, 512] 3 x 4.
  EXPECT_EQ(b.weight_fp8_scales, sizeof(float) * (4 * 4 + 3 * 4));
  EXPECT_EQ(b.x_low, kN * kIn);
  EXPECT_EQ(b.dy_low, 2 * kN * kOut);  // dy^T's codes and dy's, made together
  // VEC128: the larger of x [256, 384] (256 x 3) and x^T [384, 256] (384 x 2).
  EXPECT_EQ(b.x_scales, sizeof(float) * 768);
  // dy^T [512, 256]: 512 x 2 (4096 bytes), then dy [256, 512]: 256 x 4.
  EXPECT_EQ(b.dy_scales, sizeof(float) * (1024 + 1024));
  EXPECT_EQ(b.weight_fake_quant + b.x_f32 + b.dy_f32 + b.weight_bf16 + b.saved_codes, 0u);
}

TEST(CudaProjectionPlan, Fp8OnAmpereIsEmulatedWithFakeQuantizedCopies) {
  const PathSpec fp8 = path_of(PathKind::kFineGrainedFp);
  const ProjectionGemm g = gemm(GemmRole::kForward, fp8, 80);
  EXPECT_EQ(g.plan.impl, GemmImpl::kEmulated);
  EXPECT_EQ(g.a, OperandPrep::kFakeQuantFp);
  EXPECT_EQ(g.b, OperandPrep::kFakeQuantFp);
  const ProjectionBuffers b = projection_buffers(kShape, fp8, fp8, GemmPrecision::FP32, {80});
  EXPECT_EQ(b.weight_fake_quant, kOut * kIn * sizeof(float));
  EXPECT_EQ(b.x_f32, kN * kIn * sizeof(float));
  // dy is fake-quantized into a copy: the weight gradient's, then (dy may not be overwritten)
  // the input gradient's.
  EXPECT_EQ(b.dy_f32, kN * kOut * sizeof(float));
  EXPECT_EQ(b.weight_fp8_codes + b.x_low + b.dy_low, 0u);
}

TEST(CudaProjectionPlan, SavedIntRestoresItsCodesForTheWeightGradient) {
  const PathSpec actq = path_of(PathKind::kSavedIntGroupwise);
  EXPECT_EQ(gemm(GemmRole::kWeightGradient, actq).a, OperandPrep::kDequantized);
  EXPECT_EQ(gemm(GemmRole::kWeightGradient, actq).b, OperandPrep::kAsIs);
  EXPECT_EQ(gemm(GemmRole::kForward, actq).b, OperandPrep::kAsIs);
  EXPECT_EQ(gemm(GemmRole::kWeightGradient, actq, 90, GemmPrecision::BF16).a,
            OperandPrep::kDequantizedBf16);

  const ProjectionBuffers fp32 = projection_buffers(kShape, actq, actq, GemmPrecision::FP32, {90});
  const GroupwiseSpec spec = groupwise_spec_for_width(actq.saved, kShape.in);
  EXPECT_EQ(fp32.saved_codes, packed_bytes(kShape.tokens, kShape.in, spec));
  EXPECT_EQ(fp32.saved_scales, sizeof(float) * scale_count(kShape.tokens, kShape.in, spec));
  EXPECT_EQ(fp32.x_f32, kN * kIn * sizeof(float));
  EXPECT_EQ(fp32.weight_bf16 + fp32.x_low + fp32.dy_low, 0u);

  const ProjectionBuffers bf16 = projection_buffers(kShape, actq, actq, GemmPrecision::BF16, {90});
  EXPECT_EQ(bf16.weight_bf16, kOut * kIn * 2);
  EXPECT_EQ(bf16.x_low, kN * kIn * 2);
  EXPECT_EQ(bf16.dy_low, kN * kOut * 2);
  // Under bf16 the codes are dequantized straight to bf16: no fp32 copy of x.
  EXPECT_EQ(bf16.x_f32, 0u);
}

TEST(CudaProjectionPlan, SavedCodesHaveRoomForTheLargerPath) {
  PathSpec int2 = path_of(PathKind::kSavedIntGroupwise), int8 = int2;
  int2.saved.bits = 2;
  int8.saved.bits = 8;
  const ProjectionBuffers b = projection_buffers(kShape, int2, int8, GemmPrecision::FP32, {90});
  EXPECT_EQ(b.saved_codes, kN * kIn);  // 8 bits per value
}

TEST(CudaProjectionPlan, SharedSpecsAreCopiesOfTheLeaderNotOwnCodes) {
  // q, k, v under actq: int2 and int8 shared. The leader plans one copy of each and no own
  // codes; a later sharer plans nothing; a path whose spec is not shared keeps its own.
  PathSpec int2 = path_of(PathKind::kSavedIntGroupwise), int8 = int2;
  int2.saved.bits = 2;
  int8.saved.bits = 8;
  ProjectionShape leader = kShape;
  leader.shared_saved_specs = {int2.saved, int8.saved};
  const ProjectionBuffers b = projection_buffers(leader, int2, int8, GemmPrecision::FP32, {90});
  EXPECT_EQ(b.saved_codes + b.saved_scales, 0u);
  ASSERT_EQ(b.shared_codes.size(), 2u);
  EXPECT_EQ(b.shared_codes[0], kN * kIn / 4);
  EXPECT_EQ(b.shared_codes[1], kN * kIn);
  EXPECT_EQ(b.shared_scales[1], sizeof(float) * kN * kIn / 128);
  const SomeLeader some_leader;
  ProjectionShape sharer = leader;
  sharer.saved_input_leader = &some_leader;
  const ProjectionBuffers s = projection_buffers(sharer, int2, int8, GemmPrecision::FP32, {90});
  EXPECT_EQ(s.saved_codes + s.saved_scales, 0u);
  EXPECT_TRUE(s.shared_codes.empty());
  sharer.shared_saved_specs = {int2.saved};
  const ProjectionBuffers own = projection_buffers(sharer, int2, int8, GemmPrecision::FP32, {90});
  EXPECT_EQ(own.saved_codes, kN * kIn);  // the unshared int8 path
}

TEST(CudaProjectionPlan, Int8ForwardQuantizesToCodesAndItsInputGradientIsEmulated) {
  const PathSpec int8 = path_of(PathKind::kInt8Gemm);
  EXPECT_EQ(gemm(GemmRole::kForward, int8).a, OperandPrep::kInt8Codes);
  EXPECT_EQ(gemm(GemmRole::kForward, int8).b, OperandPrep::kInt8Codes);
  EXPECT_EQ(gemm(GemmRole::kInputGradient, int8).a, OperandPrep::kFakeQuantInt8);
  EXPECT_EQ(gemm(GemmRole::kInputGradient, int8).b, OperandPrep::kFakeQuantInt8);
  const ProjectionBuffers b = projection_buffers(kShape, int8, int8, GemmPrecision::FP32, {90});
  EXPECT_EQ(b.weight_int8_codes, kOut * kIn);
  EXPECT_EQ(b.weight_int8_scales, kOut * sizeof(float));       // one per output channel
  EXPECT_EQ(b.weight_fake_quant, kOut * kIn * sizeof(float));  // the input gradient's W
  EXPECT_GE(b.x_low, kN * kIn);                                // x's codes (and its bf16 copy)
  EXPECT_GE(b.x_scales, kN * sizeof(float));                   // one per token
  EXPECT_EQ(b.x_f32, 0u);  // nothing of x is fake-quantized any more
  EXPECT_STREQ(operand_prep_name(OperandPrep::kInt8Codes), "int8_codes");
}

TEST(CudaProjectionPlan, Int8QuantizesInPlaceWhenDyMayBeOverwritten) {
  const PathSpec int8 = path_of(PathKind::kInt8Gemm);
  EXPECT_EQ(gemm(GemmRole::kWeightGradient, int8).a, OperandPrep::kBf16);  // SwitchBack
  ProjectionShape head = kShape;
  head.backward_may_overwrite_dy = true;
  const ProjectionBuffers in_place =
      projection_buffers(head, int8, int8, GemmPrecision::FP32, {90});
  EXPECT_EQ(in_place.dy_f32, 0u);
  EXPECT_EQ(in_place.dy_low, kN * kOut * 2);  // the bf16 weight gradient's dy
  const ProjectionBuffers copied =
      projection_buffers(kShape, int8, int8, GemmPrecision::FP32, {90});
  EXPECT_EQ(copied.dy_f32, kN * kOut * sizeof(float));
}

TEST(CudaProjectionPlan, Fp32BackendGemmsNeedNothing) {
  const PathSpec plain = path_of(PathKind::kBackendGemm);
  const ProjectionBuffers b = projection_buffers(kShape, plain, plain, GemmPrecision::FP32, {90});
  const ProjectionBuffers none;
  EXPECT_EQ(b.weight_bf16 + b.weight_fp8_codes + b.weight_fake_quant + b.x_f32 + b.x_low +
                b.dy_f32 + b.dy_low + b.saved_codes,
            none.weight_bf16);
}

// Only their addresses matter: which group leads, which x is read.
const int leader = 0, other_leader = 0;
const float x = 0.0f, other_x = 0.0f;

TEST(CudaProjectionPlan, AnInputGroupSharesEachFormOfXPerGeneration) {
  const PathSpec bf16 = path_of(PathKind::kBf16Gemm);
  const PathSpec fp8 = path_of(PathKind::kFineGrainedFp);
  const PathSpec fp6 = path_of(PathKind::kFineGrainedFp, FpFormat::kE3M2);
  auto key = [&](OperandPrep prep, GemmRole role, const PathSpec& path, uint64_t generation = 5,
                 const void* group = &leader, const void* input = &x) {
    return prepared_input_key(group, generation, input, prep, role, path);
  };
  const GemmRole fwd = GemmRole::kForward, wgrad = GemmRole::kWeightGradient;
  // bf16 is the same bits for the forward and the weight gradient.
  EXPECT_TRUE(same_prepared_input(key(OperandPrep::kBf16, fwd, bf16),
                                  key(OperandPrep::kBf16, wgrad, bf16)));
  EXPECT_TRUE(same_prepared_input(key(OperandPrep::kFp8Codes, fwd, fp8),
                                  key(OperandPrep::kFp8Codes, fwd, fp8)));
  EXPECT_TRUE(same_prepared_input(key(OperandPrep::kInt8Codes, fwd, bf16),
                                  key(OperandPrep::kInt8Codes, fwd, bf16)));
  // FP8 codes: 1x128 tiles of x for the forward, 128x1 tiles of x^T for the weight gradient;
  // and the format's grid.
  EXPECT_FALSE(same_prepared_input(key(OperandPrep::kFp8Codes, fwd, fp8),
                                   key(OperandPrep::kFp8Codes, wgrad, fp8)));
  EXPECT_FALSE(same_prepared_input(key(OperandPrep::kFp8Codes, fwd, fp8),
                                   key(OperandPrep::kFp8Codes, fwd, fp6)));
  EXPECT_FALSE(same_prepared_input(key(OperandPrep::kBf16, fwd, bf16),
                                   key(OperandPrep::kFp8Codes, fwd, fp8)));
  // Another generation, group or x is another input.
  const PreparedInputKey held = key(OperandPrep::kBf16, fwd, bf16);
  EXPECT_FALSE(same_prepared_input(held, key(OperandPrep::kBf16, fwd, bf16, 6)));
  EXPECT_FALSE(same_prepared_input(held, key(OperandPrep::kBf16, fwd, bf16, 5, &other_leader)));
  EXPECT_FALSE(same_prepared_input(held, key(OperandPrep::kBf16, fwd, bf16, 5, &leader, &other_x)));
  // No group, or a preparation that is not shared: never the same, not even as itself.
  const PreparedInputKey alone = key(OperandPrep::kBf16, fwd, bf16, 5, nullptr);
  EXPECT_FALSE(same_prepared_input(alone, alone));
  for (OperandPrep prep :
       {OperandPrep::kAsIs, OperandPrep::kFakeQuantFp, OperandPrep::kFakeQuantInt8,
        OperandPrep::kDequantized, OperandPrep::kDequantizedBf16}) {
    const PreparedInputKey k = key(prep, wgrad, fp8);
    EXPECT_EQ(k.group, nullptr) << operand_prep_name(prep);
    EXPECT_FALSE(same_prepared_input(k, k)) << operand_prep_name(prep);
  }
  EXPECT_EQ(key(OperandPrep::kInt8Codes, wgrad, bf16).group, nullptr);
}

TEST(CudaProjectionPlan, TheBackwardPreparesDyOnceWhereBothGemmsReadOneForm) {
  auto dy_prep = [](const PathSpec& path, int sm = 90,
                    GemmPrecision precision = GemmPrecision::FP32) {
    return backward_dy_preparation(gemm(GemmRole::kWeightGradient, path, sm, precision),
                                   gemm(GemmRole::kInputGradient, path, sm, precision));
  };
  EXPECT_EQ(dy_prep(path_of(PathKind::kBf16Gemm)), DyPreparation::kBf16Once);
  EXPECT_EQ(dy_prep(path_of(PathKind::kBackendGemm), 90, GemmPrecision::BF16),
            DyPreparation::kBf16Once);
  EXPECT_EQ(dy_prep(path_of(PathKind::kBackendGemm)), DyPreparation::kPerGemm);  // fp32 as is
  EXPECT_EQ(dy_prep(path_of(PathKind::kFineGrainedFp)), DyPreparation::kFp8BothOnce);
  // Emulated on sm_80: fake-quantized per GEMM, 128x1 tiles for one and 1x128 for the other.
  EXPECT_EQ(dy_prep(path_of(PathKind::kFineGrainedFp), 80), DyPreparation::kPerGemm);
  // int8: the weight gradient in bf16, the input gradient fake-quantized.
  EXPECT_EQ(dy_prep(path_of(PathKind::kInt8Gemm)), DyPreparation::kPerGemm);

  // kFp8BothOnce's scratch: dy^T's codes and dy's side by side, scales likewise, 256-byte
  // aligned and disjoint; the projection's buffers hold both.
  const Fp8DyPairLayout l = fp8_dy_pair_layout(int64_t(kN), int64_t(kOut));
  EXPECT_EQ(l.codes_t, 0u);
  EXPECT_EQ(l.codes % 256, 0u);
  EXPECT_GE(l.codes, kN * kOut);
  EXPECT_EQ(l.codes_bytes, l.codes + kN * kOut);
  const size_t scales_t = sizeof(float) * size_t(vec128_scale_count(int64_t(kOut), int64_t(kN)));
  EXPECT_EQ(l.scales_t, 0u);
  EXPECT_EQ(l.scales % 256, 0u);
  EXPECT_GE(l.scales, scales_t);
  EXPECT_EQ(l.scales_bytes,
            l.scales + sizeof(float) * size_t(vec128_scale_count(int64_t(kN), int64_t(kOut))));
  const Fp8DyPairLayout odd = fp8_dy_pair_layout(3, 5);  // offsets still rounded up
  EXPECT_EQ(odd.codes, 256u);
  EXPECT_EQ(odd.scales, 256u);
  const PathSpec fp8 = path_of(PathKind::kFineGrainedFp);
  const ProjectionBuffers b = projection_buffers(kShape, fp8, fp8, GemmPrecision::FP32, {90});
  EXPECT_EQ(b.dy_low, l.codes_bytes);
  EXPECT_EQ(b.dy_scales, l.scales_bytes);
}

TEST(CudaProjectionPlan, AnFp8ForwardKeepsXTransposedCodesForItsGroupsWeightGradients) {
  auto keeps = [](const PathSpec& path, int sm = 90,
                  GemmPrecision precision = GemmPrecision::FP32) {
    return forward_keeps_x_t(gemm(GemmRole::kForward, path, sm, precision),
                             gemm(GemmRole::kWeightGradient, path, sm, precision));
  };
  const PathSpec fp8 = path_of(PathKind::kFineGrainedFp), bf16 = path_of(PathKind::kBf16Gemm);
  EXPECT_TRUE(keeps(fp8));
  EXPECT_TRUE(keeps(path_of(PathKind::kFineGrainedFp, FpFormat::kE2M1)));  // e4m3 codes too
  EXPECT_FALSE(keeps(fp8, 80));  // emulated: fake-quantized fp32 copies, nothing to keep
  EXPECT_FALSE(keeps(bf16));
  EXPECT_FALSE(keeps(path_of(PathKind::kInt8Gemm)));  // int8 codes forward, bf16 weight gradient
  EXPECT_FALSE(keeps(path_of(PathKind::kSavedIntGroupwise), 90, GemmPrecision::BF16));
  EXPECT_FALSE(keeps(path_of(PathKind::kBackendGemm), 90, GemmPrecision::BF16));

  // The leader of an input holds x^T [384, 256]'s codes and VEC128 scales (384 x 2) when
  // either of its paths keeps them; a member of its group and a path keeping none hold none.
  for (const ProjectionBuffers& b :
       {projection_buffers(kShape, fp8, bf16, GemmPrecision::FP32, {90}),
        projection_buffers(kShape, bf16, fp8, GemmPrecision::FP32, {90})}) {
    EXPECT_EQ(b.saved_x_t_copies, 1);
    EXPECT_EQ(b.saved_x_t_codes, kIn * kN);
    EXPECT_EQ(b.saved_x_t_scales, sizeof(float) * 384 * 2);
  }
  const SomeLeader some_leader;
  ProjectionShape member = kShape;
  member.input_leader = &some_leader;
  const ProjectionBuffers m = projection_buffers(member, fp8, fp8, GemmPrecision::FP32, {90});
  EXPECT_EQ(m.saved_x_t_codes + m.saved_x_t_scales, 0u);
  EXPECT_EQ(m.x_low, kN * kIn);  // its forward may still quantize x (another format)
  const ProjectionBuffers none = projection_buffers(kShape, bf16, bf16, GemmPrecision::FP32, {90});
  EXPECT_EQ(none.saved_x_t_codes + none.saved_x_t_scales, 0u);
  const ProjectionBuffers ampere = projection_buffers(kShape, fp8, fp8, GemmPrecision::FP32, {80});
  EXPECT_EQ(ampere.saved_x_t_codes + ampere.saved_x_t_scales, 0u);
}

TEST(CudaProjectionPlan, KeptCopiesOfXReplaceXOnlyWhereNoPathReadsIt) {
  const PathSpec bf16 = path_of(PathKind::kBf16Gemm), fp8 = path_of(PathKind::kFineGrainedFp),
                 e3m2 = path_of(PathKind::kFineGrainedFp, FpFormat::kE3M2),
                 e5m2 = path_of(PathKind::kFineGrainedFp, FpFormat::kE5M2),
                 saved = path_of(PathKind::kSavedIntGroupwise),
                 backend = path_of(PathKind::kBackendGemm), int8 = path_of(PathKind::kInt8Gemm);
  const GpuTarget hopper{90}, ampere{80};
  auto kept = [&](const PathSpec& path, GemmPrecision precision = GemmPrecision::FP32,
                  GpuTarget target = GpuTarget{90}) {
    return kept_x_of(kShape, path, precision, target);
  };
  EXPECT_EQ(kept(bf16), KeptX::kBf16);
  EXPECT_EQ(kept(backend, GemmPrecision::BF16), KeptX::kBf16);  // the bf16 recipe
  EXPECT_EQ(kept(backend), KeptX::kNone);                       // fp32 GEMMs read x
  EXPECT_EQ(kept(fp8), KeptX::kTransposedCodes);
  EXPECT_EQ(kept(fp8, GemmPrecision::FP32, ampere), KeptX::kNone);  // emulated: fake-quantized
  EXPECT_EQ(kept(e5m2), KeptX::kNone);  // no e5m2 block-scaled GEMM: emulated
  EXPECT_EQ(kept(int8), KeptX::kNone);  // int8 codes forward, bf16 weight gradient
  EXPECT_EQ(kept(saved, GemmPrecision::BF16), KeptX::kNone);  // its own restored codes

  auto replace = [&](const ProjectionShape& shape, const PathSpec& low, const PathSpec& recovery,
                     GemmPrecision precision = GemmPrecision::FP32) {
    return kept_copies_replace_x(shape, low, recovery, precision, hopper);
  };
  EXPECT_TRUE(replace(kShape, bf16, bf16));
  EXPECT_TRUE(replace(kShape, backend, backend, GemmPrecision::BF16));
  EXPECT_TRUE(replace(kShape, e3m2, fp8));    // fp8mix
  EXPECT_TRUE(replace(kShape, fp8, bf16));    // x^T codes on one path, the bf16 copy on the other
  EXPECT_TRUE(replace(kShape, saved, bf16));  // the low path reads its codes
  EXPECT_FALSE(replace(kShape, saved, saved, GemmPrecision::BF16));  // nothing to keep
  EXPECT_FALSE(replace(kShape, backend, backend));
  // A path whose backward reads x keeps x whatever the other keeps.
  EXPECT_FALSE(replace(kShape, int8, bf16));
  EXPECT_FALSE(replace(kShape, e5m2, fp8));
  ProjectionShape elsewhere = kShape;
  elsewhere.input_read_elsewhere = true;
  EXPECT_FALSE(replace(elsewhere, bf16, bf16));
  EXPECT_FALSE(replace(elsewhere, e3m2, fp8));

  // The leader's copies: bf16 x [256, 384] only where they replace x; x^T's codes once per
  // format there (fp8mix: e3m2 and e4m3), else once.
  const ProjectionBuffers mixed =
      projection_buffers(kShape, e3m2, fp8, GemmPrecision::FP32, hopper);
  EXPECT_EQ(mixed.saved_x_t_copies, 2);
  EXPECT_EQ(mixed.saved_x_t_formats[0], FpFormat::kE3M2);
  EXPECT_EQ(mixed.saved_x_t_formats[1], FpFormat::kE4M3);
  EXPECT_EQ(mixed.saved_x_t_codes, kIn * kN);  // each
  EXPECT_EQ(mixed.saved_x_bf16, 0u);
  const ProjectionBuffers one = projection_buffers(kShape, fp8, fp8, GemmPrecision::FP32, hopper);
  EXPECT_EQ(one.saved_x_t_copies, 1);
  const ProjectionBuffers fp8_bf16 =
      projection_buffers(kShape, fp8, bf16, GemmPrecision::FP32, hopper);
  EXPECT_EQ(fp8_bf16.saved_x_t_copies, 1);
  EXPECT_EQ(fp8_bf16.saved_x_bf16, kN * kIn * 2);
  const ProjectionBuffers o = projection_buffers(elsewhere, e3m2, fp8, GemmPrecision::FP32, hopper);
  EXPECT_EQ(o.saved_x_t_copies, 1);  // x is kept: one copy, the last keeping forward's format
  EXPECT_EQ(projection_buffers(kShape, int8, bf16, GemmPrecision::FP32, hopper).saved_x_bf16, 0u);
  EXPECT_EQ(projection_buffers(kShape, saved, bf16, GemmPrecision::FP32, hopper).saved_x_bf16,
            kN * kIn * 2);
  const SomeLeader some_leader;
  ProjectionShape member = kShape;
  member.input_leader = &some_leader;
  const ProjectionBuffers m = projection_buffers(member, e3m2, bf16, GemmPrecision::FP32, hopper);
  EXPECT_EQ(m.saved_x_bf16 + m.saved_x_t_codes, 0u);  // the leader's are shared
  EXPECT_EQ(m.saved_x_t_copies, 0);
}

TEST(CudaProjectionPlan, DescribesEachPathsGemmsAndWhyOneIsEmulated) {
  const GpuTarget hopper{90}, ampere{80};
  EXPECT_EQ(describe_projection_gemms(kShape, path_of(PathKind::kFineGrainedFp),
                                      GemmPrecision::FP32, hopper),
            "fp8_block");
  EXPECT_EQ(describe_projection_gemms(kShape, path_of(PathKind::kFineGrainedFp),
                                      GemmPrecision::FP32, ampere),
            "emulated (sm_80 has no block-scaled FP8 GEMM (Hopper, sm_90, only))");
  EXPECT_EQ(describe_projection_gemms(kShape, path_of(PathKind::kSavedIntGroupwise),
                                      GemmPrecision::BF16, hopper),
            "bf16");
  const std::string int8 =
      describe_projection_gemms(kShape, path_of(PathKind::kInt8Gemm), GemmPrecision::FP32, hopper);
  EXPECT_EQ(int8.rfind("forward int8, input_gradient emulated (the int8 input gradient", 0), 0u)
      << int8;
  EXPECT_NE(int8.find("weight_gradient bf16"), std::string::npos) << int8;
}

TEST(DeviceMemoryReport, NamesTheTensorTheRolesAndTheDevice) {
  MemoryUse held;
  held.bytes[static_cast<int>(MemoryRole::Weights)] = size_t(3) << 30;
  held.bytes[static_cast<int>(MemoryRole::SavedActivations)] = size_t(1) << 29;
  const std::string m = device_out_of_memory_message("blocks.3.attn.probs", size_t(1) << 31, held,
                                                     size_t(1) << 30, size_t(80) << 30);
  for (const char* part :
       {"blocks.3.attn.probs (2.00 GiB)", "already holds 3.50 GiB", "weights 3.00 GiB",
        "saved_activations 0.50 GiB", "1.00 GiB free of 80.00 GiB", "train.micro_batch"}) {
    EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
  }
  EXPECT_EQ(m.find("gradients"), std::string::npos) << "a role holding nothing is not listed";
}

}  // namespace
}  // namespace gnmr
