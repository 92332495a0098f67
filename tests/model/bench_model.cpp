// bench_model: tokens/s of LlamaModel::forward_backward on the CPU backend, with the time
// per backend op (a Backend decorator that times every call; CPU ops are synchronous).
//   bench_model [threads=2] [steps=5] [dim ffn heads kv_heads layers vocab micro_batch seq]
// Defaults: the llama2-60m shape 512 1376 8 8 8 32000, micro_batch 4, seq 256.
// Environment: GNMR_GEMM_PRECISION=fp32|bf16 (train.gemm_precision), GNMR_RECIPE=fp32|bf16|
// actq|fp8mix|int8 (precision.recipe with its defaults; every unit on the low path),
// GNMR_WEIGHT_CACHE=0 (set the GEMM precision after building the model: no bf16 weight cache,
// every GEMM re-rounds its weight, as before the cache).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/llama.h"

namespace gnmr {
namespace {

using Clock = std::chrono::steady_clock;

class TimingBackend final : public Backend {
 public:
  explicit TimingBackend(Backend& inner) : in_(inner) {}
  std::map<std::string, double> seconds;

  std::string name() const override { return in_.name(); }
  std::string device() const override { return in_.device(); }
  Tensor allocate(const std::string& n, std::vector<int64_t> s, DType d, MemoryRole r) override {
    return in_.allocate(n, std::move(s), d, r);
  }
  MemoryUse memory_use() const override { return in_.memory_use(); }
  size_t peak_allocated_bytes() const override { return in_.peak_allocated_bytes(); }
  void copy_to_host(const Tensor& s, void* h) override {
    time("copy", [&] { in_.copy_to_host(s, h); });
  }
  void copy_from_host(Tensor& d, const void* h) override {
    time("copy", [&] { in_.copy_from_host(d, h); });
  }
  void copy(const Tensor& s, Tensor& d) override {
    time("copy", [&] { in_.copy(s, d); });
  }
  void fill_zero(Tensor& t) override {
    time("fill_zero", [&] { in_.fill_zero(t); });
  }
  void synchronize() override { in_.synchronize(); }
  int64_t sync_count() const override { return in_.sync_count(); }
  void embedding_forward(const Tensor& a, const Tensor& b, Tensor& c) override {
    time("embedding", [&] { in_.embedding_forward(a, b, c); });
  }
  void embedding_backward(const Tensor& a, const Tensor& b, Tensor& c) override {
    time("embedding", [&] { in_.embedding_backward(a, b, c); });
  }
  void rmsnorm_forward(const Tensor& x, const Tensor& w, float e, Tensor& o, Tensor& r) override {
    time("rmsnorm", [&] { in_.rmsnorm_forward(x, w, e, o, r); });
  }
  void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& r, const Tensor& d,
                        Tensor& dx, Tensor& dw) override {
    time("rmsnorm", [&] { in_.rmsnorm_backward(x, w, r, d, dx, dw); });
  }
  using Backend::matmul_backward_input;
  using Backend::matmul_backward_weight;
  using Backend::matmul_forward;
  void matmul_forward(const Tensor& x, const Tensor& w, Tensor& y, GemmPrecision p) override {
    time(y.dim(1) == vocab ? "gemm lm_head" : "gemm", [&] { in_.matmul_forward(x, w, y, p); });
  }
  void matmul_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx, bool acc,
                             GemmPrecision p) override {
    time(dy.dim(1) == vocab ? "gemm lm_head" : "gemm",
         [&] { in_.matmul_backward_input(dy, w, dx, acc, p); });
  }
  void matmul_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw,
                              GemmPrecision p) override {
    time(dy.dim(1) == vocab ? "gemm lm_head" : "gemm",
         [&] { in_.matmul_backward_weight(x, dy, dw, p); });
  }
  void quantize_int_groupwise(const Tensor& x, Tensor& p, Tensor& s, const GroupwiseSpec& spec,
                              const RngKey& key) override {
    time("quantize", [&] { in_.quantize_int_groupwise(x, p, s, spec, key); });
  }
  void dequantize_int_groupwise(const Tensor& p, const Tensor& s, const GroupwiseSpec& spec,
                                Tensor& o) override {
    time("quantize", [&] { in_.dequantize_int_groupwise(p, s, spec, o); });
  }
  void fake_quantize_fp_blockwise(const Tensor& x, Tensor& o, FpFormat f, int64_t br,
                                  int64_t bc) override {
    time("quantize", [&] { in_.fake_quantize_fp_blockwise(x, o, f, br, bc); });
  }
  void fake_quantize_int8_per_row(const Tensor& x, Tensor& o) override {
    time("quantize", [&] { in_.fake_quantize_int8_per_row(x, o); });
  }
  void round_to_bf16(const Tensor& x, Tensor& o) override {
    time("quantize", [&] { in_.round_to_bf16(x, o); });
  }
  std::unique_ptr<ProjectionState> plan_projection(const std::string& n, const ProjectionShape& s,
                                                   const PathSpec& low,
                                                   const PathSpec& recovery) override {
    std::unique_ptr<ProjectionState> state;
    time("plan", [&] { state = in_.plan_projection(n, s, low, recovery); });
    return state;
  }
  // The projection's own GEMMs and quantizers run inside the inner backend, untimed apart.
  void projection_forward(ProjectionState& st, const PathSpec& p, const Tensor& w, const Tensor& x,
                          Tensor& y, bool save, const RngKey& key) override {
    time(y.dim(1) == vocab ? "projection lm_head" : "projection",
         [&] { in_.projection_forward(st, p, w, x, y, save, key); });
  }
  void projection_backward(ProjectionState& st, const PathSpec& p, const Tensor& w, Tensor& dy,
                           Tensor& dx, bool acc, Tensor& dw) override {
    time(dy.dim(1) == vocab ? "projection lm_head" : "projection",
         [&] { in_.projection_backward(st, p, w, dy, dx, acc, dw); });
  }
  void invalidate_prepared_weights() override { in_.invalidate_prepared_weights(); }
  std::string describe_projection(const ProjectionShape& shape,
                                  const PathSpec& path) const override {
    return in_.describe_projection(shape, path);
  }
  void rope_forward(Tensor& x, const Tensor& c, const Tensor& s) override {
    time("rope", [&] { in_.rope_forward(x, c, s); });
  }
  void rope_backward(Tensor& x, const Tensor& c, const Tensor& s) override {
    time("rope", [&] { in_.rope_backward(x, c, s); });
  }
  std::unique_ptr<AttentionState> plan_attention(const std::string& n, const AttentionShape& s,
                                                 bool out_kept) override {
    return in_.plan_attention(n, s, out_kept);
  }
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o,
                         AttentionState& saved) override {
    time("attention fwd", [&] { in_.attention_forward(q, k, v, o, saved); });
  }
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionState& saved, const Tensor& d, Tensor& dq, Tensor& dk,
                          Tensor& dv) override {
    time("attention bwd", [&] { in_.attention_backward(q, k, v, saved, d, dq, dk, dv); });
  }
  void swiglu_forward(const Tensor& g, const Tensor& u, Tensor& o) override {
    time("swiglu", [&] { in_.swiglu_forward(g, u, o); });
  }
  void swiglu_backward(const Tensor& g, const Tensor& u, const Tensor& d, Tensor& dg,
                       Tensor& du) override {
    time("swiglu", [&] { in_.swiglu_backward(g, u, d, dg, du); });
  }
  void residual_forward(const Tensor& a, const Tensor& b, Tensor& o) override {
    time("residual", [&] { in_.residual_forward(a, b, o); });
  }
  void cross_entropy_forward(const Tensor& l, const Tensor& t, Tensor& o) override {
    time("cross_entropy", [&] { in_.cross_entropy_forward(l, t, o); });
  }
  void cross_entropy_forward_backward(Tensor& l, const Tensor& t, Tensor& o, float d) override {
    time("cross_entropy", [&] { in_.cross_entropy_forward_backward(l, t, o, d); });
  }
  void accumulate_mean_loss(const Tensor& l, int64_t n, Tensor& s) override {
    time("cross_entropy", [&] { in_.accumulate_mean_loss(l, n, s); });
  }
  void sum_squares(const std::vector<Tensor>& t, Tensor& o) override {
    time("sum_squares", [&] { in_.sum_squares(t, o); });
  }
  void plan_sum_squares(const std::vector<Tensor>& t) override { in_.plan_sum_squares(t); }
  void global_norm_clip(const Tensor& s, const Tensor& l, double c, Tensor& o) override {
    time("sum_squares", [&] { in_.global_norm_clip(s, l, c, o); });
  }
  void scale(Tensor& t, float f) override {
    time("scale", [&] { in_.scale(t, f); });
  }
  void adamw_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& s,
                    const Tensor& c) override {
    time("adamw", [&] { in_.adamw_update(p, g, m, v, s, c); });
  }
  int64_t vocab = -1;

 private:
  template <typename F>
  void time(const char* what, F&& f) {
    in_.set_gemm_precision(gemm_precision());
    const auto start = Clock::now();
    f();
    seconds[what] += std::chrono::duration<double>(Clock::now() - start).count();
  }
  Backend& in_;
};

