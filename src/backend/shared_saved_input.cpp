// Saved-input sharing bookkeeping (shared_saved_input.h).
#include "backend/shared_saved_input.h"

#include <string>
#include <utility>

#include "util/error.h"

namespace gnmr {

bool same_groupwise_spec(const GroupwiseSpec& a, const GroupwiseSpec& b) {
  return a.bits == b.bits && a.group_size == b.group_size && a.stochastic == b.stochastic;
}

SharedSavedInput::SharedSavedInput(std::vector<GroupwiseSpec> specs) : specs_(std::move(specs)) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    GNMR_CHECK(!specs_[i].stochastic,
               "shared saved input: a stochastic spec cannot be shared (each unit's codes "
               "depend on its own RNG key)");
    for (size_t j = 0; j < i; ++j) {
      GNMR_CHECK(
          !same_groupwise_spec(specs_[i], specs_[j]),
          "shared saved input: spec " + std::to_string(i) + " repeats spec " + std::to_string(j));
    }
  }
  written_in_.assign(specs_.size(), 0);
}

int SharedSavedInput::copy_of(const GroupwiseSpec& spec) const {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (same_groupwise_spec(specs_[i], spec)) return static_cast<int>(i);
  }
  return -1;
}

int SharedSavedInput::join() {
  saved_in_.push_back(0);
  return static_cast<int>(saved_in_.size()) - 1;
}

bool SharedSavedInput::save(int member, int copy, const void* x) {
  GNMR_CHECK(member >= 0 && static_cast<size_t>(member) < saved_in_.size(),
             "shared saved input: unknown member " + std::to_string(member));
  if (member == 0) {
    ++generation_;
    input_ = x;
  } else {
    GNMR_CHECK(saved_in_[static_cast<size_t>(member)] != generation_ && generation_ > 0,
               "shared saved input: member " + std::to_string(member) +
                   " saved before the leader saved its new input");
    GNMR_CHECK(x == input_, "shared saved input: member " + std::to_string(member) +
                                " reads another x than its leader");
  }
  saved_in_[static_cast<size_t>(member)] = generation_;
  if (copy < 0) return false;
  uint64_t& written = written_in_.at(static_cast<size_t>(copy));
  if (written == generation_) return false;
  written = generation_;
  return true;
}

bool SharedSavedInput::written(int copy) const {
  return generation_ > 0 && written_in_.at(static_cast<size_t>(copy)) == generation_;
}

}  // namespace gnmr
