// ProjectionPaths: the per-unit low / recovery switch (docs/DESIGN.md §2 step 2, §4).
// Shapes: x: [N, in]; W: [out, in]; y, dy: [N, out]; dx: [N, in]; N = tokens.
#include "model/projection_paths.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "backend/shared_saved_input.h"
#include "util/error.h"

namespace gnmr {

ProjectionPaths::ProjectionPaths(const PrecisionRecipe& recipe, Backend& backend,
                                 const ParamTable& table, int64_t tokens, SavedInputSharing sharing)
    : recipe_(recipe), backend_(backend), table_(table), tokens_(tokens) {
  plan_.path.assign(table_.units.size(), Path::Low);
  plan_sharing(sharing);
  for (const ProjectionUnit& u : table_.units) {
    const ParamInfo& p = table_.params[static_cast<size_t>(u.param_index)];
    ProjectionShape shape{tokens, p.shape[1], p.shape[0]};
    const int leader = input_leader(u.id);
    if (leader >= 0) shape.input_leader = states_[static_cast<size_t>(leader)].get();
    shape.input_read_elsewhere = u.kind == ProjectionKind::O;  // attention's out
    const int group = shared_group_[static_cast<size_t>(u.id)];
    if (group >= 0) {
      const int leader = shared_leader_[static_cast<size_t>(group)];
      shape.shared_saved_specs = shared_specs_[static_cast<size_t>(group)];
      if (leader != u.id) shape.saved_input_leader = states_[static_cast<size_t>(leader)].get();
    }
    states_.push_back(backend_.plan_projection(p.name, shape, recipe_.low, recipe_.recovery));
  }
  const ParamInfo& head = table_.params[static_cast<size_t>(table_.lm_head)];
  ProjectionShape head_shape{tokens, head.shape[1], head.shape[0]};
  head_shape.backward_may_overwrite_dy = true;  // dlogits [N, V] is dead after the backward
  head_shape.input_read_elsewhere = true;       // xn_final, kept for the lm_head always
  lm_head_state_ = backend_.plan_projection(head.name, head_shape, lm_head_path_, lm_head_path_);
  for (const std::unique_ptr<ProjectionState>& state : states_) {
    stats_.planned_saved_activation_bytes += state->planned_saved_bytes();
  }
  const int n_layers = static_cast<int>(table_.layers.size());
  for (int l = 0; l < n_layers; ++l) {
    for (int i = 0; i < kInputsPerLayer; ++i) {
      const UnitInput input = static_cast<UnitInput>(i);
      if (!input_kept(l, input)) continue;
      stats_.planned_saved_activation_bytes +=
          static_cast<size_t>(tokens_ * input_width(l, input)) * sizeof(float);
    }
  }
  recompute_stats();
}

UnitInput unit_input(ProjectionKind kind) {
  switch (kind) {
    case ProjectionKind::Q:
    case ProjectionKind::K:
    case ProjectionKind::V:
      return UnitInput::kAttentionNorm;
    case ProjectionKind::O:
      return UnitInput::kAttentionOut;
    case ProjectionKind::Gate:
    case ProjectionKind::Up:
      return UnitInput::kMlpNorm;
    case ProjectionKind::Down:
      return UnitInput::kSwigluOut;
  }
  return UnitInput::kAttentionNorm;
}

bool ProjectionPaths::input_kept(int layer, UnitInput input) const {
  for (const ProjectionUnit& u : table_.units) {
    if (u.layer != layer || unit_input(u.kind) != input) continue;
    const ProjectionState& state = *states_[static_cast<size_t>(u.id)];
    if (state.reads_forward_input(recipe_.low) || state.reads_forward_input(recipe_.recovery)) {
      return true;
    }
  }
  return false;
}

int ProjectionPaths::input_leader(int id) const {
  const ProjectionUnit& unit = table_.units.at(static_cast<size_t>(id));
  for (const ProjectionUnit& u : table_.units) {
    if (u.layer == unit.layer && unit_input(u.kind) == unit_input(unit.kind)) {
      return u.id == id ? -1 : u.id;
    }
  }
  return -1;
}

int64_t ProjectionPaths::input_width(int layer, UnitInput input) const {
  for (const ProjectionUnit& u : table_.units) {
    if (u.layer == layer && unit_input(u.kind) == input) {
      return table_.params[static_cast<size_t>(u.param_index)].shape[1];
    }
  }
  return 0;
}

ProjectionPaths::~ProjectionPaths() = default;

void ProjectionPaths::plan_sharing(SavedInputSharing sharing) {
  shared_group_.assign(table_.units.size(), -1);
  if (sharing == SavedInputSharing::kPerUnit) return;
  // The paths a unit can take; a spec is shared when it is deterministic (round-to-nearest:
  // the codes are a function of x and the spec alone).
  std::vector<const PathSpec*> paths = {&recipe_.recovery};
  if (recipe_.has_low_path) paths.insert(paths.begin(), &recipe_.low);
  const int n_layers = static_cast<int>(table_.layers.size());
  for (int l = 0; l < n_layers; ++l) {
    for (int i = 0; i < kInputsPerLayer; ++i) {
      const UnitInput input = static_cast<UnitInput>(i);
      std::vector<int> members;  // in unit order, which is the forward's order
      for (const ProjectionUnit& u : table_.units) {
        if (u.layer == l && unit_input(u.kind) == input) members.push_back(u.id);
      }
      if (members.size() < 2) continue;
      const int64_t cols = input_width(l, input);
      std::vector<GroupwiseSpec> specs;
      for (const PathSpec* path : paths) {
        if (path->kind != PathKind::kSavedIntGroupwise || path->saved.stochastic) continue;
        const GroupwiseSpec spec = groupwise_spec_for_width(path->saved, cols);
        const bool listed = std::any_of(specs.begin(), specs.end(), [&](const GroupwiseSpec& s) {
          return same_groupwise_spec(s, spec);
        });
        if (!listed) specs.push_back(spec);
      }
      if (specs.empty()) continue;
      const int group = static_cast<int>(shared_specs_.size());
      shared_specs_.push_back(specs);
      shared_leader_.push_back(members.front());
      for (int id : members) shared_group_[static_cast<size_t>(id)] = group;
    }
  }
}

int ProjectionPaths::shared_copy(int id) const {
  const int group = shared_group_[static_cast<size_t>(id)];
  const PathSpec& path = path_of(id);
  if (group < 0 || path.kind != PathKind::kSavedIntGroupwise) return -1;
  const ProjectionUnit& u = table_.units[static_cast<size_t>(id)];
  const int64_t cols = table_.params[static_cast<size_t>(u.param_index)].shape[1];
  const GroupwiseSpec spec = groupwise_spec_for_width(path.saved, cols);
  const std::vector<GroupwiseSpec>& specs = shared_specs_[static_cast<size_t>(group)];
  for (size_t i = 0; i < specs.size(); ++i) {
    if (same_groupwise_spec(specs[i], spec)) return static_cast<int>(i);
  }
  return -1;
}

const PathSpec& ProjectionPaths::path_of(int id) const {
  if (!recipe_.has_low_path) return recipe_.recovery;
  return plan_.path[static_cast<size_t>(id)] == Path::Low ? recipe_.low : recipe_.recovery;
}

void ProjectionPaths::set_routing(const RoutingPlan& plan) {
  if (plan.path.size() != plan_.path.size()) {
    throw Error(ErrorKind::Runtime, "routing plan has " + std::to_string(plan.path.size()) +
                                        " paths, the model has " +
                                        std::to_string(plan_.path.size()) + " projection units");
  }
  std::copy(plan.path.begin(), plan.path.end(), plan_.path.begin());
  recompute_stats();
}

void ProjectionPaths::recompute_stats() {
  const size_t n_units = table_.units.size();
  stats_.units_low = 0;
  stats_.units_recovery = 0;
  stats_.saved_activation_bytes = 0;
  stats_.saved_bytes_per_unit.assign(n_units, 0);
  // Per layer activation: whether a unit's current path reads the fp32 input, and its width.
  std::vector<bool> input_read(table_.layers.size() * kInputsPerLayer, false);
  std::vector<int64_t> input_cols(input_read.size(), 0);
  std::set<std::pair<size_t, int>> group_copies_counted;  // (input, ProjectionState::group_copy)
  // Per sharing group and copy: whether its bytes are counted already.
  std::vector<std::vector<bool>> copy_counted;
  for (const std::vector<GroupwiseSpec>& specs : shared_specs_) {
    copy_counted.emplace_back(specs.size(), false);
  }
  for (const ProjectionUnit& u : table_.units) {
    const bool low = recipe_.has_low_path && plan_.path[u.id] == Path::Low;
    (low ? stats_.units_low : stats_.units_recovery) += 1;
    const PathSpec& path = path_of(u.id);
    const ProjectionState& state = *states_[static_cast<size_t>(u.id)];
    const int64_t cols = table_.params[static_cast<size_t>(u.param_index)].shape[1];
    const size_t own = state.saved_bytes(path);
    const bool reads_input = state.reads_forward_input(path);
    stats_.saved_bytes_per_unit[u.id] =
        own + (reads_input ? static_cast<size_t>(tokens_ * cols) * sizeof(float) : 0);
    const int copy = shared_copy(u.id);
    const size_t input =
        static_cast<size_t>(u.layer * kInputsPerLayer) + static_cast<size_t>(unit_input(u.kind));
    const int group_copy = state.group_copy(path);
    if (group_copy >= 0) {
      if (group_copies_counted.insert({input, group_copy}).second) {
        stats_.saved_activation_bytes += own;
      }
    } else if (copy < 0) {
      stats_.saved_activation_bytes += own;
    } else {
      std::vector<bool>& counted =
          copy_counted[static_cast<size_t>(shared_group_[static_cast<size_t>(u.id)])];
      if (!counted[static_cast<size_t>(copy)]) stats_.saved_activation_bytes += own;
      counted[static_cast<size_t>(copy)] = true;
    }
    input_read[input] = input_read[input] || reads_input;
    input_cols[input] = cols;
  }
  for (size_t i = 0; i < input_read.size(); ++i) {
    if (input_read[i]) {
      stats_.saved_activation_bytes += static_cast<size_t>(tokens_ * input_cols[i]) * sizeof(float);
    }
  }
}

RngKey ProjectionPaths::rounding_key(const ProjectionUnit& u) const {
  const uint32_t n_units = static_cast<uint32_t>(table_.units.size());
  return RngKey{recipe_.seed, static_cast<uint32_t>(step_),
                static_cast<uint32_t>(u.id) + n_units * static_cast<uint32_t>(micro_step_)};
}

void ProjectionPaths::prepare_weights() {
  std::vector<ProjectionWeight> weights;
  weights.reserve(states_.size());
  for (const ProjectionUnit& u : table_.units) {
    weights.push_back({*states_[static_cast<size_t>(u.id)], path_of(u.id),
                       table_.params[static_cast<size_t>(u.param_index)].weight});
  }
  backend_.prepare_projection_weights(weights);
}

void ProjectionPaths::forward(const ProjectionUnit& u, const Tensor& x, Tensor& y,
                              bool save_for_backward) {
  // Each unit saves x at its own path's precision; units of one input on the same
  // deterministic spec share one copy (plan_sharing), written by the first of them.
  backend_.projection_forward(*states_[static_cast<size_t>(u.id)], path_of(u.id),
                              table_.params[static_cast<size_t>(u.param_index)].weight, x, y,
                              save_for_backward, rounding_key(u));
}

void ProjectionPaths::residual_rmsnorm_forward(const ProjectionUnit& first_unit, const Tensor& a,
                                               const Tensor& b, Tensor& sum,
                                               const Tensor& norm_weight, float eps, Tensor& out,
                                               Tensor& rstd, Tensor& y, bool save_for_backward) {
  const RngKey key = rounding_key(first_unit);
  backend_.residual_rmsnorm_projection_forward(
      a, b, sum, norm_weight, eps, out, rstd,
      {*states_[static_cast<size_t>(first_unit.id)], path_of(first_unit.id),
       table_.params[static_cast<size_t>(first_unit.param_index)].weight, key},
      y, save_for_backward);
}

void ProjectionPaths::swiglu_forward(const ProjectionUnit& down_unit, const Tensor& gate,
                                     const Tensor& up, Tensor& out, Tensor& y,
                                     bool save_for_backward) {
  const RngKey key = rounding_key(down_unit);
  backend_.swiglu_projection_forward(
      gate, up, out,
      {*states_[static_cast<size_t>(down_unit.id)], path_of(down_unit.id),
       table_.params[static_cast<size_t>(down_unit.param_index)].weight, key},
      y, save_for_backward);
}

void ProjectionPaths::backward(const ProjectionUnit& u, Tensor& dy, Tensor& dx,
                               bool accumulate_dx) {
  ParamInfo& p = table_.params[static_cast<size_t>(u.param_index)];
  backend_.projection_backward(*states_[static_cast<size_t>(u.id)], path_of(u.id), p.weight, dy, dx,
                               accumulate_dx, p.grad);
}

void ProjectionPaths::rope_backward(const ProjectionUnit& u, Tensor& dy, const Tensor& cos,
                                    const Tensor& sin, Tensor& dx, bool accumulate_dx) {
  ParamInfo& p = table_.params[static_cast<size_t>(u.param_index)];
  backend_.rope_projection_backward(
      dy, cos, sin, {*states_[static_cast<size_t>(u.id)], path_of(u.id), p.weight, p.grad}, dx,
      accumulate_dx);
}

void ProjectionPaths::rmsnorm_backward(const ProjectionUnit& u, const Tensor& x,
                                       const Tensor& norm_weight, const Tensor& rstd,
                                       const Tensor& dout, Tensor& dx, Tensor& dweight,
                                       Tensor& d_in, bool accumulate_dx) {
  ParamInfo& p = table_.params[static_cast<size_t>(u.param_index)];
  backend_.rmsnorm_projection_backward(
      x, norm_weight, rstd, dout, dx, dweight,
      {*states_[static_cast<size_t>(u.id)], path_of(u.id), p.weight, p.grad}, d_in, accumulate_dx);
}

void ProjectionPaths::swiglu_backward(const ProjectionUnit& gate_unit,
                                      const ProjectionUnit& up_unit, const Tensor& gate,
                                      const Tensor& up, const Tensor& dout, Tensor& dgate,
                                      Tensor& dup, Tensor& dx) {
  ParamInfo& g = table_.params[static_cast<size_t>(gate_unit.param_index)];
  ParamInfo& u = table_.params[static_cast<size_t>(up_unit.param_index)];
  backend_.swiglu_projections_backward(
      gate, up, dout, dgate, dup,
      {*states_[static_cast<size_t>(gate_unit.id)], path_of(gate_unit.id), g.weight, g.grad},
      {*states_[static_cast<size_t>(up_unit.id)], path_of(up_unit.id), u.weight, u.grad}, dx);
}

void ProjectionPaths::lm_head_forward(const Tensor& x, Tensor& logits, bool save_for_backward) {
  backend_.projection_forward(*lm_head_state_, lm_head_path_,
                              table_.params[static_cast<size_t>(table_.lm_head)].weight, x, logits,
                              save_for_backward, RngKey{});
}

void ProjectionPaths::lm_head_loss_backward(Tensor& logits, const Tensor& targets, Tensor& losses,
                                            float dloss, Tensor& dx) {
  ParamInfo& p = table_.params[static_cast<size_t>(table_.lm_head)];
  backend_.cross_entropy_projection_backward(
      logits, targets, losses, dloss, {*lm_head_state_, lm_head_path_, p.weight, p.grad}, dx);
}

}  // namespace gnmr
