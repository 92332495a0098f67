// How good cuBLASLt's heuristic is on our GEMMs: for every GEMM a training step of a model config
// runs (each projection shape and the lm_head, each role, bf16 and block-scaled FP8 e4m3), the
// heuristic's first algorithm (what LtGemmRunner::run takes) against the others it ranks, each
// timed on the same operands, and whether each gives the first one's bits (on 64 columns of the
// result spread over it). The answers say
// whether timing the candidates at start would pay (the FP8 GEMMs gain well under the
// datasheet's 2x over bf16: README, "What has run on a GPU"), and whether a run that did so
// would need to keep its choice for a resume to stay bit-exact.
//
//   bench_gpu_gemm MODEL_CONFIG TOKENS [MAX_ALGORITHMS]
//
// One JSON line per GEMM, then one summary line per recipe (bf16: every GEMM bf16; fp8mix: the
// projections FP8, the lm_head bf16): the step's GEMM milliseconds with the first algorithms and
// with the fastest, each GEMM weighted by how many the step runs (per layer: q and o, k and v,
// gate and up, down). Not a test: scripts/gpu_check.sh's gemm-sweep stage runs it. Exit 1
// without a GPU or on an error.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/gemm_plan.h"
#include "config/config.h"
#include "kernels/cuda_check.cuh"
#include "precision/bf16.h"
#include "util/error.h"

namespace {

using gnmr::GemmImpl;
using gnmr::GemmOperand;
using gnmr::GemmOperandType;
using gnmr::GemmPlan;
using gnmr::GemmRole;

constexpr int kRounds = 2;           // every candidate timed this often, interleaved; the least
constexpr int kCallsPerTiming = 10;  // calls between one pair of events
constexpr int64_t kSampledColumns = 64;

struct DeviceBytes {
  explicit DeviceBytes(size_t n) : bytes(n) { GNMR_CUDA_CHECK(cudaMalloc(&data, n)); }
  ~DeviceBytes() { cudaFree(data); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* data = nullptr;
  size_t bytes;
};

// Codes of varied finite values (constant operands would toggle fewer bits and draw less power
// than training data does): bf16 of N(0, 1); e4m3 of every finite magnitude, 0x7F (NaN) never.
std::vector<uint8_t> random_codes(const GemmOperand& o, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t n = size_t(o.rows * o.cols);
  std::vector<uint8_t> bytes(n * size_t(gnmr::gemm_operand_bytes(o.type)));
  if (o.type == GemmOperandType::kBF16) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t code = gnmr::encode_bf16(normal(rng));
      std::memcpy(&bytes[2 * i], &code, 2);
    }
  } else if (o.type == GemmOperandType::kE4M3) {
    for (uint8_t& b : bytes) b = uint8_t(rng() % 0x7F) | uint8_t(rng() & 0x80);
  } else {
    throw gnmr::Error(gnmr::ErrorKind::Runtime,
                      "bench_gpu_gemm: no random codes for operand " + o.tensor);
  }
  return bytes;
}

struct Operands {
  DeviceBytes a, b, d;
  DeviceBytes a_scales, b_scales;  // FP8 only (1 byte otherwise)
  explicit Operands(const GemmPlan& p)
      : a(size_t(p.a.rows * p.a.cols * gnmr::gemm_operand_bytes(p.a.type))),
        b(size_t(p.b.rows * p.b.cols * gnmr::gemm_operand_bytes(p.b.type))),
        d(size_t(p.m * p.n * gnmr::gemm_operand_bytes(p.d_type))),
        a_scales(size_t(std::max<int64_t>(1, p.a.scale_count)) * sizeof(float)),
        b_scales(size_t(std::max<int64_t>(1, p.b.scale_count)) * sizeof(float)) {
    const std::vector<uint8_t> a_codes = random_codes(p.a, 1), b_codes = random_codes(p.b, 2);
    GNMR_CUDA_CHECK(cudaMemcpy(a.data, a_codes.data(), a.bytes, cudaMemcpyHostToDevice));
    GNMR_CUDA_CHECK(cudaMemcpy(b.data, b_codes.data(), b.bytes, cudaMemcpyHostToDevice));
    // Dequantization multipliers of a typical size (|x| ~ 1 quantized to e4m3's 448).
    const std::vector<float> scales(std::max(a_scales.bytes, b_scales.bytes) / sizeof(float),
                                    1.0f / 256.0f);
    GNMR_CUDA_CHECK(
        cudaMemcpy(a_scales.data, scales.data(), a_scales.bytes, cudaMemcpyHostToDevice));
    GNMR_CUDA_CHECK(
        cudaMemcpy(b_scales.data, scales.data(), b_scales.bytes, cudaMemcpyHostToDevice));
  }
};

struct Candidate {
  bool ran = false;
  std::string error;
  double ms = 0.0;  // the least of kRounds timings
  bool same_bits = false;
};

