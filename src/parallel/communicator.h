// Communicator: the data-parallel seam (docs/DESIGN.md §7). The trainer sums gradients and loss
// totals across ranks through it and never sees MPI or NCCL.
//
// Implementations: `local` (one process, every call a no-op) in local_communicator.h,
// `mpi` (CPU ranks) in mpi_communicator.h, `nccl` (GPU ranks, device tensors on the CUDA
// backend's stream) in nccl_communicator.h.
//
// Every call is a collective: all ranks must make the same calls in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace gnmr {

struct LaunchEnv;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;  // "local" | "mpi" | "nccl"

  virtual int rank() const = 0;        // 0 .. world_size() - 1
  virtual int world_size() const = 0;  // number of data-parallel ranks
  virtual int local_rank() const = 0;  // rank among the processes on this node (GPU index)

  // tensor = sum over ranks of tensor, in place. F32 (gradients) or F64 (the trainer's loss
  // sum in backend memory: the same sum as allreduce_sum(double*) below). The result is
  // bit-identical on every rank (replicated weights must never drift apart); how each
  // implementation guarantees that is written next to it. The memory must be what the
  // implementation can read: host memory for mpi (pair it with the cpu backend), device memory for
  // nccl. It may return before the sum is done (nccl queues it on the backend's stream, ahead of
  // the ops that read it); see wait_for_collectives.
  virtual void allreduce_sum(Tensor& tensor) = 0;
  // values[0..count) = sum over ranks, in place, host doubles (loss sums, token counts).
  // Bit-identical on every rank, as above.
  virtual void allreduce_sum(double* values, size_t count) = 0;
  // Overlapped gradient reduction (docs/DESIGN.md §7): start_allreduce_sum begins the sum of
  // an F32 tensor and may return before it is done; the tensor must not be read or written
  // until wait_all() has returned. Every rank starts the same slices in the same order.
  // The result is bit-identical on every rank, like allreduce_sum. progress() lets a
  // library without its own progress thread move pending sums forward; call it now and then
  // (the trainer calls it whenever backward finishes a layer). The default is
  // allreduce_sum itself (local: a no-op), so nothing is left for wait_all.
  virtual void start_allreduce_sum(Tensor tensor) { allreduce_sum(tensor); }
  virtual void progress() {}
  virtual void wait_all() {}
  // How long the backend waited at the last wait_all() for overlapped reductions still running
  // (ms, >= 0), measured on the device where the wait is the device's (nccl: from the backend's
  // stream reaching wait_all to the communication stream's end); read it after
  // wait_for_collectives(). Negative where the host's own wait is the measure (mpi, local: the
  // caller times wait_all).
  virtual double last_overlap_wait_ms() { return -1.0; }
  // ZeRO-1 (docs/DESIGN.md §7). tensor: F32 [world_size * shard] in memory the implementation
  // reads (as allreduce_sum), shard r = elements [r * shard, (r + 1) * shard)
  // (parallel/shard_ranges.h). reduce_scatter_sum: this rank's shard becomes the sum over ranks
  // of their copies of it (the other shards are left unspecified). mpi adds them in rank order,
  // ((x_0 + x_1) + x_2) + ..., so the result is fixed by the world size; nccl in NCCL's order
  // (docs/DESIGN.md §7 says when a rerun repeats it). all_gather: every rank's shard r
  // becomes rank r's shard (a copy, exact). The default refuses with ErrorKind::NotBuilt.
  virtual void reduce_scatter_sum(Tensor& tensor);
  virtual void all_gather(Tensor& tensor);
  // ZeRO-1 overlapped with backward (dist.zero=1, dist.bucket_mb > 0): begins
  // reduce_scatter_sum's work for elements [begin, end) of `tensor` only, and may return before
  // it is done. After wait_all(), this rank's shard elements in [begin, end) hold the sum over
  // ranks: on mpi the bits reduce_scatter_sum gives them (the same rank-order sum, whatever
  // the ranges); on nccl NCCL's sum, which for more than two ranks may differ from the blocking
  // one in the last bit (nccl_communicator.cpp). Nothing in [begin, end) may be read or written
  // until then; every rank starts the same ranges in the same order. The default: a world of
  // one has nothing to sum; others refuse with NotBuilt.
  virtual void start_reduce_scatter_sum(Tensor tensor, int64_t begin, int64_t end);
  // Copies `bytes` bytes of host memory from rank `root` to every other rank.
  virtual void broadcast(void* host_bytes, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // True on every rank when every rank passed the same value (e.g. a config hash), false
  // on every rank otherwise; lets a launch with mismatched inputs stop on all ranks at once.
  virtual bool all_agree(uint64_t value) = 0;
  // Returns once every collective this rank issued has finished, or throws Error(Runtime)
  // naming the rank and the collective when one failed or passed dist.timeout_s. Call it
  // before a host wait on the backend (the step's readback), which has no deadline of its own.
  // A no-op where the collectives block until done (local, mpi).
  virtual void wait_for_collectives() {}
  // The deadline of this communicator's waits in seconds (nccl; local and mpi have none: 0, and
  // setting it does nothing).
  virtual double timeout_s() const { return 0.0; }
  virtual void set_timeout_s(double /*seconds*/) {}

  // Ends every process of the job with `exit_code`. Use it when this rank failed while
  // others may be blocked in a collective: a plain exit would leave them waiting (and, for
  // MPI, MPI_Finalize itself waits for them).
  [[noreturn]] virtual void abort(int exit_code) = 0;
};

