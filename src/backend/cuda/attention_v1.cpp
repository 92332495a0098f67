// MaterializedAttention (attention_v1.h): plan_attention_v1's steps on cuBLASLt and the causal
// softmax kernels. CPU twin: src/backend/cpu/attention.cpp.
#include "backend/cuda/attention_v1.h"

#include <array>
#include <cstdint>
#include <map>

#include "backend/cuda/cublaslt_descriptors.h"
#include "backend/cuda/operand_alignment.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"
#include "util/error.h"

namespace gnmr::cuda {

namespace {

cublasLtMatrixLayout_t batched_layout(const BatchedMatrix& m, int64_t batch_count,
                                      const std::string& what) {
  const std::string where = what + ", operand " + attention_tensor_name(m.tensor);
  cublasLtMatrixLayout_t layout = nullptr;
  GNMR_CUBLASLT_CHECK(
      cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, uint64_t(m.rows), uint64_t(m.cols), m.ld),
      where);
  try {
    const int32_t count = static_cast<int32_t>(batch_count);
    const int64_t stride = m.batch_stride;
    GNMR_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count, sizeof count),
                        where);
    GNMR_CUBLASLT_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                         &stride, sizeof stride),
        where);
  } catch (...) {
    cublasLtMatrixLayoutDestroy(layout);
    throw;
  }
  return layout;
}

// The operand's alignment (operand_alignment.h): P's T x T matrices (T = 17) or a head's
// columns sit at 4-byte boundaries.
uint32_t alignment_bytes(const float* start, const BatchedMatrix& m, int64_t batch_count) {
  return operand_alignment_bytes(start, m.ld * int64_t(sizeof(float)),
                                 batch_count > 1 ? m.batch_stride * int64_t(sizeof(float)) : 0);
}

std::string matrix_key(const BatchedMatrix& m) {
  return std::to_string(int(m.tensor)) + "," + std::to_string(m.rows) + "," +
         std::to_string(m.cols) + "," + std::to_string(m.ld) + "," + std::to_string(m.batch_stride);
}

bool same_shape(const AttentionShape& a, const AttentionShape& b) {
  return a.batch == b.batch && a.seq == b.seq && a.heads == b.heads && a.kv_heads == b.kv_heads &&
         a.head_dim == b.head_dim;
}

}  // namespace

cublasComputeType_t attention_v1_compute_type(GemmPrecision precision) {
  return precision == GemmPrecision::BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
}

AttentionGemmDescriptors::AttentionGemmDescriptors(const AttentionGemmPlan& plan,
                                                   GemmPrecision precision) {
  what_ = std::string("attention ") + attention_gemm_name(plan.gemm) + " " +
          std::to_string(plan.m) + " x " + std::to_string(plan.n) + " x " + std::to_string(plan.k) +
          ", batch " + std::to_string(plan.batch_count) +
          (precision == GemmPrecision::BF16 ? ", bf16" : "");
  GNMR_CHECK(plan.batch_count >= 1 && plan.batch_count <= INT32_MAX,
             what_ + ": cuBLASLt's batch count is an int32");
  try {
    create_matmul_descriptor(matmul_, attention_v1_compute_type(precision), CUDA_R_32F, plan.transa,
                             plan.transb, what_);
    a_ = batched_layout(plan.a, plan.batch_count, what_);
    b_ = batched_layout(plan.b, plan.batch_count, what_);
    d_ = batched_layout(plan.d, plan.batch_count, what_);
  } catch (...) {
    destroy();
    throw;
  }
}

AttentionGemmDescriptors::~AttentionGemmDescriptors() {
  destroy();
}

void AttentionGemmDescriptors::destroy() {
  destroy_lt_descriptors(matmul_, a_, b_, d_);
}

struct MaterializedAttention::Impl {
  // One GEMM's descriptors and the heuristic's algorithm for its operands' alignments, made on
  // first use and cached (the shapes repeat every layer and step).
  struct Prepared {
    std::unique_ptr<AttentionGemmDescriptors> descriptors;
    cublasLtMatmulPreference_t preference = nullptr;
    cublasLtMatmulHeuristicResult_t heuristic{};
    ~Prepared() {
      if (preference) cublasLtMatmulPreferenceDestroy(preference);
    }
  };

