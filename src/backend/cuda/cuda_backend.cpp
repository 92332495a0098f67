// CudaBackend (cuda_backend.h): each op checks shapes on the host (tensor_checks.h), then
// queues its kernel (kernels/*.cuh) or cuBLASLt matmul on the backend's stream.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_projection.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/device_probe.h"
#include "backend/cuda/op_timer.h"
#include "backend/embedding_index.h"
#include "backend/tensor_checks.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/model_ops.cuh"
#include "kernels/quantize.cuh"
#include "kernels/train_ops.cuh"
#include "util/error.h"
#include "util/splitmix64.h"

namespace gnmr {

namespace {

// Host-to-device uploads go through pinned staging slots, so copy_from_host returns at once
// (the caller's buffer is copied before it returns) without waiting for the GPU. A slot is
// reused after kStagingSlots further uploads, once its event says its copy is done: with a
// step's few uploads per micro-batch that copy finished long before. (The host still waits
// there when a window has more than 5 micro-steps of 3 uploads each; a wait on copies queued
// micro-steps ago, not on the step.) Uploads over kMaxStagedBytes (weights and optimizer state
// at start-up, never a step's tokens) are copied straight from the caller's memory and waited
// for instead, so the slots never hold more than 16 x 16 MiB of pinned memory for the run.
constexpr int kStagingSlots = 16;
constexpr size_t kMaxStagedBytes = size_t{16} << 20;

struct StagingSlot {
  void* host = nullptr;  // pinned
  size_t bytes = 0;
  cudaEvent_t done = nullptr;
};

int64_t last_dim(const Tensor& t) {
  return matrix_cols(t);
}

class CudaBackend final : public Backend {
 public:
  int device_index() const { return device_index_; }
  cudaStream_t stream() const { return stream_; }

  explicit CudaBackend(const CudaBackendOptions& options) : memory_(options.poison) {
    const CudaDeviceProbe probe = probe_cuda_device(options.device);
    if (!probe.usable) {
      throw Error(ErrorKind::Runtime, "cuda backend: " + probe.problem +
                                          "; use backend=cpu on a machine without a usable GPU");
    }
    GNMR_CUDA_CHECK(cudaSetDevice(options.device));
    device_index_ = options.device;
    cudaDeviceProp prop{};
    GNMR_CUDA_CHECK(cudaGetDeviceProperties(&prop, options.device));
    target_.compute_capability = prop.major * 10 + prop.minor;
    device_name_ = probe.device;
    // A blocking stream: it orders after the synchronous cudaMemset of each allocation
    // (issued on the legacy default stream).
    GNMR_CUDA_CHECK(cudaStreamCreate(&stream_));
    op_timer_ = std::make_unique<cuda::OpTimer>(stream_);
    gemm_ = std::make_unique<LtGemmRunner>();
    attention_ = std::make_unique<cuda::CudaAttentionOps>(
        options, options.device, int64_t(prop.sharedMemPerBlockOptin), *gemm_);
    for (StagingSlot& slot : staging_) {
      GNMR_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    }
  }

  // Destroy calls have nothing actionable to report from a destructor.
  ~CudaBackend() override {
    if (stream_) cudaStreamSynchronize(stream_);
    for (StagingSlot& slot : staging_) {
      if (slot.host) cudaFreeHost(slot.host);
      if (slot.done) cudaEventDestroy(slot.done);
    }
    attention_.reset();
    gemm_.reset();
    op_timer_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  std::string device() const override { return device_name_; }

  // ---- memory ----
  Tensor allocate(const std::string& name, std::vector<int64_t> shape, DType dtype,
                  MemoryRole role) override {
    Tensor t = allocate_tensor(memory_, name, std::move(shape), dtype, role);
    if (dtype == DType::I32) {
      // Token ids: room for the embedding index of a batch of this size (embedding_backward:
      // at most n unique tokens, their n + 1 offsets, n positions), and staging slots that
      // hold it, the largest upload of a step.
      const size_t index_bytes = sizeof(int32_t) * size_t(3 * t.numel() + 1);
      embedding_index_.reserve(memory_, index_bytes);
      reserve_staging(index_bytes);
    }
    return t;
  }
  MemoryUse memory_use() const override {
    MemoryUse use = memory_.use();
    use.bytes[static_cast<int>(MemoryRole::Scratch)] += LtGemmRunner::kWorkspaceBytes;
    return use;
  }
  size_t peak_allocated_bytes() const override {
    return memory_.peak() + LtGemmRunner::kWorkspaceBytes;
  }

  void copy_to_host(const Tensor& src, void* host) override {
    ++sync_count_;
    if (src.bytes() > 0) {
      GNMR_CUDA_CHECK(
          cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_));
    }
    GNMR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy_from_host(Tensor& dst, const void* host) override {
    const auto timing = time_op("copy");
    if (dst.bytes() == 0) return;
    if (dst.dtype == DType::I32) {  // token ids: the embedding backward indexes them on the host
      auto& mirror = host_tokens_[dst.data];
      mirror.resize(size_t(dst.numel()));
      std::memcpy(mirror.data(), host, dst.bytes());
    }
    upload(dst.data, host, dst.bytes());
  }
  void copy(const Tensor& src, Tensor& dst) override {
    const auto timing = time_op("copy");
    GNMR_CHECK(src.bytes() == dst.bytes() && src.dtype == dst.dtype, "copy: tensors differ");
    if (src.bytes() > 0) {
      GNMR_CUDA_CHECK(
          cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, stream_));
    }
  }
  void fill_zero(Tensor& t) override {
    const auto timing = time_op("copy");
    if (t.bytes() > 0) GNMR_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.bytes(), stream_));
  }
  void synchronize() override {
    ++sync_count_;
    GNMR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  int64_t sync_count() const override { return sync_count_; }
  void set_op_timing(bool on) override { op_timer_->set_enabled(on); }
  std::map<std::string, double> op_times_ms() override {
    ++sync_count_;
    return op_timer_->totals_ms();
  }

  // ---- model ops ----
  void embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) override {
    const auto timing = time_op("embedding");
    const int64_t n = tokens.numel(), d = last_dim(table);
    GNMR_CHECK(out.numel() == n * d, "embedding_forward: out " + out.shape_string());
    cuda::embedding_forward(i32_data(tokens), f32_data(table), f32_data(out), n, d, stream_);
  }
  void embedding_backward(const Tensor& tokens, const Tensor& dout, Tensor& dtable) override {
    const auto timing = time_op("embedding");
    const int64_t n = tokens.numel(), d = last_dim(dtable);
    GNMR_CHECK(dout.numel() == n * d, "embedding_backward: dout " + dout.shape_string());
    auto it = host_tokens_.find(tokens.data);
    GNMR_CHECK(it != host_tokens_.end() && int64_t(it->second.size()) == n,
               "embedding_backward: the tokens were not uploaded with copy_from_host");
    const EmbeddingIndex index = make_embedding_index(it->second.data(), n);
    // One upload: [unique tokens | offsets | positions].
    std::vector<int32_t> packed;
    packed.reserve(index.tokens.size() + index.offsets.size() + index.positions.size());
    packed.insert(packed.end(), index.tokens.begin(), index.tokens.end());
    packed.insert(packed.end(), index.offsets.begin(), index.offsets.end());
    packed.insert(packed.end(), index.positions.begin(), index.positions.end());
    auto* device = static_cast<int32_t*>(embedding_index_.data);
    GNMR_CHECK(device != nullptr && packed.size() * sizeof(int32_t) <= embedding_index_.bytes,
               "embedding_backward: index buffer too small");
    upload(device, packed.data(), packed.size() * sizeof(int32_t));
    const int64_t unique = int64_t(index.tokens.size());
    cuda::embedding_backward(device, device + unique, device + 2 * unique + 1, unique,
                             f32_data(dout), f32_data(dtable), d, stream_);
  }

