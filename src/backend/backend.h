// Backend: the seam between the model's math and the hardware (docs/DESIGN.md §6).
//
// A Tensor is a handle to memory the backend owns (host memory for cpu, device memory for
// cuda); model code passes handles around and never dereferences `data`. Every op is
// enqueued: on a GPU it returns before the work is done. Only copy_to_host hands numbers to
// the host; it and synchronize() are the calls that wait for the device (sync_count() counts
// them), and a training step makes one: the loss and the squared gradient norms are computed
// in backend memory, the clip factor and the skip decision are made from them there, and the
// loss and norms are read back together at the end.
// Memory is planned once (the model allocates everything at construction); no op allocates
// a Tensor during a step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "precision/counter_rng.h"
#include "precision/fp_format.h"
#include "precision/path_spec.h"
#include "precision/quantize_groupwise.h"

namespace gnmr {

// F64 holds the trainer's double scalars in backend memory (loss sums, squared norms).
enum class DType { F32, BF16, I32, U8, F64 };

// What a buffer is for, so that `gnmr bench` can say where the memory goes. Weights:
// parameters; Gradients: their gradients; OptimizerState: AdamW moments; Activations: buffers
// one micro-step reuses (inputs, logits, activation gradients); SavedActivations: what the
// forward keeps for the backward (per layer); Scratch: per-step working memory (GEMM inputs,
// prepared weights, op workspaces).
enum class MemoryRole {
  Weights,
  Gradients,
  OptimizerState,
  Activations,
  SavedActivations,
  Scratch
};
constexpr int kMemoryRoles = 6;
const char* memory_role_name(MemoryRole role);  // "weights", ..., "saved_activations", "scratch"

// Bytes held per role (indexed by MemoryRole) and their sum.
struct MemoryUse {
  size_t bytes[kMemoryRoles] = {};
  size_t operator[](MemoryRole role) const { return bytes[static_cast<int>(role)]; }
  size_t total() const;
};

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

struct Tensor {
  void* data = nullptr;  // backend-owned; host code other than the backend must not read it
  DType dtype = DType::F32;
  std::vector<int64_t> shape;

  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
  std::string shape_string() const;  // "[4, 256, 512]"
};

// A view of `numel(shape)` elements of `base` starting `offset` elements in (no copy).
// Pointer arithmetic only, so it is valid for device memory too.
Tensor tensor_view(const Tensor& base, std::vector<int64_t> shape, int64_t offset = 0);

// Numerics of the projection GEMMs (matmul_*). train.gemm_precision in the config.
// BF16: both GEMM inputs rounded to bf16 (round-to-nearest-even), products accumulated in
// fp32, output fp32. The attention core, norms, loss and optimizer always run fp32.
enum class GemmPrecision { FP32, BF16 };

GemmPrecision parse_gemm_precision(const std::string& name);  // "fp32" | "bf16", else Error(Config)

class ProjectionState;

// A projection y = x W^T as one unit (or the lm_head) runs it: tokens N, W: [out, in].
struct ProjectionShape {
  int64_t tokens = 0;
  int64_t in = 0;
  int64_t out = 0;
  // The caller's dy is dead after projection_backward (the lm_head's dlogits [N, V]): the
  // backend may round or quantize it in place instead of into a copy.
  bool backward_may_overwrite_dy = false;
  // Saved-input sharing (shared_saved_input.h), decided by the model: projections reading the
  // same x that save it with the same deterministic group-wise spec keep one copy of it.
  // shared_saved_specs: the specs (as saved: groupwise_spec_for_width) whose codes this
  // projection keeps in the shared copies instead of its own buffers, the same list for every
  // projection of the input. saved_input_leader: nullptr for the first of them planned, which
  // allocates the copies (one per spec, counted in its planned_saved_bytes); for the later
  // ones, that first one's state. The leader's saving forward must be the first of each new x.
  std::vector<GroupwiseSpec> shared_saved_specs = {};
  const ProjectionState* saved_input_leader = nullptr;
  // Input groups, decided by the model: the projections of one layer that read the same x
  // (q, k, v; gate, up). input_leader: nullptr for the first of them planned and for a
  // projection reading an x of its own; for the later ones, that first one's state. The
  // leader's forward runs first for each new x and the others' forwards read that x; a
  // backward that reads x reads it unchanged since (the contract of reads_forward_input). A
  // backend may then prepare x once for the whole group: the CUDA backend rounds it to bf16
  // or quantizes it to fp8 codes once per group, not once per projection.
  const ProjectionState* input_leader = nullptr;
  // The model may keep x to the backward whatever the projection reads: another op's backward
  // may read it (the o projection's x is attention's out), or the model keeps it always (the
  // lm_head's xn_final). A backend then keeps no copy of x in place of it, which would only add
  // memory.
  bool input_read_elsewhere = false;
};

// What a backend planned for one projection (plan_projection): the memory both of its paths
// need (saved codes, the prepared weight) and what the last saving forward kept for the
// backward. Opaque to the model, owned by it, valid while the backend lives.
class ProjectionState {
 public:
  virtual ~ProjectionState() = default;
  // Whether the backward of `path` reads the forward's input x itself: the caller then keeps
  // x unchanged from projection_forward(save) to projection_backward.
  virtual bool reads_forward_input(const PathSpec& path) const = 0;
  // Bytes of the copy the backward of `path` reads (packed codes and scales), its own or one
  // it shares with the other projections of its input; 0 when the backward reads the
  // forward's input instead.
  virtual size_t saved_bytes(const PathSpec& path) const = 0;
  // Which of the copies of x that the projections of an input group (ProjectionShape::
  // input_leader) keep for their weight gradients that copy is (the CUDA backend's bf16 copy,
  // its x^T codes per FP8 format), or -1 when it is not one of those: each is counted once per
  // input, as the fp32 input is.
  virtual int group_copy(const PathSpec& path) const {
    (void)path;
    return -1;
  }
  // Bytes plan_projection allocated for those copies (room for the larger path not shared,
  // and the shared copies when this is their leader), as counted under
  // MemoryRole::SavedActivations.
  virtual size_t planned_saved_bytes() const = 0;
};

// One projection's forward as a fused op takes it (Backend::swiglu_projection_forward,
// residual_rmsnorm_projection_forward): its state, the path it runs, its weight and the
// stochastic-rounding key of its saved codes.
struct ProjectionForwardCall {
  ProjectionState& state;
  const PathSpec& path;
  const Tensor& w;
  const RngKey& key;
};

// One projection's backward as a fused op takes it (Backend::swiglu_projections_backward,
// rope_projection_backward, rmsnorm_projection_backward, cross_entropy_projection_backward): its
// state, the path its forward ran, its weight, and the gradient it adds dy^T x to.
struct ProjectionBackwardCall {
  ProjectionState& state;
  const PathSpec& path;
  const Tensor& w;
  Tensor& dw;
};

// One projection's weight as Backend::prepare_projection_weights takes it: its state, the path
// its GEMMs run next, and the weight.
struct ProjectionWeight {
  ProjectionState& state;
  const PathSpec& path;
  const Tensor& w;
};

// B = batch, T = seq, H = query heads, Hkv = key/value heads, hd = head dim.
struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
};

