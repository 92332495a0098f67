// CpuBackend: Backend over host memory; each op checks shapes and calls its loop in ops.h.
#include "backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/projection.h"
#include "backend/tensor_checks.h"
#include "util/error.h"

namespace gnmr {

namespace {

// The attention backward's saved state on the cpu: the softmax probabilities.
class CpuAttentionState final : public AttentionState {
 public:
  size_t saved_bytes() const override { return probs.bytes(); }
  std::string kernel() const override { return "materialized (cpu)"; }
  Tensor probs;  // [B, H, T, T]
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, bool poison) : threads_(cpu_backend_threads(threads)), poison_(poison) {
    // One BLAS thread: the backend parallelizes GEMMs itself (gemm_parallel), and the
    // per-(batch, head) attention GEMMs run inside OpenMP regions.
    openblas_set_num_threads(1);
    // The quantizers in src/precision open plain `omp parallel for` regions (they cannot take
    // the backend's thread count); without this they would use every core even at
    // train.threads=1, and spin at their barriers when another job holds the other cores.
    omp_set_num_threads(threads_);
  }

  ~CpuBackend() override {
    for (void* block : blocks_) std::free(block);
  }

  std::string name() const override { return "cpu"; }
  std::string device() const override { return detect_cpu_features().model_name; }

  Tensor allocate(const std::string& name, std::vector<int64_t> shape, DType dtype,
                  MemoryRole role) override {
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    for (int64_t s : t.shape) {
      GNMR_CHECK(s >= 0, "allocate " + name + ": negative extent in " + t.shape_string());
    }
    const size_t bytes = std::max<size_t>(64, (t.bytes() + 63) / 64 * 64);
    void* block = std::aligned_alloc(64, bytes);
    if (block == nullptr) {
      throw Error(ErrorKind::Runtime, "cpu backend: out of memory allocating " + name + " " +
                                          t.shape_string() + " (" + std::to_string(bytes) +
                                          " bytes, " + std::to_string(allocated_bytes()) +
                                          " already allocated)");
    }
    std::memset(block, poisoned(role) ? 0xFF : 0, bytes);
    blocks_.push_back(block);
    t.data = block;
    tensor_bytes_[static_cast<int>(role)] += bytes;
    return t;
  }

  // The op workspaces (grown on first use of a shape, then reused) count as scratch.
  MemoryUse memory_use() const override {
    MemoryUse use;
    for (int r = 0; r < kMemoryRoles; ++r) use.bytes[r] = tensor_bytes_[r];
    use.bytes[static_cast<int>(MemoryRole::Scratch)] += workspace_bytes();
    return use;
  }
  size_t peak_allocated_bytes() const override { return allocated_bytes(); }  // nothing is freed

  // Empty tensors may have null data (and null host buffers): memcpy/memset must not see them.
  void copy_to_host(const Tensor& src, void* host) override {
    ++sync_count_;
    if (src.bytes() > 0) std::memcpy(host, src.data, src.bytes());
  }
  void copy_from_host(Tensor& dst, const void* host) override {
    if (dst.bytes() > 0) std::memcpy(dst.data, host, dst.bytes());
  }
  void copy(const Tensor& src, Tensor& dst) override {
    GNMR_CHECK(src.bytes() == dst.bytes() && src.dtype == dst.dtype, "copy: tensors differ");
    if (src.bytes() > 0) std::memcpy(dst.data, src.data, src.bytes());
  }
  void fill_zero(Tensor& t) override {
    if (t.bytes() > 0) std::memset(t.data, 0, t.bytes());
  }
  // Nothing to wait for on the CPU, but counted as the GPU call that would wait.
  void synchronize() override { ++sync_count_; }
  int64_t sync_count() const override { return sync_count_; }

