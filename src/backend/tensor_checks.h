// The shape and dtype checks every backend makes on the handles it is given (the CPU and CUDA
// backends check the same things with the same messages). Pure host code on Tensor metadata;
// nothing here reads `data`.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "util/error.h"

namespace gnmr {

// The typed pointer of a tensor, after checking its dtype.
inline float* f32_data(const Tensor& t) {
  GNMR_CHECK(t.dtype == DType::F32,
             "expected an f32 tensor, got " + std::string(dtype_name(t.dtype)));
  return static_cast<float*>(t.data);
}
inline double* f64_data(const Tensor& t) {
  GNMR_CHECK(t.dtype == DType::F64,
             "expected an f64 tensor, got " + std::string(dtype_name(t.dtype)));
  return static_cast<double*>(t.data);
}
inline const int32_t* i32_data(const Tensor& t) {
  GNMR_CHECK(t.dtype == DType::I32,
             "expected an i32 tensor, got " + std::string(dtype_name(t.dtype)));
  return static_cast<const int32_t*>(t.data);
}

inline void check_same_numel(const Tensor& a, const Tensor& b, const char* what) {
  GNMR_CHECK(a.numel() == b.numel(), std::string(what) + ": shapes " + a.shape_string() + " and " +
                                         b.shape_string() + " differ");
}

// Rows and columns of a tensor seen as a matrix [numel / last, last].
inline int64_t matrix_cols(const Tensor& t) {
  return t.shape.empty() ? 1 : t.shape.back();
}
inline int64_t matrix_rows(const Tensor& t) {
  return t.numel() / std::max<int64_t>(1, matrix_cols(t));
}

// The attention shape of q [B, T, H, hd] and k [B, T, Hkv, hd], checked.
inline AttentionShape attention_shape_of(const Tensor& q, const Tensor& k) {
  GNMR_CHECK(q.shape.size() == 4 && k.shape.size() == 4 && q.dim(0) == k.dim(0) &&
                 q.dim(1) == k.dim(1) && q.dim(3) == k.dim(3) && k.dim(2) > 0 &&
                 q.dim(2) % k.dim(2) == 0,
             "attention: q " + q.shape_string() + " and k " + k.shape_string() +
                 " are not [B, T, H, hd] and [B, T, Hkv, hd] with Hkv dividing H");
  return AttentionShape{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
}

}  // namespace gnmr
