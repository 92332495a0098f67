// Every buffer a LLaMA-2 forward/backward pass touches, allocated once by LlamaModel.
// N = micro_batch * seq_len tokens; views with 4-d head shapes are made where needed.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace gnmr {

// What one decoder layer saves in the forward pass for its backward pass. The projection
// inputs xn_attn, att, xn_mlp and act are the layer's own only when a backward reads them
// (ProjectionPaths::input_kept); otherwise they are views of one per-step buffer shared by
// all layers, valid only during the layer's forward.
struct LayerActivations {
  Tensor xn_attn;    // [N, D]  input_layernorm(x): the input of units q, k, v
  Tensor rstd_attn;  // [N]
  // The layer's own, or one per-step set shared by all layers where the attention state keeps
  // what its backward reads (AttentionState::keeps_inputs).
  Tensor q;  // [N, H * hd]   after rotary
  Tensor k;  // [N, Hkv * hd] after rotary
  Tensor v;  // [N, Hkv * hd]
  // What attention's backward reads beyond q, k, v (Backend::plan_attention); every layer's is
  // the same one in an evaluation model (ModelGradients::kNone, model/llama.h).
  std::shared_ptr<AttentionState> attention;
  Tensor att;       // [N, D]  attention output: the input of unit o
  Tensor h;         // [N, D]  x + o_proj(att)
  Tensor xn_mlp;    // [N, D]  post_attention_layernorm(h): the input of units gate, up
  Tensor rstd_mlp;  // [N]
  Tensor gate;      // [N, F]
  Tensor up;        // [N, F]
  Tensor act;       // [N, F]  silu(gate) * up: the input of unit down
};

struct Activations {
  Tensor tokens;                 // [N] i32
  Tensor targets;                // [N] i32
  std::vector<Tensor> residual;  // L + 1 of [N, D]: residual[l] is layer l's input
  std::vector<LayerActivations> layers;
  Tensor xn_final;            // [N, D] model.norm(residual[L])
  Tensor rstd_final;          // [N]
  Tensor logits;              // [N, V]; overwritten by dlogits in the backward
  Tensor losses;              // [N]
  Tensor rope_cos, rope_sin;  // [max_seq, hd / 2]
};

// Gradient scratch, reused by every layer (gradients of activations do not outlive a layer,
// except d_residual which carries the residual-stream gradient downwards).
struct GradientScratch {
  Tensor d_residual;  // [N, D]
  Tensor d_normed;    // [N, D]  gradient at a norm output (q/k/v or gate/up or lm_head input)
  Tensor d_att;       // [N, D]
  Tensor dq;          // [N, H * hd]
  Tensor dk, dv;      // [N, Hkv * hd]
  Tensor d_gate, d_up, d_act;  // [N, F]
};

}  // namespace gnmr
