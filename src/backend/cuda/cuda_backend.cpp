// CudaBackend (cuda_backend.h): each op checks shapes on the host (tensor_checks.h), then
// queues its kernel (kernels/*.cuh) or cuBLASLt matmul on the backend's stream.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "backend/cuda/attention_v1.h"
#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cuda_projection.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/device_probe.h"
#include "backend/cuda/flash_kernel_choice.h"
#include "backend/cuda/op_timer.h"
#include "backend/embedding_index.h"
#include "backend/flash_layout.h"
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

// The emulated build (tests only): FlashTiles::Auto keeps the default tiles there.
#ifdef GNMR_CUDA_EMULATED
constexpr bool kEmulatedCuda = true;
#else
constexpr bool kEmulatedCuda = false;
#endif

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

// The attention kernels a layer runs: v1 (attention_v1.h), the SIMT flash kernels
// (kernels/flash_attention.cu, fp32 throughout) or the bf16 tensor-core ones
// (kernels/flash_attention_mma.cu).
enum class AttentionKernel { Materialized, FlashSimt, FlashTensorCores };

// The variant each tensor-core flash pass runs at an attention shape, chosen at its first
// forward and first backward (flash_kernel_choice.h); shared by the backend and the shape's
// attention states, whose kernel() names it.
struct FlashPassChoice {
  bool chosen = false;
  cuda::FlashVariant variant;
  bool wgmma_other_bits = false;  // wgmma was offered and its outputs' digest differed
};
struct FlashShapeChoice {
  FlashPassChoice forward, backward;
  // Under auto, where wgmma could be offered: CudaBackendOptions::wgmma_trial's answer at this
  // shape, asked at its first plan ("" the kernels may run; else why not).
  std::optional<std::string> wgmma_trial_problem;
};

// Either kernel's saved tensors: v1 keeps probs; flash keeps lse and either its own copy of out
// or, when the caller keeps out (plan_attention's out_kept), where the forward wrote it.
class CudaAttentionState final : public AttentionState {
 public:
  // Only the tensors this state allocated: an unallocated Tensor has no shape, which numel()
  // counts as one element.
  size_t saved_bytes() const override {
    size_t bytes = 0;
    for (const Tensor* t : {&probs, &out, &lse, &inputs_bf16}) bytes += t->data ? t->bytes() : 0;
    return bytes;
  }
  // The tensor-core kernels' backward reads the forward's bf16 copies of q, k, v, kept here.
  bool keeps_inputs() const override { return kernel_kind == AttentionKernel::FlashTensorCores; }
  std::string kernel() const override {
    switch (kernel_kind) {
      case AttentionKernel::Materialized:
        return v1_precision == GemmPrecision::BF16
                   ? "materialized (cuBLASLt GEMMs on bf16 tensor cores + fp32 causal softmax)"
                   : "materialized (cuBLASLt fp32 GEMMs + causal softmax)";
      case AttentionKernel::FlashSimt:
        return "flash (fp32 SIMT)";
      case AttentionKernel::FlashTensorCores: {
        const std::string kernels =
            instruction == cuda::FlashMmaInstruction::Wgmma
                ? "flash_wgmma (bf16 tensor cores, wgmma; query tiles of "
            : wgmma_offered
                ? "flash_bf16 (bf16 tensor cores, mma.sync, or wgmma where it gives mma.sync's "
                  "bits and is faster; query tiles of "
                : "flash_bf16 (bf16 tensor cores, mma.sync; query tiles of ";
        if (tiles_timed) {
          return kernels + "64 or 128 rows in the forward" +
                 (shape.head_dim == 64 ? " and the dq pass" : ", 64 in the dq pass") +
                 ", the faster at this shape, timed at its first forward and backward" +
                 chosen_text() + ")";
        }
        return kernels + std::to_string(kFlashMmaForwardQueryTile) + " rows in the forward, " +
               std::to_string(flash_mma_query_pass_tile(shape.head_dim)) + " in the dq pass)";
      }
    }
    return "?";
  }
  // "; chosen: the forward on wgmma, 128-row query tiles, ..." once a pass has chosen.
  std::string chosen_text() const {
    std::string text;
    const std::pair<const char*, const FlashPassChoice*> passes[2] = {
        {"the forward", choice ? &choice->forward : nullptr},
        {"the backward", choice ? &choice->backward : nullptr}};
    for (const auto& [pass, c] : passes) {
      if (c == nullptr || !c->chosen) continue;
      text += (text.empty() ? "; chosen: " : ", ") + std::string(pass) + " on " +
              cuda::flash_variant_text(c->variant);
    }
    return text;
  }
  // The out the flash backward reads: the copy, or the caller's own.
  const float* flash_out() const {
    if (!out_kept) return static_cast<const float*>(out.data);
    GNMR_CHECK(caller_out != nullptr, "attention_backward before its attention_forward");
    return caller_out;
  }
  bool flash() const { return kernel_kind != AttentionKernel::Materialized; }
  AttentionKernel kernel_kind = AttentionKernel::Materialized;
  bool tiles_timed = false;  // the tensor-core kernels' query tiles: timed, not the defaults
  // The tensor-core kernels' instruction: wgmma for model.attention = flash_wgmma. Under auto,
  // with the tiles timed on a device that runs wgmma, the default of a choice that offers wgmma
  // too (wgmma_offered; flash_kernel_choice.h).
  cuda::FlashMmaInstruction instruction = cuda::FlashMmaInstruction::MmaSync;
  bool wgmma_offered = false;
  // The tensor-core kernels' choice at this shape, shared by the backend's states of the shape
  // (the backend's flash_choices_).
  std::shared_ptr<FlashShapeChoice> choice;
  // v1's GEMMs: the run's GEMM precision when the state was planned (attention_v1_compute_type).
  GemmPrecision v1_precision = GemmPrecision::FP32;
  bool out_kept = false;
  Tensor probs;                       // v1: [B, H, T, T]
  Tensor out;                         // flash, out not kept: [B, T, H, hd]
  const float* caller_out = nullptr;  // flash, out kept: the last forward's out
  Tensor lse;                         // flash: [B, H, T]
  Tensor inputs_bf16;  // tensor cores: bf16 q, k, v (flash_attention_mma_inputs_bytes)
  AttentionShape shape{};
};

