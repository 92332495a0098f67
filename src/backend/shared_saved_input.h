// Saved-input sharing (docs/DESIGN.md §6): projections that read the same x (q, k, v; gate,
// up) and save it with the same deterministic group-wise spec keep one copy of its codes. The
// model says who may share (ProjectionShape::shared_saved_specs, saved_input_leader); this is
// the bookkeeping every backend uses to decide, per saving forward, which copy a path keeps
// its codes in and whether they still have to be written. Where the copies live is the
// backend's (cpu/projection.h, cuda/cuda_projection.h).
//
// One copy per shared spec, so any routing is covered: a step where q is on the low path and
// k on recovery writes both copies, one where all three are on the same path writes one. The
// leader (the projection planned first) runs the first saving forward of each new x; the
// first saving forward on a copy's spec after that writes the copy, later ones on the same
// spec find it written and skip the quantization. Sound only because the quantization is
// deterministic (round-to-nearest): the codes are a function of x and the spec alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "precision/quantize_groupwise.h"

namespace gnmr {

// Equal specs quantize equal x to equal codes (stochastic ones only with equal keys).
bool same_groupwise_spec(const GroupwiseSpec& a, const GroupwiseSpec& b);

class SharedSavedInput {
 public:
  // specs: one copy each, as the projections save them (groupwise_spec_for_width applied),
  // distinct and deterministic; Error(Runtime) otherwise.
  explicit SharedSavedInput(std::vector<GroupwiseSpec> specs);

  size_t copies() const { return specs_.size(); }
  const GroupwiseSpec& spec(int copy) const { return specs_.at(static_cast<size_t>(copy)); }
  // The copy that holds codes of `spec`, or -1 when the spec is not shared.
  int copy_of(const GroupwiseSpec& spec) const;

  // A new member (the first to join is the leader); returns its index.
  int join();
  // The saving forward of `member` reading x, whose path keeps its codes in `copy` (-1: in
  // none of these). Returns whether the caller must write the copy now (the first saving
  // forward on it since the leader's). Error(Runtime) when a member other than the leader
  // saves twice without the leader saving in between, or reads another x than the leader.
  bool save(int member, int copy, const void* x);
  // Whether `copy` holds the codes of the x of the last saving forward (the backward's check).
  bool written(int copy) const;

 private:
  std::vector<GroupwiseSpec> specs_;
  std::vector<uint64_t> written_in_;  // per copy: the generation it was written in (0 = never)
  std::vector<uint64_t> saved_in_;    // per member: the generation of its last saving forward
  uint64_t generation_ = 0;           // bumped by each saving forward of the leader
  const void* input_ = nullptr;       // the x of this generation
};

}  // namespace gnmr
