// CUDA's execution model on the host, so kernel code runs (and is tested) without a GPU.
// Two users:
// - test_flash_attention_emulated.cpp runs the flash kernels' device code, extracted by
//   extract_device_code.sh, through emulated_launch();
// - emulate_kernel_file.sh turns a whole kernels/*.cu file into host C++ (its launch wrappers
//   included: `k<<<grid, block, shared, stream>>>(args)` becomes emulated_kernel_launch()), and
//   emulated_cudart.cpp answers the CUDA runtime calls on host memory; the gpu tests of those
//   kernels then run unchanged on the host (tests/gpu, test_gpu_emulated).
//
// The model (emulated_cuda.cpp): blocks run one after another; a block's threads are fibers
// (fiber_switch.h) in one OS thread, run in thread order until each returns or waits at a barrier,
// so a run is deterministic. What it checks that a GPU would not say clearly:
// - a __syncthreads some threads of the block never reach (they returned or wait elsewhere), and
//   a full-warp shuffle some lanes never reach: an error naming the block, not a hang;
// - dynamic shared memory above 48 KiB without cudaFuncSetAttribute raising the limit, or above
//   the device's opt-in maximum (an H100's), and launch shapes outside CUDA's limits: the launch
//   fails as on a GPU (cudaGetLastError);
// - shared memory starts as NaN bytes, so a read of an element no thread wrote shows;
// - races through shared memory between the cp.async copies and the ldmatrix, wgmma and vector
//   (load_float4, load_float2) reads of different threads with no __syncthreads between them
//   (a copy counting from its issue to its landing at its thread's wait, a wgmma's read from
//   its issue to its thread's wait), and a copy over a wgmma's operands before that wait: an
//   error naming both threads and the byte;
// - a wgmma without the fences the PTX ISA asks for (wgmma_fence, fence_proxy_async_shared), or
//   not issued alike by every thread of its warpgroup.
// Global memory is host memory (emulated_cudart.cpp allocates each buffer exactly), so the
// ASan build catches a kernel reading or writing past a buffer.
// What it cannot check: races between threads of a block through plain loads and stores
// (fibers switch only at barriers),
// the hardware's mma summation order and CUDA's expf/logf (the host's libm runs instead).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>

