// Host API of the attention kernels. Device pointers, fp32, queued on `stream`, launches
// checked with GNMR_CUDA_CHECK. Plain C++, so a .cpp file can include it and link gnmr_kernels.
// - v1 (kernels/causal_softmax.cu): the causal softmax over score rows and its backward,
//   between the cuBLASLt GEMMs that MaterializedAttention (src/backend/cuda/attention_v1.h)
//   runs. CPU twin: the softmax steps inside gnmr::cpu::attention_forward / attention_backward
//   (src/backend/cpu/attention.cpp).
// - flash (kernels/flash_attention.cu): fused causal GQA attention, forward and deterministic
//   backward, no T x T tensor. CPU twin: gnmr::cpu::flash_attention_forward / backward
//   (src/backend/cpu/flash_attention.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace gnmr::cuda {

// scores: [matrices, t, t] in place -> causal softmax probabilities: row i of each matrix keeps
// keys 0..i and is exactly zero after i (overwriting whatever was there).
void causal_softmax_forward(float* scores, int64_t matrices, int64_t t, cudaStream_t stream);

// probs: [matrices, t, t] from causal_softmax_forward; dscores: the same shape, dP on entry,
// dS = scale * P * (dP - sum_j P dP) per row on exit (exactly zero after the diagonal).
void causal_softmax_backward(const float* probs, float* dscores, int64_t matrices, int64_t t,
                             float scale, cudaStream_t stream);

// Head dims the flash kernels are built for (64 and 128); the others throw Error(Config).
bool flash_attention_supports_head_dim(int64_t head_dim);

// The most shared memory per block, in bytes, any of the flash kernels takes at this head dim
// (64 or 128) and sequence length: the SIMT ones, or with tensor_cores the bf16 mma ones. A
// device whose opt-in limit is below it cannot run them.
int64_t flash_attention_shared_bytes(int64_t head_dim, int64_t seq, bool tensor_cores);

// Floats of device scratch flash_attention_backward needs ([B, H, T], the rows' dout . out).
int64_t flash_attention_backward_scratch_floats(int64_t batch, int64_t seq, int64_t heads);

// Causal attention, scale 1/sqrt(head_dim); query head h reads kv head h / (heads / kv_heads).
// q, out: [batch, seq, heads, head_dim]; k, v: [batch, seq, kv_heads, head_dim];
// lse: [batch, heads, seq], the log-sum-exp of each query's scaled scores. out and lse are
// overwritten. Throws Error(Config) naming the shape for an unsupported head_dim, and
// Error(Runtime) when the device's shared memory per block is too small for the tiles.
void flash_attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                             int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, cudaStream_t stream);

// Bytes of the two device buffers of the tensor-core kernels (src/backend/flash_layout.h,
// flash_mma_buffers): `inputs`, the forward's bf16 copies of q, k, v, which the backward reads;
// and the backward's scratch (bf16 dout and delta).
int64_t flash_attention_mma_inputs_bytes(int64_t batch, int64_t seq, int64_t heads,
                                         int64_t kv_heads, int64_t head_dim);
int64_t flash_attention_mma_scratch_bytes(int64_t batch, int64_t seq, int64_t heads,
                                          int64_t kv_heads, int64_t head_dim);

// Which tensor-core instruction the bf16 flash kernels below run: mma.sync (sm_80 and sm_90,
// the default, run on an H200), or sm_90a's warpgroup MMA (wgmma: H100 and H200 only, written
// since and not yet run on a GPU). The same results within the same bounds; whether the same
// bits is the hardware's summation order (the emulation gives the same bits).
enum class FlashMmaInstruction { MmaSync, Wgmma };

// What keeps the wgmma kernels off `device` ("" where they run): a compute capability other
// than 9.0, or a build without sm_90a code. The entry points below throw Error(Runtime) with
// it when asked for wgmma there.
std::string flash_wgmma_unavailable(int device);

// One wgmma.mma_async m64n64k16 (bf16 -> fp32) on the GPU (kernels/wgmma_operand_check.cu), to
// check how the hardware reads the operand layouts the wgmma kernels describe
// (src/backend/wgmma_operand.h): `image` (device memory, image_bytes: a multiple of 16, at most
// 48 KiB) is copied to the block's shared memory as is, and each operand's descriptor built from
// its WgmmaCheckOperand (byte offsets; start from the image's first byte). With a_rows null, A
// and B from shared memory, both K-major (the kernels' S = Q K^T); else A from registers, taken
// from a_rows (device memory, 64 x 16 bf16 codes, row-major) as each warp's mma.sync A fragment,
// and B MN-major (O = P V). d (device memory, 64 x 64 floats, row-major): D = A B, placed by the
// accumulators' layout (warp w rows 16 w .. 16 w + 15, mma.sync's C fragment per 8 columns).
// Throws Error(Runtime) where flash_wgmma_unavailable names a reason, and for a bad image size.
struct WgmmaCheckOperand {
  uint32_t start = 0, lbo = 0, sbo = 0;
};
void wgmma_operand_check(const void* image, int image_bytes, WgmmaCheckOperand a,
                         WgmmaCheckOperand b, const uint16_t* a_rows, float* d,
                         cudaStream_t stream);

