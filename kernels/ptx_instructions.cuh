// The inline-PTX instructions the tensor-core kernels wrap (kernels/flash_attention_mma.cu,
// kernels/wgmma_operand_check.cu): mma.sync, ldmatrix, cp.async, the bf16 pair conversion, the
// warp shuffle, ex2.approx, vector loads and stores, and sm_90a's wgmma with its fences. A file
// includes this between "hardware only" markers: the CUDA emulation (tests/emulated_cuda)
// blanks them and supplies its own of each (emulated_cuda.h), which checks what a GPU would
// not say clearly.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace gnmr::cuda {

// D += A B on the tensor cores: a, b, d fragments as src/backend/mma_fragment.h lays them out.
__device__ inline void mma_bf16_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ldmatrix.sync.aligned.m8n8.x4 (.trans): `row` is this lane's row address in shared memory
// (16-byte aligned), r[j] what it receives of matrix j (src/backend/mma_fragment.h).
__device__ inline void ldmatrix_x4(uint32_t r[4], const uint16_t* row) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ inline void ldmatrix_x4_trans(uint32_t r[4], const uint16_t* row) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// cp.async.cg (sm_80+): this thread's asynchronous copy of `src_bytes` (16, or 0 to zero-fill)
// from global `src` to shared `dst`, both 16-byte aligned; it lands when the thread waits for
// its group (every committed group but the newest N), and is visible to the block after a
// barrier that follows the wait.
__device__ inline void cp_async_16(void* dst, const void* src, int src_bytes) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src),
               "r"(src_bytes)
               : "memory");
}
// cp.async.ca of 4 bytes (`src_bytes` 4, or 0 to zero-fill), both addresses 4-byte aligned.
__device__ inline void cp_async_4(void* dst, const void* src, int src_bytes) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(address), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ inline void cp_async_commit_group() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ inline void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Two floats rounded to the nearest bf16 (ties to even, as encode_bf16) in one register, `low`
// in the low half: one cvt.rn.bf16x2.f32.
__device__ inline uint32_t pack_bf16x2_rn(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);  // .x = low: the low half
  uint32_t bits;
  memcpy(&bits, &pair, sizeof bits);
  return bits;
}

// The value lane ^ lane_mask of this warp holds.
__device__ inline float warp_shfl_xor(float value, int lane_mask) {
  return __shfl_xor_sync(0xFFFFFFFFu, value, lane_mask);
}

// 2^x in one instruction: ex2.approx.ftz.f32, the special-function unit's MUFU.EX2 that exp2f
// ends in too. exp2f (these kernels are built without fast math) adds three instructions around
// it, halving inputs below -126 and squaring the result, to keep results under 2^-126 as
// subnormals; here they are 0, the other results the same bits. Every exponential these kernels
// take is a softmax weight in [0, 1], the row's largest 1 (the forward's running max; lse in
// the backward), so a weight under 2^-126 is far below fp32's resolution of any sum or product
// it enters.
__device__ inline float exp2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// v = p[0..3] in one 16-byte load (p 16-byte aligned).
__device__ inline void load_float4(const float* p, float v[4]) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
// v = p[0..1] in one 8-byte load (p 8-byte aligned).
__device__ inline void load_float2(const float* p, float v[2]) {
  const float2 q = *reinterpret_cast<const float2*>(p);
  v[0] = q.x, v[1] = q.y;
}
// p[0..3] = the bf16 codes in `low` (p[0] its low half, p[1] its high) and `high`, in one 8-byte
// store (p 8-byte aligned).
__device__ inline void store_bf16x4(uint16_t* p, uint32_t low, uint32_t high) {
  *reinterpret_cast<uint2*>(p) = make_uint2(low, high);
}
// The shared state space's address of p (cvta.to.shared), what a wgmma descriptor holds.
__device__ inline uint32_t shared_space_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The 32 accumulator registers of a thread's share of an m64n64 wgmma, d[j][i], as asm
// operands %0 .. %31 (read and written).
#define GNMR_WGMMA_M64N64_ACCUMULATORS(d)                                                       \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])
// sm_90a's warpgroup MMA, wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 (operands and
// descriptors: src/backend/wgmma_operand.h): d[j] is the mma.sync C fragment of columns 8 j ..
// 8 j + 7 of the warp's 16 rows; scale_d 0: D = A B, 1: D = A B + D. Only sm_90a has these
// instructions; the sm_80 build compiles them to a trap, and the host launches the wgmma kernel
// only on a compute capability 9.0 device (flash_wgmma_unavailable).
// - _ss: A and B from shared memory, both K-major (imm-trans-a 0, imm-trans-b 0).
__device__ inline void wgmma_m64n64k16_ss(float d[][4], uint64_t a_desc, uint64_t b_desc,
                                          int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : GNMR_WGMMA_M64N64_ACCUMULATORS(d)
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
#else
  (void)d, (void)a_desc, (void)b_desc, (void)scale_d;
  __trap();
#endif
}
// - _rs_trans_b: A in registers (the mma.sync A fragment of the warp's 16 rows), B from shared
//   memory MN-major (imm-trans-b 1).
__device__ inline void wgmma_m64n64k16_rs_trans_b(float d[][4], const uint32_t a[4],
                                                  uint64_t b_desc, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, "
      "p, 1, 1, 1;\n}\n"
      : GNMR_WGMMA_M64N64_ACCUMULATORS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
#else
  (void)d, (void)a, (void)b_desc, (void)scale_d;
  __trap();
#endif
}
// wgmma.fence: the registers a wgmma reads (its accumulators, A) were written by other
// instructions before it. commit_group closes this thread's wgmma group; wait_group<N> waits
// until at most N groups are in flight, after which their accumulators may be read.
__device__ inline void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ inline void wgmma_commit_group() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ inline void wgmma_wait_group() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Pins `registers` (an accumulator, or A fragments) to this point: the compiler
// moves no use or definition of them across it (CUTLASS's warpgroup_fence_operand). Used
// - after a wgmma.wait_group, so that no instruction reads accumulators before their products
//   have landed: the wgmma's asm hands them out at issue as far as the compiler knows, and
//   ptxas would serialize every wgmma of a kernel with such a read (C7514);
// - before a wgmma_fence(), on the accumulators and A fragments that ordinary instructions
//   wrote (the softmax's rescale, dS), so that no such write sinks past the wgmma.fence that
//   must follow it (CUTLASS pins the accumulators before warpgroup_arrive the same way).
template <typename T, int N>
__device__ inline void wgmma_fence_operands(T (&registers)[N][4]) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, uint32_t>,
                "an fp32 accumulator or bf16-pair A fragments");
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (std::is_same_v<T, float>) {
        asm volatile("" : "+f"(registers[i][j])::"memory");
      } else {
        asm volatile("" : "+r"(registers[i][j])::"memory");
      }
    }
  }
}
// fence.proxy.async.shared::cta: the shared memory cp.async wrote (the generic proxy) is
// visible to the wgmma's reads (the async proxy), once a barrier after it orders the threads.
__device__ inline void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

}  // namespace gnmr::cuda