// Ends the job after this rank failed with `error`: logs it with the rank, then abort()s with
// its exit code (a gnmr::Error's kind, else ErrorKind::Runtime), so that no peer is left
// waiting in a collective for a rank that will never join it.
[[noreturn]] void end_job_after_error(Communicator& comm, const std::exception& error);

// Runs `body`, which makes collective calls, on every rank. On a job of several ranks an
// exception out of it ends the whole job (end_job_after_error); on one rank it propagates, as
// there is no peer to wait. Use it around every stretch of a job from its communicator's
// creation on: setup that fails on one rank only (a node without the data, a GPU short of
// memory) would otherwise leave the others in their first collective.
template <typename Body>
auto run_or_end_job(Communicator& comm, Body&& body) -> decltype(body()) {
  if (comm.world_size() == 1) return body();
  try {
    return body();
  } catch (const std::exception& e) {
    end_job_after_error(comm, e);
  }
}

// Gives the collectives of a scope another deadline, restoring the previous one on exit: those
// that wait while one rank writes files (a checkpoint) get dist.checkpoint_timeout_s.
class CommunicatorTimeoutScope {
 public:
  CommunicatorTimeoutScope(Communicator& comm, double seconds)
      : comm_(comm), previous_(comm.timeout_s()) {
    comm_.set_timeout_s(seconds);
  }
  ~CommunicatorTimeoutScope() { comm_.set_timeout_s(previous_); }
  CommunicatorTimeoutScope(const CommunicatorTimeoutScope&) = delete;
  CommunicatorTimeoutScope& operator=(const CommunicatorTimeoutScope&) = delete;

 private:
  Communicator& comm_;
  double previous_;
};

struct CommunicatorOptions {
  std::string kind = "auto";       // dist.communicator
  double timeout_s = 600.0;        // dist.timeout_s: the deadline of every nccl wait and rendezvous
  std::string rendezvous = "tcp";  // dist.rendezvous: how nccl ranks without MPI share the id
  std::string rendezvous_dir = "";  // dist.rendezvous_dir (rendezvous "file")
  std::string backend = "cpu";      // whose tensors it will sum: "cpu" (host) | "cuda" (device)
  int cuda_device = 0;              // the cuda backend's device and cudaStream_t (cuda_backend.h)
  void* cuda_stream = nullptr;
};

// kind: "auto" | "local" | "mpi" | "nccl". "auto" is local for one process (launch_env.h),
// nccl for more on the cuda backend, mpi for more on the cpu backend. Refuses, as
// ErrorKind::Usage, a launch whose environment and communicator disagree (e.g. `local` under a
// 4-process mpirun, or an srun step whose processes did not find each other through MPI),
// since every rank would otherwise train its own model in silence, and a communicator that
// cannot read the backend's memory (mpi with cuda, nccl with cpu). nccl takes its unique id
// over MPI when an MPI launcher started the job, else over the rendezvous (rendezvous.h):
// TCP at the launch environment's address (torchrun's MASTER_ADDR / MASTER_PORT, or SLURM's
// first node), or files in options.rendezvous_dir.
// A communicator this build lacks is ErrorKind::NotBuilt.
std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options);
// The same for a given launch environment (tests; a caller that already read it).
std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options,
                                                const LaunchEnv& env);

}  // namespace gnmr
