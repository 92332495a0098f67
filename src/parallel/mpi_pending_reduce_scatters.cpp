#include "parallel/mpi_pending_reduce_scatters.h"

#include <algorithm>

#include "parallel/mpi_check.h"
#include "parallel/shard_ranges.h"
#include "util/error.h"

namespace gnmr {

namespace {

const char* const kHint =
    "every rank must start the same gradient buckets in the same order; a rank that failed "
    "or skipped one leaves the others mismatched";

constexpr size_t kNowhere = size_t(-1);
constexpr size_t kMaxRingElements = size_t{1} << 24;

}  // namespace

MpiPendingReduceScatters::MpiPendingReduceScatters(MPI_Comm comm, size_t max_elements_per_call)
    : max_elements_per_call_(max_elements_per_call),
      ring_capacity_(std::min(kMaxRingElements, 8 * max_elements_per_call)) {
  GNMR_MPI_CHECK(MPI_Comm_dup(comm, &comm_), "");
  GNMR_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "");
  GNMR_MPI_CHECK(MPI_Comm_rank(comm_, &rank_), "");
  GNMR_MPI_CHECK(MPI_Comm_size(comm_, &world_size_), "");
}

// As ~MpiPendingSums: no MPI call after MPI_Finalize; reductions still pending (an error unwound
// the step) are left to MPI_Comm_free.
MpiPendingReduceScatters::~MpiPendingReduceScatters() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiPendingReduceScatters::start(float* data, size_t shard, size_t begin, size_t end) {
  const size_t world = size_t(world_size_);
  if (shard == 0 || begin >= end) return;
  if (pending_.empty()) {
    // Never more ring than one copy of every rank's whole shard.
    scratch_.resize(std::min(ring_capacity_, world * shard));
    ring_head_ = 0;
  }
  // Every rank cuts the same pieces (none depends on the rank): at most one call's elements,
  // and few enough that the world's copies of this rank's part fit the ring.
  const size_t piece =
      std::max<size_t>(1, std::min(max_elements_per_call_, scratch_.size() / world));
  for (size_t first = begin; first < end; first += piece) {
    start_piece(data, shard, first, std::min(end, first + piece));
  }
}

size_t MpiPendingReduceScatters::ring_place(size_t count) const {
  if (count == 0) return 0;
  if (count > scratch_.size()) return kNowhere;
  const Pending* oldest = nullptr;
  for (const Pending& p : pending_) {
    if (p.own_count > 0) {
      oldest = &p;
      break;
    }
  }
  if (oldest == nullptr) return 0;  // the ring is empty
  const size_t tail = oldest->scratch_at;
  if (ring_head_ > tail) {  // in use: [tail, head); free: [head, end) and [0, tail)
    if (scratch_.size() - ring_head_ >= count) return ring_head_;
    return tail >= count ? 0 : kNowhere;
  }
  // Wrapped: in use [tail, end) and [0, head); free [head, tail).
  return tail - ring_head_ >= count ? ring_head_ : kNowhere;
}

void MpiPendingReduceScatters::start_piece(float* data, size_t shard, size_t begin, size_t end) {
  const size_t world = size_t(world_size_);
  const size_t own_begin = std::max(begin, size_t(rank_) * shard);
  const size_t own_end = std::min(end, size_t(rank_ + 1) * shard);
  const size_t own_count = own_end > own_begin ? own_end - own_begin : 0;
  size_t at = ring_place(world * own_count);
  while (at == kNowhere) {
    GNMR_CHECK(!pending_.empty(), "reduce-scatter piece larger than its scratch ring");
    finish_oldest(/*wait=*/true);
    at = ring_place(world * own_count);
  }
  // A deque element stays where it is while later pieces are added: MPI reads q.counts and
  // writes q.request until the call completes.
  pending_.push_back(
      Pending{data + own_begin, own_count, at, MPI_REQUEST_NULL, std::vector<int>(4 * world, 0)});
  Pending& q = pending_.back();
  int* send_counts = q.counts.data();
  int* send_displacements = send_counts + world;
  int* receive_counts = send_displacements + world;
  int* receive_displacements = receive_counts + world;
  for (const ShardRange& piece :
       shard_ranges_of(int64_t(shard), world_size_, int64_t(begin), int64_t(end))) {
    send_counts[piece.owner] = int(piece.count());
    send_displacements[piece.owner] = int(piece.begin - int64_t(begin));
  }
  for (size_t r = 0; r < world; ++r) {
    receive_counts[r] = int(own_count);
    receive_displacements[r] = int(r * own_count);
  }
  GNMR_MPI_CHECK(
      MPI_Ialltoallv(data + begin, send_counts, send_displacements, MPI_FLOAT, scratch_.data() + at,
                     receive_counts, receive_displacements, MPI_FLOAT, comm_, &q.request),
      kHint);
  if (own_count > 0) ring_head_ = at + world * own_count;
}

void MpiPendingReduceScatters::finish_oldest(bool wait) {
  Pending& p = pending_.front();
  if (wait) {
    GNMR_MPI_CHECK(MPI_Wait(&p.request, MPI_STATUS_IGNORE), kHint);
  } else {
    int done = 0;
    GNMR_MPI_CHECK(MPI_Test(&p.request, &done, MPI_STATUS_IGNORE), kHint);
    if (!done) return;
  }
  // Rank order, as MpiCommunicator::reduce_scatter_sum adds.
  const float* copies = scratch_.data() + p.scratch_at;
  for (size_t i = 0; i < p.own_count; ++i) {
    float sum = copies[i];
    for (size_t r = 1; r < size_t(world_size_); ++r) sum += copies[r * p.own_count + i];
    p.own[i] = sum;
  }
  pending_.pop_front();
}

void MpiPendingReduceScatters::progress() {
  while (!pending_.empty()) {
    const size_t before = pending_.size();
    finish_oldest(/*wait=*/false);
    if (pending_.size() == before) return;  // the oldest is still in flight
  }
}

void MpiPendingReduceScatters::wait_all() {
  while (!pending_.empty()) finish_oldest(/*wait=*/true);
}

}  // namespace gnmr