// One GEMM: each candidate once from D = 0 (its bits against the first's), then kRounds timings
// of kCallsPerTiming calls, the candidates interleaved so that clock and power drift fall on all.
std::vector<Candidate> measure(gnmr::LtGemmRunner& runner, const GemmPlan& plan, int max_count) {
  const std::vector<cublasLtMatmulHeuristicResult_t> ranked =
      runner.ranked_algorithms(plan, max_count);
  Operands ops(plan);
  const bool fp8 = plan.impl == GemmImpl::kFp8Block;
  const float* a_scales = fp8 ? static_cast<const float*>(ops.a_scales.data) : nullptr;
  const float* b_scales = fp8 ? static_cast<const float*>(ops.b_scales.data) : nullptr;
  auto call = [&](const cublasLtMatmulHeuristicResult_t& h) {
    runner.run_algorithm(h.algo, plan, ops.a.data, a_scales, ops.b.data, b_scales, ops.d.data,
                         nullptr);
  };
  std::vector<Candidate> out(ranked.size());
  // The bits compared: kSampledColumns of D's n columns (each m contiguous elements), evenly
  // spread. Another summation order changes nearly every element; copying the whole of D (1 GiB
  // for the lm_head) once per candidate would take most of the stage's time.
  const int64_t element = gnmr::gemm_operand_bytes(plan.d_type);
  const int64_t columns = std::min(plan.n, kSampledColumns), stride = plan.n / columns;
  std::vector<uint8_t> first_bits, bits(size_t(columns * plan.m * element));
  for (size_t i = 0; i < ranked.size(); ++i) {
    try {
      GNMR_CUDA_CHECK(cudaMemset(ops.d.data, 0, ops.d.bytes));
      call(ranked[i]);
      GNMR_CUDA_CHECK(cudaDeviceSynchronize());
      const size_t column_bytes = size_t(plan.m * element);
      for (int64_t c = 0; c < columns; ++c) {
        GNMR_CUDA_CHECK(cudaMemcpy(
            bits.data() + size_t(c) * column_bytes,
            static_cast<const uint8_t*>(ops.d.data) + size_t(c * stride * plan.ldc * element),
            column_bytes, cudaMemcpyDeviceToHost));
      }
      out[i].ran = true;
    } catch (const std::exception& e) {
      out[i].error = e.what();
      // A failed launch may leave a sticky error; if it does, the next call reports it.
      cudaGetLastError();
      continue;
    }
    if (i == 0) first_bits = bits;
    out[i].same_bits = !first_bits.empty() && bits == first_bits;
  }
  GNMR_CHECK(!out.empty(),
             "bench_gpu_gemm: the heuristic ranked no algorithm for " + gnmr::gemm_plan_key(plan));
  GNMR_CHECK(out[0].ran, "bench_gpu_gemm: the heuristic's first algorithm failed for " +
                             gnmr::gemm_plan_key(plan) + ": " + out[0].error);
  cudaEvent_t start, stop;
  GNMR_CUDA_CHECK(cudaEventCreate(&start));
  GNMR_CUDA_CHECK(cudaEventCreate(&stop));
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < ranked.size(); ++i) {
      if (!out[i].ran) continue;
      call(ranked[i]);  // warm-up
      GNMR_CUDA_CHECK(cudaEventRecord(start));
      for (int c = 0; c < kCallsPerTiming; ++c) call(ranked[i]);
      GNMR_CUDA_CHECK(cudaEventRecord(stop));
      GNMR_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      GNMR_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      const double per_call = double(ms) / kCallsPerTiming;
      out[i].ms = round == 0 ? per_call : std::min(out[i].ms, per_call);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return out;
}

struct Shape {
  const char* what;
  int64_t in, out;
  int per_step;  // GEMMs of this shape per role in a step
};