// The same forward and backward on bf16 tensor cores (kernels/flash_attention_mma.cu): q, k,
// v, dout rounded to bf16, and P and dS rounded to bf16 where they enter a product; fp32
// accumulation and softmax statistics. The forward writes its bf16 copies of q, k, v to
// `inputs` (flash_attention_mma_inputs_bytes), q and k rotated by RoPE as they are copied when
// given the tables rope_cos, rope_sin ([>= seq, head_dim / 2], backend/rope_table.h; q and k
// not written: the attention of rope_forward's q and k); the backward takes that forward's
// inputs, out and lse, and reads neither q, k nor v, so those need not outlive the forward.
// scratch: flash_attention_mma_scratch_bytes, overwritten. Both buffers 16-byte aligned
// (checked). The backend runs them for model.attention = flash_bf16 (and auto under bf16 GEMMs),
// and with wgmma for flash_wgmma.
// query_tile: the forward's query rows per thread block, 64 or 128 (by default
// kFlashMmaForwardQueryTile, backend/flash_layout.h), and the backward's dq pass's, 64 or at
// head dim 64 128 (flash_mma_query_pass_tile); the same results, other speeds (on a GPU the
// backend times both: backend/cuda/flash_tile_choice.h).
void flash_attention_forward_mma(const float* q, const float* k, const float* v,
                                 const float* rope_cos, const float* rope_sin, float* out,
                                 float* lse, void* inputs, int64_t batch, int64_t seq,
                                 int64_t heads, int64_t kv_heads, int64_t head_dim,
                                 cudaStream_t stream, int64_t query_tile,
                                 FlashMmaInstruction instruction = FlashMmaInstruction::MmaSync);
void flash_attention_backward_mma(const void* inputs, const float* out, const float* lse,
                                  const float* dout, float* dq, float* dk, float* dv, void* scratch,
                                  int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim, cudaStream_t stream, int64_t query_tile,
                                  FlashMmaInstruction instruction = FlashMmaInstruction::MmaSync);
// Each pass's kernel alone. The forward's, on the bf16 copies in `inputs` that a
// flash_attention_forward_mma of this shape made: out and lse written again, the same bits at
// either query tile. The backward's dq pass and dK/dV pass, on those copies and on the delta and
// dout's bf16 copy in `scratch` that a flash_attention_backward_mma of this shape made: dq (dk,
// dv) written again, the dq pass the same bits at either tile. For timing the two tiles on a
// shape (the cuda backend picks the faster at the shape's first call, docs/DESIGN.md §6), and
// one instruction against the other (attention-bench).
void flash_forward_mma_kernel_only(const void* inputs, float* out, float* lse, int64_t batch,
                                   int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                   cudaStream_t stream, int64_t query_tile,
                                   FlashMmaInstruction instruction = FlashMmaInstruction::MmaSync);
void flash_dq_pass_mma_only(const void* inputs, const float* lse, const void* scratch, float* dq,
                            int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                            int64_t head_dim, cudaStream_t stream, int64_t query_tile,
                            FlashMmaInstruction instruction = FlashMmaInstruction::MmaSync);
void flash_key_value_pass_mma_only(const void* inputs, const float* lse, const void* scratch,
                                   float* dk, float* dv, int64_t batch, int64_t seq, int64_t heads,
                                   int64_t kv_heads, int64_t head_dim, cudaStream_t stream,
                                   FlashMmaInstruction instruction = FlashMmaInstruction::MmaSync);

// From the forward's q, k, v, out and lse and the gradient dout (shaped as out): dq, dk, dv
// overwritten, without atomics (the same bits on every run). scratch:
// flash_attention_backward_scratch_floats floats, overwritten.
void flash_attention_backward(const float* q, const float* k, const float* v, const float* out,
                              const float* lse, const float* dout, float* dq, float* dk, float* dv,
                              float* scratch, int64_t batch, int64_t seq, int64_t heads,
                              int64_t kv_heads, int64_t head_dim, cudaStream_t stream);

}  // namespace gnmr::cuda
