#include "model/param_table.h"

namespace gnmr {

namespace {

// Each tensor starts on a 64-element (256-byte) boundary of the flat buffers.
constexpr int64_t kAlign = 64;

int add_param(ParamTable& table, std::string name, std::vector<int64_t> shape, int unit) {
  ParamInfo info;
  info.name = std::move(name);
  info.shape = std::move(shape);
  info.unit = unit;
  info.weight_decay = info.shape.size() >= 2;
  info.offset = table.flat_size;
  int64_t numel = 1;
  for (int64_t s : info.shape) numel *= s;
  table.flat_size += (numel + kAlign - 1) / kAlign * kAlign;
  table.params.push_back(std::move(info));
  return static_cast<int>(table.params.size()) - 1;
}

}  // namespace

ParamTable build_param_table(const ModelConfig& c) {
  ParamTable table;
  const int64_t dim = c.dim, ffn = c.ffn_dim, vocab = c.vocab_size;
  const int64_t kv_dim = static_cast<int64_t>(c.n_kv_heads) * c.head_dim();
  table.embedding = add_param(table, "model.embed_tokens.weight", {vocab, dim}, -1);
  // [out, in] per projection kind, in ProjectionKind order q, k, v, o, gate, up, down.
  const std::vector<int64_t> proj_shapes[kKindsPerLayer] = {
      {dim, dim}, {kv_dim, dim}, {kv_dim, dim}, {dim, dim}, {ffn, dim}, {ffn, dim}, {dim, ffn}};
  const char* proj_names[kKindsPerLayer] = {
      "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
      "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  for (int layer = 0; layer < c.n_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    LayerParamIndex index{};
    for (int k = 0; k < kKindsPerLayer; ++k) {
      const ProjectionKind kind = static_cast<ProjectionKind>(k);
      const int id = unit_id(layer, kind);
      index.proj[k] = add_param(table, prefix + proj_names[k] + ".weight", proj_shapes[k], id);
      table.units.push_back(ProjectionUnit{id, layer, kind, index.proj[k]});
    }
    index.input_norm = add_param(table, prefix + "input_layernorm.weight", {dim}, -1);
    index.post_norm = add_param(table, prefix + "post_attention_layernorm.weight", {dim}, -1);
    table.layers.push_back(index);
  }
  table.final_norm = add_param(table, "model.norm.weight", {dim}, -1);
  table.lm_head = add_param(table, "lm_head.weight", {vocab, dim}, -1);
  return table;
}

std::vector<int64_t> param_offsets(const std::vector<ParamInfo>& params) {
  std::vector<int64_t> offsets;
  offsets.reserve(params.size());
  for (const ParamInfo& p : params) offsets.push_back(p.offset);
  return offsets;
}

}  // namespace gnmr