namespace gnmr::cuda {

// threadIdx, blockIdx, blockDim, gridDim: CUDA's uint3 / dim3 without the CUDA headers.
struct EmulatedDim {
  unsigned x = 1, y = 1, z = 1;
  EmulatedDim() = default;
  EmulatedDim(unsigned ex, unsigned ey = 1, unsigned ez = 1) : x(ex), y(ey), z(ez) {}
  // From CUDA's dim3, and from the int / int64_t grid sizes our launch wrappers compute.
  template <typename D, typename = decltype(std::declval<D>().z)>
  EmulatedDim(const D& d) : x(d.x), y(d.y), z(d.z) {}
  template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
  EmulatedDim(I ex) : x(static_cast<unsigned>(ex)) {
    // A negative or over-wide size must fail the launch, not wrap to a valid-looking one.
    if (ex < 0 || static_cast<uint64_t>(ex) > 0xFFFFFFFFull) x = 0;
  }
  uint64_t volume() const { return uint64_t{x} * y * z; }
};

// The running thread's indices (set by the scheduler at every switch: one OS thread runs all).
extern EmulatedDim threadIdx, blockIdx, blockDim, gridDim;

// Runs `kernel` (one CUDA thread's body) over `grid` x `block` threads with `shared_bytes` of
// dynamic shared memory, after CUDA's launch checks; a failed check sets the error
// cudaGetLastError() returns (emulated_cudart.cpp) and runs nothing. `kernel_id` is the kernel
// function's address (what cudaFuncSetAttribute names). Throws std::logic_error for what would
// hang or be undefined on a GPU (a barrier some threads never reach).
void emulated_kernel_launch(const std::function<void()>& kernel, const void* kernel_id,
                            EmulatedDim grid, EmulatedDim block, size_t shared_bytes = 0,
                            const void* stream = nullptr);

// The flash tests' form: `blocks` x `threads` threads (a multiple of 32), `shared_floats`
// floats of dynamic shared memory, no launch limits checked. Throws std::invalid_argument for a
// thread count that is not a positive multiple of 32.
void emulated_launch(int64_t blocks, int threads, int64_t shared_floats,
                     const std::function<void()>& kernel);

// The block's dynamic shared memory (`extern __shared__`), NaN bytes at the block's start.
float* emulated_shared_memory();
// __syncthreads(): waits until every thread of the block arrives.
void emulated_syncthreads();
// __syncwarp() over the whole warp.
void emulated_syncwarp();

// The last launch error, as a cudaError_t value (0: none) and a sentence, read and cleared by
// the emulated cudaGetLastError.
int emulated_take_launch_error(bool clear);
const char* emulated_launch_error_text();
// Whether [p, p + bytes) lies inside one emulated cudaMalloc allocation (emulated_cudart.cpp):
// the emulated cuBLASLt checks its operands with it.
bool emulated_is_device_range(const void* p, size_t bytes);
// How many cudaMallocHost calls this process has made (emulated_cudart.cpp): a test checks that
// a training step makes none (each synchronizes a real device, gradient sums in flight included).
int64_t emulated_pinned_host_allocations();
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
void emulated_set_max_dynamic_shared_bytes(const void* kernel_id, int bytes);
// The emulated device: an H100 / H200 (sm_90) as the kernels' shared-memory checks read it.
constexpr int kEmulatedSharedBytesDefault = 48 * 1024;
constexpr int kEmulatedSharedBytesOptin = 227 * 1024;
constexpr int kEmulatedComputeMajor = 9, kEmulatedComputeMinor = 0;

// A full-warp exchange: every lane of the warp hands `bytes` of `in` and receives the bytes
// lane ^ lane_mask handed. Throws (through the scheduler) when a mask other than the whole warp
// is asked for or not every lane of the warp arrives.
void emulated_shfl_xor(unsigned mask, const void* in, void* out, size_t bytes, int lane_mask);

template <typename T>
T warp_shuffle_xor(unsigned mask, T value, int lane_mask) {
  static_assert(std::is_arithmetic_v<T>, "__shfl_xor_sync exchanges arithmetic values");
  T out;
  emulated_shfl_xor(mask, &value, &out, sizeof(T), lane_mask);
  return out;
}

// The flash tests' shuffle (kernels/flash_attention_mma.cu wraps __shfl_xor_sync the same way).
inline float warp_shfl_xor(float value, int lane_mask) {
  return warp_shuffle_xor(0xFFFFFFFFu, value, lane_mask);
}

// ex2.approx.ftz.f32 (kernels/flash_attention_mma.cu wraps it the same way): 2^x, a result
// below the smallest normal float (2^-126) flushed to 0. The host's exp2 stands in for the
// special-function unit's approximation, which may differ from it in the last bits.
inline float exp2_approx_ftz(float x) {
  const float y = std::exp2(x);
  return y < std::numeric_limits<float>::min() ? 0.0f : y;
}

// The 16- and 8-byte loads and the 8-byte store kernels/flash_attention_mma.cu wraps the same
// way: v = p[0..3]; v = p[0..1]; p[0..3] = the bf16 codes of `low` (its low half first) and
// `high`. Fail the launch for a pointer off its access's boundary (a GPU faults). A load from
// shared memory is checked against the cp.async races as an ldmatrix is.
void load_float4(const float* p, float v[4]);
void load_float2(const float* p, float v[2]);
void store_bf16x4(uint16_t* p, uint32_t low, uint32_t high);

// mma.sync.m16n8k16 bf16 -> fp32 (fragments as src/backend/mma_fragment.h lays them out): each
// output's 16 exact bf16 products and its accumulator summed in double and rounded once to
// float; the hardware's order and internal precision differ, so GPU results match within the
// fp32 rounding of a 16-term sum, not bit for bit.
void mma_bf16_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2]);

// cvt.rn.bf16x2.f32 (the kernels' __floats2bfloat162_rn): two floats rounded to the nearest
// bf16, ties to even, `low` in the low half; encode_bf16's bits for every non-NaN value.
uint32_t pack_bf16x2_rn(float low, float high);

