#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <thread>
#include <vector>

#include "parallel/launch_env.h"
#include "parallel/nccl_library.h"
#include "parallel/rendezvous.h"
#include "parallel/shard_ranges.h"
#include "util/error.h"
#include "util/log.h"

namespace gnmr {

namespace {

static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES &&
                  kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES,
              "ncclUniqueId is kNcclUniqueIdBytes bytes");

// The host collectives stage through this much device memory (broadcasts go in chunks).
constexpr size_t kStagingBytes = size_t{1} << 20;

using Clock = std::chrono::steady_clock;

std::string nccl_message(ncclResult_t result, ncclComm_t comm) {
  std::string text = nccl_api().GetErrorString(result);
  const char* last = nccl_api().GetLastError(comm);
  if (last != nullptr && last[0] != '\0') text += std::string(" (") + last + ")";
  return text;
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(NcclCommunicatorOptions options)
      : rank_(options.rank),
        world_size_(options.world_size),
        local_rank_(options.local_rank),
        stream_(static_cast<cudaStream_t>(options.stream)),
        timeout_s_(options.timeout_s),
        configured_timeout_s_(options.timeout_s),
        host_(std::move(options.host)) {
    GNMR_CHECK(options.unique_id.size() == sizeof(ncclUniqueId),
               "an NCCL unique id is " + std::to_string(sizeof(ncclUniqueId)) + " bytes, got " +
                   std::to_string(options.unique_id.size()));
    GNMR_CHECK(stream_ != nullptr, "the NCCL communicator needs the CUDA backend's stream");
    try {
      create(options);
    } catch (const std::exception& e) {
      release();
      // Launched by MPI, a rank that cannot create its communicator ends the job at once: the
      // others would wait in their own creation until the deadline.
      if (mpi_ends_the_job()) end_job_after_error(*host_, e);
      throw;
    } catch (...) {
      release();
      throw;
    }
  }

  ~NcclCommunicator() override { release(); }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int local_rank() const override { return local_rank_; }

  // In place on the backend's stream; NCCL's ring and tree all-reduce hand every rank the
  // bytes the last step of the ring (or the tree's root) produced, so replicated weights stay
  // identical; the weight hash before each checkpoint (trainer) would catch a violation.
  void allreduce_sum(Tensor& tensor) override {
    GNMR_CHECK(
        tensor.dtype == DType::F32 || tensor.dtype == DType::F64,
        std::string("allreduce_sum takes F32 or F64 tensors, got ") + dtype_name(tensor.dtype));
    const auto count = static_cast<size_t>(tensor.numel());
    if (count == 0) return;
    const ncclDataType_t type = tensor.dtype == DType::F32 ? ncclFloat32 : ncclFloat64;
    wait_all();
    finish_call(nccl_.AllReduce(tensor.data, tensor.data, count, type, ncclSum, comm_, stream_),
                "tensor all-reduce");
    record("tensor all-reduce");
  }

  // Overlapped with backward (docs/DESIGN.md §7): on the communication stream, after
  // everything the backend's stream has queued so far (the backward ops that wrote the bucket),
  // while the backend's stream goes on with the earlier layers. wait_all() joins the streams.
  void start_allreduce_sum(Tensor tensor) override {
    GNMR_CHECK(
        tensor.dtype == DType::F32,
        std::string("start_allreduce_sum takes F32 tensors, got ") + dtype_name(tensor.dtype));
    const auto count = static_cast<size_t>(tensor.numel());
    if (count == 0) return;
    follow_backend_stream();
    finish_call(
        nccl_.AllReduce(tensor.data, tensor.data, count, ncclFloat32, ncclSum, comm_, comm_stream_),
        "overlapped gradient all-reduce");
    overlapped_pending_ = true;
  }

  // ZeRO-1 overlapped with backward: each piece of [begin, end) that lies in shard r is an
  // in-place ncclReduce to rank r (parallel/shard_ranges.h), grouped into one launch on the
  // communication stream. NCCL documents no order of the additions, so the bits of a bucketed
  // reduce-scatter can differ from the blocking one's in the last place for more than two
  // ranks (two ranks: one addition, x_0 + x_1, either way). Only the owner keeps a sum, so no
  // two ranks can disagree on it; a rerun repeats it where NCCL repeats its algorithm (the same
  // topology, version and message sizes; docs/DESIGN.md §7).
  void start_reduce_scatter_sum(Tensor tensor, int64_t begin, int64_t end) override {
    const size_t shard = shard_elements(tensor, world_size_, "start_reduce_scatter_sum");
    check_element_range(tensor, begin, end, "start_reduce_scatter_sum");
    const std::vector<ShardRange> pieces = shard_ranges_of(int64_t(shard), world_size_, begin, end);
    if (pieces.empty()) return;
    follow_backend_stream();
    auto* data = static_cast<float*>(tensor.data);
    finish_call(nccl_.GroupStart(), "overlapped gradient reduce-scatter (group start)");
    ncclResult_t first_error = ncclSuccess;
    for (const ShardRange& piece : pieces) {
      const ncclResult_t result =
          nccl_.Reduce(data + piece.begin, data + piece.begin, size_t(piece.count()), ncclFloat32,
                       ncclSum, piece.owner, comm_, comm_stream_);
      if (result != ncclSuccess && result != ncclInProgress && first_error == ncclSuccess) {
        first_error = result;
      }
    }
    // The group is closed even after a failed call, so this thread is not left inside it.
    const ncclResult_t ended = nccl_.GroupEnd();
    finish_call(first_error != ncclSuccess ? first_error : ended,
                "overlapped gradient reduce-scatter");
    overlapped_pending_ = true;
  }

  // The backend's stream waits for the communication stream; the host does not. Every blocking
  // collective calls it first, so whatever a caller does, this communicator's collectives are
  // ordered on the device as they were issued (NCCL requires one order on every rank).
  void wait_all() override {
    if (!overlapped_pending_) return;
    cuda_check(cudaEventRecord(backward_done_, stream_), "marking the end of backward");
    cuda_check(cudaEventRecord(communication_done_, comm_stream_),
               "recording the end of the overlapped gradient reduction");
    overlap_timed_ = true;
    cuda_check(cudaStreamWaitEvent(stream_, communication_done_, 0),
               "ordering the backend's stream after the overlapped gradient reduction");
    record("overlapped gradient reduction");
    overlapped_pending_ = false;
  }

  // The communication stream's end minus the backend stream's arrival at wait_all: what the
  // backend's stream waited (0 when the reductions had finished first).
  double last_overlap_wait_ms() override {
    if (!overlap_timed_) return 0.0;
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, backward_done_, communication_done_),
               "timing the overlapped gradient reduction");
    return std::max(0.0, double(ms));
  }

  // ZeRO-1 (communicator.h): in place, shard r of the buffer is rank r's receive buffer
  // (NCCL's in-place form, recvbuff = sendbuff + rank * recvcount). The order of the additions
  // is NCCL's (see start_reduce_scatter_sum).
  void reduce_scatter_sum(Tensor& tensor) override {
    const size_t shard = shard_elements(tensor, world_size_, "reduce_scatter_sum");
    if (shard == 0) return;
    wait_all();
    auto* data = static_cast<float*>(tensor.data);
    finish_call(nccl_.ReduceScatter(data, data + size_t(rank_) * shard, shard, ncclFloat32, ncclSum,
                                    comm_, stream_),
                "gradient reduce-scatter");
    record("gradient reduce-scatter");
  }

  // In place (sendbuff = recvbuff + rank * sendcount); a copy, exact.
  void all_gather(Tensor& tensor) override {
    const size_t shard = shard_elements(tensor, world_size_, "all_gather");
    if (shard == 0) return;
    wait_all();
    auto* data = static_cast<float*>(tensor.data);
    finish_call(
        nccl_.AllGather(data + size_t(rank_) * shard, data, shard, ncclFloat32, comm_, stream_),
        "weight all-gather");
    record("weight all-gather");
  }

  void allreduce_sum(double* values, size_t count) override {
    for (size_t first = 0; first < count; first += kStagingBytes / sizeof(double)) {
      const size_t n = std::min(kStagingBytes / sizeof(double), count - first);
      to_staging(values + first, n * sizeof(double));
      finish_call(nccl_.AllReduce(staging_, staging_, n, ncclFloat64, ncclSum, comm_, stream_),
                  "all-reduce of host doubles");
      record("all-reduce of host doubles");
      from_staging(values + first, n * sizeof(double));
    }
  }

  void broadcast(void* host_bytes, size_t bytes, int root) override {
    GNMR_CHECK(root >= 0 && root < world_size_, "broadcast root " + std::to_string(root) +
                                                    " is not a rank of a world of " +
                                                    std::to_string(world_size_));
    auto* data = static_cast<char*>(host_bytes);
    for (size_t first = 0; first < bytes; first += kStagingBytes) {
      const size_t n = std::min(kStagingBytes, bytes - first);
      to_staging(data + first, n);
      finish_call(nccl_.Broadcast(staging_, staging_, n, ncclUint8, root, comm_, stream_),
                  "broadcast");
      record("broadcast");
      from_staging(data + first, n);
    }
  }

  void barrier() override {
    double one = 1.0;
    allreduce_sum(&one, 1);
  }

  // max(v) and max(~v) = ~min(v) in one integer all-reduce: exact, so every rank agrees.
  bool all_agree(uint64_t value) override {
    uint64_t extremes[2] = {value, ~value};
    to_staging(extremes, sizeof(extremes));
    finish_call(nccl_.AllReduce(staging_, staging_, 2, ncclUint64, ncclMax, comm_, stream_),
                "agreement check");
    record("agreement check");
    from_staging(extremes, sizeof(extremes));
    return extremes[0] == ~extremes[1];
  }

  void wait_for_collectives() override { wait_device(); }
  double timeout_s() const override { return timeout_s_; }
  void set_timeout_s(double seconds) override { timeout_s_ = seconds; }

  // No ncclCommAbort here: the process ends, which frees the communicator and stops its
  // kernels, and NCCL documents that every active rank must call the abort for it to succeed,
  // so on the one failing rank it could wait for peers that are still computing (and keep
  // MPI_Abort, which ends them at once, from running). The peers see this process's
  // connections close and fail their own collectives within their deadline.
  [[noreturn]] void abort(int exit_code) override {
    comm_ = nullptr;
    if (host_) host_->abort(exit_code);  // MPI: ends every rank of the job at once
    std::_Exit(exit_code);
  }

 private:
  // Whether a failure here ends every rank through MPI (the host that handed out the id).
  bool mpi_ends_the_job() const { return host_ != nullptr && world_size_ > 1; }
  void create(const NcclCommunicatorOptions& options) {
    // NCCL_COMM_BLOCKING overrides config.blocking (NCCL's init reads it after the config).
    const char* blocking = std::getenv("NCCL_COMM_BLOCKING");
    if (blocking != nullptr && std::atoi(blocking) != 0) {
      throw Error(ErrorKind::Runtime,
                  "rank " + std::to_string(rank_) + ": NCCL_COMM_BLOCKING=" + blocking +
                      " would make NCCL's calls block, so a collective whose peer died could "
                      "hang past dist.timeout_s instead of ending the job; unset it (gnmr "
                      "runs NCCL non-blocking and polls it against the deadline)");
    }
    if (rank_ == 0) spdlog::info("nccl: {}", describe_nccl(nccl_));
    cuda_check(cudaSetDevice(options.device), "selecting the backend's GPU");
    cuda_check(cudaEventCreateWithFlags(&backend_ready_, cudaEventDisableTiming),
               "creating an event");
    // Timed, for last_overlap_wait_ms().
    cuda_check(cudaEventCreate(&communication_done_), "creating an event");
    cuda_check(cudaEventCreate(&backward_done_), "creating an event");
    // The overlapped reductions' stream: non-blocking (no implicit wait on the legacy default
    // stream) and of the highest priority, so NCCL's kernels get SMs while backward's fill the
    // device.
    int least_priority = 0, greatest_priority = 0;
    cuda_check(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority),
               "reading the stream priorities");
    cuda_check(
        cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest_priority),
        "creating the communication stream");
    cuda_check(cudaMalloc(&staging_, kStagingBytes), "allocating the host-collective staging");
    ncclUniqueId id;
    std::memcpy(&id, options.unique_id.data(), sizeof(id));
    // Non-blocking: the only mode in which a rank can abort a communicator whose peer died
    // (docs/DESIGN.md §7); every call may then return ncclInProgress, and the state is polled.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "gnmr";
    const ncclResult_t result = nccl_.CommInitRankConfig(&comm_, world_size_, id, rank_, &config);
    finish_call(result, "communicator creation (waiting for every rank to join)");
  }

  // Finalize flushes outstanding work; a communicator that does not finish in a few seconds
  // (or already failed) is aborted instead. Errors are dropped: this runs in a destructor.
  void release() {
    if (comm_ != nullptr) {
      ncclResult_t state = nccl_.CommFinalize(comm_);
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (state == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::yield();
        if (nccl_.CommGetAsyncError(comm_, &state) != ncclSuccess) break;
      }
      if (state == ncclSuccess) {
        nccl_.CommDestroy(comm_);
      } else {
        nccl_.CommAbort(comm_);
      }
      comm_ = nullptr;
    }
    if (staging_ != nullptr) cudaFree(staging_);
    staging_ = nullptr;
    for (cudaEvent_t* event : {&backend_ready_, &communication_done_, &backward_done_}) {
      if (*event != nullptr) cudaEventDestroy(*event);
      *event = nullptr;
    }
    for (const Outstanding& o : outstanding_) cudaEventDestroy(o.done);
    outstanding_.clear();
    for (cudaEvent_t event : spare_events_) cudaEventDestroy(event);
    spare_events_.clear();
    if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
    comm_stream_ = nullptr;
  }

  // `action` and `what` are joined only on failure: these checks sit on the per-step path.
  void cuda_check(cudaError_t status, const char* action, const char* what = "") {
    if (status != cudaSuccess) {
      throw Error(ErrorKind::Runtime, "rank " + std::to_string(rank_) + ": " + action + what +
                                          " failed: " + cudaGetErrorString(status));
    }
  }

  // With MPI present the error ends the job through MPI_Abort (run_or_end_job, and the
  // constructor for a failed creation), which frees everything; NCCL's abort is skipped there,
  // as in abort(), since it could first wait for peers that are waiting for this rank.
  [[noreturn]] void fail(const std::string& what) {
    if (comm_ != nullptr && !mpi_ends_the_job()) nccl_.CommAbort(comm_);
    comm_ = nullptr;
    throw Error(ErrorKind::Runtime, "rank " + std::to_string(rank_) + " of " +
                                        std::to_string(world_size_) + ": NCCL " + what);
  }

  // A non-blocking call returns ncclInProgress until its work is queued; nothing else may be
  // queued on the stream before then, so poll the state (an enqueue, not a device wait).
  void finish_call(ncclResult_t result, const char* what) {
    const auto deadline = Clock::now() + deadline_duration();
    while (result == ncclInProgress) {
      if (Clock::now() > deadline) {
        fail(std::string(what) + " did not finish within " + deadline_text() +
             " (a rank did not join or stopped answering)");
      }
      std::this_thread::yield();
      const ncclResult_t query = nccl_.CommGetAsyncError(comm_, &result);
      if (query != ncclSuccess) result = query;
    }
    if (result != ncclSuccess) fail(std::string(what) + " failed: " + nccl_message(result, comm_));
  }

  // The communication stream waits for everything queued on the backend's stream so far.
  void follow_backend_stream() {
    cuda_check(cudaEventRecord(backend_ready_, stream_), "marking a gradient bucket ready");
    cuda_check(cudaStreamWaitEvent(comm_stream_, backend_ready_, 0),
               "ordering the communication stream after backward");
  }

  // Marks the end of collective `what` on the backend's stream (an event of its own, so a wait
  // names the collective it is stuck on, not the last one issued).
  void record(const char* what) {
    cudaEvent_t done = nullptr;
    if (spare_events_.empty()) {
      cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "creating an event");
    } else {
      done = spare_events_.back();
      spare_events_.pop_back();
    }
    outstanding_.push_back(Outstanding{done, what});  // destroyed by release() whatever happens
    cuda_check(cudaEventRecord(done, stream_), "recording the end of ", what);
  }

  // Polls the outstanding collectives' ends in the order they were queued (the stream's), with
  // NCCL's asynchronous error, until the device has finished them all, the communicator
  // failed, or the deadline passed: a failure names the first collective not finished.
  void wait_device() {
    const auto deadline = Clock::now() + deadline_duration();
    for (const Outstanding& o : outstanding_) {
      while (true) {
        const cudaError_t status = cudaEventQuery(o.done);
        if (status == cudaSuccess) break;
        if (status != cudaErrorNotReady) cuda_check(status, "waiting for ", o.what);
        ncclResult_t state = ncclSuccess;
        const ncclResult_t query = nccl_.CommGetAsyncError(comm_, &state);
        if (query != ncclSuccess) state = query;
        if (state != ncclSuccess && state != ncclInProgress) {
          fail(std::string(o.what) + " failed: " + nccl_message(state, comm_));
        }
        if (Clock::now() > deadline) {
          fail(std::string(o.what) + " did not finish within " + deadline_text() +
               " (another rank stopped answering)");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    for (const Outstanding& o : outstanding_) spare_events_.push_back(o.done);
    outstanding_.clear();
  }

  // A copy from pageable memory may make the host wait for the stream (CUDA's synchronization
  // rules), and a wait on a collective whose peer died would have no deadline: the collectives
  // queued so far are waited for first, with it.
  void to_staging(const void* host, size_t bytes) {
    wait_all();
    wait_device();
    cuda_check(cudaMemcpyAsync(staging_, host, bytes, cudaMemcpyHostToDevice, stream_),
               "copying a host collective's input");
  }

  // The collective is waited for (with the deadline) before the copy back: a device-to-host
  // copy into pageable memory blocks the host, and must not block on a hung peer.
  void from_staging(void* host, size_t bytes) {
    wait_device();
    cuda_check(cudaMemcpy(host, staging_, bytes, cudaMemcpyDeviceToHost),
               "copying a host collective's result");
  }

  std::chrono::steady_clock::duration deadline_duration() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  }
  // "600 s (dist.timeout_s)": the deadline and the key that set it.
  std::string deadline_text() const {
    return std::to_string(int64_t(timeout_s_)) + " s (" +
           (timeout_s_ == configured_timeout_s_ ? "dist.timeout_s" : "dist.checkpoint_timeout_s") +
           ")";
  }

  const NcclApi& nccl_ = nccl_api();  // first: loaded (or refused) before anything is created
  int rank_, world_size_, local_rank_;
  cudaStream_t stream_;
  double timeout_s_;
  const double configured_timeout_s_;  // dist.timeout_s; timeout_s_ differs inside a checkpoint
  std::unique_ptr<Communicator> host_;
  ncclComm_t comm_ = nullptr;
  // The collectives queued and not yet waited for, in order: each one's end on the backend's
  // stream. Their events return to the spares once waited for.
  struct Outstanding {
    cudaEvent_t done;
    const char* what;
  };
  std::vector<Outstanding> outstanding_;
  std::vector<cudaEvent_t> spare_events_;
  // The overlapped reductions (start_*): their stream, the backend's stream's point each one
  // follows, and their end, which the backend's stream waits for in wait_all() (timed).
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t backend_ready_ = nullptr;
  cudaEvent_t communication_done_ = nullptr;
  cudaEvent_t backward_done_ = nullptr;  // the backend's stream at wait_all, for the timing
  bool overlapped_pending_ = false;
  bool overlap_timed_ = false;  // a wait_all() has recorded both timed events
  void* staging_ = nullptr;
};

}  // namespace

