// Attention speed on one GPU: the flash kernels (kernels/flash_attention.cu), the tensor-core
// flash kernels (kernels/flash_attention_mma.cu) and the v1 attention
// (backend/cuda/attention_v1.h: its GEMMs in fp32, then in bf16 as "materialized-bf16"), forward
// and backward, causal, hd 128, at T = 1024, 2048 and 4096 with 16384 tokens per call (B = 16384 /
// T, H = Hkv = 16), then llama2-1b-gpu's heads (hd 64, H = Hkv = 32) at T = 1024, and the memory
// each keeps (saved for the backward, plus its backward scratch); `--small` runs T = 128 instead
// (the dry run's). Then each pass's kernel alone (JSON with "pass": the forward, the dQ pass and
// the dK/dV pass), the mma.sync ones and, on sm_90a (H100, H200), the wgmma ones, at each query
// tile. Causal FLOPs are
// half the dense ones: forward 2 * 2 * B * H * T^2 * hd / 2, backward 2.5x that (FlashAttention-2,
// arXiv 2307.08691, section 4: five matmuls against two). Prints one JSON line per (kernel, T). Not
// a test: scripts/gpu_check.sh's attention-bench stage runs it. Exit 1 without a GPU.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/attention_v1.h"
#include "backend/cuda/cublaslt_descriptors.h"
#include "backend/flash_layout.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"

