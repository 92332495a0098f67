#include "model/llama.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "backend/rope_table.h"
#include "model/init.h"
#include "util/error.h"

namespace gnmr {

namespace {

void validate(const ModelConfig& c, int micro_batch, int seq_len) {
  validate_model_shape(c, seq_len);
  if (micro_batch <= 0) {
    throw Error(ErrorKind::Config, "config: \"train.micro_batch\" must be > 0 (got " +
                                       std::to_string(micro_batch) + ")");
  }
}

// What an evaluation model's buffer `name` is called: "layer.3.xn_attn" -> "xn_attn",
// "residual.5" -> "residual", the one buffer of that kind every layer shares there.
std::string name_shared_by_layers(const std::string& name) {
  if (name.rfind("layer.", 0) == 0) return name.substr(name.find('.', 6) + 1);
  if (name.rfind("residual.", 0) == 0) return "residual";
  return name;
}

}  // namespace

AttentionShape llama_attention_shape(const ModelConfig& config, int64_t micro_batch,
                                     int64_t seq_len) {
  return AttentionShape{micro_batch, seq_len, config.n_heads, config.n_kv_heads, config.head_dim()};
}

LlamaModel::LlamaModel(const ModelConfig& config, Backend& backend, int micro_batch, int seq_len,
                       const PrecisionRecipe& recipe, SavedInputSharing sharing,
                       int64_t flat_elements_multiple, ModelGradients gradients)
    : config_(config), backend_(backend), micro_batch_(micro_batch), seq_len_(seq_len) {
  validate(config, micro_batch, seq_len);
  table_ = build_param_table(config);
  GNMR_CHECK(flat_elements_multiple >= 1,
             "flat_elements_multiple " + std::to_string(flat_elements_multiple));
  const int64_t flat_elements = (table_.flat_size + flat_elements_multiple - 1) /
                                flat_elements_multiple * flat_elements_multiple;
  flat_weights_ = backend_.allocate("weights", {flat_elements}, DType::F32, MemoryRole::Weights);
  if (gradients == ModelGradients::kHeld) {
    flat_grads_ = backend_.allocate("grads", {flat_elements}, DType::F32, MemoryRole::Gradients);
  }
  for (ParamInfo& p : table_.params) {
    p.weight = tensor_view(flat_weights_, p.shape, p.offset);
    if (gradients == ModelGradients::kHeld) p.grad = tensor_view(flat_grads_, p.shape, p.offset);
  }

  const int64_t n = tokens_per_micro_batch(), d = config.dim, f = config.ffn_dim;
  const int64_t hd = config.head_dim(), kv = static_cast<int64_t>(config.n_kv_heads) * hd;
  // Per-micro-step buffers (inputs, logits, activation gradients) and what each layer keeps
  // for its backward.
  auto f32 = [&](const std::string& name, std::vector<int64_t> shape) {
    return backend_.allocate(name, std::move(shape), DType::F32, MemoryRole::Activations);
  };
  // An evaluation model (ModelGradients::kNone) runs forward_loss only, in which no layer's
  // activations outlive its forward but h, which the next layer reads before it writes its own
  // (and the residual stream, which each layer's first op reads and its next overwrites): so
  // its layers share one set of buffers, one layer's whatever the depth.
  const bool layers_share_activations = gradients == ModelGradients::kNone;
  std::map<std::string, Tensor> shared_by_layers;
  auto saved = [&](const std::string& name, std::vector<int64_t> shape) {
    if (!layers_share_activations) {
      return backend_.allocate(name, std::move(shape), DType::F32, MemoryRole::SavedActivations);
    }
    const std::string shared_name = name_shared_by_layers(name);
    auto it = shared_by_layers.find(shared_name);
    if (it == shared_by_layers.end()) {
      Tensor t = backend_.allocate(shared_name, shape, DType::F32, MemoryRole::SavedActivations);
      it = shared_by_layers.emplace(shared_name, t).first;
    }
    GNMR_CHECK(it->second.shape == shape, "layers share " + shared_name + " of another shape");
    return it->second;
  };
  // The projections first: what they plan decides which of their inputs each layer keeps.
  paths_ = std::make_unique<ProjectionPaths>(recipe, backend_, table_, n, sharing);
  // A projection input that no unit's backward reads (every unit reading it keeps its own
  // copy, e.g. actq's codes) lives in one per-step buffer shared by all layers; it only has
  // to last from its producer to its last GEMM in the forward. xn_attn, att, xn_mlp and act
  // are never live at the same time.
  bool any_scratch_input = false;
  for (int l = 0; l < config.n_layers; ++l) {
    for (int i = 0; i < kInputsPerLayer; ++i) {
      any_scratch_input |= !paths_->input_kept(l, static_cast<UnitInput>(i));
    }
  }
  Tensor projection_input;
  if (any_scratch_input) projection_input = f32("projection_input", {n * std::max(d, f)});
  auto input = [&](int layer, UnitInput which, const std::string& name, int64_t cols) {
    if (paths_->input_kept(layer, which)) return saved(name, {n, cols});
    return tensor_view(projection_input, {n, cols});
  };
  act_.tokens = backend_.allocate("tokens", {n}, DType::I32, MemoryRole::Activations);
  act_.targets = backend_.allocate("targets", {n}, DType::I32, MemoryRole::Activations);
  for (int l = 0; l <= config.n_layers; ++l) {
    act_.residual.push_back(saved("residual." + std::to_string(l), {n, d}));
  }
  struct {
    Tensor q, k, v;
  } attention_inputs;  // allocated with the first layer that shares them
  for (int l = 0; l < config.n_layers; ++l) {
    const std::string p = "layer." + std::to_string(l) + ".";
    LayerActivations a;
    a.xn_attn = input(l, UnitInput::kAttentionNorm, p + "xn_attn", d);
    a.rstd_attn = saved(p + "rstd_attn", {n});
    a.att = input(l, UnitInput::kAttentionOut, p + "att", d);
    // att is attention's out; when it is the layer's own (not per-step scratch), nothing writes
    // it between the forward and the backward, so the backend may read it there.
    const bool out_kept = paths_->input_kept(l, UnitInput::kAttentionOut);
    if (layers_share_activations && l > 0) {
      GNMR_CHECK(out_kept == paths_->input_kept(0, UnitInput::kAttentionOut),
                 "layers that share their attention state keep their out alike");
      a.attention = act_.layers.front().attention;
    } else {
      a.attention = backend_.plan_attention(
          p + "attention", llama_attention_shape(config, micro_batch, seq_len), out_kept);
    }
    // q, k, v are the layer's own where attention's backward reads them; where its state keeps
    // its own copies (keeps_inputs), one per-step set shared by all layers, which only has to
    // last from the projections to the attention forward.
    if (a.attention->keeps_inputs()) {
      if (attention_inputs.q.data == nullptr) {
        attention_inputs.q = f32("attention_q", {n, d});
        attention_inputs.k = f32("attention_k", {n, kv});
        attention_inputs.v = f32("attention_v", {n, kv});
      }
      a.q = attention_inputs.q;
      a.k = attention_inputs.k;
      a.v = attention_inputs.v;
    } else {
      a.q = saved(p + "q", {n, d});
      a.k = saved(p + "k", {n, kv});
      a.v = saved(p + "v", {n, kv});
    }
    a.h = saved(p + "h", {n, d});
    a.xn_mlp = input(l, UnitInput::kMlpNorm, p + "xn_mlp", d);
    a.rstd_mlp = saved(p + "rstd_mlp", {n});
    a.gate = saved(p + "gate", {n, f});
    a.up = saved(p + "up", {n, f});
    a.act = input(l, UnitInput::kSwigluOut, p + "act", f);
    act_.layers.push_back(std::move(a));
  }
  act_.xn_final = saved("xn_final", {n, d});
  act_.rstd_final = saved("rstd_final", {n});
  act_.logits = f32("logits", {n, config.vocab_size});
  act_.losses = f32("losses", {n});

  std::vector<float> cos, sin;
  compute_rope_table(config.rope_theta, static_cast<int>(hd), seq_len, cos, sin);
  act_.rope_cos = f32("rope_cos", {seq_len, hd / 2});
  act_.rope_sin = f32("rope_sin", {seq_len, hd / 2});
  backend_.copy_from_host(act_.rope_cos, cos.data());
  backend_.copy_from_host(act_.rope_sin, sin.data());

  scratch_.d_att = f32("d_att", {n, d});  // the forward's scratch too
  if (gradients == ModelGradients::kHeld) {
    scratch_.d_residual = f32("d_residual", {n, d});
    scratch_.d_normed = f32("d_normed", {n, d});
    scratch_.dq = f32("dq", {n, d});
    scratch_.dk = f32("dk", {n, kv});
    scratch_.dv = f32("dv", {n, kv});
    scratch_.d_gate = f32("d_gate", {n, f});
    scratch_.d_up = f32("d_up", {n, f});
    scratch_.d_act = f32("d_act", {n, f});
  }

  host_targets_.resize(static_cast<size_t>(n));
  host_losses_.resize(static_cast<size_t>(n));
}

LlamaModel::~LlamaModel() = default;

int64_t llama_parameter_count(const ModelConfig& config) {
  const int64_t dim = config.dim, vocab = config.vocab_size, ffn = config.ffn_dim;
  const int64_t kv_dim = int64_t(config.n_kv_heads) * config.head_dim();
  const int64_t per_layer = 2 * dim + 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * ffn;
  return 2 * vocab * dim + int64_t(config.n_layers) * per_layer + dim;
}

int64_t LlamaModel::num_params() const {
  int64_t total = 0;
  for (const ParamInfo& p : table_.params) total += p.weight.numel();
  return total;
}

void LlamaModel::init_weights(uint64_t seed) {
  std::vector<float> host;
  for (size_t i = 0; i < table_.params.size(); ++i) {
    ParamInfo& p = table_.params[i];
    host.assign(static_cast<size_t>(p.weight.numel()), 1.0f);
    if (p.shape.size() >= 2) {
      fill_normal_counter_based(seed, i, config_.init_std, host.data(), p.weight.numel());
    }
    backend_.copy_from_host(p.weight, host.data());
  }
  paths_->invalidate_weights();
}

void LlamaModel::check_holds_gradients(const char* call) const {
  GNMR_CHECK(flat_grads_.data != nullptr,
             std::string(call) + " on a model built without gradients (ModelGradients::kNone)");
}

void LlamaModel::zero_grads() {
  check_holds_gradients("zero_grads");
  backend_.fill_zero(flat_grads_);
  // A new step: the optimizer has written the weights since the cache was made.
  paths_->invalidate_weights();
  micro_step_ = 0;
}

std::string LlamaModel::attention_kernel() const {
  return act_.layers.empty() ? "none (no layers)" : act_.layers.front().attention->kernel();
}

int64_t LlamaModel::flops_per_token() const {
  int64_t matmul_params = 0;
  for (size_t i = 0; i < table_.params.size(); ++i) {
    const ParamInfo& p = table_.params[i];
    if (p.unit >= 0 || static_cast<int>(i) == table_.lm_head) matmul_params += p.weight.numel();
  }
  return 6 * matmul_params +
         12 * static_cast<int64_t>(config_.n_layers) * config_.dim * static_cast<int64_t>(seq_len_);
}

const ProjectionUnit& LlamaModel::unit(int layer, ProjectionKind kind) const {
  return table_.units[static_cast<size_t>(unit_id(layer, kind))];
}

Tensor LlamaModel::heads_view(const Tensor& t, int heads) const {
  return tensor_view(t, {micro_batch_, seq_len_, heads, config_.head_dim()});
}

void LlamaModel::project_forward(const ProjectionUnit& u, const Tensor& x, Tensor& y) {
  paths_->forward(u, x, y, save_for_backward_);
}

void LlamaModel::project_backward(const ProjectionUnit& u, Tensor& dy, Tensor& dx,
                                  bool accumulate_dx) {
  paths_->backward(u, dy, dx, accumulate_dx);
}

int LlamaModel::upload_batch(const int32_t* tokens, const int32_t* targets) {
  const int64_t n = tokens_per_micro_batch();
  int valid = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      throw Error(ErrorKind::Data, "token " + std::to_string(tokens[i]) + " at position " +
                                       std::to_string(i) + " is outside model.vocab_size " +
                                       std::to_string(config_.vocab_size));
    }
    if (targets[i] >= config_.vocab_size || targets[i] < -1) {
      throw Error(ErrorKind::Data, "target " + std::to_string(targets[i]) + " at position " +
                                       std::to_string(i) + " is outside model.vocab_size " +
                                       std::to_string(config_.vocab_size) +
                                       " (-1 marks an ignored position)");
    }
    valid += targets[i] >= 0 ? 1 : 0;
  }
  if (valid == 0) throw Error(ErrorKind::Data, "micro-batch has no targets (all are -1)");
  backend_.copy_from_host(act_.tokens, tokens);
  backend_.copy_from_host(act_.targets, targets);
  return valid;
}