  // The device buffers of one call, by AttentionTensor: inputs (read by A and B) and outputs
  // (written as D).
  struct Buffers {
    std::array<const float*, 10> in{};
    std::array<float*, 10> out{};
  };

  Prepared& prepare(const AttentionGemmPlan& g, GemmPrecision precision,
                    const std::array<uint32_t, 3>& align);
  void run_gemm(const AttentionGemmPlan& g, GemmPrecision precision, const AttentionGemmCall& call,
                const Buffers& buf, cudaStream_t stream);
  const AttentionPlan& plan_for(const AttentionShape& s);
  void run(const std::vector<AttentionStep>& steps, const AttentionPlan& plan,
           GemmPrecision precision, const Buffers& buf, cudaStream_t stream);

  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<std::string, std::unique_ptr<Prepared>> cache;
  std::unique_ptr<AttentionPlan> plan;  // of the last shape (one per model in practice)
};

MaterializedAttention::Impl::Prepared& MaterializedAttention::Impl::prepare(
    const AttentionGemmPlan& g, GemmPrecision precision, const std::array<uint32_t, 3>& align) {
  std::string key = std::string(attention_gemm_name(g.gemm)) + "/" +
                    std::to_string(int(attention_v1_compute_type(precision))) + "/" +
                    std::to_string(g.m) + "/" + std::to_string(g.n) + "/" + std::to_string(g.k) +
                    "/" + std::to_string(int(g.transa)) + std::to_string(int(g.transb)) + "/" +
                    std::to_string(g.batch_count) + "/" + matrix_key(g.a) + "/" + matrix_key(g.b) +
                    "/" + matrix_key(g.d);
  for (uint32_t a : align) key += "/" + std::to_string(a);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;

  auto p = std::make_unique<Prepared>();
  p->descriptors = std::make_unique<AttentionGemmDescriptors>(g, precision);
  const std::string& what = p->descriptors->what();
  GNMR_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&p->preference), what);
  const uint64_t max_workspace = workspace_bytes;
  GNMR_CUBLASLT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(p->preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &max_workspace, sizeof max_workspace),
      what);
  const std::array<cublasLtMatmulPreferenceAttributes_t, 4> attrs = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const std::array<uint32_t, 4> values = {align[0], align[1], align[2], align[2]};  // C = D
  for (size_t i = 0; i < attrs.size(); ++i) {
    GNMR_CUBLASLT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(p->preference, attrs[i], &values[i], sizeof values[i]),
        what);
  }
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle, p->descriptors->matmul(), p->descriptors->a(), p->descriptors->b(),
      p->descriptors->d(), p->descriptors->d(), p->preference, 1, &p->heuristic, &found);
  GNMR_CUBLASLT_CHECK(status, what + " (heuristic, " + key + ")");
  if (found == 0) {
    throw Error(ErrorKind::Runtime, "cuBLASLt has no algorithm for " + what + " (" + key + ")");
  }
  return *cache.emplace(key, std::move(p)).first->second;
}

void MaterializedAttention::Impl::run_gemm(const AttentionGemmPlan& g, GemmPrecision precision,
                                           const AttentionGemmCall& call, const Buffers& buf,
                                           cudaStream_t stream) {
  const float* a = buf.in[size_t(g.a.tensor)];
  const float* b = buf.in[size_t(g.b.tensor)];
  float* d = buf.out[size_t(g.d.tensor)];
  GNMR_CHECK(a && b && d, std::string("attention ") + attention_gemm_name(g.gemm) +
                              ": a buffer of the call is missing");
  a += call.a_offset, b += call.b_offset, d += call.d_offset;
  Prepared& p =
      prepare(g, precision,
              {alignment_bytes(a, g.a, g.batch_count), alignment_bytes(b, g.b, g.batch_count),
               alignment_bytes(d, g.d, g.batch_count)});
  const float alpha = g.alpha, beta = call.beta;
  GNMR_CUBLASLT_CHECK(
      cublasLtMatmul(handle, p.descriptors->matmul(), &alpha, a, p.descriptors->a(), b,
                     p.descriptors->b(), &beta, d, p.descriptors->d(), d, p.descriptors->d(),
                     &p.heuristic.algo, workspace, workspace_bytes, stream),
      p.descriptors->what());
}