  void embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) override {
    const int64_t n = tokens.numel(), d = matrix_cols(table);
    GNMR_CHECK(out.numel() == n * d, "embedding_forward: out " + out.shape_string());
    cpu::embedding_forward(i32_data(tokens), f32_data(table), f32_data(out), n, d, threads_);
  }
  void embedding_backward(const Tensor& tokens, const Tensor& dout, Tensor& dtable) override {
    const int64_t n = tokens.numel(), d = matrix_cols(dtable);
    GNMR_CHECK(dout.numel() == n * d, "embedding_backward: dout " + dout.shape_string());
    cpu::embedding_backward(i32_data(tokens), f32_data(dout), f32_data(dtable), n, d, threads_);
  }

  void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                       Tensor& rstd) override {
    const int64_t n = matrix_rows(x), d = matrix_cols(x);
    GNMR_CHECK(weight.numel() == d && rstd.numel() == n, "rmsnorm_forward: shapes");
    check_same_numel(x, out, "rmsnorm_forward");
    cpu::rmsnorm_forward(f32_data(x), f32_data(weight), eps, f32_data(out), f32_data(rstd), n, d,
                         threads_);
  }
  void rmsnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        const Tensor& dout, Tensor& dx, Tensor& dweight) override {
    const int64_t n = matrix_rows(x), d = matrix_cols(x);
    GNMR_CHECK(weight.numel() == d && dweight.numel() == d && rstd.numel() == n,
               "rmsnorm_backward: shapes");
    check_same_numel(x, dout, "rmsnorm_backward");
    check_same_numel(x, dx, "rmsnorm_backward");
    float* ws = workspace(workspace_rmsnorm_, cpu::rmsnorm_backward_workspace(n, d));
    cpu::rmsnorm_backward(f32_data(x), f32_data(weight), f32_data(rstd), f32_data(dout),
                          f32_data(dx), f32_data(dweight), n, d, ws, threads_);
  }

  using Backend::matmul_backward_input;
  using Backend::matmul_backward_weight;
  using Backend::matmul_forward;

  void matmul_forward(const Tensor& x, const Tensor& weight, Tensor& y,
                      GemmPrecision precision) override {
    const int64_t n = matrix_rows(x), in = matrix_cols(x), out = matrix_rows(weight);
    GNMR_CHECK(matrix_cols(weight) == in && y.numel() == n * out,
               "matmul_forward: x " + x.shape_string() + ", W " + weight.shape_string() + ", y " +
                   y.shape_string());
    const float* xp = gemm_input(f32_data(x), x.numel(), precision, workspace_a_);
    const float* wp = gemm_input(f32_data(weight), weight.numel(), precision, workspace_b_);
    cpu::matmul_forward(xp, wp, f32_data(y), n, in, out, threads_);
  }
  void matmul_backward_input(const Tensor& dy, const Tensor& weight, Tensor& dx, bool accumulate,
                             GemmPrecision precision) override {
    const int64_t n = matrix_rows(dy), out = matrix_cols(dy), in = matrix_cols(weight);
    GNMR_CHECK(matrix_rows(weight) == out && dx.numel() == n * in,
               "matmul_backward_input: dy " + dy.shape_string() + ", W " + weight.shape_string() +
                   ", dx " + dx.shape_string());
    const float* dyp = gemm_input(f32_data(dy), dy.numel(), precision, workspace_a_);
    const float* wp = gemm_input(f32_data(weight), weight.numel(), precision, workspace_b_);
    cpu::matmul_backward_input(dyp, wp, f32_data(dx), n, in, out, accumulate, threads_);
  }
  void matmul_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dweight,
                              GemmPrecision precision) override {
    const int64_t n = matrix_rows(x), in = matrix_cols(x), out = matrix_cols(dy);
    GNMR_CHECK(matrix_rows(dy) == n && dweight.numel() == out * in,
               "matmul_backward_weight: x " + x.shape_string() + ", dy " + dy.shape_string() +
                   ", dW " + dweight.shape_string());
    const float* xp = gemm_input(f32_data(x), x.numel(), precision, workspace_a_);
    const float* dyp = gemm_input(f32_data(dy), dy.numel(), precision, workspace_b_);
    cpu::matmul_backward_weight(xp, dyp, f32_data(dweight), n, in, out, threads_);
  }

  std::unique_ptr<ProjectionState> plan_projection(const std::string& name,
                                                   const ProjectionShape& shape,
                                                   const PathSpec& low,
                                                   const PathSpec& recovery) override {
    std::unique_ptr<cpu::CpuProjectionState> state =
        cpu::plan_projection(*this, name, shape, low, recovery);
    workspace(workspace_projection_x_, state->x_scratch);
    workspace(workspace_projection_dy_, state->dy_scratch);
    return state;
  }
  void projection_forward(ProjectionState& state, const PathSpec& path, const Tensor& w,
                          const Tensor& x, Tensor& y, bool save, const RngKey& key) override {
    cpu::projection_forward(projection_call(state, w), path, x, y, save, key);
  }
  void projection_backward(ProjectionState& state, const PathSpec& path, const Tensor& w,
                           Tensor& dy, Tensor& dx, bool accumulate_dx, Tensor& dw) override {
    cpu::projection_backward(projection_call(state, w), path, dy, dx, accumulate_dx, dw);
  }
  void invalidate_prepared_weights() override { ++weights_epoch_; }
  // Everything but an fp32 GEMM of unchanged inputs is the fp32 emulation (cpu/projection.h).
  std::string describe_projection(const ProjectionShape&, const PathSpec& path) const override {
    const bool plain =
        (path.kind == PathKind::kBackendGemm || path.kind == PathKind::kSavedIntGroupwise) &&
        gemm_precision() == GemmPrecision::FP32;
    return plain ? "fp32"
                 : "emulated (the cpu backend rounds or fake-quantizes the GEMM inputs in fp32, "
                   "then runs an fp32 GEMM)";
  }

  void quantize_int_groupwise(const Tensor& x, Tensor& packed, Tensor& scales,
                              const GroupwiseSpec& spec, const RngKey& key) override {
    const int64_t n = matrix_rows(x), d = matrix_cols(x);
    validate_groupwise_spec(d, spec);
    GNMR_CHECK(packed.dtype == DType::U8 && packed.bytes() >= gnmr::packed_bytes(n, d, spec) &&
                   static_cast<size_t>(scales.numel()) >= scale_count(n, d, spec),
               "quantize_int_groupwise: x " + x.shape_string() + " needs " +
                   std::to_string(gnmr::packed_bytes(n, d, spec)) + " packed bytes and " +
                   std::to_string(scale_count(n, d, spec)) + " scales, got " +
                   packed.shape_string() + " and " + scales.shape_string());
    cpu::quantize_int_groupwise(f32_data(x), n, d, spec, static_cast<uint8_t*>(packed.data),
                                f32_data(scales), key);
  }
  void dequantize_int_groupwise(const Tensor& packed, const Tensor& scales,
                                const GroupwiseSpec& spec, Tensor& out) override {
    const int64_t n = matrix_rows(out), d = matrix_cols(out);
    validate_groupwise_spec(d, spec);
    GNMR_CHECK(packed.dtype == DType::U8 && packed.bytes() >= gnmr::packed_bytes(n, d, spec) &&
                   static_cast<size_t>(scales.numel()) >= scale_count(n, d, spec),
               "dequantize_int_groupwise: out " + out.shape_string() + " needs " +
                   std::to_string(gnmr::packed_bytes(n, d, spec)) + " packed bytes and " +
                   std::to_string(scale_count(n, d, spec)) + " scales, got " +
                   packed.shape_string() + " and " + scales.shape_string());
    cpu::dequantize_int_groupwise(static_cast<const uint8_t*>(packed.data), f32_data(scales), n, d,
                                  spec, f32_data(out));
  }
  void fake_quantize_fp_blockwise(const Tensor& x, Tensor& out, FpFormat format, int64_t block_rows,
                                  int64_t block_cols) override {
    check_same_numel(x, out, "fake_quantize_fp_blockwise");
    GNMR_CHECK(block_rows > 0 && block_cols > 0, "fake_quantize_fp_blockwise: empty block");
    cpu::fake_quantize_fp_blockwise(f32_data(x), matrix_rows(x), matrix_cols(x), format, block_rows,
                                    block_cols, f32_data(out));
  }
  void fake_quantize_int8_per_row(const Tensor& x, Tensor& out) override {
    check_same_numel(x, out, "fake_quantize_int8_per_row");
    cpu::fake_quantize_int8_per_row(f32_data(x), matrix_rows(x), matrix_cols(x), f32_data(out));
  }
  void round_to_bf16(const Tensor& x, Tensor& out) override {
    check_same_numel(x, out, "round_to_bf16");
    cpu::round_to_bf16_copy(f32_data(x), f32_data(out), x.numel(), threads_);
  }

  void rope_forward(Tensor& x, const Tensor& cos, const Tensor& sin) override {
    GNMR_CHECK(x.shape.size() == 4 && cos.dim(0) >= x.dim(1) && cos.dim(1) * 2 == x.dim(3),
               "rope_forward: x " + x.shape_string() + " vs table " + cos.shape_string());
    cpu::rope_forward(f32_data(x), f32_data(cos), f32_data(sin), x.dim(0), x.dim(1), x.dim(2),
                      x.dim(3), threads_);
  }
  void rope_backward(Tensor& dx, const Tensor& cos, const Tensor& sin) override {
    GNMR_CHECK(dx.shape.size() == 4 && cos.dim(0) >= dx.dim(1) && cos.dim(1) * 2 == dx.dim(3),
               "rope_backward: dx " + dx.shape_string() + " vs table " + cos.shape_string());
    cpu::rope_backward(f32_data(dx), f32_data(cos), f32_data(sin), dx.dim(0), dx.dim(1), dx.dim(2),
                       dx.dim(3), threads_);
  }

  // The probabilities are all the backward reads, so out_kept changes nothing here.
  std::unique_ptr<AttentionState> plan_attention(const std::string& name,
                                                 const AttentionShape& shape,
                                                 bool /*out_kept*/) override {
    auto state = std::make_unique<CpuAttentionState>();
    state->probs = allocate(name + ".probs", {shape.batch, shape.heads, shape.seq, shape.seq},
                            DType::F32, MemoryRole::SavedActivations);
    return state;
  }
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                         AttentionState& saved) override {
    const cpu::AttentionShape s = attention_shape(q, k);
    check_same_numel(k, v, "attention_forward");
    check_same_numel(q, out, "attention_forward");
    const Tensor& probs = attention_probs(saved, s);
    cpu::attention_forward(f32_data(q), f32_data(k), f32_data(v), f32_data(out), f32_data(probs), s,
                           threads_);
  }
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionState& saved, const Tensor& dout, Tensor& dq, Tensor& dk,
                          Tensor& dv) override {
    const cpu::AttentionShape s = attention_shape(q, k);
    check_same_numel(q, dq, "attention_backward");
    check_same_numel(q, dout, "attention_backward");
    check_same_numel(k, dk, "attention_backward");
    check_same_numel(v, dv, "attention_backward");
    const Tensor& probs = attention_probs(saved, s);
    float* ws = workspace(workspace_attention_, cpu::attention_backward_workspace(s, threads_));
    cpu::attention_backward(f32_data(q), f32_data(k), f32_data(v), f32_data(probs), f32_data(dout),
                            f32_data(dq), f32_data(dk), f32_data(dv), s, ws, threads_);
  }

  void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) override {
    check_same_numel(gate, up, "swiglu_forward");
    check_same_numel(gate, out, "swiglu_forward");
    cpu::swiglu_forward(f32_data(gate), f32_data(up), f32_data(out), gate.numel(), threads_);
  }
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                       Tensor& dup) override {
    check_same_numel(gate, dout, "swiglu_backward");
    check_same_numel(gate, dgate, "swiglu_backward");
    check_same_numel(up, dup, "swiglu_backward");
    cpu::swiglu_backward(f32_data(gate), f32_data(up), f32_data(dout), f32_data(dgate),
                         f32_data(dup), gate.numel(), threads_);
  }

  void residual_forward(const Tensor& a, const Tensor& b, Tensor& out) override {
    check_same_numel(a, b, "residual_forward");
    check_same_numel(a, out, "residual_forward");
    cpu::residual_forward(f32_data(a), f32_data(b), f32_data(out), a.numel(), threads_);
  }

  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses) override {
    const int64_t n = matrix_rows(logits), vocab = matrix_cols(logits);
    GNMR_CHECK(targets.numel() == n && losses.numel() == n, "cross_entropy_forward: shapes");
    cpu::cross_entropy_forward(f32_data(logits), i32_data(targets), f32_data(losses), n, vocab,
                               threads_);
  }
  void cross_entropy_forward_backward(Tensor& logits, const Tensor& targets, Tensor& losses,
                                      float dloss) override {
    const int64_t n = matrix_rows(logits), vocab = matrix_cols(logits);
    GNMR_CHECK(targets.numel() == n && losses.numel() == n,
               "cross_entropy_forward_backward: shapes");
    cpu::cross_entropy_forward_backward(f32_data(logits), i32_data(targets), f32_data(losses),
                                        dloss, n, vocab, threads_);
  }

  void accumulate_mean_loss(const Tensor& losses, int64_t valid_targets,
                            Tensor& loss_sum) override {
    GNMR_CHECK(valid_targets > 0 && loss_sum.numel() == 1,
               "accumulate_mean_loss: needs valid targets and a one-element sum, got " +
                   std::to_string(valid_targets) + " and " + loss_sum.shape_string());
    cpu::accumulate_mean_loss(f32_data(losses), losses.numel(), valid_targets, f64_data(loss_sum));
  }
  void sum_squares(const std::vector<Tensor>& tensors, Tensor& out_per_tensor) override {
    GNMR_CHECK(out_per_tensor.numel() == static_cast<int64_t>(tensors.size()),
               "sum_squares: " + std::to_string(tensors.size()) + " tensors, out " +
                   out_per_tensor.shape_string());
    std::vector<const float*> pointers;
    std::vector<int64_t> counts;
    for (const Tensor& t : tensors) {
      pointers.push_back(f32_data(t));
      counts.push_back(t.numel());
    }
    cpu::sum_squares(pointers.data(), counts.data(), static_cast<int64_t>(tensors.size()),
                     f64_data(out_per_tensor), threads_);
  }
  void plan_sum_squares(const std::vector<Tensor>&) override {}  // no workspace on the CPU
  void global_norm_clip(const Tensor& sum_squares, const Tensor& loss_sum, double max_norm,
                        Tensor& clip) override {
    GNMR_CHECK(loss_sum.numel() == 1 && clip.numel() == 2,
               "global_norm_clip: loss_sum " + loss_sum.shape_string() + ", clip " +
                   clip.shape_string() + " (want [1] and [2])");
    cpu::global_norm_clip(f64_data(sum_squares), sum_squares.numel(), *f64_data(loss_sum), max_norm,
                          f32_data(clip));
  }
  void scale(Tensor& t, float factor) override {
    cpu::scale(f32_data(t), factor, t.numel(), threads_);
  }
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s,
                    const Tensor& clip) override {
    check_same_numel(param, grad, "adamw_update");
    check_same_numel(param, m, "adamw_update");
    check_same_numel(param, v, "adamw_update");
    GNMR_CHECK(s.step >= 1, "adamw_update: step is 1-based");
    GNMR_CHECK(clip.numel() == 2, "adamw_update: clip " + clip.shape_string() + " (want [2])");
    const float* scale_and_flag = f32_data(clip);
    if (scale_and_flag[1] == 0.0f) return;
    cpu::adamw_update(f32_data(param), f32_data(grad), f32_data(m), f32_data(v), param.numel(), s,
                      scale_and_flag[0], threads_);
  }

 private:
  // The probabilities of a state this backend planned for shape `s`.
  static const Tensor& attention_probs(const AttentionState& saved, const cpu::AttentionShape& s) {
    const auto* state = dynamic_cast<const CpuAttentionState*>(&saved);
    GNMR_CHECK(state != nullptr, "attention state was not planned by the cpu backend");
    GNMR_CHECK(state->probs.numel() == s.batch * s.heads * s.seq * s.seq,
               "attention: state planned for probs " + state->probs.shape_string());
    return state->probs;
  }

  static cpu::AttentionShape attention_shape(const Tensor& q, const Tensor& k) {
    return attention_shape_of(q, k);
  }

  cpu::ProjectionCall projection_call(ProjectionState& state, const Tensor& w) {
    auto* cpu_state = dynamic_cast<cpu::CpuProjectionState*>(&state);
    GNMR_CHECK(cpu_state != nullptr, "projection state was not planned by the cpu backend");
    const cpu::ProjectionScratch scratch{
        workspace_projection_x_.data(), static_cast<int64_t>(workspace_projection_x_.size()),
        workspace_projection_dy_.data(), static_cast<int64_t>(workspace_projection_dy_.size())};
    return cpu::ProjectionCall{*this, *cpu_state, w, scratch, weights_epoch_};
  }

  // In bf16 mode a GEMM input is rounded into a scratch copy; in fp32 mode it is used as is.
  const float* gemm_input(const float* src, int64_t count, GemmPrecision precision,
                          std::vector<float>& scratch) {
    if (precision == GemmPrecision::FP32) return src;
    float* dst = workspace(scratch, count);
    cpu::round_to_bf16_copy(src, dst, count, threads_);
    return dst;
  }

  // Scratch that grows to its high-water mark during the first step, then stays.
  static float* workspace(std::vector<float>& buffer, int64_t count) {
    if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(static_cast<size_t>(count));
    return buffer.data();
  }
  size_t workspace_bytes() const {
    return sizeof(float) *
           (workspace_rmsnorm_.size() + workspace_attention_.size() + workspace_a_.size() +
            workspace_b_.size() + workspace_projection_x_.size() + workspace_projection_dy_.size());
  }

  // The poison mode's fill (make_cpu_backend): the roles nothing may read before it writes.
  bool poisoned(MemoryRole role) const {
    return poison_ && (role == MemoryRole::Activations || role == MemoryRole::SavedActivations ||
                       role == MemoryRole::Scratch);
  }

  int threads_;
  bool poison_;
  int64_t sync_count_ = 0;
  std::vector<void*> blocks_;
  size_t tensor_bytes_[kMemoryRoles] = {};  // by MemoryRole
  std::vector<float> workspace_rmsnorm_, workspace_attention_, workspace_a_, workspace_b_;
  // The projections' shared scratch, sized when they are planned (projection.h).
  std::vector<float> workspace_projection_x_, workspace_projection_dy_;
  uint64_t weights_epoch_ = 1;  // bumped by invalidate_prepared_weights
};

}  // namespace

int cpu_backend_threads(int threads) {
  return threads > 0 ? threads : omp_get_max_threads();
}

const Tensor& cpu_attention_probs(const AttentionState& state) {
  const auto* cpu_state = dynamic_cast<const CpuAttentionState*>(&state);
  GNMR_CHECK(cpu_state != nullptr, "attention state was not planned by the cpu backend");
  return cpu_state->probs;
}

std::unique_ptr<Backend> make_cpu_backend(int threads, bool poison) {
  return std::make_unique<CpuBackend>(threads, poison);
}

}  // namespace gnmr