  void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                       Tensor& rstd) override {
    const auto timing = time_op("rmsnorm");
    const int64_t n = matrix_rows(x), d = matrix_cols(x);
    GNMR_CHECK(weight.numel() == d && rstd.numel() == n, "rmsnorm_forward: shapes");
    check_same_numel(x, out, "rmsnorm_forward");
    cuda::rmsnorm_forward(f32_data(x), f32_data(weight), eps, f32_data(out), f32_data(rstd), n, d,
                          stream_);
  }
  // The residual add in the RMSNorm kernel's pass over each row: a, b read once, the sum written
  // and not read back from memory (timed as rmsnorm).
  void residual_rmsnorm_forward(const Tensor& a, const Tensor& b, Tensor& sum, const Tensor& weight,
                                float eps, Tensor& out, Tensor& rstd) override {
    const auto timing = time_op("rmsnorm");
    launch_residual_rmsnorm_forward("residual_rmsnorm_forward", a, b, sum, weight, eps, out, rstd,
                                    nullptr);
  }
  void rmsnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        const Tensor& dout, Tensor& dx, Tensor& dweight) override {
    const auto timing = time_op("rmsnorm");
    launch_rmsnorm_backward("rmsnorm_backward", x, weight, rstd, dout, dx, dweight, nullptr);
  }
  // The kernels of the two ops above, and of the fused ops that take them, after checking the
  // shapes (errors name `op`); out_bf16, dx_bf16: the bf16 copies as cuda::residual_rmsnorm_forward
  // and cuda::rmsnorm_backward write them, or null.
  void launch_residual_rmsnorm_forward(const char* op, const Tensor& a, const Tensor& b,
                                       Tensor& sum, const Tensor& weight, float eps, Tensor& out,
                                       Tensor& rstd, uint16_t* out_bf16) {
    const int64_t n = matrix_rows(a), d = matrix_cols(a);
    GNMR_CHECK(weight.numel() == d && rstd.numel() == n, std::string(op) + ": shapes");
    check_same_numel(a, b, op);
    check_same_numel(a, sum, op);
    check_same_numel(a, out, op);
    cuda::residual_rmsnorm_forward(f32_data(a), f32_data(b), f32_data(sum), f32_data(weight), eps,
                                   f32_data(out), f32_data(rstd), n, d, stream_, out_bf16);
  }
  void launch_rmsnorm_backward(const char* op, const Tensor& x, const Tensor& weight,
                               const Tensor& rstd, const Tensor& dout, Tensor& dx, Tensor& dweight,
                               uint16_t* dx_bf16) {
    const int64_t n = matrix_rows(x), d = matrix_cols(x);
    GNMR_CHECK(weight.numel() == d && dweight.numel() == d && rstd.numel() == n,
               std::string(op) + ": shapes");
    check_same_numel(x, dout, op);
    check_same_numel(x, dx, op);
    auto* ws = static_cast<float*>(rmsnorm_workspace_.reserve(
        memory_, sizeof(float) * size_t(cuda::rmsnorm_backward_workspace_floats(n, d))));
    cuda::rmsnorm_backward(f32_data(x), f32_data(weight), f32_data(rstd), f32_data(dout),
                           f32_data(dx), f32_data(dweight), n, d, ws, stream_, dx_bf16);
  }

  using Backend::matmul_backward_input;
  using Backend::matmul_backward_weight;
  using Backend::matmul_forward;

  // The plain GEMMs: a projection with no plan of its own (kBackendGemm at `precision`), its
  // bf16 operands rounded into the shared scratch on every call.
  void matmul_forward(const Tensor& x, const Tensor& weight, Tensor& y,
                      GemmPrecision precision) override {
    const auto timing = time_op("gemm");
    const int64_t n = matrix_rows(x), in = matrix_cols(x), out = matrix_rows(weight);
    GNMR_CHECK(matrix_cols(weight) == in && y.numel() == n * out,
               "matmul_forward: x " + x.shape_string() + ", W " + weight.shape_string() + ", y " +
                   y.shape_string());
    const GemmPlan plan =
        plan_gemm(GemmRole::kForward, n, in, out, PathSpec{}, precision, target_, false);
    gemm_->run(plan, gemm_input(weight, precision, matmul_a_), nullptr,
               gemm_input(x, precision, matmul_b_), nullptr, f32_data(y), stream_);
  }
  void matmul_backward_input(const Tensor& dy, const Tensor& weight, Tensor& dx, bool accumulate,
                             GemmPrecision precision) override {
    const auto timing = time_op("gemm");
    const int64_t n = matrix_rows(dy), out = matrix_cols(dy), in = matrix_cols(weight);
    GNMR_CHECK(matrix_rows(weight) == out && dx.numel() == n * in,
               "matmul_backward_input: dy " + dy.shape_string() + ", W " + weight.shape_string() +
                   ", dx " + dx.shape_string());
    const GemmPlan plan =
        plan_gemm(GemmRole::kInputGradient, n, in, out, PathSpec{}, precision, target_, accumulate);
    gemm_->run(plan, gemm_input(weight, precision, matmul_a_), nullptr,
               gemm_input(dy, precision, matmul_b_), nullptr, f32_data(dx), stream_);
  }
  void matmul_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dweight,
                              GemmPrecision precision) override {
    const auto timing = time_op("gemm");
    const int64_t n = matrix_rows(x), in = matrix_cols(x), out = matrix_cols(dy);
    GNMR_CHECK(matrix_rows(dy) == n && dweight.numel() == out * in,
               "matmul_backward_weight: x " + x.shape_string() + ", dy " + dy.shape_string() +
                   ", dW " + dweight.shape_string());
    const GemmPlan plan =
        plan_gemm(GemmRole::kWeightGradient, n, in, out, PathSpec{}, precision, target_, true);
    gemm_->run(plan, gemm_input(x, precision, matmul_a_), nullptr,
               gemm_input(dy, precision, matmul_b_), nullptr, f32_data(dweight), stream_);
  }

  // ---- projections ----
  std::unique_ptr<ProjectionState> plan_projection(const std::string& name,
                                                   const ProjectionShape& shape,
                                                   const PathSpec& low,
                                                   const PathSpec& recovery) override {
    // Every RMSNorm output is some projection's input [tokens, in], so its backward's
    // workspace is sized here, before the first step.
    rmsnorm_workspace_.reserve(
        memory_,
        sizeof(float) * size_t(cuda::rmsnorm_backward_workspace_floats(shape.tokens, shape.in)));
    return cuda::plan_projection(projection_context(), name, shape, low, recovery);
  }
  void projection_forward(ProjectionState& state, const PathSpec& path, const Tensor& w,
                          const Tensor& x, Tensor& y, bool save, const RngKey& key) override {
    cuda::projection_forward(projection_context(), cuda_state(state), path, w, x, y, save, key);
  }
  void projection_backward(ProjectionState& state, const PathSpec& path, const Tensor& w,
                           Tensor& dy, Tensor& dx, bool accumulate_dx, Tensor& dw) override {
    cuda::projection_backward(projection_context(), cuda_state(state), path, w, dy, dx,
                              accumulate_dx, dw);
  }
  // Where the down projection's forward rounds x to bf16, or its saving forward makes x's FP8
  // codes and x^T's, the SwiGLU runs in the kernel that does (cuda::ComputedX), which writes out
  // too.
  void swiglu_projection_forward(const Tensor& gate, const Tensor& up, Tensor& out,
                                 const ProjectionForwardCall& down, Tensor& y, bool save) override {
    const cuda::ProjectionContext c = projection_context();
    cuda::CudaProjectionState& s = cuda_state(down.state);
    check_same_numel(gate, up, "swiglu_projection_forward");
    check_same_numel(gate, out, "swiglu_projection_forward");
    const float *g = f32_data(gate), *u = f32_data(up);
    float* o = f32_data(out);
    const int64_t n = matrix_rows(out), in = matrix_cols(out);
    cudaStream_t stream = stream_;
    cuda::ComputedX x;
    x.bf16 = [=](uint16_t* bf16) { cuda::swiglu_forward_with_bf16(g, u, o, bf16, n * in, stream); };
    if (cuda::fused_pair_takes(down.path.format, in, {g, u, o})) {
      x.fp8_pair = [=](FpFormat format, uint8_t* codes, float* scales, uint8_t* codes_t,
                       float* scales_t) {
        cuda::quantize_swiglu_output_1x128_and_transposed(g, u, o, n, in, format, codes, scales,
                                                          codes_t, scales_t, stream);
      };
    }
    if (!cuda::forward_takes_computed_x(c, s, down.path, save, x)) {
      Backend::swiglu_projection_forward(gate, up, out, down, y, save);
      return;
    }
    cuda::projection_forward(c, s, down.path, down.w, out, y, save, down.key, &x);
  }
  // Where the first projection reading the norm's output rounds x to bf16, the norm's kernel
  // writes the bf16 copy beside out (cuda::ComputedX): a read of out fewer. Its time is then
  // the projection's "prep x".
  void residual_rmsnorm_projection_forward(const Tensor& a, const Tensor& b, Tensor& sum,
                                           const Tensor& weight, float eps, Tensor& out,
                                           Tensor& rstd, const ProjectionForwardCall& first,
                                           Tensor& y, bool save) override {
    const cuda::ProjectionContext c = projection_context();
    cuda::CudaProjectionState& s = cuda_state(first.state);
    cuda::ComputedX x;
    x.bf16 = [&](uint16_t* bf16) {
      launch_residual_rmsnorm_forward("residual_rmsnorm_projection_forward", a, b, sum, weight, eps,
                                      out, rstd, bf16);
    };
    if (!cuda::forward_takes_computed_x(c, s, first.path, save, x)) {
      Backend::residual_rmsnorm_projection_forward(a, b, sum, weight, eps, out, rstd, first, y,
                                                   save);
      return;
    }
    cuda::projection_forward(c, s, first.path, first.w, out, y, save, first.key, &x);
  }
  // Whether a projection's backward on `path` takes `dy` (cuda::ComputedDy): where both its
  // GEMMs read one form of dy and `dy` offers that form (the backward's forward_takes_computed_x).
  // A producer offers FP8's pair only where its kernel takes the arrays (fused_pair_takes).
  bool takes_computed_dy(const cuda::ProjectionContext& c, cuda::CudaProjectionState& s,
                         const PathSpec& path, bool accumulate, const cuda::ComputedDy& dy) const {
    switch (cuda::backward_dy_preparation_of(c, s, path, accumulate)) {
      case DyPreparation::kBf16Once:
        return bool(dy.bf16);
      case DyPreparation::kFp8BothOnce:
        return bool(dy.fp8_pair);
      case DyPreparation::kPerGemm:
        break;
    }
    return false;
  }
  // Where the projection's one form of dy is bf16, the norm's backward kernel writes it beside
  // dx (cuda::ComputedDy): a read of dx fewer. Its time is then the projection's
  // "prep dy (dW)".
  void rmsnorm_projection_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                   const Tensor& dout, Tensor& dx, Tensor& dweight,
                                   const ProjectionBackwardCall& proj, Tensor& d_in,
                                   bool accumulate) override {
    const cuda::ProjectionContext c = projection_context();
    cuda::CudaProjectionState& s = cuda_state(proj.state);
    cuda::ComputedDy dy;
    dy.bf16 = [&](uint16_t* out) {
      launch_rmsnorm_backward("rmsnorm_projection_backward", x, weight, rstd, dout, dx, dweight,
                              out);
    };
    if (!takes_computed_dy(c, s, proj.path, accumulate, dy)) {
      Backend::rmsnorm_projection_backward(x, weight, rstd, dout, dx, dweight, proj, d_in,
                                           accumulate);
      return;
    }
    cuda::projection_backward(c, s, proj.path, proj.w, dx, d_in, accumulate, proj.dw, &dy);
  }
  // Where gate and up each make one form of dy (FP8 codes or bf16), the kernel making it
  // computes dgate (dup) from gate, up and dout: dgate and dup are never written.
  void swiglu_projections_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                                   Tensor& dgate, Tensor& dup,
                                   const ProjectionBackwardCall& gate_proj,
                                   const ProjectionBackwardCall& up_proj, Tensor& dx) override {
    const cuda::ProjectionContext c = projection_context();
    cuda::CudaProjectionState& gs = cuda_state(gate_proj.state);
    cuda::CudaProjectionState& us = cuda_state(up_proj.state);
    const int64_t n = matrix_rows(gate), cols = matrix_cols(gate);
    // The FP8 pair on offer where the kernel takes the arrays in the projection's format.
    auto swiglu_gradient = [&](cuda::SwigluGradient which, FpFormat format) {
      cuda::ComputedDy dy;
      if (cuda::fused_pair_takes(format, cols, {f32_data(gate), f32_data(up), f32_data(dout)})) {
        dy.fp8_pair = [&, which](FpFormat f, uint8_t* codes, float* scales, uint8_t* codes_t,
                                 float* scales_t) {
          cuda::quantize_swiglu_gradient_1x128_and_transposed(
              f32_data(gate), f32_data(up), f32_data(dout), which, n, cols, f, codes, scales,
              codes_t, scales_t, stream_);
        };
      }
      dy.bf16 = [&, which](uint16_t* out) {
        cuda::swiglu_gradient_to_bf16(f32_data(gate), f32_data(up), f32_data(dout),
                                      which == cuda::SwigluGradient::kUp, out, n * cols, stream_);
      };
      return dy;
    };
    const cuda::ComputedDy dgate_codes =
        swiglu_gradient(cuda::SwigluGradient::kGate, gate_proj.path.format);
    const cuda::ComputedDy dup_codes =
        swiglu_gradient(cuda::SwigluGradient::kUp, up_proj.path.format);
    if (!takes_computed_dy(c, gs, gate_proj.path, false, dgate_codes) ||
        !takes_computed_dy(c, us, up_proj.path, true, dup_codes)) {
      Backend::swiglu_projections_backward(gate, up, dout, dgate, dup, gate_proj, up_proj, dx);
      return;
    }
    check_same_numel(gate, up, "swiglu_projections_backward");
    check_same_numel(gate, dout, "swiglu_projections_backward");
    check_same_numel(gate, dgate, "swiglu_projections_backward");
    check_same_numel(gate, dup, "swiglu_projections_backward");
    cuda::projection_backward(c, gs, gate_proj.path, gate_proj.w, dgate, dx, false, gate_proj.dw,
                              &dgate_codes);
    cuda::projection_backward(c, us, up_proj.path, up_proj.w, dup, dx, true, up_proj.dw,
                              &dup_codes);
  }
  // Where the projection makes one form of dy, the kernel making it rotates the gradient back
  // as it reads it (cuda::ComputedDy; FP8 codes for head dims 64 and 128): dx is left
  // unrotated.
  void rope_projection_backward(Tensor& dx, const Tensor& cos, const Tensor& sin,
                                const ProjectionBackwardCall& proj, Tensor& d_in,
                                bool accumulate) override {
    const cuda::ProjectionContext c = projection_context();
    cuda::CudaProjectionState& s = cuda_state(proj.state);
    check_rope_tables(dx, cos, sin, "rope_projection_backward");
    const int64_t b = dx.dim(0), t = dx.dim(1), heads = dx.dim(2), hd = dx.dim(3);
    cuda::ComputedDy rotated;
    if (cuda::fused_pair_takes(proj.path.format, heads * hd, {f32_data(dx)}) &&
        cuda::rope_gradient_quantizable(hd, f32_data(cos), f32_data(sin))) {
      rotated.fp8_pair = [&](FpFormat format, uint8_t* codes, float* scales, uint8_t* codes_t,
                             float* scales_t) {
        cuda::quantize_rope_gradient_1x128_and_transposed(
            f32_data(dx), f32_data(cos), f32_data(sin), b * t, t, heads, hd, format, codes, scales,
            codes_t, scales_t, stream_);
      };
    }
    rotated.bf16 = [&](uint16_t* out) {
      cuda::rope_backward_to_bf16(f32_data(dx), f32_data(cos), f32_data(sin), b, t, heads, hd, out,
                                  stream_);
    };
    if (!takes_computed_dy(c, s, proj.path, accumulate, rotated)) {
      Backend::rope_projection_backward(dx, cos, sin, proj, d_in, accumulate);
      return;
    }
    Tensor dy = tensor_view(dx, {b * t, heads * hd});  // [N, out]
    cuda::projection_backward(c, s, proj.path, proj.w, dy, d_in, accumulate, proj.dw, &rotated);
  }
  void invalidate_prepared_weights() override { ++weights_epoch_; }
  void prepare_projection_weights(const std::vector<ProjectionWeight>& weights) override {
    std::vector<cuda::WeightToPrepare> units;
    units.reserve(weights.size());
    for (const ProjectionWeight& u : weights) units.push_back({cuda_state(u.state), u.path, u.w});
    cuda::prepare_weights(projection_context(), units);
  }
  std::string describe_projection(const ProjectionShape& shape,
                                  const PathSpec& path) const override {
    return describe_projection_gemms(shape, path, gemm_precision(), target_);
  }

  // ---- rope, attention, swiglu, residual, loss ----
  // x [B, T, heads, hd] against the tables [>= T, hd / 2].
  static void check_rope_tables(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                const char* op) {
    GNMR_CHECK(x.shape.size() == 4 && cos.shape.size() == 2 && cos.dim(0) >= x.dim(1) &&
                   cos.dim(1) * 2 == x.dim(3) && sin.shape == cos.shape,
               std::string(op) + ": x " + x.shape_string() + " vs tables " + cos.shape_string() +
                   ", " + sin.shape_string());
  }
  void rope_forward(Tensor& x, const Tensor& cos, const Tensor& sin) override {
    const auto timing = time_op("rope");
    check_rope_tables(x, cos, sin, "rope_forward");
    cuda::rope_forward(f32_data(x), f32_data(cos), f32_data(sin), x.dim(0), x.dim(1), x.dim(2),
                       x.dim(3), stream_);
  }
  void rope_backward(Tensor& dx, const Tensor& cos, const Tensor& sin) override {
    const auto timing = time_op("rope");
    check_rope_tables(dx, cos, sin, "rope_backward");
    cuda::rope_backward(f32_data(dx), f32_data(cos), f32_data(sin), dx.dim(0), dx.dim(1), dx.dim(2),
                        dx.dim(3), stream_);
  }

  std::unique_ptr<AttentionState> plan_attention(const std::string& name,
                                                 const AttentionShape& shape,
                                                 bool out_kept) override {
    return attention_->plan(attention_context(), name, shape, out_kept);
  }
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                         AttentionState& saved) override {
    attention_->forward(attention_context(), q, k, v, nullptr, out, saved);
  }
  // Where the tensor-core kernels run, RoPE rotates q and k as the forward copies them to bf16
  // (rope_forward_to_bf16), q and k left unrotated; elsewhere the three ops.
  void rope_attention_forward(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cos,
                              const Tensor& sin, Tensor& out, AttentionState& saved) override {
    const cuda::CudaAttentionState& state =
        cuda::CudaAttentionOps::state_of(saved, attention_shape_of(q, k));
    if (state.kernel_kind != cuda::AttentionKernel::FlashTensorCores) {
      Backend::rope_attention_forward(q, k, v, cos, sin, out, saved);
      return;
    }
    check_rope_tables(q, cos, sin, "rope_attention_forward");
    check_rope_tables(k, cos, sin, "rope_attention_forward");
    const cuda::RopeTables tables{f32_data(cos), f32_data(sin)};
    attention_->forward(attention_context(), q, k, v, &tables, out, saved);
  }
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionState& saved, const Tensor& dout, Tensor& dq, Tensor& dk,
                          Tensor& dv) override {
    attention_->backward(attention_context(), q, k, v, saved, dout, dq, dk, dv);
  }

  void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) override {
    const auto timing = time_op("swiglu");
    check_same_numel(gate, up, "swiglu_forward");
    check_same_numel(gate, out, "swiglu_forward");
    cuda::swiglu_forward(f32_data(gate), f32_data(up), f32_data(out), gate.numel(), stream_);
  }
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                       Tensor& dup) override {
    const auto timing = time_op("swiglu");
    check_same_numel(gate, dout, "swiglu_backward");
    check_same_numel(gate, dgate, "swiglu_backward");
    check_same_numel(up, dup, "swiglu_backward");
    cuda::swiglu_backward(f32_data(gate), f32_data(up), f32_data(dout), f32_data(dgate),
                          f32_data(dup), gate.numel(), stream_);
  }
  void residual_forward(const Tensor& a, const Tensor& b, Tensor& out) override {
    const auto timing = time_op("residual");
    check_same_numel(a, b, "residual_forward");
    check_same_numel(a, out, "residual_forward");
    cuda::residual_forward(f32_data(a), f32_data(b), f32_data(out), a.numel(), stream_);
  }

  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses) override {
    const auto timing = time_op("cross_entropy");
    const int64_t n = matrix_rows(logits), vocab = matrix_cols(logits);
    GNMR_CHECK(targets.numel() == n && losses.numel() == n, "cross_entropy_forward: shapes");
    cuda::cross_entropy_forward(f32_data(logits), i32_data(targets), f32_data(losses), n, vocab,
                                stream_);
  }
  void cross_entropy_forward_backward(Tensor& logits, const Tensor& targets, Tensor& losses,
                                      float dloss) override {
    const auto timing = time_op("cross_entropy");
    launch_cross_entropy_forward_backward("cross_entropy_forward_backward", logits, targets, losses,
                                          dloss, nullptr);
  }
  // Where the lm_head's one form of dy is bf16, the loss's kernel writes the gradient only as
  // that (cuda::ComputedDy), the fp32 gradient never written nor read back. Its time is then
  // the lm_head's "prep dy (dW)".
  void cross_entropy_projection_backward(Tensor& logits, const Tensor& targets, Tensor& losses,
                                         float dloss, const ProjectionBackwardCall& lm_head,
                                         Tensor& dx) override {
    const cuda::ProjectionContext c = projection_context();
    cuda::CudaProjectionState& s = cuda_state(lm_head.state);
    cuda::ComputedDy dy;
    dy.bf16 = [&](uint16_t* out) {
      launch_cross_entropy_forward_backward("cross_entropy_projection_backward", logits, targets,
                                            losses, dloss, out);
    };
    if (!takes_computed_dy(c, s, lm_head.path, false, dy)) {
      Backend::cross_entropy_projection_backward(logits, targets, losses, dloss, lm_head, dx);
      return;
    }
    cuda::projection_backward(c, s, lm_head.path, lm_head.w, logits, dx, false, lm_head.dw, &dy);
  }
  // The kernel of the two ops above after checking the shapes (errors name `op`); grad_bf16 as
  // cuda::cross_entropy_forward_backward takes it, or null.
  void launch_cross_entropy_forward_backward(const char* op, Tensor& logits, const Tensor& targets,
                                             Tensor& losses, float dloss, uint16_t* grad_bf16) {
    const int64_t n = matrix_rows(logits), vocab = matrix_cols(logits);
    GNMR_CHECK(targets.numel() == n && losses.numel() == n, std::string(op) + ": shapes");
    cuda::cross_entropy_forward_backward(f32_data(logits), i32_data(targets), f32_data(losses),
                                         dloss, n, vocab, stream_, grad_bf16);
  }

  // ---- precision-recipe ops ----
  void quantize_int_groupwise(const Tensor& x, Tensor& packed, Tensor& scales,
                              const GroupwiseSpec& spec, const RngKey& key) override {
    const auto timing = time_op("quantize");
    const int64_t n = matrix_rows(x), d = matrix_cols(x);
    check_groupwise_buffers(n, d, spec, packed, scales, "quantize_int_groupwise");
    cuda::quantize_int_groupwise(f32_data(x), n, d, spec, static_cast<uint8_t*>(packed.data),
                                 f32_data(scales), key, stream_);
  }
  void dequantize_int_groupwise(const Tensor& packed, const Tensor& scales,
                                const GroupwiseSpec& spec, Tensor& out) override {
    const auto timing = time_op("quantize");
    const int64_t n = matrix_rows(out), d = matrix_cols(out);
    check_groupwise_buffers(n, d, spec, packed, scales, "dequantize_int_groupwise");
    cuda::dequantize_int_groupwise(static_cast<const uint8_t*>(packed.data), f32_data(scales), n, d,
                                   spec, f32_data(out), stream_);
  }
  void fake_quantize_fp_blockwise(const Tensor& x, Tensor& out, FpFormat format, int64_t block_rows,
                                  int64_t block_cols) override {
    const auto timing = time_op("quantize");
    check_same_numel(x, out, "fake_quantize_fp_blockwise");
    GNMR_CHECK(block_rows > 0 && block_cols > 0, "fake_quantize_fp_blockwise: empty block");
    cuda::fake_quantize_fp_blockwise(f32_data(x), f32_data(out), matrix_rows(x), matrix_cols(x),
                                     format, block_rows, block_cols, stream_);
  }
  void fake_quantize_int8_per_row(const Tensor& x, Tensor& out) override {
    const auto timing = time_op("quantize");
    check_same_numel(x, out, "fake_quantize_int8_per_row");
    cuda::fake_quantize_int8_per_row(f32_data(x), matrix_rows(x), matrix_cols(x), f32_data(out),
                                     stream_);
  }
  void round_to_bf16(const Tensor& x, Tensor& out) override {
    const auto timing = time_op("quantize");
    check_same_numel(x, out, "round_to_bf16");
    cuda::round_to_bf16(f32_data(x), f32_data(out), x.numel(), stream_);
  }

  // ---- trainer ops ----
  void accumulate_mean_loss(const Tensor& losses, int64_t valid_targets,
                            Tensor& loss_sum) override {
    const auto timing = time_op("loss");
    GNMR_CHECK(valid_targets > 0 && loss_sum.numel() == 1,
               "accumulate_mean_loss: needs valid targets and a one-element sum, got " +
                   std::to_string(valid_targets) + " and " + loss_sum.shape_string());
    cuda::accumulate_mean_loss(f32_data(losses), losses.numel(), valid_targets, f64_data(loss_sum),
                               stream_);
  }
  void sum_squares(const std::vector<Tensor>& tensors, Tensor& out_per_tensor) override {
    const auto timing = time_op("norms");
    GNMR_CHECK(out_per_tensor.numel() == static_cast<int64_t>(tensors.size()),
               "sum_squares: " + std::to_string(tensors.size()) + " tensors, out " +
                   out_per_tensor.shape_string());
    std::vector<const float*> pointers;
    for (const Tensor& t : tensors) pointers.push_back(f32_data(t));
    const std::vector<int64_t> counts = numels(tensors);
    auto* ws = static_cast<double*>(reserve_sum_squares_workspace(counts));
    cuda::sum_squares(pointers.data(), counts.data(), int64_t(counts.size()),
                      f64_data(out_per_tensor), ws, stream_);
  }
  void plan_sum_squares(const std::vector<Tensor>& tensors) override {
    reserve_sum_squares_workspace(numels(tensors));
  }
  void global_norm_clip(const Tensor& sum_squares, const Tensor& loss_sum, double max_norm,
                        Tensor& clip) override {
    const auto timing = time_op("norms");
    GNMR_CHECK(loss_sum.numel() == 1 && clip.numel() == 2,
               "global_norm_clip: loss_sum " + loss_sum.shape_string() + ", clip " +
                   clip.shape_string() + " (want [1] and [2])");
    cuda::global_norm_clip(f64_data(sum_squares), sum_squares.numel(), f64_data(loss_sum), max_norm,
                           f32_data(clip), stream_);
  }
  void scale(Tensor& t, float factor) override {
    const auto timing = time_op("scale");
    cuda::scale(f32_data(t), factor, t.numel(), stream_);
  }
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s,
                    const Tensor& clip) override {
    std::vector<AdamWUpdate> one{AdamWUpdate{param, grad, m, v, s}};
    adamw_update_batch(one, clip);
  }
  void adamw_update_batch(std::vector<AdamWUpdate>& updates, const Tensor& clip) override {
    const auto timing = time_op("optimizer");
    GNMR_CHECK(clip.numel() == 2, "adamw_update: clip " + clip.shape_string() + " (want [2])");
    std::vector<cuda::AdamWTensor> tensors;
    tensors.reserve(updates.size());
    for (AdamWUpdate& u : updates) {
      check_same_numel(u.param, u.grad, "adamw_update");
      check_same_numel(u.param, u.m, "adamw_update");
      check_same_numel(u.param, u.v, "adamw_update");
      GNMR_CHECK(u.step.step >= 1, "adamw_update: step is 1-based");
      tensors.push_back(cuda::AdamWTensor{f32_data(u.param), f32_data(u.grad), f32_data(u.m),
                                          f32_data(u.v), u.param.numel(), u.step});
    }
    cuda::adamw_update_batch(tensors, f32_data(clip), stream_);
  }

 private:
  // Every staging slot at least `bytes` (at most kMaxStagedBytes), now, where tensors are
  // allocated: cudaMallocHost and cudaFreeHost synchronize the device, and in a step that wait
  // would take in the gradient sums in flight, which wait on the other ranks (no deadline).
  void reserve_staging(size_t bytes) {
    for (StagingSlot& slot : staging_) {
      GNMR_CUDA_CHECK(cudaEventSynchronize(slot.done));
      grow_staging_slot(slot, std::min(bytes, kMaxStagedBytes));
    }
  }
  // `slot` (its copy done) holding at least `bytes`.
  void grow_staging_slot(StagingSlot& slot, size_t bytes) {
    if (slot.bytes >= bytes) return;
    if (slot.host) GNMR_CUDA_CHECK(cudaFreeHost(slot.host));
    slot.host = nullptr;
    slot.bytes = 0;
    GNMR_CUDA_CHECK(cudaMallocHost(&slot.host, bytes));
    slot.bytes = bytes;
  }

  // One staged upload (see kStagingSlots): pinned copy, then an async copy on the stream.
  void upload(void* device, const void* host, size_t bytes) {
    if (bytes > kMaxStagedBytes) {
      GNMR_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
      GNMR_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the caller may reuse `host` at once
      return;
    }
    StagingSlot& slot = staging_[next_slot_];
    next_slot_ = (next_slot_ + 1) % kStagingSlots;
    GNMR_CUDA_CHECK(cudaEventSynchronize(slot.done));  // its previous copy has been made
    grow_staging_slot(slot, bytes);
    std::memcpy(slot.host, host, bytes);
    GNMR_CUDA_CHECK(cudaMemcpyAsync(device, slot.host, bytes, cudaMemcpyHostToDevice, stream_));
    GNMR_CUDA_CHECK(cudaEventRecord(slot.done, stream_));
  }

  // A plain GEMM's operand: as is in fp32, else rounded to bf16 into `scratch`.
  const void* gemm_input(const Tensor& t, GemmPrecision precision, DeviceScratch& scratch) {
    if (precision == GemmPrecision::FP32) return f32_data(t);
    auto* out = static_cast<uint16_t*>(scratch.reserve(memory_, size_t(t.numel()) * 2));
    cuda::convert_to_bf16(f32_data(t), t.numel(), out, stream_);
    return out;
  }

  static void check_groupwise_buffers(int64_t n, int64_t d, const GroupwiseSpec& spec,
                                      const Tensor& packed, const Tensor& scales,
                                      const char* what) {
    validate_groupwise_spec(d, spec);
    GNMR_CHECK(packed.dtype == DType::U8 && packed.bytes() >= gnmr::packed_bytes(n, d, spec) &&
                   static_cast<size_t>(scales.numel()) >= scale_count(n, d, spec),
               std::string(what) + ": [" + std::to_string(n) + ", " + std::to_string(d) +
                   "] needs " + std::to_string(gnmr::packed_bytes(n, d, spec)) +
                   " packed bytes and " + std::to_string(scale_count(n, d, spec)) +
                   " scales, got " + packed.shape_string() + " and " + scales.shape_string());
  }

  static std::vector<int64_t> numels(const std::vector<Tensor>& tensors) {
    std::vector<int64_t> counts;
    for (const Tensor& t : tensors) counts.push_back(t.numel());
    return counts;
  }
  // The chunk partials of sum_squares over tensors of these sizes (kernels/sum_squares.cu).
  void* reserve_sum_squares_workspace(const std::vector<int64_t>& counts) {
    const int64_t doubles =
        cuda::sum_squares_workspace_doubles(counts.data(), int64_t(counts.size()));
    return sum_squares_workspace_.reserve(memory_,
                                          sizeof(double) * size_t(std::max<int64_t>(1, doubles)));
  }
  static cuda::CudaProjectionState& cuda_state(ProjectionState& state) {
    auto* s = dynamic_cast<cuda::CudaProjectionState*>(&state);
    GNMR_CHECK(s != nullptr, "projection state was not planned by the cuda backend");
    return *s;
  }
  cuda::ProjectionContext projection_context() {
    return cuda::ProjectionContext{memory_, projection_scratch_, *gemm_,  *op_timer_,
                                   stream_, gemm_precision(),    target_, weights_epoch_};
  }
  cuda::AttentionContext attention_context() {
    return cuda::AttentionContext{memory_, stream_, *op_timer_, sync_count_, gemm_precision()};
  }
  // The span of one op in `gnmr bench`'s breakdown (op_timer.h); nothing while timing is off.
  cuda::OpTimer::Scope time_op(const char* family) {
    return cuda::OpTimer::Scope(*op_timer_, family);
  }

  DeviceMemory memory_;
  int device_index_ = 0;
  GpuTarget target_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::OpTimer> op_timer_;  // set_op_timing
  std::unique_ptr<LtGemmRunner> gemm_;
  // Reset before gemm_ in the destructor: v1's GEMMs use gemm_'s handle and workspace.
  std::unique_ptr<cuda::CudaAttentionOps> attention_;
  int64_t sync_count_ = 0;
  uint64_t weights_epoch_ = 1;  // bumped by invalidate_prepared_weights
  StagingSlot staging_[kStagingSlots];
  int next_slot_ = 0;
  // The host copy of each uploaded i32 tensor, by device address (embedding_backward).
  std::map<const void*, std::vector<int32_t>> host_tokens_;
  cuda::ProjectionScratch projection_scratch_;
  DeviceScratch embedding_index_{"embedding_index"}, rmsnorm_workspace_{"rmsnorm_workspace"},
      sum_squares_workspace_{"sum_squares_workspace"}, matmul_a_{"matmul_a"}, matmul_b_{"matmul_b"};
};

}  // namespace