std::vector<uint8_t> make_nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t result = nccl_api().GetUniqueId(&id);
  if (result != ncclSuccess) {
    throw Error(ErrorKind::Runtime,
                std::string("NCCL could not make its unique id: ") + nccl_message(result, nullptr) +
                    " (NCCL_SOCKET_IFNAME names the network interface it should use)");
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
  return std::vector<uint8_t>(bytes, bytes + sizeof(id));
}

std::vector<uint8_t> share_nccl_unique_id(const LaunchEnv& env, const CommunicatorOptions& options,
                                          Communicator* host) {
  if (env.world_size == 1) return make_nccl_unique_id();
  if (host != nullptr) {
    // Every rank loads NCCL before the broadcast: a rank without a usable one (no libnccl on
    // its node, a wrong GNMR_NCCL_LIBRARY) fails here, where the caller ends the job through
    // MPI, not in the communicator's creation while the others wait for it to join.
    nccl_api();
    std::vector<uint8_t> id(kNcclUniqueIdBytes);
    if (host->rank() == 0) id = make_nccl_unique_id();
    host->broadcast(id.data(), id.size(), 0);
    return id;
  }
  // Checked before making the id: a launch that cannot rendezvous fails without touching NCCL.
  const RendezvousOptions rendezvous =
      rendezvous_options_for(env, options.rendezvous, options.rendezvous_dir, options.timeout_s);
  std::vector<uint8_t> id;
  if (env.rank == 0) id = make_nccl_unique_id();
  return rendezvous_broadcast(rendezvous, id);
}

std::unique_ptr<Communicator> make_nccl_communicator(NcclCommunicatorOptions options) {
  return std::make_unique<NcclCommunicator>(std::move(options));
}

}  // namespace gnmr
