// Moving test data in and out of backend tensors (shared by the backend and model tests).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace gnmr {
namespace testing {

// A new F32 tensor of `shape` holding `host`.
inline Tensor upload(Backend& be, const std::vector<float>& host, std::vector<int64_t> shape) {
  Tensor t = be.allocate("test", std::move(shape), DType::F32, MemoryRole::Scratch);
  be.copy_from_host(t, host.data());
  return t;
}

// A host copy of any tensor's bytes, read as T (float by default).
template <typename T = float>
std::vector<T> download(Backend& be, const Tensor& t) {
  std::vector<T> host(t.bytes() / sizeof(T));
  be.copy_to_host(t, host.data());
  return host;
}

// A tensor handle over host memory the caller owns (for host-memory code paths such as the
// MPI communicator; no backend involved).
inline Tensor host_tensor(std::vector<float>& values) {
  Tensor t;
  t.data = values.data();
  t.dtype = DType::F32;
  t.shape = {static_cast<int64_t>(values.size())};
  return t;
}

}  // namespace testing
}  // namespace gnmr
