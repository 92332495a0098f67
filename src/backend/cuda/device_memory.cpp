// DeviceMemory (device_memory.h).
#include "backend/cuda/device_memory.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "backend/cuda/device_memory_report.h"
#include "kernels/cuda_check.cuh"
#include "util/error.h"

namespace gnmr {

DeviceMemory::~DeviceMemory() {
  // Nothing actionable to report from a destructor.
  for (auto& [p, block] : blocks_) cudaFree(p);
}

Tensor allocate_tensor(DeviceMemory& memory, const std::string& name, std::vector<int64_t> shape,
                       DType dtype, MemoryRole role) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  for (int64_t s : t.shape) {
    GNMR_CHECK(s >= 0, "allocate " + name + ": negative extent in " + t.shape_string());
  }
  t.data = memory.allocate(name, t.bytes(), role);
  return t;
}

void* DeviceMemory::allocate(const std::string& name, size_t bytes, MemoryRole role) {
  bytes = std::max<size_t>(256, (bytes + 255) / 256 * 256);
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error so the report's query works
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw Error(ErrorKind::Runtime,
                device_out_of_memory_message(name, bytes, use_, free_bytes, total_bytes));
  }
  GNMR_CUDA_CHECK(status);
  const bool poisoned =
      poison_ && (role == MemoryRole::Activations || role == MemoryRole::SavedActivations ||
                  role == MemoryRole::Scratch);
  GNMR_CUDA_CHECK(cudaMemset(p, poisoned ? 0xFF : 0, bytes));
  blocks_[p] = Block{bytes, role};
  use_.bytes[static_cast<int>(role)] += bytes;
  peak_ = std::max(peak_, use_.total());
  return p;
}

void DeviceMemory::release(void* p) {
  if (p == nullptr) return;
  auto it = blocks_.find(p);
  GNMR_CHECK(it != blocks_.end(), "DeviceMemory::release of a pointer it did not allocate");
  GNMR_CUDA_CHECK(cudaFree(p));
  use_.bytes[static_cast<int>(it->second.role)] -= it->second.bytes;
  blocks_.erase(it);
}

void* DeviceScratch::reserve(DeviceMemory& memory, size_t need) {
  if (need <= bytes && data != nullptr) return data;
  memory.release(data);
  data = nullptr;
  bytes = 0;
  data = memory.allocate(name, need, MemoryRole::Scratch);
  bytes = need;
  return data;
}

}  // namespace gnmr
