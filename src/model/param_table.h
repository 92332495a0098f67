// The parameter table of a LLaMA-2 model: Hugging Face names, shapes, projection units,
// weight-decay flags and each tensor's place in the flat weight / gradient buffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "controller/units.h"

namespace gnmr {

struct ParamInfo {
  // HF LlamaForCausalLM name: model.embed_tokens.weight,
  // model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
  // model.layers.{i}.mlp.{gate,up,down}_proj.weight,
  // model.layers.{i}.{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight
  std::string name;
  std::vector<int64_t> shape;  // [out, in] for matrices, as HF stores them
  Tensor weight;               // fp32 master weight (a view into LlamaModel::flat_weights())
  Tensor grad;                 // fp32 gradient (a view into LlamaModel::flat_grads())
  int unit = -1;               // projection unit id (layer * 7 + kind) or -1
  // Decay the matrices (projections, embedding, lm_head), not the norm gains: the nanoGPT /
  // llm.c convention "every parameter with >= 2 dims".
  bool weight_decay = false;
  int64_t offset = 0;  // elements into the flat buffers (64-element aligned)
};

struct ProjectionUnit {
  int id;  // layer * 7 + kind (gnmr/units.h)
  int layer;
  ProjectionKind kind;
  int param_index;  // into params()
};

// Where each parameter of a layer sits in the table.
struct LayerParamIndex {
  int input_norm, post_norm;
  int proj[kKindsPerLayer];  // by ProjectionKind
};

struct ParamTable {
  std::vector<ParamInfo> params;  // weight/grad left empty; the model fills them
  std::vector<ProjectionUnit> units;
  std::vector<LayerParamIndex> layers;
  int embedding = -1, final_norm = -1, lm_head = -1;
  int64_t flat_size = 0;  // elements in the flat buffers, padding included
};

// In Hugging Face state_dict order.
ParamTable build_param_table(const ModelConfig& config);

// Where each parameter starts in the flat buffers, in table order (what a gradient bucket plan
// is cut from: parallel/gradient_buckets.h).
std::vector<int64_t> param_offsets(const std::vector<ParamInfo>& params);

}  // namespace gnmr