int run(int argc, char** argv) {
  auto arg = [&](int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; };
  const int threads = arg(1, 2), steps = arg(2, 5);
  ModelConfig c;
  c.dim = arg(3, 512);
  c.ffn_dim = arg(4, 1376);
  c.n_heads = arg(5, 8);
  c.n_kv_heads = arg(6, 8);
  c.n_layers = arg(7, 8);
  c.vocab_size = arg(8, 32000);
  const int micro_batch = arg(9, 4), seq = arg(10, 256);
  c.max_seq_len = seq;
  const char* precision = std::getenv("GNMR_GEMM_PRECISION");
  const char* recipe = std::getenv("GNMR_RECIPE");

  auto cpu = make_cpu_backend(threads);
  TimingBackend be(*cpu);
  be.vocab = c.vocab_size;
  const char* cache = std::getenv("GNMR_WEIGHT_CACHE");
  const bool late = cache != nullptr && std::string(cache) == "0";
  if (precision != nullptr && !late) be.set_gemm_precision(parse_gemm_precision(precision));
  LlamaModel model(c, be, micro_batch, seq, recipe_by_name(recipe != nullptr ? recipe : "fp32"));
  if (precision != nullptr && late) be.set_gemm_precision(parse_gemm_precision(precision));
  model.init_weights(1);
  const int64_t n = model.tokens_per_micro_batch();
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0, c.vocab_size - 1);
  std::vector<int32_t> tokens(n), targets(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = token(rng), targets[i] = token(rng);

  model.zero_grads();
  model.forward_backward(tokens.data(), targets.data(), 1.0f);  // warm-up: page in, workspaces
  be.seconds.clear();
  const auto start = Clock::now();
  const std::clock_t cpu_start = std::clock();
  float loss = 0.0f;
  for (int s = 0; s < steps; ++s) {
    model.zero_grads();
    loss = model.forward_backward(tokens.data(), targets.data(), 1.0f);
  }
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  const double per_step = total / steps;
  const double cpu_per_step = double(std::clock() - cpu_start) / CLOCKS_PER_SEC / steps;
  std::printf("shape dim %d ffn %d heads %d/%d layers %d vocab %d, batch %d x %d, %d threads\n",
              c.dim, c.ffn_dim, c.n_heads, c.n_kv_heads, c.n_layers, c.vocab_size, micro_batch, seq,
              threads);
  std::printf("params %lld, memory %.1f MiB, loss %.4f, recipe %s, saved activations %.1f MiB\n",
              static_cast<long long>(model.num_params()), be.peak_allocated_bytes() / 1048576.0,
              loss, model.recipe().name.c_str(),
              model.routing_stats().saved_activation_bytes / 1048576.0);
  const MemoryUse use = be.memory_use();
  std::printf("memory by role (MiB):");
  for (int r = 0; r < kMemoryRoles; ++r) {
    std::printf(" %s %.1f", memory_role_name(static_cast<MemoryRole>(r)), use.bytes[r] / 1048576.0);
  }
  std::printf("\n");
  std::printf("forward_backward: %.1f ms/step, %.0f tokens/s, %.1f GFLOP/s (model flops)\n",
              per_step * 1e3, n / per_step, model.flops_per_token() * n / per_step * 1e-9);
  std::printf("process CPU time %.1f ms/step (wall x threads = %.1f ms: the rest is waiting)\n",
              cpu_per_step * 1e3, per_step * threads * 1e3);
  double projection = 0.0;
  for (const auto& [what, sec] : be.seconds) {
    std::printf("  %-18s %8.1f ms/step %5.1f%%\n", what.c_str(), sec / steps * 1e3,
                100.0 * sec / total);
    if (what.rfind("projection", 0) == 0) projection += sec;
  }
  std::printf("  outside the projections (their GEMMs and quantizers): %.1f%%\n",
              100.0 * (1.0 - projection / total));
  return 0;
}

}  // namespace
}  // namespace gnmr

int main(int argc, char** argv) {
  return gnmr::run(argc, argv);
}
