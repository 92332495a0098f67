// One projection (plan_projection, projection_forward / projection_backward) on the CUDA backend
// against the CPU backend, per path and GEMM precision: y, dx (accumulated) and dw (accumulated)
// from the same inputs. Narrower than the training comparison (test_gpu_training.cpp), so a
// disagreement there can be placed in one role of one path. And an input group (q, k, v) against
// the same projections each on its own: the same bits, x prepared once; and the fused ops (the
// MLP's forward and backward, RoPE's backward with q's or k's) against their ops one by one.
// Skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_projection.h"
#include "backend/rope_table.h"
#include "gpu_test_util.h"

namespace gnmr {
namespace {

// Multiples of 128, so the FP8 path runs cuBLASLt's block-scaled GEMM on sm_90.
constexpr int64_t kTokens = 256, kIn = 384, kOut = 256;

struct Outputs {
  std::vector<float> y, dx, dw;
  bool backward_read_x = true;  // run: the state's reads_forward_input (else x was poisoned)
};

Tensor upload(Backend& be, const std::vector<float>& values, std::vector<int64_t> shape) {
  Tensor t = be.allocate("t", std::move(shape), DType::F32, MemoryRole::Scratch);
  be.copy_from_host(t, values.data());
  return t;
}

std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  be.copy_to_host(t, out.data());
  return out;
}

Outputs run(Backend& be, GemmPrecision gemms, const PathSpec& path, bool dy_dead) {
  be.set_gemm_precision(gemms);
  ProjectionShape shape{kTokens, kIn, kOut};
  shape.backward_may_overwrite_dy = dy_dead;  // as the lm_head's dlogits
  std::unique_ptr<ProjectionState> state = be.plan_projection("unit", shape, path, path);
  using gnmr_test::random_normal;
  const Tensor w = upload(be, random_normal(size_t(kOut * kIn), 1), {kOut, kIn});
  Tensor x = upload(be, random_normal(size_t(kTokens * kIn), 2), {kTokens, kIn});
  Tensor dy = upload(be, random_normal(size_t(kTokens * kOut), 3), {kTokens, kOut});
  Tensor dx = upload(be, random_normal(size_t(kTokens * kIn), 4), {kTokens, kIn});
  Tensor dw = upload(be, random_normal(size_t(kOut * kIn), 5), {kOut, kIn});
  Tensor y = be.allocate("y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
  be.projection_forward(*state, path, w, x, y, /*save=*/true, RngKey{7, 3, 11});
  // A backward that does not read x (it reads a copy the forward kept) gets the same dW with x
  // overwritten, as the model then reuses x's memory.
  const bool backward_read_x = state->reads_forward_input(path);
  if (!backward_read_x) {
    be.copy_from_host(x, std::vector<float>(size_t(kTokens * kIn), std::nanf("")).data());
  }
  be.projection_backward(*state, path, w, dy, dx, /*accumulate_dx=*/true, dw);
  return {download(be, y), download(be, dx), download(be, dw), backward_read_x};
}

PathSpec path_of(PathKind kind) {
  PathSpec path;
  path.kind = kind;
  return path;
}

// The fine-grained FP path in `format` (e4m3: fp8mix's recovery; e3m2: its low path).
PathSpec fp_path(FpFormat format) {
  PathSpec path = path_of(PathKind::kFineGrainedFp);
  path.format = format;
  return path;
}

// A CUDA backend whose GEMMs outside the paths run fp32.
std::unique_ptr<Backend> cuda_backend_fp32_gemms() {
  std::unique_ptr<Backend> be = make_cuda_backend(CudaBackendOptions{});
  be->set_gemm_precision(GemmPrecision::FP32);
  return be;
}

// max |gpu - cpu| / max |cpu| over a tensor.
double relative_difference(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    diff = std::max(diff, std::fabs(double(gpu[i]) - double(cpu[i])));
    scale = std::max(scale, std::fabs(double(cpu[i])));
  }
  return diff / scale;
}

struct Case {
  const char* name;
  GemmPrecision gemms;
  PathSpec path;
  // The same operand bits on both backends, fp32 accumulation in another order: a few ulps of
  // a 384-term sum relative to the tensor's largest entry; 1e-5 leaves a factor of ~100.
  // FP8: the same codes, Hopper's reduced-precision accumulation: 1e-3.
  double tolerance;
  bool gpu_backward_reads_x;  // false: a copy of x kept by the forward (kept_copies_replace_x)
};

TEST(GpuProjection, EveryPathAndGemmPrecisionMatchesTheCpuPerRole) {
  SKIP_WITHOUT_GPU();
  const std::vector<Case> cases = {
      {"fp32 gemms", GemmPrecision::FP32, PathSpec{}, 1e-5, true},
      {"bf16 gemms", GemmPrecision::BF16, PathSpec{}, 1e-5, false},
      {"bf16 path", GemmPrecision::FP32, path_of(PathKind::kBf16Gemm), 1e-5, false},
      {"fp8 path", GemmPrecision::FP32, path_of(PathKind::kFineGrainedFp), 1e-3, false}};
  for (const Case& c : cases) {
    for (const bool dy_dead : {false, true}) {
      SCOPED_TRACE(std::string(c.name) + (dy_dead ? ", dy dead after the backward" : ""));
      std::unique_ptr<Backend> cpu = make_cpu_backend(2);
      std::unique_ptr<Backend> gpu = make_cuda_backend(CudaBackendOptions{});
      const Outputs want = run(*cpu, c.gemms, c.path, dy_dead);
      const Outputs got = run(*gpu, c.gemms, c.path, dy_dead);
      EXPECT_LE(relative_difference(got.y, want.y), c.tolerance) << "y";
      EXPECT_LE(relative_difference(got.dx, want.dx), c.tolerance) << "dx";
      EXPECT_LE(relative_difference(got.dw, want.dw), c.tolerance) << "dw";
      EXPECT_EQ(got.backward_read_x, c.gpu_backward_reads_x);
    }
  }
}

// Three projections of one x, as q, k, v, each planned with the paths `low` and `recovery` and
// run on paths[i]: planned as an input group (the later two naming the first as their
// input_leader) or each on its own, two micro-steps each, with another projection (on
// paths[0]) running between the forwards and the backwards as o, gate, up and down do.
struct GroupRun {
  std::vector<Outputs> outputs;  // by micro-step, then projection
  // By projection (cuda): x-side preparations made and found made, and weight gradients that
  // read x^T's codes or the bf16 copy of x kept by the group's forward.
  std::vector<int64_t> prepared, reused, kept_reads, bf16_kept_reads;
  bool x_poisoned = false;  // no backward read x: it was overwritten after the forwards
};

GroupRun run_group(Backend& be, GemmPrecision gemms, const PathSpec& low, const PathSpec& recovery,
                   const std::vector<PathSpec>& paths, bool grouped,
                   bool input_read_elsewhere = false) {
  const PathSpec& path = paths[0];
  be.set_gemm_precision(gemms);
  const int64_t outs[3] = {kOut, kOut / 2, kOut / 2};
  std::vector<std::unique_ptr<ProjectionState>> states;
  std::vector<Tensor> w, dw, y, dy;
  for (int i = 0; i < 3; ++i) {
    ProjectionShape shape{kTokens, kIn, outs[i]};
    if (grouped && i > 0) shape.input_leader = states.front().get();
    shape.input_read_elsewhere = input_read_elsewhere;
    states.push_back(be.plan_projection("unit" + std::to_string(i), shape, low, recovery));
    w.push_back(
        upload(be, gnmr_test::random_normal(size_t(outs[i] * kIn), 10 + i), {outs[i], kIn}));
    dw.push_back(upload(be, std::vector<float>(size_t(outs[i] * kIn), 0.0f), {outs[i], kIn}));
    y.push_back(be.allocate("y", {kTokens, outs[i]}, DType::F32, MemoryRole::Scratch));
    dy.push_back(be.allocate("dy", {kTokens, outs[i]}, DType::F32, MemoryRole::Scratch));
  }
  std::unique_ptr<ProjectionState> other =
      be.plan_projection("other", ProjectionShape{kTokens, kIn, kOut}, path, path);
  const Tensor other_w = upload(be, gnmr_test::random_normal(size_t(kOut * kIn), 20), {kOut, kIn});
  const Tensor other_x =
      upload(be, gnmr_test::random_normal(size_t(kTokens * kIn), 21), {kTokens, kIn});
  Tensor other_dw = upload(be, std::vector<float>(size_t(kOut * kIn), 0.0f), {kOut, kIn});
  Tensor other_y = be.allocate("other_y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
  Tensor other_dx = be.allocate("other_dx", {kTokens, kIn}, DType::F32, MemoryRole::Scratch);
  Tensor x = be.allocate("x", {kTokens, kIn}, DType::F32, MemoryRole::Scratch);
  Tensor dx = be.allocate("dx", {kTokens, kIn}, DType::F32, MemoryRole::Scratch);
  GroupRun r;
  for (uint32_t step = 0; step < 2; ++step) {  // a new x in the same memory
    be.copy_from_host(x, gnmr_test::random_normal(size_t(kTokens * kIn), 30 + step).data());
    for (int i = 0; i < 3; ++i) {
      be.projection_forward(*states[size_t(i)], paths[size_t(i)], w[size_t(i)], x, y[size_t(i)],
                            true, RngKey{7, step, uint32_t(i)});
    }
    // Where no backward of the three reads x itself, x is overwritten before them (the model
    // then reuses its memory): they must read what their forwards kept.
    r.x_poisoned = true;
    for (int i = 0; i < 3; ++i) {
      r.x_poisoned = r.x_poisoned && !states[size_t(i)]->reads_forward_input(paths[size_t(i)]);
    }
    if (r.x_poisoned) {
      be.copy_from_host(x, std::vector<float>(size_t(kTokens * kIn), std::nanf("")).data());
    }
    be.projection_forward(*other, path, other_w, other_x, other_y, true, RngKey{7, step, 3});
    Tensor other_dy =
        upload(be, gnmr_test::random_normal(size_t(kTokens * kOut), 40 + step), {kTokens, kOut});
    be.projection_backward(*other, path, other_w, other_dy, other_dx, false, other_dw);
    for (int i = 0; i < 3; ++i) {
      be.copy_from_host(
          dy[size_t(i)],
          gnmr_test::random_normal(size_t(kTokens * outs[i]), 50 + 3 * step + uint32_t(i)).data());
      be.projection_backward(*states[size_t(i)], paths[size_t(i)], w[size_t(i)], dy[size_t(i)], dx,
                             /*accumulate_dx=*/i > 0, dw[size_t(i)]);
    }
    for (int i = 0; i < 3; ++i) {
      r.outputs.push_back(
          {download(be, y[size_t(i)]), download(be, dx), download(be, dw[size_t(i)])});
    }
  }
  for (const std::unique_ptr<ProjectionState>& state : states) {
    const auto* cuda_state = dynamic_cast<const cuda::CudaProjectionState*>(state.get());
    r.prepared.push_back(cuda_state != nullptr ? cuda_state->x_prepared : -1);
    r.reused.push_back(cuda_state != nullptr ? cuda_state->x_reused : -1);
    r.kept_reads.push_back(cuda_state != nullptr ? cuda_state->x_t_kept_reads : -1);
    r.bf16_kept_reads.push_back(cuda_state != nullptr ? cuda_state->x_bf16_kept_reads : -1);
  }
  return r;
}

void expect_same_bits(const GroupRun& grouped, const GroupRun& alone) {
  ASSERT_EQ(alone.outputs.size(), grouped.outputs.size());
  for (size_t i = 0; i < alone.outputs.size(); ++i) {
    SCOPED_TRACE("micro-step " + std::to_string(i / 3) + ", projection " + std::to_string(i % 3));
    EXPECT_EQ(grouped.outputs[i].y, alone.outputs[i].y);
    EXPECT_EQ(grouped.outputs[i].dx, alone.outputs[i].dx);
    EXPECT_EQ(grouped.outputs[i].dw, alone.outputs[i].dw);
  }
}

TEST(GpuProjection, AnInputGroupPreparesXOnceAndGivesEachProjectionItsOwnBits) {
  SKIP_WITHOUT_GPU();
  PathSpec saved_int4 = path_of(PathKind::kSavedIntGroupwise);
  saved_int4.saved = GroupwiseSpec{4, 128, false};
  struct GroupCase {
    const char* name;
    GemmPrecision gemms;
    PathSpec path;
    int64_t shared_per_step;     // x preparations per micro-step the group makes once
    int64_t kept_per_step;       // weight gradients per projection reading the forward's x^T codes
    int64_t bf16_kept_per_step;  // ... reading the bf16 copy of x the forward kept
  };
  // bf16 is one form for the forward and the weight gradient, kept from the forward in place of
  // x (kept_copies_replace_x); int8 a form each; fp8 one kernel for both (x^T's codes kept from
  // the forward, in place of x: forward_keeps_x_t); the saved path's weight gradient reads its
  // own restored codes (never shared).
  const std::vector<GroupCase> cases = {
      {"bf16 path", GemmPrecision::FP32, path_of(PathKind::kBf16Gemm), 1, 0, 1},
      {"bf16 gemms", GemmPrecision::BF16, PathSpec{}, 1, 0, 1},
      {"fp8 path", GemmPrecision::FP32, path_of(PathKind::kFineGrainedFp), 1, 1, 0},
      {"int8 path", GemmPrecision::FP32, path_of(PathKind::kInt8Gemm), 2, 0, 0},
      {"saved int4, bf16 gemms", GemmPrecision::BF16, saved_int4, 1, 0, 0}};
  for (const GroupCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Backend> gpu = make_cuda_backend(CudaBackendOptions{});
    const std::vector<PathSpec> paths(3, c.path);
    const GroupRun alone = run_group(*gpu, c.gemms, c.path, c.path, paths, false);
    const GroupRun grouped = run_group(*gpu, c.gemms, c.path, c.path, paths, true);
    expect_same_bits(grouped, alone);
    const int64_t steps = 2, per_step = c.shared_per_step;
    EXPECT_EQ(grouped.prepared, (std::vector<int64_t>{steps * per_step, 0, 0}));
    EXPECT_EQ(grouped.reused, (std::vector<int64_t>{0, steps * per_step, steps * per_step}));
    EXPECT_EQ(alone.prepared, std::vector<int64_t>(3, steps * per_step));
    EXPECT_EQ(alone.reused, std::vector<int64_t>(3, 0));
    EXPECT_EQ(grouped.kept_reads, std::vector<int64_t>(3, steps * c.kept_per_step));
    EXPECT_EQ(alone.kept_reads, std::vector<int64_t>(3, steps * c.kept_per_step));
    EXPECT_EQ(grouped.bf16_kept_reads, std::vector<int64_t>(3, steps * c.bf16_kept_per_step));
    EXPECT_EQ(alone.bf16_kept_reads, std::vector<int64_t>(3, steps * c.bf16_kept_per_step));
    // x overwritten before the backwards where they read kept copies or saved codes.
    EXPECT_EQ(grouped.x_poisoned, c.path.kind != PathKind::kInt8Gemm);
  }
}

// A group whose projections run different paths of the two they were planned with, as GNMR
// routes q, k, v: each projection's own bits whatever the others ran. Where the kept copies
// replace x (kept_copies_replace_x) the group keeps x^T's codes once per format and the bf16
// copy, and every weight gradient reads its path's copy with x overwritten. Where x is kept
// (read elsewhere, as o's), one x^T copy holds the last keeping forward's format: a weight
// gradient whose format it does not hold quantizes x again.
TEST(GpuProjection, AGroupOnMixedPathsReadsItsPathsKeptCopies) {
  SKIP_WITHOUT_GPU();
  const PathSpec fp8 = fp_path(FpFormat::kE4M3), e3m2 = fp_path(FpFormat::kE3M2),
                 bf16 = path_of(PathKind::kBf16Gemm);
  PathSpec saved_int4 = path_of(PathKind::kSavedIntGroupwise);
  saved_int4.saved = GroupwiseSpec{4, 128, false};
  struct MixedCase {
    const char* name;
    PathSpec low, recovery;
    std::vector<PathSpec> paths;
    bool read_elsewhere;                   // ProjectionShape::input_read_elsewhere
    std::vector<int64_t> kept_reads;       // grouped, per projection, over two micro-steps
    std::vector<int64_t> bf16_kept_reads;  // ... of the bf16 copy of x
  };
  const std::vector<MixedCase> cases = {
      {"fp8 / bf16: bf16, fp8, fp8", fp8, bf16, {bf16, fp8, fp8}, false, {0, 2, 2}, {2, 0, 0}},
      {"fp8 / bf16: fp8, bf16, fp8", fp8, bf16, {fp8, bf16, fp8}, false, {2, 0, 2}, {0, 2, 0}},
      {"e3m2 / e4m3: e4m3, e3m2, e3m2", e3m2, fp8, {fp8, e3m2, e3m2}, false, {2, 2, 2}, {0, 0, 0}},
      {"saved int4 / bf16: bf16, int4, int4",
       saved_int4,
       bf16,
       {bf16, saved_int4, saved_int4},
       false,
       {0, 0, 0},
       {2, 0, 0}},
      {"saved int4 / bf16: int4, bf16, bf16",
       saved_int4,
       bf16,
       {saved_int4, bf16, bf16},
       false,
       {0, 0, 0},
       {0, 2, 2}},
      // k's forward keeps e3m2 codes over q's e4m3 ones; v finds both of its forms made.
      {"x read elsewhere, e3m2 / e4m3: e4m3, e3m2, e3m2",
       e3m2,
       fp8,
       {fp8, e3m2, e3m2},
       true,
       {0, 2, 2},
       {0, 0, 0}}};
  for (const MixedCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Backend> gpu = make_cuda_backend(CudaBackendOptions{});
    const GroupRun alone =
        run_group(*gpu, GemmPrecision::FP32, c.low, c.recovery, c.paths, false, c.read_elsewhere);
    const GroupRun grouped =
        run_group(*gpu, GemmPrecision::FP32, c.low, c.recovery, c.paths, true, c.read_elsewhere);
    expect_same_bits(grouped, alone);
    EXPECT_EQ(grouped.kept_reads, c.kept_reads);
    EXPECT_EQ(grouped.bf16_kept_reads, c.bf16_kept_reads);
    EXPECT_EQ(grouped.x_poisoned, !c.read_elsewhere);
    EXPECT_EQ(alone.x_poisoned, !c.read_elsewhere);
    for (size_t i = 0; i < 3; ++i) {  // alone, every fp8 (bf16) projection reads its own
      EXPECT_EQ(alone.kept_reads[i], c.paths[i].kind == PathKind::kFineGrainedFp ? 2 : 0);
      EXPECT_EQ(alone.bf16_kept_reads[i], c.paths[i].kind == PathKind::kBf16Gemm ? 2 : 0);
    }
  }
}

// The MLP's backward (swiglu_projections_backward) for gate and up as an input group: where
// both paths make one form of dy (FP8 codes, bf16), the kernel making it computes it from gate,
// up and dout (the gradients never written); elsewhere (e5m2 runs emulated, its GEMMs each
// quantizing dy) the SwiGLU backward and two projection backwards run. Either way dx and both
// dW are the bits of those three ops run one by one.
TEST(GpuProjection, TheMlpBackwardMakesDyFromTheSwigluInputsWithTheSameBits) {
  SKIP_WITHOUT_GPU();
  const PathSpec fp8 = fp_path(FpFormat::kE4M3), e3m2 = fp_path(FpFormat::kE3M2),
                 e5m2 = fp_path(FpFormat::kE5M2), bf16 = path_of(PathKind::kBf16Gemm);
  struct MlpCase {
    const char* name;
    PathSpec gate_path, up_path;
    bool fused;
  };
  const std::vector<MlpCase> cases = {{"e4m3, e4m3", fp8, fp8, true},
                                      {"e3m2, e4m3 (GNMR's routing)", e3m2, fp8, true},
                                      {"e4m3, bf16", fp8, bf16, true},
                                      {"bf16, bf16", bf16, bf16, true},
                                      {"e5m2 (emulated: dy per GEMM), e4m3", e5m2, fp8, false}};
  using gnmr_test::random_normal;
  for (const MlpCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Backend> be = cuda_backend_fp32_gemms();
    ProjectionShape shape{kTokens, kIn, kOut};
    std::unique_ptr<ProjectionState> gate_state =
        be->plan_projection("gate", shape, c.gate_path, c.up_path);
    shape.input_leader = gate_state.get();
    std::unique_ptr<ProjectionState> up_state =
        be->plan_projection("up", shape, c.gate_path, c.up_path);
    const Tensor w_gate = upload(*be, random_normal(size_t(kOut * kIn), 1), {kOut, kIn});
    const Tensor w_up = upload(*be, random_normal(size_t(kOut * kIn), 2), {kOut, kIn});
    const Tensor x = upload(*be, random_normal(size_t(kTokens * kIn), 3), {kTokens, kIn});
    const Tensor dout = upload(*be, random_normal(size_t(kTokens * kOut), 4), {kTokens, kOut});
    Tensor gate = be->allocate("gate", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
    Tensor up = be->allocate("up", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
    be->projection_forward(*gate_state, c.gate_path, w_gate, x, gate, true, RngKey{});
    be->projection_forward(*up_state, c.up_path, w_up, x, up, true, RngKey{});
    const std::vector<float> poison(size_t(kTokens * kOut), 123.0f);
    Outputs fused, alone;  // dx, and dw holding dW_gate then dW_up
    std::vector<float> dgate_fused, dgate_alone;
    for (bool one_by_one : {false, true}) {
      Tensor dgate = upload(*be, poison, {kTokens, kOut}),
             dup = upload(*be, poison, {kTokens, kOut});
      Tensor dx = be->allocate("dx", {kTokens, kIn}, DType::F32, MemoryRole::Scratch);
      Tensor dw_gate = be->allocate("dw_gate", {kOut, kIn}, DType::F32, MemoryRole::Scratch);
      Tensor dw_up = be->allocate("dw_up", {kOut, kIn}, DType::F32, MemoryRole::Scratch);
      if (one_by_one) {
        be->swiglu_backward(gate, up, dout, dgate, dup);
        be->projection_backward(*gate_state, c.gate_path, w_gate, dgate, dx, false, dw_gate);
        be->projection_backward(*up_state, c.up_path, w_up, dup, dx, true, dw_up);
      } else {
        be->swiglu_projections_backward(gate, up, dout, dgate, dup,
                                        {*gate_state, c.gate_path, w_gate, dw_gate},
                                        {*up_state, c.up_path, w_up, dw_up}, dx);
      }
      Outputs& o = one_by_one ? alone : fused;
      o.dx = download(*be, dx);
      o.dw = download(*be, dw_gate);
      const std::vector<float> dw_up_host = download(*be, dw_up);
      o.dw.insert(o.dw.end(), dw_up_host.begin(), dw_up_host.end());
      (one_by_one ? dgate_alone : dgate_fused) = download(*be, dgate);
    }
    EXPECT_EQ(fused.dx, alone.dx);
    EXPECT_EQ(fused.dw, alone.dw);
    const auto& gs = dynamic_cast<const cuda::CudaProjectionState&>(*gate_state);
    const auto& us = dynamic_cast<const cuda::CudaProjectionState&>(*up_state);
    EXPECT_EQ(gs.computed_dy_backwards, c.fused ? 1 : 0);
    EXPECT_EQ(us.computed_dy_backwards, c.fused ? 1 : 0);
    // Fused, dgate is never written; else it is the SwiGLU backward's.
    EXPECT_EQ(dgate_fused, c.fused ? poison : dgate_alone);
    EXPECT_NE(dgate_alone, poison);
  }
}

// The MLP's forward (swiglu_projection_forward) for the down projection: where its forward
// rounds x to bf16, or its saving forward quantizes x to FP8 codes with x^T's kept ones, the
// SwiGLU runs in the kernel that does, which writes out too; elsewhere the SwiGLU and the
// projection run one after the other. Either way out, y and, after the backward, dx and dW are
// the bits of the two ops run one by one.
TEST(GpuProjection, TheMlpForwardRunsTheSwigluInTheKernelPreparingDownsInputWithTheSameBits) {
  SKIP_WITHOUT_GPU();
  const PathSpec fp8 = fp_path(FpFormat::kE4M3), e3m2 = fp_path(FpFormat::kE3M2),
                 e5m2 = fp_path(FpFormat::kE5M2), bf16 = path_of(PathKind::kBf16Gemm);
  struct MlpCase {
    const char* name;
    PathSpec path;
    bool save, fused;
  };
  const std::vector<MlpCase> cases = {{"e4m3, saving", fp8, true, true},
                                      {"e3m2, saving", e3m2, true, true},
                                      {"e4m3, not saving (eval)", fp8, false, false},
                                      {"bf16, saving", bf16, true, true},
                                      {"bf16, not saving (eval)", bf16, false, true},
                                      {"e5m2 (emulated), saving", e5m2, true, false}};
  using gnmr_test::random_normal;
  for (const MlpCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Backend> be = cuda_backend_fp32_gemms();
    std::unique_ptr<ProjectionState> down =
        be->plan_projection("down", ProjectionShape{kTokens, kIn, kOut}, fp8, c.path);
    const Tensor w = upload(*be, random_normal(size_t(kOut * kIn), 1), {kOut, kIn});
    const Tensor gate = upload(*be, random_normal(size_t(kTokens * kIn), 2), {kTokens, kIn});
    const Tensor up = upload(*be, random_normal(size_t(kTokens * kIn), 3), {kTokens, kIn});
    Tensor dy = upload(*be, random_normal(size_t(kTokens * kOut), 4), {kTokens, kOut});
    const std::vector<float> poison(size_t(kTokens * kIn), 123.0f);
    Outputs fused, alone;
    std::vector<float> out_fused, out_alone;
    for (bool one_by_one : {false, true}) {
      Tensor out = upload(*be, poison, {kTokens, kIn});
      Tensor y = be->allocate("y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
      Tensor dx = be->allocate("dx", {kTokens, kIn}, DType::F32, MemoryRole::Scratch);
      Tensor dw = be->allocate("dw", {kOut, kIn}, DType::F32, MemoryRole::Scratch);
      const RngKey key{7, 1, 2};
      if (one_by_one) {
        be->swiglu_forward(gate, up, out);
        be->projection_forward(*down, c.path, w, out, y, c.save, key);
      } else {
        be->swiglu_projection_forward(gate, up, out, {*down, c.path, w, key}, y, c.save);
      }
      Outputs& o = one_by_one ? alone : fused;
      o.y = download(*be, y);
      if (c.save) {
        be->projection_backward(*down, c.path, w, dy, dx, false, dw);
        o.dx = download(*be, dx);
        o.dw = download(*be, dw);
      }
      (one_by_one ? out_alone : out_fused) = download(*be, out);
    }
    EXPECT_EQ(out_fused, out_alone);
    EXPECT_NE(out_alone, poison);
    EXPECT_EQ(fused.y, alone.y);
    EXPECT_EQ(fused.dx, alone.dx);
    EXPECT_EQ(fused.dw, alone.dw);
    const auto& s = dynamic_cast<const cuda::CudaProjectionState&>(*down);
    EXPECT_EQ(s.computed_x_forwards, c.fused ? 1 : 0);
  }
}

// The paths the RMSNorm's fused ops are tested on, and whether the norm's kernel makes the
// projection's operand (bf16 x or dy) on each.
struct NormPathCase {
  const char* name;
  GemmPrecision gemms;
  PathSpec path;
  bool fused;
};
// A run's outputs by name, so two runs compare whole (expect_same_outputs).
using NamedOutputs = std::map<std::string, std::vector<float>>;
void download_into(Backend& be, NamedOutputs& outputs,
                   std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  for (const auto& [name, tensor] : tensors) outputs[name] = download(be, *tensor);
}
void expect_same_outputs(const NamedOutputs& fused, const NamedOutputs& alone) {
  ASSERT_EQ(fused.size(), alone.size());
  for (const auto& [name, values] : alone) EXPECT_EQ(fused.at(name), values) << name;
}

std::vector<NormPathCase> norm_path_cases() {
  return {{"bf16 path", GemmPrecision::FP32, path_of(PathKind::kBf16Gemm), true},
          {"backend GEMMs in bf16", GemmPrecision::BF16, path_of(PathKind::kBackendGemm), true},
          {"backend GEMMs in fp32", GemmPrecision::FP32, path_of(PathKind::kBackendGemm), false},
          {"e4m3 (FP8 operands)", GemmPrecision::FP32, fp_path(FpFormat::kE4M3), false}};
}

// The residual RMSNorm before attention and the MLP (residual_rmsnorm_projection_forward) with
// the group's leader (q, gate) and a second projection reading the norm's output: where the
// leader's forward rounds x to bf16, the norm's kernel writes the bf16 copy beside out (the
// group's kept copy, which the follower and both weight gradients then read, or the scratch);
// elsewhere the norm and the projection run one after the other. Either way sum, out, rstd,
// both y and, after the backwards, dx and both dW are the bits of the ops run one by one.
TEST(GpuProjection, TheNormBeforeAGroupWritesItsLeadersBf16XInItsPassWithTheSameBits) {
  SKIP_WITHOUT_GPU();
  using gnmr_test::random_normal;
  for (const NormPathCase& c : norm_path_cases()) {
    for (const bool save : {true, false}) {  // false: an evaluation's forward
      SCOPED_TRACE(testing::Message() << c.name << (save ? ", saving" : ", not saving"));
      std::unique_ptr<Backend> be = cuda_backend_fp32_gemms();
      be->set_gemm_precision(c.gemms);
      ProjectionShape shape{kTokens, kIn, kOut};
      std::unique_ptr<ProjectionState> leader = be->plan_projection("q", shape, c.path, c.path);
      shape.input_leader = leader.get();
      std::unique_ptr<ProjectionState> follower = be->plan_projection("k", shape, c.path, c.path);
      const Tensor w_leader = upload(*be, random_normal(size_t(kOut * kIn), 1), {kOut, kIn});
      const Tensor w_follower = upload(*be, random_normal(size_t(kOut * kIn), 2), {kOut, kIn});
      const Tensor a = upload(*be, random_normal(size_t(kTokens * kIn), 3), {kTokens, kIn});
      const Tensor b = upload(*be, random_normal(size_t(kTokens * kIn), 4), {kTokens, kIn});
      const Tensor norm_w = upload(*be, random_normal(size_t(kIn), 5), {kIn});
      Tensor dy = upload(*be, random_normal(size_t(kTokens * kOut), 6), {kTokens, kOut});
      const std::vector<float> poison(size_t(kTokens * kIn), 123.0f);
      NamedOutputs fused, alone;
      for (bool one_by_one : {false, true}) {
        Tensor sum = upload(*be, poison, {kTokens, kIn});
        Tensor out = upload(*be, poison, {kTokens, kIn});
        Tensor rstd = upload(*be, std::vector<float>(size_t(kTokens), 123.0f), {kTokens});
        Tensor y_leader = be->allocate("yq", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
        Tensor y_follower = be->allocate("yk", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
        Tensor dx = be->allocate("dx", {kTokens, kIn}, DType::F32, MemoryRole::Scratch);
        Tensor dw_leader = be->allocate("dwq", {kOut, kIn}, DType::F32, MemoryRole::Scratch);
        Tensor dw_follower = be->allocate("dwk", {kOut, kIn}, DType::F32, MemoryRole::Scratch);
        const RngKey key{7, 1, 2};
        if (one_by_one) {
          be->residual_rmsnorm_forward(a, b, sum, norm_w, 1e-5f, out, rstd);
          be->projection_forward(*leader, c.path, w_leader, out, y_leader, save, key);
        } else {
          be->residual_rmsnorm_projection_forward(a, b, sum, norm_w, 1e-5f, out, rstd,
                                                  {*leader, c.path, w_leader, key}, y_leader, save);
        }
        be->projection_forward(*follower, c.path, w_follower, out, y_follower, save, key);
        NamedOutputs& r = one_by_one ? alone : fused;
        if (save) {  // the follower's backward first, as the model runs them (v, k, then q)
          be->projection_backward(*follower, c.path, w_follower, dy, dx, false, dw_follower);
          be->projection_backward(*leader, c.path, w_leader, dy, dx, true, dw_leader);
          download_into(*be, r, {{"dx", &dx}, {"dw q", &dw_leader}, {"dw k", &dw_follower}});
        }
        download_into(*be, r,
                      {{"sum", &sum},
                       {"out", &out},
                       {"rstd", &rstd},
                       {"y q", &y_leader},
                       {"y k", &y_follower}});
      }
      expect_same_outputs(fused, alone);
      EXPECT_NE(alone.at("out"), poison);
      const auto& ls = dynamic_cast<const cuda::CudaProjectionState&>(*leader);
      const auto& fs = dynamic_cast<const cuda::CudaProjectionState&>(*follower);
      EXPECT_EQ(ls.computed_x_forwards, c.fused ? 1 : 0);
      EXPECT_EQ(fs.computed_x_forwards, 0);
      // The follower prepared no x of its own where the leader's was bf16: it found the copy.
      if (c.fused) {
        EXPECT_EQ(fs.x_prepared, 0);
      }
    }
  }
}

// The RMSNorm's backward and the backward of the projection whose output its residual add took
// (rmsnorm_projection_backward: o, down): where the path's one form of dy is bf16, the norm's
// kernel writes it beside dx, which the projection's GEMMs read; elsewhere the norm's backward
// and the projection's run one after the other. Either way dx, the norm's dweight and the
// projection's d_in and dW are the bits of the two ops run one by one.
TEST(GpuProjection, TheNormBackwardWritesTheProjectionsBf16DyInItsPassWithTheSameBits) {
  SKIP_WITHOUT_GPU();
  using gnmr_test::random_normal;
  for (const NormPathCase& c : norm_path_cases()) {
    for (const bool accumulate : {false, true}) {  // d_in overwritten, or added to
      SCOPED_TRACE(testing::Message() << c.name << (accumulate ? ", d_in +=" : ", d_in ="));
      std::unique_ptr<Backend> be = cuda_backend_fp32_gemms();
      be->set_gemm_precision(c.gemms);
      std::unique_ptr<ProjectionState> proj =
          be->plan_projection("o", ProjectionShape{kTokens, kIn, kOut}, c.path, c.path);
      const Tensor w = upload(*be, random_normal(size_t(kOut * kIn), 1), {kOut, kIn});
      const Tensor x = upload(*be, random_normal(size_t(kTokens * kIn), 2), {kTokens, kIn});
      // The norm reads the projection's output side: rows of kOut.
      const Tensor norm_x = upload(*be, random_normal(size_t(kTokens * kOut), 3), {kTokens, kOut});
      const Tensor norm_w = upload(*be, random_normal(size_t(kOut), 4), {kOut});
      const Tensor dout = upload(*be, random_normal(size_t(kTokens * kOut), 5), {kTokens, kOut});
      Tensor xn = be->allocate("xn", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
      Tensor rstd = be->allocate("rstd", {kTokens}, DType::F32, MemoryRole::Scratch);
      be->rmsnorm_forward(norm_x, norm_w, 1e-5f, xn, rstd);
      NamedOutputs fused, alone;
      for (bool one_by_one : {false, true}) {
        Tensor y = be->allocate("y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
        be->projection_forward(*proj, c.path, w, x, y, true, RngKey{7, 1, 2});
        Tensor dx = upload(*be, random_normal(size_t(kTokens * kOut), 6), {kTokens, kOut});
        Tensor dweight = upload(*be, random_normal(size_t(kOut), 7), {kOut});
        Tensor d_in = upload(*be, random_normal(size_t(kTokens * kIn), 8), {kTokens, kIn});
        Tensor dw = upload(*be, random_normal(size_t(kOut * kIn), 9), {kOut, kIn});
        if (one_by_one) {
          be->rmsnorm_backward(norm_x, norm_w, rstd, dout, dx, dweight);
          be->projection_backward(*proj, c.path, w, dx, d_in, accumulate, dw);
        } else {
          be->rmsnorm_projection_backward(norm_x, norm_w, rstd, dout, dx, dweight,
                                          {*proj, c.path, w, dw}, d_in, accumulate);
        }
        download_into(*be, one_by_one ? alone : fused,
                      {{"dx", &dx}, {"dweight", &dweight}, {"d_in", &d_in}, {"dw", &dw}});
      }
      expect_same_outputs(fused, alone);
      const auto& ps = dynamic_cast<const cuda::CudaProjectionState&>(*proj);
      EXPECT_EQ(ps.computed_dy_backwards, c.fused ? 1 : 0);
    }
  }
}

// The loss and the lm_head's backward (cross_entropy_projection_backward): where the lm_head's
// one form of dy is bf16, the loss's kernel writes the gradient only as bf16 (logits keeps the
// logits); elsewhere the loss's forward-backward and the projection's backward run one after
// the other. Either way the losses, dx and dW are the bits of the two ops run one by one.
TEST(GpuProjection, TheLossWritesTheLmHeadsBf16DyInItsPassWithTheSameBits) {
  SKIP_WITHOUT_GPU();
  using gnmr_test::random_normal;
  for (const NormPathCase& c : norm_path_cases()) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Backend> be = cuda_backend_fp32_gemms();
    be->set_gemm_precision(c.gemms);
    ProjectionShape shape{kTokens, kIn, kOut};  // kOut: the vocabulary
    shape.backward_may_overwrite_dy = true;     // as the model plans the lm_head
    shape.input_read_elsewhere = true;
    std::unique_ptr<ProjectionState> head = be->plan_projection("lm_head", shape, c.path, c.path);
    const Tensor w = upload(*be, random_normal(size_t(kOut * kIn), 1), {kOut, kIn});
    const Tensor x = upload(*be, random_normal(size_t(kTokens * kIn), 2), {kTokens, kIn});
    std::vector<int32_t> target_ids(static_cast<size_t>(kTokens));
    for (size_t i = 0; i < target_ids.size(); ++i) target_ids[i] = int32_t((i * 37 + 5) % kOut);
    target_ids[3] = -1;  // an ignored position: a zero gradient row
    Tensor targets = be->allocate("targets", {kTokens}, DType::I32, MemoryRole::Scratch);
    be->copy_from_host(targets, target_ids.data());
    NamedOutputs fused, alone;
    for (bool one_by_one : {false, true}) {
      Tensor logits = be->allocate("logits", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
      be->projection_forward(*head, c.path, w, x, logits, true, RngKey{});
      Tensor losses = be->allocate("losses", {kTokens}, DType::F32, MemoryRole::Scratch);
      Tensor dx = upload(*be, random_normal(size_t(kTokens * kIn), 3), {kTokens, kIn});
      Tensor dw = upload(*be, random_normal(size_t(kOut * kIn), 4), {kOut, kIn});
      const float dloss = 1.0f / 255.0f;
      if (one_by_one) {
        be->cross_entropy_forward_backward(logits, targets, losses, dloss);
        be->projection_backward(*head, c.path, w, logits, dx, false, dw);
      } else {
        be->cross_entropy_projection_backward(logits, targets, losses, dloss,
                                              {*head, c.path, w, dw}, dx);
      }
      download_into(*be, one_by_one ? alone : fused,
                    {{"losses", &losses}, {"dx", &dx}, {"dw", &dw}});
    }
    expect_same_outputs(fused, alone);
    const auto& hs = dynamic_cast<const cuda::CudaProjectionState&>(*head);
    EXPECT_EQ(hs.computed_dy_backwards, c.fused ? 1 : 0);
  }
}

// The attention backward's rope_projection_backward for q or k: where the path makes one form
// of dy (bf16; FP8 codes for head dims 64 and 128), the kernel making it rotates dy back as it
// reads it and leaves it unrotated; elsewhere RoPE's backward runs in place, then the
// projection's. Either way dx (accumulated) and dW are the bits of the two ops one by one.
TEST(GpuProjection, TheAttentionBackwardRotatesDyInTheKernelPreparingItWithTheSameBits) {
  SKIP_WITHOUT_GPU();
  const PathSpec fp8 = fp_path(FpFormat::kE4M3), e3m2 = fp_path(FpFormat::kE3M2),
                 e5m2 = fp_path(FpFormat::kE5M2), bf16 = path_of(PathKind::kBf16Gemm);
  struct RopeCase {
    const char* name;
    PathSpec path;
    int64_t hd;
    bool fused;
  };
  const std::vector<RopeCase> cases = {{"e4m3, hd 64", fp8, 64, true},
                                       {"e3m2, hd 128", e3m2, 128, true},
                                       {"e4m3, hd 32 (pairs across lanes)", fp8, 32, false},
                                       {"bf16, hd 64", bf16, 64, true},
                                       {"bf16, hd 32", bf16, 32, true},
                                       {"e5m2 (emulated: dy per GEMM), hd 64", e5m2, 64, false}};
  using gnmr_test::random_normal;
  constexpr int64_t kBatch = 2, kSeq = kTokens / kBatch;
  for (const RopeCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Backend> be = cuda_backend_fp32_gemms();
    std::unique_ptr<ProjectionState> state =
        be->plan_projection("q", ProjectionShape{kTokens, kIn, kOut}, c.path, c.path);
    const Tensor w = upload(*be, random_normal(size_t(kOut * kIn), 1), {kOut, kIn});
    const Tensor x = upload(*be, random_normal(size_t(kTokens * kIn), 2), {kTokens, kIn});
    Tensor y = be->allocate("y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
    be->projection_forward(*state, c.path, w, x, y, true, RngKey{});
    std::vector<float> cos_host, sin_host;
    compute_rope_table(10000.0f, static_cast<int>(c.hd), static_cast<int>(kSeq + 5), cos_host,
                       sin_host);
    const Tensor cos = upload(*be, cos_host, {kSeq + 5, c.hd / 2});
    const Tensor sin = upload(*be, sin_host, {kSeq + 5, c.hd / 2});
    const std::vector<float> dy_host = random_normal(size_t(kTokens * kOut), 3);
    const std::vector<int64_t> heads_shape = {kBatch, kSeq, kOut / c.hd, c.hd};
    Outputs fused, alone;  // dx and dw
    std::vector<float> dy_fused, dy_alone;
    for (bool one_by_one : {false, true}) {
      Tensor dy = upload(*be, dy_host, heads_shape);
      Tensor dx = upload(*be, random_normal(size_t(kTokens * kIn), 4), {kTokens, kIn});
      Tensor dw = be->allocate("dw", {kOut, kIn}, DType::F32, MemoryRole::Scratch);
      if (one_by_one) {
        be->rope_backward(dy, cos, sin);
        be->projection_backward(*state, c.path, w, dy, dx, true, dw);
      } else {
        be->rope_projection_backward(dy, cos, sin, {*state, c.path, w, dw}, dx, true);
      }
      Outputs& o = one_by_one ? alone : fused;
      o.dx = download(*be, dx);
      o.dw = download(*be, dw);
      (one_by_one ? dy_alone : dy_fused) = download(*be, dy);
    }
    EXPECT_EQ(fused.dx, alone.dx);
    EXPECT_EQ(fused.dw, alone.dw);
    const auto& s = dynamic_cast<const cuda::CudaProjectionState&>(*state);
    EXPECT_EQ(s.computed_dy_backwards, c.fused ? 1 : 0);
    EXPECT_EQ(dy_fused, c.fused ? dy_host : dy_alone);  // fused: left unrotated
    EXPECT_NE(dy_alone, dy_host);
  }
}

// Backend::prepare_projection_weights: the FP8 weights among the projections (e4m3, e3m2) are
// quantized in one batch before any GEMM, and the GEMMs read those codes: W written after the
// batch (without invalidate_prepared_weights, which no caller may do) leaves y and dx those of
// the W the batch read, while the paths it leaves to first use (bf16; e5m2, emulated) read the
// new W. A new weights epoch makes them again. y, dx and dW are the bits of a run without it.
TEST(GpuProjection, PreparedWeightsAreQuantizedInOneBatchAndTheGemmsReadThoseCodes) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::pair<PathSpec, bool>> paths = {{fp_path(FpFormat::kE4M3), true},
                                                        {fp_path(FpFormat::kE3M2), true},
                                                        {path_of(PathKind::kBf16Gemm), false},
                                                        {fp_path(FpFormat::kE5M2), false}};
  using gnmr_test::random_normal;
  std::unique_ptr<Backend> be = cuda_backend_fp32_gemms();
  const Tensor x = upload(*be, random_normal(size_t(kTokens * kIn), 2), {kTokens, kIn});
  Tensor dy = upload(*be, random_normal(size_t(kTokens * kOut), 3), {kTokens, kOut});
  std::vector<std::unique_ptr<ProjectionState>> states;
  std::vector<Tensor> w;
  for (size_t i = 0; i < paths.size(); ++i) {
    states.push_back(be->plan_projection("unit" + std::to_string(i),
                                         ProjectionShape{kTokens, kIn, kOut}, paths[i].first,
                                         paths[i].first));
    w.push_back(upload(*be, random_normal(size_t(kOut * kIn), 10 + uint32_t(i)), {kOut, kIn}));
  }
  auto run_all = [&] {
    std::vector<Outputs> out;
    for (size_t i = 0; i < paths.size(); ++i) {
      Tensor y = be->allocate("y", {kTokens, kOut}, DType::F32, MemoryRole::Scratch);
      Tensor dx = be->allocate("dx", {kTokens, kIn}, DType::F32, MemoryRole::Scratch);
      Tensor dw = be->allocate("dw", {kOut, kIn}, DType::F32, MemoryRole::Scratch);
      be->projection_forward(*states[i], paths[i].first, w[i], x, y, true, RngKey{7, 1, 2});
      be->projection_backward(*states[i], paths[i].first, w[i], dy, dx, false, dw);
      out.push_back({download(*be, y), download(*be, dx), download(*be, dw)});
    }
    return out;
  };
  auto prepare = [&] {
    std::vector<ProjectionWeight> weights;
    for (size_t i = 0; i < paths.size(); ++i) weights.push_back({*states[i], paths[i].first, w[i]});
    be->prepare_projection_weights(weights);
  };
  auto batched = [&](size_t i) {
    return dynamic_cast<const cuda::CudaProjectionState&>(*states[i]).weights_prepared_in_batch;
  };
  const std::vector<Outputs> alone = run_all();  // each weight prepared by its forward

  be->invalidate_prepared_weights();
  prepare();
  for (size_t i = 0; i < paths.size(); ++i) EXPECT_EQ(batched(i), paths[i].second ? 1 : 0) << i;
  for (size_t i = 0; i < paths.size(); ++i) {
    be->copy_from_host(w[i], random_normal(size_t(kOut * kIn), 20 + uint32_t(i)).data());
  }
  const std::vector<Outputs> after = run_all();
  for (size_t i = 0; i < paths.size(); ++i) {
    SCOPED_TRACE(paths[i].first.describe());
    EXPECT_EQ(after[i].dw, alone[i].dw);  // the weight gradient reads no W
    if (paths[i].second) {
      EXPECT_EQ(after[i].y, alone[i].y);
      EXPECT_EQ(after[i].dx, alone[i].dx);
    } else {
      EXPECT_NE(after[i].y, alone[i].y);
    }
  }
  prepare();  // the same epoch: nothing to make
  for (size_t i = 0; i < paths.size(); ++i) EXPECT_EQ(batched(i), paths[i].second ? 1 : 0) << i;

  be->invalidate_prepared_weights();
  prepare();
  for (size_t i = 0; i < paths.size(); ++i) EXPECT_EQ(batched(i), paths[i].second ? 2 : 0) << i;
  const std::vector<Outputs> remade = run_all();
  for (size_t i = 0; i < paths.size(); ++i) EXPECT_NE(remade[i].y, alone[i].y) << i;
}

}  // namespace
}  // namespace gnmr