const char* attention_choice_name(CudaAttention choice) {
  switch (choice) {
    case CudaAttention::Auto:
      return "auto";
    case CudaAttention::Flash:
      return "flash";
    case CudaAttention::FlashBf16:
      return "flash_bf16";
    case CudaAttention::FlashWgmma:
      return "flash_wgmma";
    case CudaAttention::Materialized:
      return "materialized";
  }
  return "?";
}

// Which kernels `shape` runs under `choice` on a device allowing `shared_limit` bytes of shared
// memory per block (opt-in). auto takes the flash kernels of the GEMMs' precision (tensor cores
// when `bf16_gemms`, else fp32 SIMT) where the head dim is theirs and their tiles fit, else the
// materialized kernels, and says so (`warned`: once per backend, not once per layer). An explicit
// flash choice whose head dim the kernels lack, or whose tiles do not fit, is an error naming the
// shape and the bytes, raised here, before the first step.
AttentionKernel attention_kernel_for(CudaAttention choice, bool bf16_gemms,
                                     const AttentionShape& shape, int64_t shared_limit,
                                     bool& warned) {
  if (choice == CudaAttention::Materialized) return AttentionKernel::Materialized;
  const bool tensor_cores = choice == CudaAttention::FlashBf16 ||
                            choice == CudaAttention::FlashWgmma ||
                            (choice == CudaAttention::Auto && bf16_gemms);
  const AttentionKernel flash =
      tensor_cores ? AttentionKernel::FlashTensorCores : AttentionKernel::FlashSimt;
  const bool supported = cuda::flash_attention_supports_head_dim(shape.head_dim);
  if (choice != CudaAttention::Auto && !supported) {
    throw Error(ErrorKind::Config, std::string("model.attention \"") +
                                       attention_choice_name(choice) + "\": head dim " +
                                       std::to_string(shape.head_dim) + " (" +
                                       attention_shape_text(shape) +
                                       ") is not supported by the flash kernels (64, 128); use "
                                       "model.attention=materialized or auto");
  }
  if (!supported) return AttentionKernel::Materialized;
  const int64_t needed =
      cuda::flash_attention_shared_bytes(shape.head_dim, shape.seq, tensor_cores);
  if (needed <= shared_limit) return flash;
  if (choice != CudaAttention::Auto) {
    throw Error(ErrorKind::Runtime,
                std::string("model.attention \"") + attention_choice_name(choice) + "\": the " +
                    "kernels need " + std::to_string(needed) +
                    " bytes of shared memory per block for " + attention_shape_text(shape) +
                    ", this GPU allows " + std::to_string(shared_limit) +
                    "; use model.attention=materialized or auto");
  }
  if (!warned) {
    spdlog::warn(
        "model.attention auto: the flash kernels need {} bytes of shared memory per "
        "block for {}, this GPU allows {}; running the materialized kernels",
        needed, attention_shape_text(shape), shared_limit);
  }
  warned = true;
  return AttentionKernel::Materialized;
}