float LlamaModel::read_mean_loss(int valid_targets) {
  backend_.copy_to_host(act_.losses, host_losses_.data());
  double sum = 0.0;
  for (float loss : host_losses_) sum += loss;
  return static_cast<float>(sum / valid_targets);
}

float LlamaModel::forward_loss(const int32_t* tokens, const int32_t* targets) {
  const int valid = upload_batch(tokens, targets);
  // Evaluation may follow an optimizer update with no zero_grads() in between.
  paths_->invalidate_weights();
  forward(/*save_for_backward=*/false);
  backend_.cross_entropy_forward(act_.logits, act_.targets, act_.losses);
  return read_mean_loss(valid);
}

int LlamaModel::forward_backward_pass(const int32_t* tokens, const int32_t* targets,
                                      float loss_scale) {
  check_holds_gradients("forward_backward");
  const int valid = upload_batch(tokens, targets);
  paths_->set_micro_step(micro_step_++);
  forward(/*save_for_backward=*/true);
  // d(mean loss)/d(loss_i) = 1 / valid, times the caller's scale (e.g. 1 / micro-steps).
  backward(loss_scale / static_cast<float>(valid));
  return valid;
}

void LlamaModel::forward_backward(const int32_t* tokens, const int32_t* targets, float loss_scale,
                                  Tensor& loss_sum) {
  const int valid = forward_backward_pass(tokens, targets, loss_scale);
  backend_.accumulate_mean_loss(act_.losses, valid, loss_sum);
}