const AttentionPlan& MaterializedAttention::Impl::plan_for(const AttentionShape& s) {
  if (!plan || !same_shape(plan->shape, s)) {
    plan = std::make_unique<AttentionPlan>(plan_attention_v1(s));
  }
  return *plan;
}

void MaterializedAttention::Impl::run(const std::vector<AttentionStep>& steps,
                                      const AttentionPlan& plan, GemmPrecision precision,
                                      const Buffers& buf, cudaStream_t stream) {
  const int64_t t = plan.shape.seq;
  for (const AttentionStep& step : steps) {
    switch (step.kind) {
      case AttentionStepKind::kGemm:
        run_gemm(plan.gemms[size_t(step.gemm)], precision, step.call, buf, stream);
        break;
      case AttentionStepKind::kSoftmaxForward:
        causal_softmax_forward(buf.out[size_t(AttentionTensor::kProbs)] + step.probs_offset,
                               step.matrices, t, stream);
        break;
      case AttentionStepKind::kSoftmaxBackward:
        causal_softmax_backward(buf.in[size_t(AttentionTensor::kProbs)] + step.probs_offset,
                                buf.out[size_t(AttentionTensor::kDScores)] + step.dscores_offset,
                                step.matrices, t, plan.scale, stream);
        break;
    }
  }
}

MaterializedAttention::MaterializedAttention(cublasLtHandle_t handle, void* workspace,
                                             size_t workspace_bytes)
    : impl_(std::make_unique<Impl>()) {
  GNMR_CHECK(handle != nullptr, "MaterializedAttention: the cuBLASLt handle is null");
  GNMR_CHECK(workspace != nullptr || workspace_bytes == 0,
             "MaterializedAttention: workspace_bytes > 0 with a null workspace");
  impl_->handle = handle;
  impl_->workspace = workspace;
  impl_->workspace_bytes = workspace_bytes;
}

MaterializedAttention::~MaterializedAttention() = default;

int64_t MaterializedAttention::backward_scratch_floats(const AttentionShape& s) {
  return attention_v1_backward_scratch_floats(s);
}

void MaterializedAttention::forward(const float* q, const float* k, const float* v, float* out,
                                    float* probs, const AttentionShape& s, GemmPrecision precision,
                                    cudaStream_t stream) {
  GNMR_CHECK(q && k && v && out && probs, "MaterializedAttention::forward: a null device pointer");
  const AttentionPlan& plan = impl_->plan_for(s);
  Impl::Buffers buf;
  buf.in[size_t(AttentionTensor::kQ)] = q;
  buf.in[size_t(AttentionTensor::kK)] = k;
  buf.in[size_t(AttentionTensor::kV)] = v;
  buf.in[size_t(AttentionTensor::kProbs)] = probs;  // the out GEMM reads the softmax's result
  buf.out[size_t(AttentionTensor::kProbs)] = probs;
  buf.out[size_t(AttentionTensor::kOut)] = out;
  impl_->run(plan.forward, plan, precision, buf, stream);
}

void MaterializedAttention::backward(const float* q, const float* k, const float* v,
                                     const float* probs, const float* dout, float* dq, float* dk,
                                     float* dv, float* scratch, const AttentionShape& s,
                                     GemmPrecision precision, cudaStream_t stream) {
  GNMR_CHECK(q && k && v && probs && dout && dq && dk && dv && scratch,
             "MaterializedAttention::backward: a null device pointer");
  const AttentionPlan& plan = impl_->plan_for(s);
  Impl::Buffers buf;
  buf.in[size_t(AttentionTensor::kQ)] = q;
  buf.in[size_t(AttentionTensor::kK)] = k;
  buf.in[size_t(AttentionTensor::kV)] = v;
  buf.in[size_t(AttentionTensor::kProbs)] = probs;
  buf.in[size_t(AttentionTensor::kDOut)] = dout;
  buf.in[size_t(AttentionTensor::kDScores)] = scratch;  // dS, read by the dq and dk GEMMs
  buf.out[size_t(AttentionTensor::kDScores)] = scratch;
  buf.out[size_t(AttentionTensor::kDq)] = dq;
  buf.out[size_t(AttentionTensor::kDk)] = dk;
  buf.out[size_t(AttentionTensor::kDv)] = dv;
  impl_->run(plan.backward, plan, precision, buf, stream);
}

}  // namespace gnmr::cuda
