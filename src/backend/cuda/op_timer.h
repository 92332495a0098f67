// Device time by op family, for `gnmr bench`'s breakdown of a step (Backend::set_op_timing):
// while on, each op the backend runs lies between two CUDA events on its stream, and
// totals_ms() sums each family's spans once the stream has finished them. Off (the default),
// a scope records nothing. The events time the stream, not the kernels alone: a span includes
// the gaps between the launches inside it, and the gaps between spans are in no family.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

namespace gnmr::cuda {

class OpTimer {
 public:
  explicit OpTimer(cudaStream_t stream) : stream_(stream) {}
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  // On: the totals start again from zero. Off: scopes record nothing.
  void set_enabled(bool on);

  // The span of one op of `family` (a string literal: kept by pointer), from construction to
  // destruction; nothing while the timer is off. Scopes do not nest: each op has one family.
  class Scope {
   public:
    Scope(OpTimer& timer, const char* family);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpTimer* timer_ = nullptr;  // null while the timer is off
    size_t span_ = 0;
  };

  // Waits for the stream, then ms per family over every span since set_enabled(true).
  std::map<std::string, double> totals_ms();

 private:
  struct Span {
    const char* family;
    cudaEvent_t start, stop;
  };
  cudaEvent_t take_event();

  cudaStream_t stream_;
  bool enabled_ = false;
  std::vector<Span> spans_;         // recorded since enabled, in stream order
  std::vector<cudaEvent_t> spare_;  // timed events, reused
};

}  // namespace gnmr::cuda
