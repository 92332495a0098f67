// One rank of the multi-process checks of the nccl communicator (nccl_rank_check.h).
#include "tests/gpu/nccl_rank_check.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "parallel/communicator.h"
#include "parallel/launch_env.h"
#include "parallel/nccl_communicator.h"
#include "train/make_backend.h"
#include "util/error.h"

namespace gnmr {
namespace {

constexpr double kDeadlineSeconds = 10.0;

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("rank check failed: %s\n", what.c_str());
    ++failures;
  }
}

// Rank r's element i: a multiple of 1/4 below 64 in magnitude, so any sum over a few ranks is
// exact in float, whatever order NCCL adds in.
float input(int rank, size_t i) {
  return float(int((i * 7 + size_t(rank) * 13) % 101) - 50) * 0.25f;
}

float expected_sum(int world, size_t i) {
  float sum = 0;
  for (int r = 0; r < world; ++r) sum += input(r, i);
  return sum;
}

Tensor filled(Backend& backend, size_t n, int rank) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = input(rank, i);
  Tensor t = backend.allocate("values", {int64_t(n)}, DType::F32, MemoryRole::Gradients);
  backend.copy_from_host(t, values.data());
  return t;
}

// Elements [begin, end) of `t` against the sums over the world, bit for bit.
void check_sums(Backend& backend, const Tensor& t, size_t begin, size_t end, int world,
                const std::string& what) {
  std::vector<float> back(size_t(t.numel()));
  backend.copy_to_host(t, back.data());
  size_t differing = 0;
  for (size_t i = begin; i < end; ++i) {
    const float want = expected_sum(world, i);
    if (std::memcmp(&back[i], &want, sizeof(float)) != 0) ++differing;
  }
  check(differing == 0, what + ": " + std::to_string(differing) + " of " +
                            std::to_string(end - begin) + " elements are not the sum");
}

void run_collectives(Backend& backend, Communicator& comm) {
  const int world = comm.world_size(), rank = comm.rank();
  {  // the blocking all-reduce of a tensor (plain data parallel)
    Tensor t = filled(backend, 10007, rank);
    comm.allreduce_sum(t);
    comm.wait_for_collectives();
    check_sums(backend, t, 0, 10007, world, "allreduce_sum");
  }
  const size_t n = size_t(world) * 64 * 137;  // more than the 5000 of a bucket below
  {                                           // ZeRO-1: reduce-scatter, then all-gather
    Tensor t = filled(backend, n, rank);
    comm.reduce_scatter_sum(t);
    const size_t shard = n / size_t(world);
    check_sums(backend, t, size_t(rank) * shard, size_t(rank + 1) * shard, world,
               "reduce_scatter_sum (this rank's shard)");
    comm.all_gather(t);
    comm.wait_for_collectives();
    check_sums(backend, t, 0, n, world, "reduce_scatter_sum + all_gather");
  }
  {  // overlapped buckets, last elements first, as backward produces them
    Tensor t = filled(backend, n, rank);
    comm.start_allreduce_sum(tensor_view(t, {int64_t(n) - 5000}, 5000));
    comm.start_allreduce_sum(tensor_view(t, {5000}, 0));
    comm.wait_all();
    comm.wait_for_collectives();
    check_sums(backend, t, 0, n, world, "start_allreduce_sum buckets");
  }
  {  // ZeRO-1 overlapped: pieces reduced to their shard's owner, one across a shard edge
    Tensor t = filled(backend, n, rank);
    const int64_t cut = int64_t(n / size_t(world)) + 100;
    comm.start_reduce_scatter_sum(t, cut, int64_t(n));
    comm.start_reduce_scatter_sum(t, 0, cut);
    comm.wait_all();
    comm.all_gather(t);
    comm.wait_for_collectives();
    check_sums(backend, t, 0, n, world, "start_reduce_scatter_sum pieces + all_gather");
  }
  // The host collectives: sums of doubles, a broadcast of more than one staging chunk, agreement.
  double sums[2] = {double(rank + 1), -0.5 * rank};
  comm.allreduce_sum(sums, 2);
  check(sums[0] == world * (world + 1) / 2.0, "allreduce_sum of host doubles [0]");
  check(sums[1] == -0.25 * world * (world - 1), "allreduce_sum of host doubles [1]");
  const int root = world - 1;
  std::vector<uint8_t> bytes(3 * (size_t{1} << 20) + 17, 0);
  if (rank == root) {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 131 + 7);
  }
  comm.broadcast(bytes.data(), bytes.size(), root);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes.size(); ++i) wrong += bytes[i] != uint8_t(i * 131 + 7);
  check(wrong == 0, "broadcast from rank " + std::to_string(root) + ": " + std::to_string(wrong) +
                        " bytes differ");
  check(comm.all_agree(0x1234abcdULL), "all_agree of one value");
  check(comm.all_agree(uint64_t(rank)) == (world == 1), "all_agree of each rank's own value");
  comm.barrier();
}

