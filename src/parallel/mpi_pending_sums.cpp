#include "parallel/mpi_pending_sums.h"

#include <algorithm>

#include "parallel/mpi_check.h"

namespace gnmr {

namespace {

const char* const kHint =
    "every rank must start the same gradient buckets in the same order; a rank that failed "
    "or skipped one leaves the others mismatched";

}  // namespace

MpiPendingSums::MpiPendingSums(MPI_Comm comm, size_t max_elements_per_call)
    : max_elements_per_call_(max_elements_per_call) {
  GNMR_MPI_CHECK(MPI_Comm_dup(comm, &reduce_comm_), "");
  GNMR_MPI_CHECK(MPI_Comm_dup(comm, &broadcast_comm_), "");
  GNMR_MPI_CHECK(MPI_Comm_set_errhandler(reduce_comm_, MPI_ERRORS_RETURN), "");
  GNMR_MPI_CHECK(MPI_Comm_set_errhandler(broadcast_comm_, MPI_ERRORS_RETURN), "");
  GNMR_MPI_CHECK(MPI_Comm_rank(comm, &rank_), "");
}

// As ~MpiCommunicator: no MPI call after MPI_Finalize, and no way to report a failure. Sums
// still pending here (an error unwound the step) are left to MPI_Comm_free, which lets them
// finish before the communicator goes.
MpiPendingSums::~MpiPendingSums() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (reduce_comm_ != MPI_COMM_NULL) MPI_Comm_free(&reduce_comm_);
  if (broadcast_comm_ != MPI_COMM_NULL) MPI_Comm_free(&broadcast_comm_);
}

void MpiPendingSums::start(float* data, size_t count) {
  for (size_t first = 0; first < count; first += max_elements_per_call_) {
    Pending p{data + first, int(std::min(max_elements_per_call_, count - first)), Stage::kReducing,
              MPI_REQUEST_NULL};
    if (rank_ == 0) {
      GNMR_MPI_CHECK(MPI_Ireduce(MPI_IN_PLACE, p.data, p.count, MPI_FLOAT, MPI_SUM, 0, reduce_comm_,
                                 &p.request),
                     kHint);
    } else {
      GNMR_MPI_CHECK(
          MPI_Ireduce(p.data, nullptr, p.count, MPI_FLOAT, MPI_SUM, 0, reduce_comm_, &p.request),
          kHint);
    }
    pending_.push_back(p);
  }
}

void MpiPendingSums::start_broadcast(Pending& p) {
  GNMR_MPI_CHECK(MPI_Ibcast(p.data, p.count, MPI_FLOAT, 0, broadcast_comm_, &p.request), kHint);
  p.stage = Stage::kBroadcasting;
}

void MpiPendingSums::progress() {
  // Broadcasts start in start order on every rank (see the header): once a bucket's is still
  // waiting, no later bucket's may start.
  bool earlier_broadcasts_started = true;
  for (Pending& p : pending_) {
    int done = 0;
    if (p.stage == Stage::kReducing) {
      GNMR_MPI_CHECK(MPI_Test(&p.request, &done, MPI_STATUS_IGNORE), kHint);
      if (done) p.stage = Stage::kReduced;
    }
    if (p.stage == Stage::kReduced && earlier_broadcasts_started) start_broadcast(p);
    if (p.stage == Stage::kBroadcasting) {
      GNMR_MPI_CHECK(MPI_Test(&p.request, &done, MPI_STATUS_IGNORE), kHint);
      if (done) p.stage = Stage::kDone;
    }
    if (p.stage == Stage::kReducing || p.stage == Stage::kReduced) {
      earlier_broadcasts_started = false;
    }
  }
  while (!pending_.empty() && pending_.front().stage == Stage::kDone) pending_.pop_front();
}

void MpiPendingSums::wait_all() {
  for (Pending& p : pending_) {
    if (p.stage == Stage::kReducing) {
      GNMR_MPI_CHECK(MPI_Wait(&p.request, MPI_STATUS_IGNORE), kHint);
      p.stage = Stage::kReduced;
    }
    if (p.stage == Stage::kReduced) start_broadcast(p);
  }
  for (Pending& p : pending_) {
    if (p.stage == Stage::kBroadcasting) {
      GNMR_MPI_CHECK(MPI_Wait(&p.request, MPI_STATUS_IGNORE), kHint);
    }
  }
  pending_.clear();
}

}  // namespace gnmr