float LlamaModel::forward_backward(const int32_t* tokens, const int32_t* targets,
                                   float loss_scale) {
  return read_mean_loss(forward_backward_pass(tokens, targets, loss_scale));
}

void LlamaModel::forward(bool save_for_backward) {
  save_for_backward_ = save_for_backward;
  Backend& be = backend_;
  const auto& P = table_.params;
  const int h = config_.n_heads, hkv = config_.n_kv_heads;
  paths_->prepare_weights();  // the quantized weights of every unit, before the first GEMM
  be.embedding_forward(act_.tokens, P[table_.embedding].weight, act_.residual[0]);
  // Each residual add runs with the RMSNorm after it, and the forward of the first projection
  // reading the norm's output (residual_rmsnorm_forward: q's or gate's); the final norm, which
  // the lm_head reads, runs after the last layer.
  if (config_.n_layers == 0) {
    be.rmsnorm_forward(act_.residual[0], P[table_.final_norm].weight, config_.norm_eps,
                       act_.xn_final, act_.rstd_final);
  }
  for (int l = 0; l < config_.n_layers; ++l) {
    const LayerParamIndex& idx = table_.layers[l];
    LayerActivations& a = act_.layers[l];
    Tensor& x = act_.residual[l];
    // attention block: the input norm (xn_attn) of the embedding's output, or of the previous
    // layer's residual add (its down projection's output, in d_att), and q from it
    if (l == 0) {
      be.rmsnorm_forward(x, P[idx.input_norm].weight, config_.norm_eps, a.xn_attn, a.rstd_attn);
      project_forward(unit(l, ProjectionKind::Q), a.xn_attn, a.q);
    } else {
      paths_->residual_rmsnorm_forward(unit(l, ProjectionKind::Q), act_.layers[l - 1].h,
                                       scratch_.d_att, x, P[idx.input_norm].weight,
                                       config_.norm_eps, a.xn_attn, a.rstd_attn, a.q,
                                       save_for_backward_);
    }
    project_forward(unit(l, ProjectionKind::K), a.xn_attn, a.k);
    project_forward(unit(l, ProjectionKind::V), a.xn_attn, a.v);
    Tensor q4 = heads_view(a.q, h), k4 = heads_view(a.k, hkv), v4 = heads_view(a.v, hkv);
    Tensor att4 = heads_view(a.att, h);
    // RoPE on q and k, then attention (q and k are workspace: rope_attention_forward).
    be.rope_attention_forward(q4, k4, v4, act_.rope_cos, act_.rope_sin, att4, *a.attention);
    // o_proj output goes to d_att as scratch before the residual add
    project_forward(unit(l, ProjectionKind::O), a.att, scratch_.d_att);
    // MLP block: the residual add, its norm (xn_mlp) and gate from it
    paths_->residual_rmsnorm_forward(unit(l, ProjectionKind::Gate), x, scratch_.d_att, a.h,
                                     P[idx.post_norm].weight, config_.norm_eps, a.xn_mlp,
                                     a.rstd_mlp, a.gate, save_for_backward_);
    project_forward(unit(l, ProjectionKind::Up), a.xn_mlp, a.up);
    paths_->swiglu_forward(unit(l, ProjectionKind::Down), a.gate, a.up, a.act, scratch_.d_att,
                           save_for_backward_);
  }
  if (config_.n_layers > 0) {  // the last residual add and the final norm
    const int last = config_.n_layers - 1;
    be.residual_rmsnorm_forward(act_.layers[last].h, scratch_.d_att, act_.residual[last + 1],
                                P[table_.final_norm].weight, config_.norm_eps, act_.xn_final,
                                act_.rstd_final);
  }
  paths_->lm_head_forward(act_.xn_final, act_.logits, save_for_backward);
}