// "B=8 T=1024 H=32 Hkv=32 hd=64", for messages.
std::string attention_shape_text(const AttentionShape& s);

// What the attention forward keeps for its backward (plan_attention), backend-owned and
// opaque to the model.
class AttentionState {
 public:
  virtual ~AttentionState() = default;
  virtual size_t saved_bytes() const = 0;  // as allocated, under MemoryRole::SavedActivations
  // Which kernels run this attention, in words (the bench JSON's `attention`, the train log).
  virtual std::string kernel() const = 0;
  // Whether the state keeps what its backward reads of q, k and v (the CUDA tensor-core flash
  // kernels: the forward's bf16 copies), so that attention_backward reads only the shapes of
  // the q, k, v passed to it: the caller need not keep them from the forward to the backward.
  virtual bool keeps_inputs() const { return false; }
};

// One AdamW step as torch.optim.AdamW computes it (decoupled weight decay), with the gradient
// scale (the global-norm clip factor) read from backend memory, see adamw_update:
//   g = grad * grad_scale;  p -= lr * weight_decay * p
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
struct AdamWStep {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // 1-based, for bias correction
};

// One tensor of an optimizer step (Backend::adamw_update_batch): param, grad, m, v of one
// shape, F32, as adamw_update takes them (Tensor views: param, m and v are written through).
struct AdamWUpdate {
  Tensor param, grad, m, v;
  AdamWStep step;
};