CudaStreamHandle cuda_stream_of(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) {
    throw Error(ErrorKind::Usage, "backend \"" + backend.name() + "\" is not the cuda backend");
  }
  return CudaStreamHandle{cuda->device_index(), cuda->stream()};
}

CudaAttention parse_cuda_attention(const std::string& name) {
  if (name == "auto") return CudaAttention::Auto;
  if (name == "flash") return CudaAttention::Flash;
  if (name == "flash_bf16") return CudaAttention::FlashBf16;
  if (name == "flash_wgmma") return CudaAttention::FlashWgmma;
  if (name == "materialized") return CudaAttention::Materialized;
  throw Error(ErrorKind::Config,
              "config: \"model.attention\" is \"" + name +
                  "\", must be one of: auto, flash, flash_bf16, flash_wgmma, materialized");
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

void run_wgmma_trial_before_backend(const CudaBackendOptions& options, bool bf16_gemms,
                                    const AttentionShape& shape) {
  // Only auto asks (attention_kernel_for would refuse an explicit choice's unsupported shape).
  if (!options.wgmma_trial || options.attention != CudaAttention::Auto) return;
  // Attributes only: unlike cudaSetDevice, a kernel's attributes or an allocation, they make
  // no context. A device that cannot be read asks nothing here; the backend says why.
  int major = 0, minor = 0, shared_limit = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, options.device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, options.device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                             options.device) != cudaSuccess) {
    cudaGetLastError();  // the backend's own probe reports the device
    return;
  }
  bool warned = true;  // the backend warns of a shape that does not fit, at its plan
  const cuda::AttentionKernel kernel =
      cuda::attention_kernel_for(options.attention, bf16_gemms, shape, shared_limit, warned);
  // Compute capability 9.0 stands for flash_wgmma_unavailable, which loads a kernel to read
  // whether the build has sm_90a code (a context): without it the trial answers why, and the
  // backend, which checks that itself, never asks.
  if (cuda::asks_wgmma_trial(options.attention, true, cuda::flash_tiles_timed(options.flash_tiles),
                             kernel, major == 9 && minor == 0)) {
    options.wgmma_trial(shape);
  }
}