// cp.async.cg.shared.global (16 bytes; cp_async_4: cp.async.ca, 4 bytes) with its commit and
// wait: this thread's copy of `src_bytes` (0 or all) bytes from global `src` to shared `dst`, the
// rest zero-filled.
// The copy is only recorded; it lands when this thread waits for its group
// (cp_async_wait_group<N>: every committed group but the newest N), so a kernel that reads
// shared memory before its wait and barrier sees the old bytes (NaN, as shared memory starts),
// as a GPU may show it. Fails the launch for a dst outside the block's dynamic shared memory or
// either address off a boundary of the copy's size, and for a thread that returns with copies it
// never waited for.
void cp_async_16(void* dst, const void* src, int src_bytes);
void cp_async_4(void* dst, const void* src, int src_bytes);
void cp_async_commit_group();
void emulated_cp_async_wait_group(int pending);
template <int N>
void cp_async_wait_group() {
  emulated_cp_async_wait_group(N);
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16 and its .trans form, by the delivery rule of
// src/backend/mma_fragment.h: `row` is this lane's row address (lanes 8j..8j + 7: rows 0..7 of
// matrix j), r[j] what it receives of matrix j. Fails the launch, naming the lane, for a row
// that is not 16-byte aligned or not inside the block's dynamic shared memory (a GPU faults or
// reads another block's memory).
void ldmatrix_x4(uint32_t r[4], const uint16_t* row);
void ldmatrix_x4_trans(uint32_t r[4], const uint16_t* row);

// cvta.to.shared: p's address in the shared state space, here its byte offset in the block's
// dynamic shared memory. Fails the launch for a p outside it.
uint32_t shared_space_address(const void* p);

// sm_90a's warpgroup MMA, wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 (operands and
// descriptors as src/backend/wgmma_operand.h defines them; kernels/flash_attention_mma.cu wraps
// the instructions the same way). Warp w % 4 of the warpgroup owns rows 16 (w % 4) .. + 15 of
// the 64; d[j] is its mma.sync C fragment of columns 8 j .. 8 j + 7. scale_d 0: D = A B; 1:
// D = A B + D.
// - wgmma_m64n64k16_ss: A and B from shared memory, both K-major.
// - wgmma_m64n64k16_rs_trans_b: A in registers (the mma.sync A fragment of the warp's 16 rows),
//   B from shared memory MN-major (imm-trans-b 1).
// Asynchronous as on a GPU: the product is taken at issue (shared memory read then, checked
// against the cp.async races as ldmatrix is) and lands in d only at the thread's wait for its
// group (wgmma_wait_group<N>: every committed group but the newest N). The GPU's tensor cores
// may read the operands in shared memory at any time until that wait, so a cp.async over them
// before it fails the launch (the issuing thread's own, or one after a __syncthreads, too), and
// another thread's after it needs a __syncthreads between, as after an ldmatrix. A later wgmma into
// the same d before then accumulates onto the pending result, as the hardware chains them; d read
// before the wait holds its old values; a thread that returns with a group it never waited for,
// issues a wgmma on a descriptor with a swizzle or base offset, or issues a wgmma (form,
// descriptors, scale_d) other than the one its warpgroup's other threads issued at the same
// count, or more or fewer of them (.sync.aligned: on a GPU undefined), fails the launch. Each
// output is its 16 exact products and its accumulator summed in double and rounded once, as the
// emulated mma_bf16_m16n8k16, so the emulated wgmma and mma.sync kernels give the same bits.
void wgmma_m64n64k16_ss(float d[][4], uint64_t a_desc, uint64_t b_desc, int scale_d);
void wgmma_m64n64k16_rs_trans_b(float d[][4], const uint32_t a[4], uint64_t b_desc, int scale_d);
// For the tests of what turns on whether wgmma sums as mma.sync does (the CUDA backend offers
// the wgmma flash kernels only where they give the mma.sync kernels' bits:
// backend/cuda/flash_kernel_choice.h): while set, each emulated wgmma sum is rounded toward
// zero instead of to nearest, as on a GPU whose tensor cores round wgmma's sums otherwise.
void emulated_set_wgmma_rounds_toward_zero(bool on);
// wgmma.fence: the PTX ISA requires it between a thread's accesses of registers and a wgmma
// that reads them (its accumulators, a register A), and before the first wgmma. The emulation's
// register accesses happen in program order, so it holds the kernels to a stricter rule they
// keep: a wgmma issued with no wgmma.fence since the thread's start or its last
// wgmma.wait_group (after which a kernel reads and writes the accumulators) fails the launch.
void wgmma_fence();
// fence.proxy.async.shared::cta: the copies this thread's waits have landed become visible to
// the async proxy, which the wgmma's reads of shared memory go through. A wgmma reading a word
// whose last copy's thread has not fenced it since its landing fails the launch.
void fence_proxy_async_shared();
// The kernels' register pin (CUTLASS's warpgroup_fence_operand), after a wait and before a
// wgmma.fence: the emulation runs each thread's statements in order and its products land at
// the wait itself, so nothing to pin.
template <typename T, int N>
void wgmma_fence_operands(T (&)[N][4]) {}
void wgmma_commit_group();
void emulated_wgmma_wait_group(int pending);
template <int N>
void wgmma_wait_group() {
  emulated_wgmma_wait_group(N);
}

}  // namespace gnmr::cuda