// Shapes below: N = tokens = batch * seq, D = model dim, F = ffn dim, V = vocab,
// B = batch, T = seq, H = heads, Hkv = key/value heads, hd = head dim. All float tensors F32;
// token ids and targets I32. "+=" marks an output that is accumulated into, not overwritten.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // What it runs on, for logs and `gnmr bench`: the CPU's model name, or the GPU's
  // ("NVIDIA H200 (sm_90, 139 GiB)").
  virtual std::string device() const = 0;

  // ---- memory ----
  // A zero-filled tensor (every backend must honour the zeros: the model relies on them for
  // padding and never-written gradient rows), counted under `role`.
  virtual Tensor allocate(const std::string& name, std::vector<int64_t> shape, DType dtype,
                          MemoryRole role) = 0;
  virtual MemoryUse memory_use() const = 0;  // what is allocated now, by role (workspaces too)
  size_t allocated_bytes() const { return memory_use().total(); }
  virtual size_t peak_allocated_bytes() const = 0;
  virtual void copy_to_host(const Tensor& src, void* host) = 0;  // readback: synchronizes
  // Returns once `host` may be overwritten or freed: the caller's buffer is never read after
  // the call (the CPU copies at once; a GPU backend stages it or waits for its own copy),
  // so the model reuses one host buffer for every micro-batch's tokens. Not a readback.
  virtual void copy_from_host(Tensor& dst, const void* host) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;  // same numel and dtype
  virtual void fill_zero(Tensor& t) = 0;
  virtual void synchronize() = 0;
  // The calls so far that wait for the device (copy_to_host, synchronize): a GPU stalls at
  // each, so tests hold the trainer to one per optimizer step.
  virtual int64_t sync_count() const = 0;

  // Device time by op family (`gnmr bench`'s breakdown of a step): while on, each op's time is
  // added to its family's ("gemm", "prep x", "attention", "rmsnorm", ...); op_times_ms()
  // waits for the backend and returns the totals since timing was switched on. A backend that
  // does not time its ops (the CPU's: its step times are already its ops' own) returns none.
  virtual void set_op_timing(bool on) { (void)on; }
  virtual std::map<std::string, double> op_times_ms() { return {}; }

  void set_gemm_precision(GemmPrecision precision) { gemm_precision_ = precision; }
  GemmPrecision gemm_precision() const { return gemm_precision_; }

  // ---- model ops ----
  // tokens: [N] i32 (0 <= id < V, checked by the caller); table: [V, D]; out: [N, D]
  virtual void embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) = 0;
  // dtable[tokens[i]] += dout[i]
  virtual void embedding_backward(const Tensor& tokens, const Tensor& dout, Tensor& dtable) = 0;

  // out = weight * x / sqrt(mean(x^2) + eps) per row. x, out: [N, D]; weight: [D]; rstd: [N]
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                               Tensor& rstd) = 0;
  // dx += d/dx, dweight += d/dweight (rstd from the forward)
  virtual void rmsnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                const Tensor& dout, Tensor& dx, Tensor& dweight) = 0;

  // y = x W^T. x: [N, in]; weight: [out, in] (Hugging Face layout); y: [N, out]
  // `precision` says what the GEMM does to its inputs: FP32 uses them as given (also when a
  // precision recipe already rounded or fake-quantized them), BF16 rounds both to bf16.
  // Accumulation is fp32 either way. The overloads without it use gemm_precision().
  virtual void matmul_forward(const Tensor& x, const Tensor& weight, Tensor& y,
                              GemmPrecision precision) = 0;
  // dx = dy W (or dx += dy W when accumulate). dy: [N, out]; dx: [N, in]
  virtual void matmul_backward_input(const Tensor& dy, const Tensor& weight, Tensor& dx,
                                     bool accumulate, GemmPrecision precision) = 0;
  // dweight += dy^T x, fp32. x is the input the forward read (or the unit's saved view of it)
  virtual void matmul_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dweight,
                                      GemmPrecision precision) = 0;
  void matmul_forward(const Tensor& x, const Tensor& weight, Tensor& y) {
    matmul_forward(x, weight, y, gemm_precision_);
  }
  void matmul_backward_input(const Tensor& dy, const Tensor& weight, Tensor& dx, bool accumulate) {
    matmul_backward_input(dy, weight, dx, accumulate, gemm_precision_);
  }
  void matmul_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dweight) {
    matmul_backward_weight(x, dy, dweight, gemm_precision_);
  }
  void matmul_backward(const Tensor& x, const Tensor& weight, const Tensor& dy, Tensor& dx,
                       Tensor& dweight, bool accumulate_dx) {
    matmul_backward_input(dy, weight, dx, accumulate_dx);
    matmul_backward_weight(x, dy, dweight);
  }

  // ---- projections (the precision recipes' paths, src/precision/path_spec.h) ----
  // Plans one projection at construction for both of its paths (low and recovery may be the
  // same spec): every buffer either path needs is allocated here, under `name`, never in a
  // step. The backend chooses operand layouts and real or emulated execution per path.
  virtual std::unique_ptr<ProjectionState> plan_projection(const std::string& name,
                                                           const ProjectionShape& shape,
                                                           const PathSpec& low,
                                                           const PathSpec& recovery) = 0;
  // y = x W^T on `path` (low or recovery of the plan). x: [N, in]; w: [out, in]; y: [N, out].
  // When `save`, keeps what the backward of `path` reads (and, if reads_forward_input, the
  // view of x). Stochastic rounding of saved codes reads `key`.
  virtual void projection_forward(ProjectionState& state, const PathSpec& path, const Tensor& w,
                                  const Tensor& x, Tensor& y, bool save, const RngKey& key) = 0;
  // dw += dy^T x (x as the last saving forward kept it); dx = dy W (dx += when accumulate_dx).
  // `path` is the one that forward ran. dy is left unchanged unless the shape allowed it.
  virtual void projection_backward(ProjectionState& state, const PathSpec& path, const Tensor& w,
                                   Tensor& dy, Tensor& dx, bool accumulate_dx, Tensor& dw) = 0;
  // Drops every prepared (rounded / quantized) weight: call after the weights change. Each
  // is redone on its next use, then reused by the step's forward and backward GEMMs.
  virtual void invalidate_prepared_weights() = 0;
  // Prepares these projections' weights for their paths now, as each one's first GEMM would:
  // a backend may do together what it would otherwise do one weight at a time (the CUDA
  // backend quantizes all FP8 weights' 128x128 blocks in a few launches). The GEMMs read the
  // same operands either way. This implementation leaves each weight to its first use.
  virtual void prepare_projection_weights(const std::vector<ProjectionWeight>& weights) {
    (void)weights;
  }
  // How this backend runs `path` for a projection of `shape`: "fp32", "bf16", "fp8_block", or
  // "emulated (why)"; per GEMM ("forward ..., input_gradient ..., weight_gradient ...") when
  // its three GEMMs differ. What `gnmr bench` reports as gemm_impl and the run log names.
  virtual std::string describe_projection(const ProjectionShape& shape,
                                          const PathSpec& path) const = 0;

  // Rotary embedding in place, Hugging Face rotate-half convention.
  // x: [B, T, heads, hd]; cos, sin: [max_seq, hd / 2] (see rope_table.h); position = t.
  virtual void rope_forward(Tensor& x, const Tensor& cos, const Tensor& sin) = 0;
  // The transpose rotation, in place on the gradient.
  virtual void rope_backward(Tensor& dx, const Tensor& cos, const Tensor& sin) = 0;
  // RoPE's backward and the backward of the projection (q's or k's) that made its input, dx
  // [B, T, heads, hd] as rope_backward takes it:
  //   rope_backward(dx, cos, sin); proj's projection_backward(dx as [B T, heads hd]) -> d_in
  //   (+= when accumulate).
  // dx is the op's workspace: a backend that rotates dy as it quantizes it (the CUDA backend,
  // where the path quantizes dy to FP8 codes and nothing else, head dims 64 and 128: a read and
  // a write of dx fewer) leaves it unrotated. This implementation runs the two ops.
  virtual void rope_projection_backward(Tensor& dx, const Tensor& cos, const Tensor& sin,
                                        const ProjectionBackwardCall& proj, Tensor& d_in,
                                        bool accumulate);

  // Causal softmax attention with scale 1/sqrt(hd); query head h reads kv head h / (H / Hkv).
  // Planned once per layer: the state holds what the backward reads beyond q, k, v (the cpu:
  // the probabilities [B, H, T, T]; a flash-style kernel: the log-sum-exp [B, H, T] and out),
  // allocated here as saved activations. out_kept: the caller promises that the `out` it passes
  // to attention_forward is left unchanged until that forward's attention_backward (the model's
  // own o-projection input), so a kernel that reads out in its backward reads it there instead
  // of keeping a copy; false: the caller may overwrite out at once.
  virtual std::unique_ptr<AttentionState> plan_attention(const std::string& name,
                                                         const AttentionShape& shape,
                                                         bool out_kept) = 0;
  // q, out: [B, T, H, hd]; k, v: [B, T, Hkv, hd]; `saved` from plan_attention of that shape.
  virtual void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                 AttentionState& saved) = 0;
  // RoPE on q and k, then the attention forward:
  //   rope_forward(q, cos, sin); rope_forward(k, cos, sin); attention_forward(q, k, v, out, saved).
  // q and k are the op's workspace: a backend whose attention keeps its own copies of its
  // inputs (keeps_inputs) may rotate q and k as it copies them and leave them unrotated (the
  // CUDA tensor-core flash kernels: a read and a write of each fewer). This implementation
  // runs the three ops.
  virtual void rope_attention_forward(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cos,
                                      const Tensor& sin, Tensor& out, AttentionState& saved);
  // From the q, k, v and `saved` of the forward (only q's, k's and v's shapes where
  // saved.keeps_inputs()); dq, dk, dv overwritten.
  virtual void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionState& saved, const Tensor& dout, Tensor& dq,
                                  Tensor& dk, Tensor& dv) = 0;

  // out = silu(gate) * up. gate, up, out: [N, F]
  virtual void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  virtual void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                               Tensor& dgate, Tensor& dup) = 0;
  // The MLP's SwiGLU and the down projection reading its output:
  //   swiglu_forward(gate, up, out); down's projection_forward(out) -> y (saving when `save`).
  // A backend may make the projection's x operand in the SwiGLU's own pass (the CUDA backend,
  // where a saving FP8 forward quantizes x: out is written by the kernel that quantizes it, a
  // read of out fewer). out is written either way. This implementation runs the two ops.
  virtual void swiglu_projection_forward(const Tensor& gate, const Tensor& up, Tensor& out,
                                         const ProjectionForwardCall& down, Tensor& y, bool save);
  // The MLP's backward from the SwiGLU's output gradient dout to its input xn's gradient dx:
  //   swiglu_backward(gate, up, dout, dgate, dup);
  //   gate_proj's projection_backward(dgate) into dx (overwritten), up_proj's (dup) into dx (+=).
  // dgate and dup are the op's workspace: a backend that makes the projections' dy operands
  // from gate, up and dout as it reads them (the CUDA backend, where both paths quantize dy to
  // FP8 codes and nothing else: the gradients are never written, a write and a read of each
  // fewer) leaves them as they were. This implementation runs the three ops.
  virtual void swiglu_projections_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                                           Tensor& dgate, Tensor& dup,
                                           const ProjectionBackwardCall& gate_proj,
                                           const ProjectionBackwardCall& up_proj, Tensor& dx);

  // out = a + b (same shape)
  virtual void residual_forward(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // A residual add and the RMSNorm of its result: residual_forward(a, b, sum);
  // rmsnorm_forward(sum, weight, eps, out, rstd). A backend may do both in one pass over each row
  // (the CUDA backend: the sum is not read back from memory). This implementation runs the two.
  virtual void residual_rmsnorm_forward(const Tensor& a, const Tensor& b, Tensor& sum,
                                        const Tensor& weight, float eps, Tensor& out, Tensor& rstd);
  // The residual add and RMSNorm above, and the forward of the first projection reading the
  // norm's output (its input group's leader: q, or the MLP's gate):
  //   residual_rmsnorm_forward(a, b, sum, weight, eps, out, rstd);
  //   first's projection_forward(out) -> y (saving when `save`).
  // A backend may make the projection's x operand in the norm's own pass (the CUDA backend,
  // where the forward rounds x to bf16: the bf16 copy is written beside out, a read of out
  // fewer). out is written either way. This implementation runs the two ops.
  virtual void residual_rmsnorm_projection_forward(const Tensor& a, const Tensor& b, Tensor& sum,
                                                   const Tensor& weight, float eps, Tensor& out,
                                                   Tensor& rstd, const ProjectionForwardCall& first,
                                                   Tensor& y, bool save);
  // The RMSNorm's backward into the residual stream's gradient, and the backward of the
  // projection whose output that residual add took (o's, or down's), its dy that gradient:
  //   rmsnorm_backward(x, weight, rstd, dout, dx, dweight);
  //   proj's projection_backward(dx) into d_in (+= when accumulate).
  // A backend may make the projection's dy operand in the norm's own pass (the CUDA backend,
  // where the path's one form of dy is bf16: the bf16 copy is written beside dx, a read of dx
  // fewer). dx is written either way. This implementation runs the two ops.
  virtual void rmsnorm_projection_backward(const Tensor& x, const Tensor& weight,
                                           const Tensor& rstd, const Tensor& dout, Tensor& dx,
                                           Tensor& dweight, const ProjectionBackwardCall& proj,
                                           Tensor& d_in, bool accumulate);

  // losses[i] = logsumexp(logits[i]) - logits[i, targets[i]]; 0 where targets[i] < 0.
  // logits: [N, V]; targets: [N] i32; losses: [N]
  virtual void cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                     Tensor& losses) = 0;
  // The same, and in the same pass logits is overwritten with
  // dloss * (softmax(logits) - onehot(target)) (zero rows where targets[i] < 0).
  virtual void cross_entropy_forward_backward(Tensor& logits, const Tensor& targets, Tensor& losses,
                                              float dloss) = 0;
  // The loss, its gradient, and the lm_head's backward from that gradient:
  //   cross_entropy_forward_backward(logits, targets, losses, dloss);
  //   lm_head's projection_backward(logits) into dx (overwritten).
  // logits is the op's workspace: a backend that makes the lm_head's dy operand in the loss's
  // own pass (the CUDA backend, where that operand is bf16 and nothing else: the gradient is
  // written only as bf16) leaves the logits in it. This implementation runs the two ops.
  virtual void cross_entropy_projection_backward(Tensor& logits, const Tensor& targets,
                                                 Tensor& losses, float dloss,
                                                 const ProjectionBackwardCall& lm_head, Tensor& dx);

  // ---- precision-recipe ops (src/precision/recipe.h; CPU: cpu/quantize.cpp) ----
  // Each calls the src/precision function of the same name, so CPU and CUDA give equal bytes.
  // A tensor is a matrix [numel / last dim, last dim] (rows = tokens, cols = features).
  // x: [rows, cols] f32 -> packed: U8 with >= packed_bytes(rows, cols, spec) bytes, scales:
  // F32 with >= scale_count(rows, cols, spec) values (the buffers a unit planned for its
  // largest path; the leading part is written). Stochastic rounding reads `key`.
  virtual void quantize_int_groupwise(const Tensor& x, Tensor& packed, Tensor& scales,
                                      const GroupwiseSpec& spec, const RngKey& key) = 0;
  // packed, scales as written by quantize_int_groupwise -> out: [rows, cols] f32.
  virtual void dequantize_int_groupwise(const Tensor& packed, const Tensor& scales,
                                        const GroupwiseSpec& spec, Tensor& out) = 0;
  // out = dequantize(quantize(x)) with one fp32 scale per block_rows x block_cols block
  // (DeepSeek-V3: 1 x 128 activation tiles, 128 x 128 weight blocks). x, out: [rows, cols];
  // out may be x.
  virtual void fake_quantize_fp_blockwise(const Tensor& x, Tensor& out, FpFormat format,
                                          int64_t block_rows, int64_t block_cols) = 0;
  // out = symmetric int8 fake quantization with one scale per row (per token for activations,
  // per output channel for a weight [out, in]). x, out: [rows, cols].
  virtual void fake_quantize_int8_per_row(const Tensor& x, Tensor& out) = 0;
  // out = nearest bf16 of x, as f32 (emulated bf16 storage). Same numel.
  virtual void round_to_bf16(const Tensor& x, Tensor& out) = 0;

  // ---- trainer ops ----
  // None of these reads back: the step's scalars stay in backend memory until the trainer's
  // one copy_to_host per step.
  // loss_sum[0] += double(float(sum(losses) / valid_targets)), the sum in double in index
  // order: a micro-batch's mean loss, accumulated across micro-steps. losses: [N] f32;
  // loss_sum: [1] f64.
  virtual void accumulate_mean_loss(const Tensor& losses, int64_t valid_targets,
                                    Tensor& loss_sum) = 0;
  // out_per_tensor[i] = sum of squares of tensors[i], accumulated in double, one fused pass.
  // out_per_tensor: [tensors.size()] f64. Deterministic: fixed chunking, fixed reduction order.
  virtual void sum_squares(const std::vector<Tensor>& tensors, Tensor& out_per_tensor) = 0;
  // Before the first step: makes room for sum_squares over tensors of these sizes, so that no
  // step allocates (a backend without a workspace does nothing).
  virtual void plan_sum_squares(const std::vector<Tensor>& tensors) = 0;
  // Global-norm clipping and the skip decision of a step. norm = sqrt(sum of sum_squares[i]
  // added in index order, in double); clip[0] = float(max_norm / norm) when max_norm > 0 and
  // norm > max_norm, else 1; clip[1] = 1 when loss_sum[0] and norm are finite, else 0.
  // sum_squares: [P] f64; loss_sum: [1] f64; clip: [2] f32.
  virtual void global_norm_clip(const Tensor& sum_squares, const Tensor& loss_sum, double max_norm,
                                Tensor& clip) = 0;
  virtual void scale(Tensor& t, float factor) = 0;  // t *= factor
  // param, grad, m, v: same shape, F32; clip as global_norm_clip wrote it: grad_scale =
  // clip[0], and nothing is written when clip[1] == 0 (a non-finite step is skipped).
  virtual void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                            const AdamWStep& s, const Tensor& clip) = 0;
  // adamw_update on each of `updates` (the optimizer's step over all its tensors), each with its
  // own AdamWStep. The default runs them one by one; a backend may batch them (the CUDA one: a
  // few launches instead of one per tensor) but gives each tensor the bits of its own call.
  virtual void adamw_update_batch(std::vector<AdamWUpdate>& updates, const Tensor& clip) {
    for (AdamWUpdate& u : updates) adamw_update(u.param, u.grad, u.m, u.v, u.step, clip);
  }

 private:
  GemmPrecision gemm_precision_ = GemmPrecision::FP32;
};

}  // namespace gnmr
