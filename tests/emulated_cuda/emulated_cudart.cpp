// The CUDA runtime calls our kernels' launch wrappers and the gpu tests make, answered on the
// host for the emulation (emulated_cuda.h). A test binary links this instead of libcudart.
// - "Device" memory is host memory: cudaMalloc allocates exactly the bytes asked (256-byte
//   aligned, as cudaMalloc), so the ASan build catches an access past a buffer;
// - every copy and memset must lie inside one allocation on its device side, and a host-side
//   pointer of a copy must not be device memory: the mix-ups that fault on a GPU fail here too,
//   with a sentence cudaGetErrorString returns;
// - the devices are H100s (sm_90, 80 GiB, 227 KiB of opt-in shared memory per block), 8 of
//   them as on an HGX node, or GNMR_EMULATED_DEVICES (1 to 64); each process emulates its own
//   (the emulated NCCL, emulated_nccl.cpp, joins processes), and one process's allocations are
//   not told apart by device;
// - work is synchronous: a stream is a name, an event records the host clock, and waits and
//   synchronization calls return success (so ordering bugs between streams do not show here).
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <string>

#include "emulated_cuda/emulated_cuda.h"

namespace {

constexpr size_t kEmulatedDeviceBytes = size_t{80} << 30;
constexpr int kDefaultDevices = 8, kMostDevices = 64;
thread_local int current_device = 0;  // cudaSetDevice's, per host thread as CUDA's

std::map<const char*, size_t> allocations;  // start -> bytes
size_t allocated_bytes = 0;
std::atomic<int64_t> pinned_host_allocations{0};  // cudaMallocHost calls

struct EmulatedStream {
  int priority = 0;
};
struct EmulatedEvent {
  std::chrono::steady_clock::time_point recorded{};
  bool timing = true, was_recorded = false;
};
cudaError_t last_api_error = cudaSuccess;
std::string last_api_error_text;

cudaError_t api_error(cudaError_t error, const std::string& text) {
  last_api_error = error;
  last_api_error_text = "emulated CUDA runtime: " + text;
  return error;
}

// The allocation holding [p, p + bytes), or allocations.end().
std::map<const char*, size_t>::const_iterator allocation_holding(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  auto after = allocations.upper_bound(c);
  if (after == allocations.begin()) return allocations.end();
  const auto it = std::prev(after);
  if (c + bytes > it->first + it->second) return allocations.end();
  return it;
}

bool is_device(const void* p) {
  return allocation_holding(p, 1) != allocations.end();
}

// GNMR_EMULATED_DEVICES, read at each call (a test may change it); 0 when it is not a count
// from 1 to kMostDevices.
int device_count() {
  const char* text = std::getenv("GNMR_EMULATED_DEVICES");
  if (text == nullptr || text[0] == '\0') return kDefaultDevices;
  char* end = nullptr;
  const long count = std::strtol(text, &end, 10);
  return *end == '\0' && count >= 1 && count <= kMostDevices ? int(count) : 0;
}

cudaError_t check_device(int device, const char* call) {
  const int count = device_count();
  if (count == 0) {
    return api_error(cudaErrorInvalidValue,
                     std::string(call) +
                         ": GNMR_EMULATED_DEVICES=" + std::getenv("GNMR_EMULATED_DEVICES") +
                         " is not a device count from 1 to " + std::to_string(kMostDevices));
  }
  if (device < 0 || device >= count) {
    return api_error(cudaErrorInvalidDevice, std::string(call) + "(" + std::to_string(device) +
                                                 "): the emulation has " + std::to_string(count) +
                                                 " devices (GNMR_EMULATED_DEVICES)");
  }
  return cudaSuccess;
}

}  // namespace

namespace gnmr::cuda {

bool emulated_is_device_range(const void* p, size_t bytes) {
  return allocation_holding(p, bytes == 0 ? 1 : bytes) != allocations.end();
}

int64_t emulated_pinned_host_allocations() {
  return pinned_host_allocations;
}

}  // namespace gnmr::cuda

