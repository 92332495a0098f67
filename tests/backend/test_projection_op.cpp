// The CPU backend's projection op (plan_projection, projection_forward / _backward) against
// the composition of the backend's primitives each PathKind stands for (rounding or
// fake-quantizing into fp32 copies, then fp32 GEMMs): equal bits for y, dx and dw.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend_tensors.h"
#include "precision/quantize_groupwise.h"
#include "util/error.h"

namespace gnmr {
namespace {

using testing::download;
using testing::upload;

// 48 tokens: the fine-grained weight-gradient tiles (32 x 1 along N) end in a partial tile.
constexpr int64_t kTokens = 48, kIn = 64, kOut = 96;

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  std::string name;
  PathSpec path;
  GemmPrecision gemms;  // the backend's GemmPrecision, set before planning
};

std::vector<Case> every_path_kind() {
  PathSpec backend_gemm, bf16, saved4, saved8, fine, int8;
  bf16.kind = PathKind::kBf16Gemm;
  saved4.kind = saved8.kind = PathKind::kSavedIntGroupwise;
  saved4.saved = GroupwiseSpec{4, 32, true};
  saved8.saved = GroupwiseSpec{8, 16, false};
  fine.kind = PathKind::kFineGrainedFp;
  fine.format = FpFormat::kE3M2;
  fine.tile = 32;
  int8.kind = PathKind::kInt8Gemm;
  return {{"backend_gemm fp32", backend_gemm, GemmPrecision::FP32},
          {"backend_gemm bf16", backend_gemm, GemmPrecision::BF16},
          {"bf16_gemm", bf16, GemmPrecision::FP32},
          {"saved int4 stochastic", saved4, GemmPrecision::FP32},
          {"saved int8 under bf16 gemms", saved8, GemmPrecision::BF16},
          {"fine_grained_fp e3m2", fine, GemmPrecision::FP32},
          {"int8_gemm", int8, GemmPrecision::FP32}};
}

struct Results {
  std::vector<float> y, dx, dw, dy_after;
};

struct Inputs {
  std::vector<float> w, x, dy, dx0, dw0;
};

Inputs random_inputs() {
  return {random_vector(kOut * kIn, 1), random_vector(kTokens * kIn, 2),
          random_vector(kTokens * kOut, 3), random_vector(kTokens * kIn, 4),
          random_vector(kOut * kIn, 5)};
}

const RngKey kKey{7, 3, 11};

// The op: forward with save, then backward accumulating into dx and dw.
Results through_the_op(const Case& c, const Inputs& in) {
  auto be = make_cpu_backend(2);
  be->set_gemm_precision(c.gemms);
  std::unique_ptr<ProjectionState> state =
      be->plan_projection("unit", ProjectionShape{kTokens, kIn, kOut}, c.path, c.path);
  const Tensor w = upload(*be, in.w, {kOut, kIn}), x = upload(*be, in.x, {kTokens, kIn});
  Tensor y = be->allocate("y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
  Tensor dy = upload(*be, in.dy, {kTokens, kOut}), dx = upload(*be, in.dx0, {kTokens, kIn});
  Tensor dw = upload(*be, in.dw0, {kOut, kIn});
  be->projection_forward(*state, c.path, w, x, y, /*save=*/true, kKey);
  be->projection_backward(*state, c.path, w, dy, dx, /*accumulate_dx=*/true, dw);
  return {download(*be, y), download(*be, dx), download(*be, dw), download(*be, dy)};
}

// The primitives the path stands for, called one by one.
Results composed(const Case& c, const Inputs& in) {
  auto be = make_cpu_backend(2);
  const Tensor w = upload(*be, in.w, {kOut, kIn}), x = upload(*be, in.x, {kTokens, kIn});
  Tensor y = be->allocate("y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
  Tensor dy = upload(*be, in.dy, {kTokens, kOut}), dx = upload(*be, in.dx0, {kTokens, kIn});
  Tensor dw = upload(*be, in.dw0, {kOut, kIn});
  auto copy_of = [&](const Tensor& t) {
    return be->allocate("copy", t.shape, DType::F32, MemoryRole::Scratch);
  };
  Tensor wq = copy_of(w), xq = copy_of(x), dyq = copy_of(dy);
  const bool bf16 =
      c.path.kind == PathKind::kBf16Gemm ||
      (c.gemms == GemmPrecision::BF16 &&
       (c.path.kind == PathKind::kBackendGemm || c.path.kind == PathKind::kSavedIntGroupwise));
  const int64_t tile = c.path.tile;
  // forward and input-gradient operands
  if (bf16) {
    be->round_to_bf16(w, wq);
    be->round_to_bf16(x, xq);
    be->round_to_bf16(dy, dyq);
  } else if (c.path.kind == PathKind::kFineGrainedFp) {
    be->fake_quantize_fp_blockwise(w, wq, c.path.format, tile, tile);
    be->fake_quantize_fp_blockwise(x, xq, c.path.format, 1, tile);
    be->fake_quantize_fp_blockwise(dy, dyq, c.path.format, 1, tile);
  } else if (c.path.kind == PathKind::kInt8Gemm) {
    be->fake_quantize_int8_per_row(w, wq);
    be->fake_quantize_int8_per_row(x, xq);
    be->fake_quantize_int8_per_row(dy, dyq);
  } else {
    be->copy(w, wq);
    be->copy(x, xq);
    be->copy(dy, dyq);
  }
  be->matmul_forward(xq, wq, y, GemmPrecision::FP32);
  be->matmul_backward_input(dyq, wq, dx, true, GemmPrecision::FP32);
  // weight-gradient operands
  switch (c.path.kind) {
    case PathKind::kBackendGemm:
      be->matmul_backward_weight(x, dy, dw, c.gemms);
      break;
    case PathKind::kSavedIntGroupwise: {
      const GroupwiseSpec spec = c.path.saved;
      Tensor packed =
          be->allocate("packed", {static_cast<int64_t>(packed_bytes(kTokens, kIn, spec))},
                       DType::U8, MemoryRole::Scratch);
      Tensor scales =
          be->allocate("scales", {static_cast<int64_t>(scale_count(kTokens, kIn, spec))},
                       DType::F32, MemoryRole::Scratch);
      be->quantize_int_groupwise(x, packed, scales, spec, kKey);
      be->dequantize_int_groupwise(packed, scales, spec, xq);
      be->matmul_backward_weight(xq, dy, dw, c.gemms);
      break;
    }
    case PathKind::kBf16Gemm:
    case PathKind::kInt8Gemm:
      be->matmul_backward_weight(x, dy, dw, GemmPrecision::BF16);
      break;
    case PathKind::kFineGrainedFp:
      be->fake_quantize_fp_blockwise(x, xq, c.path.format, tile, 1);
      be->fake_quantize_fp_blockwise(dy, dyq, c.path.format, tile, 1);
      be->matmul_backward_weight(xq, dyq, dw, GemmPrecision::FP32);
      break;
  }
  return {download(*be, y), download(*be, dx), download(*be, dw), in.dy};
}

TEST(ProjectionOp, EveryPathKindGivesTheBitsOfThePrimitivesItStandsFor) {
  const Inputs in = random_inputs();
  for (const Case& c : every_path_kind()) {
    SCOPED_TRACE(c.name);
    const Results op = through_the_op(c, in), ref = composed(c, in);
    EXPECT_TRUE(same_bits(op.y, ref.y));
    EXPECT_TRUE(same_bits(op.dx, ref.dx));
    EXPECT_TRUE(same_bits(op.dw, ref.dw));
    EXPECT_TRUE(same_bits(op.dy_after, in.dy));  // dy may not be overwritten by default
  }
}

TEST(ProjectionOp, AnOverwritableDyGivesTheSameGradientsAndIsLeftRounded) {
  // The lm_head's dlogits under bf16 GEMMs: rounded in place instead of into a copy.
  const Inputs in = random_inputs();
  const Case c = every_path_kind()[1];  // backend_gemm under bf16 GEMMs
  auto be = make_cpu_backend(2);
  be->set_gemm_precision(GemmPrecision::BF16);
  ProjectionShape shape{kTokens, kIn, kOut};
  shape.backward_may_overwrite_dy = true;
  std::unique_ptr<ProjectionState> state = be->plan_projection("head", shape, c.path, c.path);
  const Tensor w = upload(*be, in.w, {kOut, kIn}), x = upload(*be, in.x, {kTokens, kIn});
  Tensor y = be->allocate("y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
  Tensor dy = upload(*be, in.dy, {kTokens, kOut}), dx = upload(*be, in.dx0, {kTokens, kIn});
  Tensor dw = upload(*be, in.dw0, {kOut, kIn});
  be->projection_forward(*state, c.path, w, x, y, true, kKey);
  be->projection_backward(*state, c.path, w, dy, dx, true, dw);
  const Results ref = composed(c, in);
  EXPECT_TRUE(same_bits(download(*be, dx), ref.dx));
  EXPECT_TRUE(same_bits(download(*be, dw), ref.dw));
  Tensor dy_rounded = upload(*be, in.dy, {kTokens, kOut});
  be->round_to_bf16(dy_rounded, dy_rounded);
  EXPECT_TRUE(same_bits(download(*be, dy), download(*be, dy_rounded)));
}

TEST(ProjectionOp, PreparedWeightsAreReusedUntilInvalidatedAndRedonePerPath) {
  PathSpec low, recovery;
  low.kind = recovery.kind = PathKind::kFineGrainedFp;
  low.format = FpFormat::kE2M1;
  low.tile = recovery.tile = 32;
  const Inputs in = random_inputs();
  auto be = make_cpu_backend(2);
  std::unique_ptr<ProjectionState> state =
      be->plan_projection("unit", ProjectionShape{kTokens, kIn, kOut}, low, recovery);
  Tensor w = upload(*be, in.w, {kOut, kIn});
  const Tensor x = upload(*be, in.x, {kTokens, kIn});
  Tensor y = be->allocate("y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
  auto forward = [&](const PathSpec& path) {
    be->projection_forward(*state, path, w, x, y, false, kKey);
    return download(*be, y);
  };
  const std::vector<float> low_w1 = forward(low), recovery_w1 = forward(recovery);
  EXPECT_FALSE(same_bits(low_w1, recovery_w1));
  EXPECT_TRUE(same_bits(forward(low), low_w1));  // the path switched back: prepared again

  be->copy_from_host(w, random_vector(kOut * kIn, 9).data());
  EXPECT_TRUE(same_bits(forward(low), low_w1));  // stale until invalidated, as documented
  be->invalidate_prepared_weights();
  const std::vector<float> low_w2 = forward(low);
  EXPECT_FALSE(same_bits(low_w2, low_w1));
  Case fresh{"fresh", low, GemmPrecision::FP32};
  Inputs changed = in;
  changed.w = random_vector(kOut * kIn, 9);
  EXPECT_TRUE(same_bits(low_w2, composed(fresh, changed).y));
}

TEST(ProjectionOp, StateSaysWhatEachPathKeepsForItsBackward) {
  auto be = make_cpu_backend(1);
  PathSpec saved4, plain;
  saved4.kind = PathKind::kSavedIntGroupwise;
  saved4.saved = GroupwiseSpec{4, 32, false};
  std::unique_ptr<ProjectionState> state =
      be->plan_projection("unit", ProjectionShape{kTokens, kIn, kOut}, saved4, plain);
  EXPECT_FALSE(state->reads_forward_input(saved4));
  EXPECT_TRUE(state->reads_forward_input(plain));
  // Half a byte per element plus one fp32 scale per 32 elements.
  EXPECT_EQ(state->saved_bytes(saved4), size_t(kTokens * kIn / 2 + kTokens * kIn / 32 * 4));
  EXPECT_EQ(state->saved_bytes(plain), 0u);
  EXPECT_EQ(state->planned_saved_bytes(), state->saved_bytes(saved4));  // 64-byte multiples
  EXPECT_EQ(be->memory_use()[MemoryRole::SavedActivations], state->planned_saved_bytes());
  std::unique_ptr<ProjectionState> plain_only =
      be->plan_projection("plain", ProjectionShape{kTokens, kIn, kOut}, plain, plain);
  EXPECT_EQ(plain_only->planned_saved_bytes(), 0u);
}

TEST(ProjectionOp, SharersOfAnInputKeepOneCopyPerSpecAndGiveTheirOwnPathsGradients) {
  // q, k, v as the model plans them under actq: one int4 and one int8 copy for the three,
  // allocated by the leader; q and v on int4 read one copy, k on int8 the other.
  PathSpec saved4, saved8;
  saved4.kind = saved8.kind = PathKind::kSavedIntGroupwise;
  saved4.saved = GroupwiseSpec{4, 32, false};
  saved8.saved = GroupwiseSpec{8, 16, false};
  const Inputs in = random_inputs();
  auto be = make_cpu_backend(2);
  ProjectionShape shape{kTokens, kIn, kOut};
  shape.shared_saved_specs = {saved4.saved, saved8.saved};
  std::vector<std::unique_ptr<ProjectionState>> states;
  for (int i = 0; i < 3; ++i) {
    states.push_back(be->plan_projection("unit" + std::to_string(i), shape, saved4, saved8));
    shape.saved_input_leader = states.front().get();
  }
  // 64-byte multiples: what is allocated is what the paths read.
  EXPECT_EQ(states[0]->planned_saved_bytes(),
            states[0]->saved_bytes(saved4) + states[0]->saved_bytes(saved8));
  EXPECT_EQ(states[1]->planned_saved_bytes(), 0u);
  EXPECT_EQ(states[2]->planned_saved_bytes(), 0u);
  EXPECT_EQ(be->memory_use()[MemoryRole::SavedActivations], states[0]->planned_saved_bytes());
  EXPECT_EQ(states[1]->saved_bytes(saved8), states[0]->saved_bytes(saved8));  // what k reads

  const PathSpec* paths[3] = {&saved4, &saved8, &saved4};
  const Tensor w = upload(*be, in.w, {kOut, kIn}), x = upload(*be, in.x, {kTokens, kIn});
  Tensor y = be->allocate("y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
  std::vector<Tensor> dx, dw;
  for (int i = 0; i < 3; ++i) {
    be->projection_forward(*states[i], *paths[i], w, x, y, /*save=*/true, kKey);
    dx.push_back(upload(*be, in.dx0, {kTokens, kIn}));
    dw.push_back(upload(*be, in.dw0, {kOut, kIn}));
  }
  for (int i = 2; i >= 0; --i) {
    Tensor dy = upload(*be, in.dy, {kTokens, kOut});
    be->projection_backward(*states[i], *paths[i], w, dy, dx[i], true, dw[i]);
  }
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const Results ref = composed(Case{"unshared", *paths[i], GemmPrecision::FP32}, in);
    EXPECT_TRUE(same_bits(download(*be, dw[i]), ref.dw));
    EXPECT_TRUE(same_bits(download(*be, dx[i]), ref.dx));
  }
  // A sharer that saves a new x before its leader would read stale codes: refused.
  EXPECT_THROW(be->projection_forward(*states[1], saved8, w, x, y, true, kKey), Error);
  be->projection_forward(*states[0], saved4, w, x, y, true, kKey);
  be->projection_forward(*states[1], saved8, w, x, y, true, kKey);
}

TEST(ProjectionOp, AStochasticSpecIsNeverShared) {
  PathSpec saved4;
  saved4.kind = PathKind::kSavedIntGroupwise;
  saved4.saved = GroupwiseSpec{4, 32, true};
  auto be = make_cpu_backend(1);
  ProjectionShape shape{kTokens, kIn, kOut};
  shape.shared_saved_specs = {saved4.saved};
  EXPECT_THROW(be->plan_projection("unit", shape, saved4, saved4), Error);
}

}  // namespace
}  // namespace gnmr