namespace {

using gnmr::AttentionShape;
using gnmr::GemmPrecision;
using gnmr::cuda::MaterializedAttention;

constexpr int kRepeats = 3;

struct Buffer {
  explicit Buffer(size_t floats) { GNMR_CUDA_CHECK(cudaMalloc(&data, floats * sizeof(float))); }
  ~Buffer() { cudaFree(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data = nullptr;
};

void fill_random(Buffer& b, size_t floats, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> host(floats);
  for (float& x : host) x = normal(rng);
  GNMR_CUDA_CHECK(cudaMemcpy(b.data, host.data(), floats * sizeof(float), cudaMemcpyHostToDevice));
}

// Milliseconds of one call of `run`, the mean of kRepeats calls after one warm-up.
template <typename Run>
double time_ms(Run run) {
  run();
  cudaEvent_t start, stop;
  GNMR_CUDA_CHECK(cudaEventCreate(&start));
  GNMR_CUDA_CHECK(cudaEventCreate(&stop));
  GNMR_CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < kRepeats; ++i) run();
  GNMR_CUDA_CHECK(cudaEventRecord(stop));
  GNMR_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  GNMR_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) / kRepeats;
}

void report(const char* kernel, const AttentionShape& s, double forward_ms, double backward_ms,
            double memory_bytes, const char* device) {
  const double forward_flops =
      2.0 * 2.0 * double(s.batch * s.heads) * double(s.seq) * double(s.seq) * s.head_dim / 2.0;
  const double backward_flops = 2.5 * forward_flops;
  std::printf(
      "{\"kernel\": \"%s\", \"device\": \"%s\", \"B\": %lld, \"T\": %lld, \"H\": %lld, "
      "\"hd\": %lld, \"forward_ms\": %.3f, \"backward_ms\": %.3f, \"forward_tflops\": %.2f, "
      "\"backward_tflops\": %.2f, \"memory_mib\": %.1f}\n",
      kernel, device, (long long)s.batch, (long long)s.seq, (long long)s.heads,
      (long long)s.head_dim, forward_ms, backward_ms, forward_flops / forward_ms / 1e9,
      backward_flops / backward_ms / 1e9, memory_bytes / (1024.0 * 1024.0));
  std::fflush(stdout);
}

// One pass's kernel alone: "pass" forward (two products), dq (the backward's dQ pass: three, 1.5
// times the forward's FLOPs) or dkdv (its dK/dV pass: four, twice).
void report_pass(const std::string& kernel, const char* pass, const AttentionShape& s, double ms,
                 const char* device) {
  const double forward_flops =
      2.0 * 2.0 * double(s.batch * s.heads) * double(s.seq) * double(s.seq) * s.head_dim / 2.0;
  const std::string name(pass);
  const double flops = forward_flops * (name == "dq" ? 1.5 : name == "dkdv" ? 2.0 : 1.0);
  std::printf(
      "{\"kernel\": \"%s\", \"pass\": \"%s\", \"device\": \"%s\", \"B\": %lld, \"T\": %lld, "
      "\"H\": %lld, \"hd\": %lld, \"ms\": %.3f, \"tflops\": %.2f}\n",
      kernel.c_str(), pass, device, (long long)s.batch, (long long)s.seq, (long long)s.heads,
      (long long)s.head_dim, ms, flops / ms / 1e9);
  std::fflush(stdout);
}

void bench(const AttentionShape& s, cublasLtHandle_t lt, void* workspace, size_t workspace_bytes,
           const char* device) {
  const size_t nq = size_t(s.batch * s.seq * s.heads * s.head_dim);
  const size_t nkv = size_t(s.batch * s.seq * s.kv_heads * s.head_dim);
  const size_t rows = size_t(s.batch * s.heads * s.seq);
  Buffer q(nq), k(nkv), v(nkv), out(nq), dout(nq), dq(nq), dk(nkv), dv(nkv);
  fill_random(q, nq, 1), fill_random(k, nkv, 2), fill_random(v, nkv, 3);
  fill_random(dout, nq, 4);
  {
    const size_t scratch_floats =
        size_t(gnmr::cuda::flash_attention_backward_scratch_floats(s.batch, s.seq, s.heads));
    Buffer lse(rows), scratch(scratch_floats);
    const auto forward = [&] {
      gnmr::cuda::flash_attention_forward(q.data, k.data, v.data, out.data, lse.data, s.batch,
                                          s.seq, s.heads, s.kv_heads, s.head_dim, nullptr);
    };
    const double forward_ms = time_ms(forward);
    const double backward_ms = time_ms([&] {
      gnmr::cuda::flash_attention_backward(q.data, k.data, v.data, out.data, lse.data, dout.data,
                                           dq.data, dk.data, dv.data, scratch.data, s.batch, s.seq,
                                           s.heads, s.kv_heads, s.head_dim, nullptr);
    });
    // Saved: the backend's copy of out and lse; scratch: delta.
    report("flash", s, forward_ms, backward_ms,
           double(sizeof(float)) * double(nq + rows + scratch_floats), device);
  }
  {
    const size_t inputs_floats = size_t(gnmr::cuda::flash_attention_mma_inputs_bytes(
                                            s.batch, s.seq, s.heads, s.kv_heads, s.head_dim) /
                                        4);
    const size_t scratch_floats = size_t(gnmr::cuda::flash_attention_mma_scratch_bytes(
                                             s.batch, s.seq, s.heads, s.kv_heads, s.head_dim) /
                                         4);
    Buffer lse(rows), inputs(inputs_floats), scratch(scratch_floats);
    // The backend's query tiles (kFlashMmaForwardQueryTile, flash_mma_query_pass_tile) first,
    // then the others: the forward's other one, and at hd 64 the dq pass's.
    const int64_t forward_tile = gnmr::kFlashMmaForwardQueryTile;
    const int64_t dq_tile = gnmr::flash_mma_query_pass_tile(s.head_dim);
    const std::pair<int64_t, int64_t> tilings[] = {
        {forward_tile, dq_tile},
        {forward_tile == 128 ? 64 : 128, s.head_dim == 64 && dq_tile == 64 ? 128 : 64}};
    for (const std::pair<int64_t, int64_t>& tiling : tilings) {
      const int64_t forward_rows = tiling.first, dq_rows = tiling.second;
      const double forward_ms = time_ms([&] {
        gnmr::cuda::flash_attention_forward_mma(q.data, k.data, v.data, nullptr, nullptr, out.data,
                                                lse.data, inputs.data, s.batch, s.seq, s.heads,
                                                s.kv_heads, s.head_dim, nullptr, forward_rows);
      });
      const double backward_ms = time_ms([&] {
        gnmr::cuda::flash_attention_backward_mma(
            inputs.data, out.data, lse.data, dout.data, dq.data, dk.data, dv.data, scratch.data,
            s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, nullptr, dq_rows);
      });
      const std::string name =
          "flash-mma-fwd" + std::to_string(forward_rows) + "-dq" + std::to_string(dq_rows);
      report(name.c_str(), s, forward_ms, backward_ms,
             double(sizeof(float)) * double(nq + rows + inputs_floats + scratch_floats), device);
    }
    // Each pass's kernel alone on the copies (and delta) the last forward and backward made,
    // mma.sync against wgmma (sm_90a only) at each query tile the pass takes: the forward's
    // (no bf16 conversion of q, k, v), the dK/dV pass's and the dQ pass's.
    using gnmr::cuda::FlashMmaInstruction;
    int device_index = 0;
    GNMR_CUDA_CHECK(cudaGetDevice(&device_index));
    std::vector<std::pair<FlashMmaInstruction, std::string>> instructions = {
        {FlashMmaInstruction::MmaSync, "mma"}};
    if (gnmr::cuda::flash_wgmma_unavailable(device_index).empty()) {
      instructions.push_back({FlashMmaInstruction::Wgmma, "wgmma"});
    }
    for (const auto& [instruction, name] : instructions) {
      const std::string prefix = "flash-" + name;
      for (const int64_t tile : {gnmr::kFlashQTile, 2 * gnmr::kFlashQTile}) {
        const std::string rows_text = std::to_string(tile);
        report_pass(prefix + "-fwd" + rows_text, "forward", s, time_ms([&] {
                      gnmr::cuda::flash_forward_mma_kernel_only(
                          inputs.data, out.data, lse.data, s.batch, s.seq, s.heads, s.kv_heads,
                          s.head_dim, nullptr, tile, instruction);
                    }),
                    device);
        if (tile == 2 * gnmr::kFlashQTile && s.head_dim != 64) continue;  // dq: 128 at hd 64 only
        report_pass(prefix + "-dq" + rows_text, "dq", s, time_ms([&] {
                      gnmr::cuda::flash_dq_pass_mma_only(
                          inputs.data, lse.data, scratch.data, dq.data, s.batch, s.seq, s.heads,
                          s.kv_heads, s.head_dim, nullptr, tile, instruction);
                    }),
                    device);
      }
      report_pass(prefix + "-dkdv", "dkdv", s, time_ms([&] {
                    gnmr::cuda::flash_key_value_pass_mma_only(
                        inputs.data, lse.data, scratch.data, dk.data, dv.data, s.batch, s.seq,
                        s.heads, s.kv_heads, s.head_dim, nullptr, instruction);
                  }),
                  device);
    }
  }
  {
    const size_t probs_floats = rows * size_t(s.seq);
    const size_t scratch_floats = size_t(MaterializedAttention::backward_scratch_floats(s));
    Buffer probs(probs_floats), scratch(scratch_floats);
    MaterializedAttention v1(lt, workspace, workspace_bytes);
    // Its GEMMs in fp32 (the CPU's numerics) and in the bf16 runs' precision.
    for (const GemmPrecision precision : {GemmPrecision::FP32, GemmPrecision::BF16}) {
      const double forward_ms = time_ms(
          [&] { v1.forward(q.data, k.data, v.data, out.data, probs.data, s, precision, nullptr); });
      const double backward_ms = time_ms([&] {
        v1.backward(q.data, k.data, v.data, probs.data, dout.data, dq.data, dk.data, dv.data,
                    scratch.data, s, precision, nullptr);
      });
      report(precision == GemmPrecision::BF16 ? "materialized-bf16" : "materialized", s, forward_ms,
             backward_ms, double(sizeof(float)) * double(probs_floats + scratch_floats), device);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // --small: the dry run's shapes (scripts/gpu_check.sh on the CUDA emulation, where the real
  // ones would take hours): every kernel and tiling once, T = 128 at hd 128 and 64.
  const bool small = argc == 2 && std::string(argv[1]) == "--small";
  if (argc > 2 || (argc == 2 && !small)) {
    std::fprintf(stderr, "usage: bench_gpu_attention [--small]\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "bench_gpu_attention: no CUDA device visible\n");
    return 1;
  }
  try {
    cudaDeviceProp prop{};
    GNMR_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    cublasLtHandle_t lt = nullptr;
    GNMR_CUBLASLT_CHECK(cublasLtCreate(&lt), "bench handle");
    const size_t workspace_bytes = size_t{32} << 20;
    void* workspace = nullptr;
    GNMR_CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    if (small) {
      for (int64_t hd : {128, 64}) {
        bench(AttentionShape{2, 128, 4, 4, hd}, lt, workspace, workspace_bytes, prop.name);
      }
    } else {
      for (int64_t t : {1024, 2048, 4096}) {
        bench(AttentionShape{16384 / t, t, 16, 16, 128}, lt, workspace, workspace_bytes, prop.name);
      }
      bench(AttentionShape{16, 1024, 32, 32, 64}, lt, workspace, workspace_bytes, prop.name);
    }
    cudaFree(workspace);
    cublasLtDestroy(lt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