void LlamaModel::backward(float dloss) {
  Backend& be = backend_;
  auto& P = table_.params;
  const int h = config_.n_heads, hkv = config_.n_kv_heads;
  GradientScratch& s = scratch_;
  const int L = config_.n_layers;
  // the loss and its gradient, and the lm_head's backward from it
  paths_->lm_head_loss_backward(act_.logits, act_.targets, act_.losses, dloss, s.d_normed);
  be.fill_zero(s.d_residual);
  // Each group of parameters is reported ready (params_ready) after the op that last writes its
  // gradients; the table lays out the final norm then lm_head, and each layer's nine tensors,
  // contiguously (build_param_table). Each RMSNorm's backward runs with the backward of the
  // projection whose output the residual add before it took (rmsnorm_backward: down's after the
  // final norm and each layer's input norm, o's after its post-attention norm); the first layer's
  // input norm, after the embedding, runs alone.
  if (L == 0) {
    be.rmsnorm_backward(act_.residual[0], P[table_.final_norm].weight, act_.rstd_final, s.d_normed,
                        s.d_residual, P[table_.final_norm].grad);
    params_ready(table_.final_norm, table_.lm_head);
  }
  for (int l = L - 1; l >= 0; --l) {
    const LayerParamIndex& idx = table_.layers[l];
    LayerActivations& a = act_.layers[l];
    // MLP block: residual[l+1] = h + down(swiglu(gate(xn), up(xn))), xn = norm(h). The norm
    // reading residual[l+1] (the final norm, or the next layer's input norm), then down's
    // backward from the residual gradient.
    const bool last = l == L - 1;
    ParamInfo& norm_after = P[last ? table_.final_norm : table_.layers[l + 1].input_norm];
    paths_->rmsnorm_backward(unit(l, ProjectionKind::Down), act_.residual[l + 1], norm_after.weight,
                             last ? act_.rstd_final : act_.layers[l + 1].rstd_attn, s.d_normed,
                             s.d_residual, norm_after.grad, s.d_act, false);
    if (last) {
      params_ready(table_.final_norm, table_.lm_head);
    } else {
      params_ready(table_.layers[l + 1].proj[0], table_.layers[l + 1].post_norm);
    }
    paths_->swiglu_backward(unit(l, ProjectionKind::Gate), unit(l, ProjectionKind::Up), a.gate,
                            a.up, s.d_act, s.d_gate, s.d_up, s.d_normed);
    // attention block: h = x + o(attention(rope(q(xn)), rope(k(xn)), v(xn))), xn = norm(x); the
    // post-attention norm, then o's backward
    paths_->rmsnorm_backward(unit(l, ProjectionKind::O), a.h, P[idx.post_norm].weight, a.rstd_mlp,
                             s.d_normed, s.d_residual, P[idx.post_norm].grad, s.d_att, false);
    Tensor q4 = heads_view(a.q, h), k4 = heads_view(a.k, hkv), v4 = heads_view(a.v, hkv);
    Tensor dq4 = heads_view(s.dq, h), dk4 = heads_view(s.dk, hkv), dv4 = heads_view(s.dv, hkv);
    be.attention_backward(q4, k4, v4, *a.attention, heads_view(s.d_att, h), dq4, dk4, dv4);
    paths_->rope_backward(unit(l, ProjectionKind::Q), dq4, act_.rope_cos, act_.rope_sin, s.d_normed,
                          false);
    paths_->rope_backward(unit(l, ProjectionKind::K), dk4, act_.rope_cos, act_.rope_sin, s.d_normed,
                          true);
    project_backward(unit(l, ProjectionKind::V), s.dv, s.d_normed, true);
  }
  if (L > 0) {  // the first layer's input norm
    const LayerParamIndex& first = table_.layers[0];
    be.rmsnorm_backward(act_.residual[0], P[first.input_norm].weight, act_.layers[0].rstd_attn,
                        s.d_normed, s.d_residual, P[first.input_norm].grad);
    params_ready(first.proj[0], first.post_norm);
  }
  be.embedding_backward(act_.tokens, s.d_residual, P[table_.embedding].grad);
  params_ready(table_.embedding, table_.embedding);
}

}  // namespace gnmr