// For the emulated NCCL (emulated_nccl.cpp), a library loaded at run time that finds these in
// the program (the runtime's link options export them): whether its buffers are device memory,
// and the device its rank selected.
extern "C" int gnmr_emulated_is_device_range(const void* p, size_t bytes) {
  return gnmr::cuda::emulated_is_device_range(p, bytes) ? 1 : 0;
}
extern "C" int gnmr_emulated_current_device(void) {
  return current_device;
}

namespace {

cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                       const char* call) {
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost) {
    return api_error(cudaErrorInvalidValue,
                     std::string(call) + ": the emulation checks explicit directions only");
  }
  if (bytes == 0) return cudaSuccess;
  const auto side_ok = [&](const void* p, bool device) {
    return device ? allocation_holding(p, bytes) != allocations.end() : !is_device(p);
  };
  if (!side_ok(dst, dst_device) || !side_ok(src, src_device)) {
    return api_error(cudaErrorInvalidValue,
                     std::string(call) + " of " + std::to_string(bytes) +
                         " bytes: the destination or source is not the side its direction "
                         "says, or runs past its allocation");
  }
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t check_memset(void* p, int value, size_t bytes, const char* call) {
  if (bytes == 0) return cudaSuccess;
  if (allocation_holding(p, bytes) == allocations.end()) {
    return api_error(cudaErrorInvalidValue, std::string(call) + " of " + std::to_string(bytes) +
                                                " bytes outside any device allocation");
  }
  std::memset(p, value, bytes);
  return cudaSuccess;
}

}  // namespace

extern "C" {

cudaError_t cudaGetLastError(void) {
  const int launch = gnmr::cuda::emulated_take_launch_error(true);
  if (launch != 0) return static_cast<cudaError_t>(launch);
  const cudaError_t api = last_api_error;
  last_api_error = cudaSuccess;
  return api;
}

cudaError_t cudaPeekAtLastError(void) {
  const int launch = gnmr::cuda::emulated_take_launch_error(false);
  return launch != 0 ? static_cast<cudaError_t>(launch) : last_api_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    default:
      return "cudaError (emulated: unnamed)";
  }
}

// The sentence of the call that failed last (launch or runtime call), so a test's failure
// says what the emulation found.
const char* cudaGetErrorString(cudaError_t error) {
  if (error == cudaSuccess) return "no error";
  if (error == last_api_error && !last_api_error_text.empty()) return last_api_error_text.c_str();
  return gnmr::cuda::emulated_launch_error_text();
}

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  void* p = nullptr;
  if (posix_memalign(&p, 256, size == 0 ? 1 : size) != 0) {
    return api_error(cudaErrorMemoryAllocation, "cudaMalloc of " + std::to_string(size) + " bytes");
  }
  allocations[static_cast<const char*>(p)] = size == 0 ? 1 : size;
  allocated_bytes += size == 0 ? 1 : size;
  *devPtr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) {
  if (devPtr == nullptr) return cudaSuccess;
  const auto it = allocations.find(static_cast<const char*>(devPtr));
  if (it == allocations.end()) {
    return api_error(cudaErrorInvalidDevicePointer,
                     "cudaFree of a pointer cudaMalloc did not return");
  }
  allocated_bytes -= it->second;
  allocations.erase(it);
  std::free(devPtr);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  return check_copy(dst, src, count, kind, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t) {
  return check_copy(dst, src, count, kind, "cudaMemcpyAsync");
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return check_memset(devPtr, value, count, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t) {
  return check_memset(devPtr, value, count, "cudaMemsetAsync");
}

cudaError_t cudaDeviceSynchronize(void) {
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  return *count > 0 ? cudaSuccess : check_device(0, "cudaGetDeviceCount");
}

cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (const cudaError_t bad = check_device(device, "cudaDeviceGetAttribute")) return bad;
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = gnmr::cuda::kEmulatedSharedBytesOptin;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = gnmr::cuda::kEmulatedSharedBytesDefault;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = gnmr::cuda::kEmulatedComputeMajor;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = gnmr::cuda::kEmulatedComputeMinor;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = 32;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
    default:
      return api_error(cudaErrorInvalidValue, "cudaDeviceGetAttribute(" +
                                                  std::to_string(int(attr)) +
                                                  "): an attribute the emulation does not model");
  }
}

cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
    return api_error(cudaErrorInvalidValue, "cudaFuncSetAttribute(" + std::to_string(int(attr)) +
                                                "): an attribute the emulation does not model");
  }
  if (value < 0 || value > gnmr::cuda::kEmulatedSharedBytesOptin) {
    return api_error(cudaErrorInvalidValue,
                     "cudaFuncSetAttribute: " + std::to_string(value) +
                         " bytes of dynamic shared memory, above the device's " +
                         std::to_string(gnmr::cuda::kEmulatedSharedBytesOptin));
  }
  gnmr::cuda::emulated_set_max_dynamic_shared_bytes(func, value);
  return cudaSuccess;
}

// A kernel's attributes as an sm_90a build's on the emulated H100 / H200: compiled for 9.0 (PTX
// and binary), 1024 threads a block; what the emulation does not model is 0.
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, const void* /*func*/) {
  *attributes = cudaFuncAttributes{};
  attributes->ptxVersion = attributes->binaryVersion =
      10 * gnmr::cuda::kEmulatedComputeMajor + gnmr::cuda::kEmulatedComputeMinor;
  attributes->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  *total = kEmulatedDeviceBytes;
  *free = kEmulatedDeviceBytes > allocated_bytes ? kEmulatedDeviceBytes - allocated_bytes : 0;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  ++pinned_host_allocations;
  *ptr = std::malloc(size == 0 ? 1 : size);
  return *ptr ? cudaSuccess : api_error(cudaErrorMemoryAllocation, "cudaMallocHost");
}

cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (const cudaError_t bad = check_device(device, "cudaSetDevice")) return bad;
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (const cudaError_t bad = check_device(device, "cudaGetDeviceProperties")) return bad;
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "emulated sm_90 (host)", sizeof prop->name - 1);
  prop->major = gnmr::cuda::kEmulatedComputeMajor;
  prop->minor = gnmr::cuda::kEmulatedComputeMinor;
  prop->totalGlobalMem = kEmulatedDeviceBytes;
  prop->sharedMemPerBlock = size_t(gnmr::cuda::kEmulatedSharedBytesDefault);
  prop->sharedMemPerBlockOptin = size_t(gnmr::cuda::kEmulatedSharedBytesOptin);
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->multiProcessorCount = 132;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  *leastPriority = 0;
  *greatestPriority = -5;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int, int priority) {
  *pStream = reinterpret_cast<cudaStream_t>(new EmulatedStream{priority});
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return cudaStreamCreateWithPriority(pStream, 0, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<EmulatedStream*>(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned int) {
  return event ? cudaSuccess
               : api_error(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: no event");
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  EmulatedEvent* e = new EmulatedEvent;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, 0);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<EmulatedEvent*>(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  if (!event) return api_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: no event");
  EmulatedEvent* e = reinterpret_cast<EmulatedEvent*>(event);
  e->recorded = std::chrono::steady_clock::now();
  e->was_recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t) {
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t) {
  return cudaSuccess;
}

// As CUDA: both events recorded and created with timing, else an error.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const EmulatedEvent* a = reinterpret_cast<const EmulatedEvent*>(start);
  const EmulatedEvent* b = reinterpret_cast<const EmulatedEvent*>(end);
  if (!a || !b || !a->timing || !b->timing) {
    return api_error(cudaErrorInvalidResourceHandle,
                     "cudaEventElapsedTime of an event created with cudaEventDisableTiming");
  }
  if (!a->was_recorded || !b->was_recorded) {
    return api_error(cudaErrorNotReady, "cudaEventElapsedTime of an event never recorded");
  }
  *ms = std::chrono::duration<float, std::milli>(b->recorded - a->recorded).count();
  return cudaSuccess;
}

}  // extern "C"