struct RecipeTotals {
  double first_ms = 0.0, best_ms = 0.0;
  int gemms = 0, faster_elsewhere = 0, other_bits = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: bench_gpu_gemm MODEL_CONFIG TOKENS [MAX_ALGORITHMS (16)]\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "bench_gpu_gemm: no CUDA device visible\n");
    return 1;
  }
  try {
    const gnmr::ModelConfig m = gnmr::load_run_config(argv[1], {}).model;
    const int64_t tokens = std::atoll(argv[2]);
    const int max_count = argc == 4 ? std::atoi(argv[3]) : 16;
    GNMR_CHECK(tokens > 0, std::string("bench_gpu_gemm: TOKENS ") + argv[2] + " (at least 1)");
    cudaDeviceProp prop{};
    GNMR_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const gnmr::GpuTarget target{prop.major * 10 + prop.minor};
    const int64_t d = m.dim, kv = int64_t(m.n_kv_heads) * m.head_dim(), f = m.ffn_dim;
    const int layers = m.n_layers;
    std::vector<Shape> shapes = {{"q,o", d, d, 2 * layers},
                                 {"k,v", d, kv, 2 * layers},
                                 {"gate,up", d, f, 2 * layers},
                                 {"down", f, d, layers},
                                 {"lm_head", d, m.vocab_size, 1}};
    if (kv == d) {  // k and v are q's shape: one GEMM, four a layer
      shapes[0] = {"q,k,v,o", d, d, 4 * layers};
      shapes.erase(shapes.begin() + 1);
    }
    gnmr::PathSpec fp8;
    fp8.kind = gnmr::PathKind::kFineGrainedFp;
    gnmr::LtGemmRunner runner;
    std::map<std::string, RecipeTotals> totals;  // "bf16", "fp8mix"
    for (const Shape& s : shapes) {
      for (GemmRole role :
           {GemmRole::kForward, GemmRole::kInputGradient, GemmRole::kWeightGradient}) {
        const bool lm_head = std::strcmp(s.what, "lm_head") == 0;
        const GemmPlan bf16 = gnmr::plan_gemm(role, tokens, s.in, s.out, gnmr::PathSpec{},
                                              gnmr::GemmPrecision::BF16, target, false);
        std::vector<GemmPlan> plans = {bf16};
        if (!lm_head) {
          plans.push_back(gnmr::plan_gemm(role, tokens, s.in, s.out, fp8, gnmr::GemmPrecision::BF16,
                                          target, false));
        }
        for (const GemmPlan& plan : plans) {
          if (plan.impl != GemmImpl::kBf16 && plan.impl != GemmImpl::kFp8Block) {
            std::printf("{\"gemm\": \"%s\", \"skipped\": \"%s\"}\n",
                        gnmr::gemm_plan_key(plan).c_str(), plan.emulated_because.c_str());
            continue;
          }
          const std::vector<Candidate> c = measure(runner, plan, max_count);
          size_t best = 0;
          int ran = 0, same = 0;
          for (size_t i = 0; i < c.size(); ++i) {
            if (c[i].ran && c[i].ms < c[best].ms) best = i;
            ran += c[i].ran;
            same += c[i].ran && c[i].same_bits;
          }
          const double flops = 2.0 * double(plan.m) * double(plan.n) * double(plan.k);
          std::printf(
              "{\"gemm\": \"%s\", \"shape\": \"%s\", \"role\": \"%s\", \"impl\": \"%s\", "
              "\"m\": %lld, \"n\": %lld, \"k\": %lld, \"per_step\": %d, \"candidates\": %zu, "
              "\"ran\": %d, \"same_bits_as_first\": %d, \"first_ms\": %.4f, \"best_ms\": %.4f, "
              "\"best_rank\": %zu, \"first_tflops\": %.1f, \"best_tflops\": %.1f, "
              "\"best_same_bits\": %s}\n",
              gnmr::gemm_plan_key(plan).c_str(), s.what, gnmr::gemm_role_name(role),
              gnmr::gemm_impl_name(plan.impl), (long long)plan.m, (long long)plan.n,
              (long long)plan.k, s.per_step, c.size(), ran, same, c[0].ms, c[best].ms, best,
              flops / c[0].ms * 1e-9, flops / c[best].ms * 1e-9,
              c[best].same_bits ? "true" : "false");
          for (size_t i = 0; i < c.size(); ++i) {
            if (!c[i].ran)
              std::fprintf(stderr, "  candidate %zu failed: %s\n", i, c[i].error.c_str());
          }
          std::fflush(stdout);
          for (const char* recipe : {"bf16", "fp8mix"}) {
            const bool counts = std::strcmp(recipe, "bf16") == 0
                                    ? plan.impl == GemmImpl::kBf16
                                    : (lm_head || plan.impl == GemmImpl::kFp8Block);
            if (!counts) continue;
            RecipeTotals& t = totals[recipe];
            t.first_ms += s.per_step * c[0].ms;
            t.best_ms += s.per_step * c[best].ms;
            ++t.gemms;
            t.faster_elsewhere += best != 0;
            t.other_bits += !c[best].same_bits;
          }
        }
      }
    }
    for (const auto& [recipe, t] : totals) {
      std::printf(
          "{\"summary\": \"%s\", \"device\": \"%s\", \"tokens\": %lld, \"gemms\": %d, "
          "\"step_ms_first\": %.2f, \"step_ms_best\": %.2f, \"first_over_best\": %.3f, "
          "\"gemms_faster_elsewhere\": %d, \"best_with_other_bits\": %d}\n",
          recipe.c_str(), prop.name, (long long)tokens, t.gemms, t.first_ms, t.best_ms,
          t.first_ms / t.best_ms, t.faster_elsewhere, t.other_bits);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
