// DeviceMemory: every byte of GPU memory the CUDA backend holds, by MemoryRole, with the peak.
// Allocations are made while the model and the backend plan (construction, plan_projection,
// plan_attention, plan_sum_squares), never by an op during a step (docs/DESIGN.md §6; only
// the plain matmul ops, which the model does not call, grow a workspace on first use). A
// failed allocation is an Error naming the tensor and the numbers (device_memory_report.h),
// raised before training starts.
// Fill: zeros, as Backend::allocate promises. With `poison` (GNMR_POISON=1) activations,
// saved activations and scratch are filled with 0xFF bytes instead (NaN as f32 and f64), so a
// read of memory no op wrote shows up as NaN; weights, gradients and optimizer state stay zero,
// because the model relies on those zeros.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace gnmr {

class DeviceMemory {
 public:
  explicit DeviceMemory(bool poison) : poison_(poison) {}
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // At least `bytes` (a minimum of 256), 256-byte aligned, filled as above. cudaMalloc, then
  // cudaMemset on the legacy default stream: the fill may still run when this returns, but
  // it comes before any later work on the backend's (blocking) stream.
  void* allocate(const std::string& name, size_t bytes, MemoryRole role);
  void release(void* p);  // p from allocate (nullptr: nothing)

  MemoryUse use() const { return use_; }
  size_t peak() const { return peak_; }
  bool poison() const { return poison_; }

 private:
  struct Block {
    size_t bytes;
    MemoryRole role;
  };
  bool poison_;
  std::unordered_map<void*, Block> blocks_;
  MemoryUse use_;
  size_t peak_ = 0;
};

// A tensor of `shape` and `dtype` in `memory`, filled as DeviceMemory::allocate fills; a
// negative extent is an internal error naming the tensor.
Tensor allocate_tensor(DeviceMemory& memory, const std::string& name, std::vector<int64_t> shape,
                       DType dtype, MemoryRole role);

// A scratch buffer that only grows: reserve() frees and reallocates when `bytes` is larger.
// Only called while planning or by an op's first use, when nothing refers to the old buffer.
struct DeviceScratch {
  std::string name;
  void* data = nullptr;
  size_t bytes = 0;
  void* reserve(DeviceMemory& memory, size_t need);
};

}  // namespace gnmr
