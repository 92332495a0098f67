// Backend-neutral helpers: dtype sizes, tensor views, precision names.
#include "backend/backend.h"

#include <sstream>

#include "util/error.h"

namespace gnmr {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F64:
      return 8;
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::U8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::I32:
      return "i32";
    case DType::U8:
      return "u8";
    case DType::F64:
      return "f64";
  }
  return "?";
}

const char* memory_role_name(MemoryRole role) {
  switch (role) {
    case MemoryRole::Weights:
      return "weights";
    case MemoryRole::Gradients:
      return "gradients";
    case MemoryRole::OptimizerState:
      return "optimizer_state";
    case MemoryRole::Activations:
      return "activations";
    case MemoryRole::SavedActivations:
      return "saved_activations";
    case MemoryRole::Scratch:
      return "scratch";
  }
  return "?";
}

size_t MemoryUse::total() const {
  size_t sum = 0;
  for (size_t b : bytes) sum += b;
  return sum;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string Tensor::shape_string() const {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

Tensor tensor_view(const Tensor& base, std::vector<int64_t> shape, int64_t offset) {
  Tensor view;
  view.dtype = base.dtype;
  view.shape = std::move(shape);
  bool sizes_ok = true;  // a negative size would make numel() negative and pass the bound
  for (int64_t size : view.shape) sizes_ok = sizes_ok && size >= 0;
  GNMR_CHECK(sizes_ok && offset >= 0 && offset + view.numel() <= base.numel(),
             "tensor_view " + view.shape_string() + " at offset " + std::to_string(offset) +
                 " does not fit in " + base.shape_string());
  view.data = static_cast<char*>(base.data) + offset * static_cast<int64_t>(dtype_size(base.dtype));
  return view;
}

GemmPrecision parse_gemm_precision(const std::string& name) {
  if (name == "fp32") return GemmPrecision::FP32;
  if (name == "bf16") return GemmPrecision::BF16;
  throw Error(ErrorKind::Config,
              "config: train.gemm_precision \"" + name + "\" is not one of fp32, bf16");
}

void Backend::residual_rmsnorm_forward(const Tensor& a, const Tensor& b, Tensor& sum,
                                       const Tensor& weight, float eps, Tensor& out, Tensor& rstd) {
  residual_forward(a, b, sum);
  rmsnorm_forward(sum, weight, eps, out, rstd);
}

void Backend::rope_projection_backward(Tensor& dx, const Tensor& cos, const Tensor& sin,
                                       const ProjectionBackwardCall& proj, Tensor& d_in,
                                       bool accumulate) {
  rope_backward(dx, cos, sin);
  Tensor dy = tensor_view(dx, {dx.dim(0) * dx.dim(1), dx.dim(2) * dx.dim(3)});  // [N, out]
  projection_backward(proj.state, proj.path, proj.w, dy, d_in, accumulate, proj.dw);
}

void Backend::rope_attention_forward(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cos,
                                     const Tensor& sin, Tensor& out, AttentionState& saved) {
  rope_forward(q, cos, sin);
  rope_forward(k, cos, sin);
  attention_forward(q, k, v, out, saved);
}

void Backend::swiglu_projection_forward(const Tensor& gate, const Tensor& up, Tensor& out,
                                        const ProjectionForwardCall& down, Tensor& y, bool save) {
  swiglu_forward(gate, up, out);
  projection_forward(down.state, down.path, down.w, out, y, save, down.key);
}

void Backend::residual_rmsnorm_projection_forward(const Tensor& a, const Tensor& b, Tensor& sum,
                                                  const Tensor& weight, float eps, Tensor& out,
                                                  Tensor& rstd, const ProjectionForwardCall& first,
                                                  Tensor& y, bool save) {
  residual_rmsnorm_forward(a, b, sum, weight, eps, out, rstd);
  projection_forward(first.state, first.path, first.w, out, y, save, first.key);
}

void Backend::rmsnorm_projection_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                          const Tensor& dout, Tensor& dx, Tensor& dweight,
                                          const ProjectionBackwardCall& proj, Tensor& d_in,
                                          bool accumulate) {
  rmsnorm_backward(x, weight, rstd, dout, dx, dweight);
  projection_backward(proj.state, proj.path, proj.w, dx, d_in, accumulate, proj.dw);
}

void Backend::cross_entropy_projection_backward(Tensor& logits, const Tensor& targets,
                                                Tensor& losses, float dloss,
                                                const ProjectionBackwardCall& lm_head, Tensor& dx) {
  cross_entropy_forward_backward(logits, targets, losses, dloss);
  projection_backward(lm_head.state, lm_head.path, lm_head.w, logits, dx, false, lm_head.dw);
}

void Backend::swiglu_projections_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                                          Tensor& dgate, Tensor& dup,
                                          const ProjectionBackwardCall& gate_proj,
                                          const ProjectionBackwardCall& up_proj, Tensor& dx) {
  swiglu_backward(gate, up, dout, dgate, dup);
  projection_backward(gate_proj.state, gate_proj.path, gate_proj.w, dgate, dx, false, gate_proj.dw);
  projection_backward(up_proj.state, up_proj.path, up_proj.w, dup, dx, true, up_proj.dw);
}

std::string attention_shape_text(const AttentionShape& s) {
  return "B=" + std::to_string(s.batch) + " T=" + std::to_string(s.seq) +
         " H=" + std::to_string(s.heads) + " Hkv=" + std::to_string(s.kv_heads) +
         " hd=" + std::to_string(s.head_dim);
}

}  // namespace gnmr