// Whether the backend asks CudaBackendOptions::wgmma_trial at an attention shape: under
// attention auto with a trial to ask, the tiles timed, where the shape runs the tensor-core flash
// kernels (`kernel`), on a device that runs wgmma. Asked by the backend at the shape's first
// plan_attention and by run_wgmma_trial_before_backend before the backend exists.
bool asks_wgmma_trial(CudaAttention choice, bool has_trial, bool tiles_timed,
                      AttentionKernel kernel, bool device_runs_wgmma) {
  return choice == CudaAttention::Auto && has_trial && tiles_timed &&
         kernel == AttentionKernel::FlashTensorCores && device_runs_wgmma;
}

// CudaBackendOptions::flash_tiles as the backend runs them: Auto is Timed on a GPU.
bool flash_tiles_timed(FlashTiles tiles) {
  return tiles == FlashTiles::Timed || (tiles == FlashTiles::Auto && !kEmulatedCuda);
}

int64_t last_dim(const Tensor& t) {
  return matrix_cols(t);
}

class CudaBackend final : public Backend {
 public:
  int device_index() const { return device_index_; }
  cudaStream_t stream() const { return stream_; }

  explicit CudaBackend(const CudaBackendOptions& options)
      : memory_(options.poison),
        attention_choice_(options.attention),
        time_flash_tiles_(flash_tiles_timed(options.flash_tiles)),
        wgmma_trial_(options.wgmma_trial) {
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
    shared_optin_bytes_ = int64_t(prop.sharedMemPerBlockOptin);
    device_name_ = probe.device;
    // A blocking stream: it orders after the synchronous cudaMemset of each allocation
    // (issued on the legacy default stream).
    GNMR_CUDA_CHECK(cudaStreamCreate(&stream_));
    op_timer_ = std::make_unique<cuda::OpTimer>(stream_);
    gemm_ = std::make_unique<LtGemmRunner>();
    attention_ = std::make_unique<cuda::MaterializedAttention>(gemm_->handle(), gemm_->workspace(),
                                                               LtGemmRunner::kWorkspaceBytes);
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
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    for (int64_t s : t.shape) {
      GNMR_CHECK(s >= 0, "allocate " + name + ": negative extent in " + t.shape_string());
    }
    t.data = memory_.allocate(name, t.bytes(), role);
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
    auto state = std::make_unique<CudaAttentionState>();
    state->shape = shape;
    state->kernel_kind =
        attention_kernel_for(attention_choice_, gemm_precision() == GemmPrecision::BF16, shape,
                             shared_optin_bytes_, warned_flash_fallback_);
    state->tiles_timed = time_flash_tiles_;
    if (state->kernel_kind ==
        AttentionKernel::FlashTensorCores) {  // made at the shape's first plan
      std::shared_ptr<FlashShapeChoice>& choice = flash_choices_[FlashChoiceKey{
          shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim}];
      if (!choice) choice = std::make_shared<FlashShapeChoice>();
      state->choice = choice;
    }
    if (attention_choice_ == CudaAttention::FlashWgmma &&
        state->kernel_kind == AttentionKernel::FlashTensorCores) {
      const std::string unavailable = cuda::flash_wgmma_unavailable(device_index_);
      if (!unavailable.empty()) {
        throw Error(ErrorKind::Config,
                    "model.attention \"flash_wgmma\" needs sm_90a's wgmma (an H100 or H200, and "
                    "a build with sm_90a code); here: " +
                        unavailable + "; use model.attention=flash_bf16 or auto");
      }
      state->instruction = cuda::FlashMmaInstruction::Wgmma;
    }
    state->wgmma_offered =
        asks_wgmma_trial(attention_choice_, bool(wgmma_trial_), time_flash_tiles_,
                         state->kernel_kind, cuda::flash_wgmma_unavailable(device_index_).empty());
    if (state->wgmma_offered) {
      std::optional<std::string>& problem = state->choice->wgmma_trial_problem;
      if (!problem) {
        problem = wgmma_trial_(shape);
        if (!problem->empty()) {
          spdlog::warn(
              "tensor-core flash at {}: the wgmma kernels are left out ({}); running "
              "mma.sync",
              attention_shape_text(shape), *problem);
        }
      }
      state->wgmma_offered = problem->empty();
    }
    if (state->wgmma_offered && !digest_partials_.data) {
      digest_partials_ = allocate("flash.digest_partials", {2 * cuda::kBitsDigestPartials},
                                  DType::F32, MemoryRole::Scratch);
    }
    state->v1_precision = gemm_precision();
    state->out_kept = state->flash() && out_kept;
    if (state->flash() && !out_kept) {
      state->out = allocate(name + ".out", {shape.batch, shape.seq, shape.heads, shape.head_dim},
                            DType::F32, MemoryRole::SavedActivations);
    }
    if (state->flash()) {
      state->lse = allocate(name + ".lse", {shape.batch, shape.heads, shape.seq}, DType::F32,
                            MemoryRole::SavedActivations);
    }
    if (state->keeps_inputs()) {  // whole floats: 256-byte regions (flash_mma_buffers)
      const int64_t bytes = cuda::flash_attention_mma_inputs_bytes(
          shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim);
      state->inputs_bf16 =
          allocate(name + ".inputs_bf16", {bytes / 4}, DType::F32, MemoryRole::SavedActivations);
    }
    if (!state->flash()) {
      state->probs = allocate(name + ".probs", {shape.batch, shape.heads, shape.seq, shape.seq},
                              DType::F32, MemoryRole::SavedActivations);
    }
    attention_scratch_.reserve(memory_, attention_scratch_bytes(*state));
    return state;
  }
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                         AttentionState& saved) override {
    run_attention_forward(q, k, v, nullptr, out, saved);
  }
  // Where the tensor-core kernels run, RoPE rotates q and k as the forward copies them to bf16
  // (rope_forward_to_bf16), q and k left unrotated; elsewhere the three ops.
  void rope_attention_forward(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cos,
                              const Tensor& sin, Tensor& out, AttentionState& saved) override {
    const CudaAttentionState& state = attention_state(saved, attention_shape_of(q, k));
    if (state.kernel_kind != AttentionKernel::FlashTensorCores) {
      Backend::rope_attention_forward(q, k, v, cos, sin, out, saved);
      return;
    }
    check_rope_tables(q, cos, sin, "rope_attention_forward");
    check_rope_tables(k, cos, sin, "rope_attention_forward");
    const RopeTables tables{f32_data(cos), f32_data(sin)};
    run_attention_forward(q, k, v, &tables, out, saved);
  }
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionState& saved, const Tensor& dout, Tensor& dq, Tensor& dk,
                          Tensor& dv) override {
    const auto timing = time_op("attention");
    const AttentionShape s = attention_shape_of(q, k);
    check_same_numel(q, dq, "attention_backward");
    check_same_numel(q, dout, "attention_backward");
    check_same_numel(k, dk, "attention_backward");
    check_same_numel(v, dv, "attention_backward");
    const CudaAttentionState& state = attention_state(saved, s);
    void* scratch = attention_scratch_.reserve(memory_, attention_scratch_bytes(state));
    if (state.kernel_kind == AttentionKernel::FlashTensorCores) {
      // q, k, v as the forward's bf16 copies in the state (keeps_inputs): those passed are
      // not read.
      FlashPassChoice& choice = state.choice->backward;
      const bool choose = !choice.chosen;
      const int64_t default_tile = flash_mma_query_pass_tile(s.head_dim);
      const cuda::FlashVariant variant =
          choose ? cuda::FlashVariant{state.instruction, default_tile} : choice.variant;
      cuda::flash_attention_backward_mma(
          state.inputs_bf16.data, state.flash_out(), f32_data(state.lse), f32_data(dout),
          f32_data(dq), f32_data(dk), f32_data(dv), scratch, s.batch, s.seq, s.heads, s.kv_heads,
          s.head_dim, stream_, variant.tile, variant.instruction);
      if (choose) {
        // The two passes again on the dout copy and delta the call left in scratch; the dq
        // pass has 128-row tiles at head dim 64 only.
        const std::vector<int64_t> tiles = s.head_dim == 64 ? cuda::flash_query_tiles(default_tile)
                                                            : std::vector<int64_t>{default_tile};
        choose_flash_variant(
            choice, state, "the backward", variant, tiles,
            [&](const cuda::FlashVariant& v) {
              cuda::flash_dq_pass_mma_only(state.inputs_bf16.data, f32_data(state.lse), scratch,
                                           f32_data(dq), s.batch, s.seq, s.heads, s.kv_heads,
                                           s.head_dim, stream_, v.tile, v.instruction);
              cuda::flash_key_value_pass_mma_only(
                  state.inputs_bf16.data, f32_data(state.lse), scratch, f32_data(dk), f32_data(dv),
                  s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, stream_, v.instruction);
            },
            {&dq, &dk, &dv});
      }
      return;
    }
    if (state.flash()) {  // each backward takes its own forward's out and lse
      cuda::flash_attention_backward(f32_data(q), f32_data(k), f32_data(v), state.flash_out(),
                                     f32_data(state.lse), f32_data(dout), f32_data(dq),
                                     f32_data(dk), f32_data(dv), static_cast<float*>(scratch),
                                     s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, stream_);
      return;
    }
    attention_->backward(f32_data(q), f32_data(k), f32_data(v), f32_data(state.probs),
                         f32_data(dout), f32_data(dq), f32_data(dk), f32_data(dv),
                         static_cast<float*>(scratch), s, state.v1_precision, stream_);
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
  // The RoPE tables the tensor-core forward rotates q and k with (rope_attention_forward).
  struct RopeTables {
    const float* cos;
    const float* sin;
  };
  // attention_forward, with q and k rotated by `rope` as the tensor-core kernels copy them where
  // it is given (only for those kernels).
  void run_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                             const RopeTables* rope, Tensor& out, AttentionState& saved) {
    const auto timing = time_op("attention");
    const AttentionShape s = attention_shape_of(q, k);
    check_same_numel(k, v, "attention_forward");
    check_same_numel(q, out, "attention_forward");
    CudaAttentionState& state = attention_state(saved, s);
    GNMR_CHECK(rope == nullptr || state.kernel_kind == AttentionKernel::FlashTensorCores,
               "attention_forward: only the tensor-core kernels rotate q and k");
    if (state.flash()) {
      if (state.kernel_kind == AttentionKernel::FlashTensorCores) {
        // Its bf16 copies of q, k, v go to the state, for the backward.
        FlashPassChoice& choice = state.choice->forward;
        const bool choose = !choice.chosen;
        const cuda::FlashVariant variant =
            choose ? cuda::FlashVariant{state.instruction, kFlashMmaForwardQueryTile}
                   : choice.variant;
        cuda::flash_attention_forward_mma(
            f32_data(q), f32_data(k), f32_data(v), rope ? rope->cos : nullptr,
            rope ? rope->sin : nullptr, f32_data(out), f32_data(state.lse), state.inputs_bf16.data,
            s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, stream_, variant.tile,
            variant.instruction);
        if (choose) {  // the kernel again on the bf16 copies the call made
          choose_flash_variant(choice, state, "the forward", variant,
                               cuda::flash_query_tiles(kFlashMmaForwardQueryTile),
                               [&](const cuda::FlashVariant& v) {
                                 cuda::flash_forward_mma_kernel_only(
                                     state.inputs_bf16.data, f32_data(out), f32_data(state.lse),
                                     s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, stream_,
                                     v.tile, v.instruction);
                               },
                               {&out, &state.lse});
        }
      } else {
        cuda::flash_attention_forward(f32_data(q), f32_data(k), f32_data(v), f32_data(out),
                                      f32_data(state.lse), s.batch, s.seq, s.heads, s.kv_heads,
                                      s.head_dim, stream_);
      }
      if (state.out_kept) {
        state.caller_out = f32_data(out);  // the caller leaves it unchanged until the backward
      } else {
        // The backward reads the state's out: the caller may overwrite its own.
        GNMR_CUDA_CHECK(cudaMemcpyAsync(state.out.data, out.data, out.bytes(),
                                        cudaMemcpyDeviceToDevice, stream_));
      }
      return;
    }
    attention_->forward(f32_data(q), f32_data(k), f32_data(v), f32_data(out), f32_data(state.probs),
                        s, state.v1_precision, stream_);
  }
  static size_t attention_scratch_bytes(const CudaAttentionState& state) {
    const AttentionShape& s = state.shape;
    if (state.kernel_kind == AttentionKernel::FlashTensorCores) {
      return size_t(
          cuda::flash_attention_mma_scratch_bytes(s.batch, s.seq, s.heads, s.kv_heads, s.head_dim));
    }
    const int64_t floats =
        state.flash() ? cuda::flash_attention_backward_scratch_floats(s.batch, s.seq, s.heads)
                      : cuda::MaterializedAttention::backward_scratch_floats(s);
    return sizeof(float) * size_t(floats);
  }
  static const CudaAttentionState& attention_state(const AttentionState& saved,
                                                   const AttentionShape& s) {
    const auto* state = dynamic_cast<const CudaAttentionState*>(&saved);
    GNMR_CHECK(state != nullptr, "attention state was not planned by the cuda backend");
    const AttentionShape& p = state->shape;
    GNMR_CHECK(p.batch == s.batch && p.seq == s.seq && p.heads == s.heads &&
                   p.kv_heads == s.kv_heads && p.head_dim == s.head_dim,
               "attention: state planned for " + attention_shape_text(p) + ", called with " +
                   attention_shape_text(s));
    return *state;
  }
  static CudaAttentionState& attention_state(AttentionState& saved, const AttentionShape& s) {
    return const_cast<CudaAttentionState&>(
        attention_state(static_cast<const AttentionState&>(saved), s));
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
  // Makes `choice`: the variant `pass` runs from now on, after a first call that ran `ran` (the
  // state's instruction at the default tile, `tiles[0]`) and left `outputs`. With the tiles not
  // timed, `ran`. Otherwise: where the state offers wgmma, `run` runs it at that tile and the
  // bits digest of `outputs` decides whether it joins (the same bits as mma.sync's) or is left
  // out (logged as a warning, and choice.wgmma_other_bits); then the offered variants are timed
  // (a single one is run once, to leave its bits), the choice is logged, and `outputs` hold the
  // chosen variant's bits. Each digest and the timing wait for the stream: a shape's first step
  // waits a few times more.
  void choose_flash_variant(FlashPassChoice& choice, const CudaAttentionState& state,
                            const char* pass, const cuda::FlashVariant& ran,
                            const std::vector<int64_t>& tiles,
                            const std::function<void(const cuda::FlashVariant&)>& run,
                            const std::vector<const Tensor*>& outputs) {
    choice.chosen = true;
    choice.variant = ran;
    if (!time_flash_tiles_) return;
    const std::string shape = attention_shape_text(state.shape);
    std::vector<cuda::FlashMmaInstruction> instructions = {ran.instruction};
    if (state.wgmma_offered) {
      const std::vector<uint64_t> reference = output_digests(outputs);
      run(cuda::FlashVariant{cuda::FlashMmaInstruction::Wgmma, ran.tile});
      if (output_digests(outputs) == reference) {
        instructions.push_back(cuda::FlashMmaInstruction::Wgmma);
      } else {
        choice.wgmma_other_bits = true;
        spdlog::warn(
            "tensor-core flash at {}: {}'s wgmma kernels wrote other bits than its mma.sync "
            "kernels; running mma.sync (model.attention=flash_wgmma runs wgmma)",
            shape, pass);
      }
    }
    const std::vector<cuda::FlashVariant> variants = cuda::flash_variants(instructions, tiles);
    if (variants.size() == 1 && !state.wgmma_offered) return;  // nothing ran since the call
    ++sync_count_;
    const cuda::FlashVariantTiming timing =
        cuda::time_flash_variants(stream_, variants.size(), [&](size_t i) { run(variants[i]); });
    spdlog::info("tensor-core flash at {}: {} runs {}", shape, pass,
                 cuda::flash_variant_timing_text(variants, timing));
    choice.variant = variants[timing.chosen];
  }
  // The bits digest of each tensor (bits_digest.h); each waits for the stream.
  std::vector<uint64_t> output_digests(const std::vector<const Tensor*>& outputs) {
    std::vector<uint64_t> digests;
    for (const Tensor* t : outputs) {
      ++sync_count_;
      digests.push_back(cuda::bits_digest(t->data, int64_t(t->bytes() / 4),
                                          static_cast<uint64_t*>(digest_partials_.data), stream_));
    }
    return digests;
  }

  // The span of one op in `gnmr bench`'s breakdown (op_timer.h); nothing while timing is off.
  cuda::OpTimer::Scope time_op(const char* family) {
    return cuda::OpTimer::Scope(*op_timer_, family);
  }

  DeviceMemory memory_;
  int device_index_ = 0;
  int64_t shared_optin_bytes_ = 0;  // shared memory per block a kernel may opt in to
  bool warned_flash_fallback_ = false;
  CudaAttention attention_choice_;
  bool time_flash_tiles_ = false;  // CudaBackendOptions::flash_tiles
  std::function<std::string(const AttentionShape&)> wgmma_trial_;  // CudaBackendOptions
  using FlashChoiceKey = std::array<int64_t, 5>;  // batch, seq, heads, kv_heads, head_dim
  std::map<FlashChoiceKey, std::shared_ptr<FlashShapeChoice>> flash_choices_;
  Tensor digest_partials_;  // kBitsDigestPartials words for output_digests, where wgmma is offered
  GpuTarget target_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::OpTimer> op_timer_;  // set_op_timing
  std::unique_ptr<LtGemmRunner> gemm_;
  std::unique_ptr<cuda::MaterializedAttention> attention_;
  int64_t sync_count_ = 0;
  uint64_t weights_epoch_ = 1;  // bumped by invalidate_prepared_weights
  StagingSlot staging_[kStagingSlots];
  int next_slot_ = 0;
  // The host copy of each uploaded i32 tensor, by device address (embedding_backward).
  std::map<const void*, std::vector<int32_t>> host_tokens_;
  cuda::ProjectionScratch projection_scratch_;
  DeviceScratch embedding_index_{"embedding_index"}, rmsnorm_workspace_{"rmsnorm_workspace"},
      attention_scratch_{"attention_scratch"}, sum_squares_workspace_{"sum_squares_workspace"},
      matmul_a_{"matmul_a"}, matmul_b_{"matmul_b"};
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
  const AttentionKernel kernel =
      attention_kernel_for(options.attention, bf16_gemms, shape, shared_limit, warned);
  // Compute capability 9.0 stands for flash_wgmma_unavailable, which loads a kernel to read
  // whether the build has sm_90a code (a context): without it the trial answers why, and the
  // backend, which checks that itself, never asks.
  if (asks_wgmma_trial(options.attention, true, flash_tiles_timed(options.flash_tiles), kernel,
                       major == 9 && minor == 0)) {
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
  const auto& state = static_cast<const CudaAttentionState&>(*saved);
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
