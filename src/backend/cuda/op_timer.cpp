// The op timer (op_timer.h).
#include "backend/cuda/op_timer.h"

#include "kernels/cuda_check.cuh"

namespace gnmr::cuda {

// Destroy calls have nothing actionable to report from a destructor.
OpTimer::~OpTimer() {
  for (const Span& s : spans_) {
    cudaEventDestroy(s.start);
    cudaEventDestroy(s.stop);
  }
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

void OpTimer::set_enabled(bool on) {
  for (const Span& s : spans_) {
    spare_.push_back(s.start);
    spare_.push_back(s.stop);
  }
  spans_.clear();
  enabled_ = on;
}

cudaEvent_t OpTimer::take_event() {
  if (spare_.empty()) {
    cudaEvent_t e = nullptr;
    GNMR_CUDA_CHECK(cudaEventCreate(&e));  // with timing
    return e;
  }
  cudaEvent_t e = spare_.back();
  spare_.pop_back();
  return e;
}

OpTimer::Scope::Scope(OpTimer& timer, const char* family) {
  if (!timer.enabled_) return;
  Span span{family, timer.take_event(), nullptr};
  span.stop = timer.take_event();
  timer.spans_.push_back(span);  // owned by the timer from here, whatever fails next
  GNMR_CUDA_CHECK(cudaEventRecord(span.start, timer.stream_));
  timer_ = &timer;
  span_ = timer.spans_.size() - 1;
}

// A failed record here leaves the span unrecorded: totals_ms() reports it then.
OpTimer::Scope::~Scope() {
  if (timer_ != nullptr) cudaEventRecord(timer_->spans_[span_].stop, timer_->stream_);
}

std::map<std::string, double> OpTimer::totals_ms() {
  GNMR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::map<std::string, double> totals;
  for (const Span& s : spans_) {
    float ms = 0.0f;
    GNMR_CUDA_CHECK(cudaEventElapsedTime(&ms, s.start, s.stop));
    totals[s.family] += double(ms);
  }
  return totals;
}

}  // namespace gnmr::cuda