// Rank W-1 stops taking part after one collective; the others go on and must fail.
int run_failure(Backend& backend, Communicator& comm, const std::string& mode) {
  Tensor t = filled(backend, 4096, comm.rank());
  comm.allreduce_sum(t);
  comm.wait_for_collectives();
  if (comm.rank() == comm.world_size() - 1) {
    std::fflush(stdout);
    if (mode == "abort") comm.abort(4);
    std::_Exit(9);
  }
  comm.barrier();
  comm.allreduce_sum(t);
  comm.wait_for_collectives();
  std::printf("rank %d: the collectives after rank %d stopped did not fail\n", comm.rank(),
              comm.world_size() - 1);
  return 1;
}

int run_rank(const std::string& mode) {
  const LaunchEnv env = read_launch_env();
  CudaBackendOptions backend_options;
  backend_options.device = cuda_device_of_this_process();  // as gnmr picks it
  std::unique_ptr<Backend> backend = make_cuda_backend(backend_options);
  const CudaStreamHandle handle = cuda_stream_of(*backend);
  CommunicatorOptions options;
  options.kind = "nccl";
  options.backend = "cuda";
  options.timeout_s = kDeadlineSeconds;
  options.cuda_device = handle.device;
  options.cuda_stream = handle.stream;
  if (mode == "absent") {
    // What make_communicator does, with rank W-1 leaving between the id and the join.
    NcclCommunicatorOptions nccl;
    nccl.rank = env.rank;
    nccl.world_size = env.world_size;
    nccl.device = handle.device;
    nccl.stream = handle.stream;
    nccl.timeout_s = kDeadlineSeconds;
    nccl.unique_id = share_nccl_unique_id(env, options, nullptr);
    if (env.rank == env.world_size - 1) std::_Exit(0);
    make_nccl_communicator(std::move(nccl));
    std::printf("rank %d: the communicator was made without rank %d\n", env.rank,
                env.world_size - 1);
    return 1;
  }
  std::unique_ptr<Communicator> comm = make_communicator(options, env);
  if (mode != "collectives") return run_failure(*backend, *comm, mode);
  run_collectives(*backend, *comm);
  std::printf("rank %d of %d: %s\n", comm->rank(), comm->world_size(),
              failures == 0 ? "every collective checked" : "checks failed");
  return failures == 0 ? 0 : 1;
}

}  // namespace

int nccl_rank_check(const std::string& mode) {
  if (mode != "collectives" && mode != "exit" && mode != "abort" && mode != "absent") {
    std::printf("nccl_rank_check: unknown mode \"%s\" (collectives, exit, abort, absent)\n",
                mode.c_str());
    return 2;
  }
  try {
    return run_rank(mode);
  } catch (const Error& e) {
    std::printf("error: %s\n", e.what());
    return 3;
  }
}

}  // namespace gnmr