std::string flash_wgmma_trial(int device, const AttentionShape& shape) {
  CudaBackendOptions options;
  options.device = device;
  options.attention = CudaAttention::Auto;
  options.flash_tiles = FlashTiles::Timed;
  options.wgmma_trial = [](const AttentionShape&) { return std::string(); };  // this is the trial
  CudaBackend backend(options);
  backend.set_gemm_precision(GemmPrecision::BF16);
  const std::unique_ptr<AttentionState> saved =
      backend.plan_attention("wgmma_trial", shape, /*out_kept=*/false);
  const auto& state = static_cast<const cuda::CudaAttentionState&>(*saved);
  if (!state.wgmma_offered) {
    const std::string unavailable = cuda::flash_wgmma_unavailable(device);
    return "auto does not offer the wgmma kernels at " + attention_shape_text(shape) + ": " +
           (unavailable.empty() ? "it runs " + state.kernel() : unavailable);
  }
  // Inputs in [-2, 2): scores of every sign and size a softmax meets in training.
  const std::vector<int64_t> q_dims = {shape.batch, shape.seq, shape.heads, shape.head_dim},
                             kv_dims = {shape.batch, shape.seq, shape.kv_heads, shape.head_dim};
  uint64_t draw = 0;
  auto random_tensor = [&](const char* name, const std::vector<int64_t>& dims) {
    Tensor t = backend.allocate(name, dims, DType::F32, MemoryRole::Scratch);
    std::vector<float> host(size_t(t.numel()));
    for (float& x : host)
      x = float(int64_t(splitmix64(++draw) >> 40) - (int64_t{1} << 23)) / 0x1p22f;
    backend.copy_from_host(t, host.data());
    return t;
  };
  const Tensor q = random_tensor("q", q_dims), k = random_tensor("k", kv_dims),
               v = random_tensor("v", kv_dims), dout = random_tensor("dout", q_dims);
  Tensor out = backend.allocate("out", q_dims, DType::F32, MemoryRole::Scratch),
         dq = backend.allocate("dq", q_dims, DType::F32, MemoryRole::Scratch),
         dk = backend.allocate("dk", kv_dims, DType::F32, MemoryRole::Scratch),
         dv = backend.allocate("dv", kv_dims, DType::F32, MemoryRole::Scratch);
  backend.attention_forward(q, k, v, out, *saved);
  backend.attention_backward(q, k, v, *saved, dout, dq, dk, dv);
  backend.synchronize();
  std::string problems;
  for (const auto& [pass, choice] : {std::pair{"the forward", &state.choice->forward},
                                     std::pair{"the backward", &state.choice->backward}}) {
    if (!choice->wgmma_other_bits) continue;
    problems += (problems.empty() ? "" : "; ") + std::string(pass) +
                "'s wgmma kernels wrote other bits than its mma.sync kernels at " +
                attention_shape_text(shape);
  }
  return problems;
}

}  // namespace gnmr
