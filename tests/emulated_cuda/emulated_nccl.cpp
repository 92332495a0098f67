// NCCL for the emulated CUDA build (emulated_cuda.h; docs/DESIGN.md §6): the calls gnmr's nccl
// communicator makes (src/parallel/nccl_library.h), with the semantics NCCL documents, for ranks
// that are processes of one machine, each emulating its GPU in host memory. A shared library
// loaded at run time like the real one: an emulated build names it as its NCCL
// (GNMR_NCCL_BUILD_LIBRARY), and refuses any other.
//
// - The unique id names a POSIX shared-memory segment. ncclCommInitRankConfig maps it, and the
//   communicator exists once every rank has joined. Each rank has a slot there as large as the
//   largest message (GNMR_EMULATED_NCCL_SLOT_MB, default 256 MiB of address space, of which only
//   what is written is ever allocated).
// - A collective is the n-th call of its communicator on every rank (NCCL requires one order).
//   Each rank copies its input to its slot and marks it posted; once every rank has posted, each
//   reads every slot in rank order, so all ranks compute the same bits, and marks the call
//   consumed. A rank posts its next input only after every rank consumed the last.
// - The emulation's streams are synchronous, so a collective runs when it is called. In a
//   non-blocking communicator (config.blocking = 0) the call returns ncclInProgress until every
//   rank has arrived, and ncclCommGetAsyncError makes the progress; a blocking one waits in the
//   call. Groups run their calls in order, one communicator after another.
// - What NCCL refuses is refused, with ncclGetLastError saying why: buffers that are not device
//   memory (the emulated runtime's allocations), overlapping buffers other than NCCL's in-place
//   forms, a root or rank out of range, two ranks on one device.
// - A peer that aborted its communicator or whose process is gone fails every call waiting for
//   it with ncclRemoteError. A peer that is alive but never calls leaves the call in progress,
//   as NCCL does: the caller's deadline (dist.timeout_s) ends it.
#include <dlfcn.h>
#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

// The loader's mark (src/parallel/nccl_library.cpp): an emulated build loads only a library
// that has it, and a GPU build refuses one that does.
extern "C" const char* gnmr_emulated_nccl(void) {
  return "gnmr's emulated NCCL (tests/emulated_cuda/emulated_nccl.cpp)";
}

namespace {

constexpr char kIdMagic[] = "gnmr-emulated-nccl-id";
constexpr int kMostRanks = 256;
constexpr size_t kPage = 4096;
constexpr unsigned kConfigMagic = 0xcafebeef;  // NCCL_CONFIG_INITIALIZER's
using Clock = std::chrono::steady_clock;

// One rank's part of the segment. The counters number collectives from 1.
struct SharedRank {
  std::atomic<int64_t> posted;    // the last collective whose input is in this rank's slot
  std::atomic<int64_t> consumed;  // the last collective this rank finished reading
  std::atomic<int32_t> pid;       // 0 until the rank joins
  std::atomic<int32_t> device;    // its emulated GPU (cudaSetDevice's)
};

// The segment starts zero-filled (ftruncate), which is each atomic's initial value.
struct SharedHeader {
  std::atomic<int32_t> world;       // set by the first rank to join; the others must agree
  std::atomic<int32_t> joined;      // ranks that have registered
  std::atomic<int32_t> aborted_by;  // 0, or the rank + 1 that aborted
  std::atomic<int64_t> slot_bytes;  // set with world
  SharedRank ranks[kMostRanks];
};
static_assert(std::atomic<int64_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "the shared counters must be address-free atomics");

constexpr size_t kHeaderBytes = (sizeof(SharedHeader) + kPage - 1) / kPage * kPage;

struct UniqueIdContents {
  char magic[sizeof(kIdMagic)];
  char segment[64];  // "/gnmr-nccl-<pid>-<random>"
};
static_assert(sizeof(UniqueIdContents) <= sizeof(ncclUniqueId), "the id fits NCCL's");

enum class Kind { AllReduce, Broadcast, Reduce, ReduceScatter, AllGather };

// One call: `count` is NCCL's (recvcount for ReduceScatter, sendcount for AllGather).
struct Call {
  Kind kind;
  const char* send;
  char* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
};

// The emulated runtime's answers (emulated_cudart.cpp), looked up in the program.
using DeviceRangeCheck = int (*)(const void*, size_t);
using CurrentDevice = int (*)(void);

thread_local std::string last_error_without_comm;
thread_local int group_depth = 0;
thread_local std::vector<ncclComm_t> group_comms;

}  // namespace

struct ncclComm {
  int rank = 0, world = 1;
  bool blocking = true;
  std::string segment;
  int fd = -1;
  SharedHeader* header = nullptr;
  size_t mapped_bytes = 0;
  int64_t slot_bytes = 0;
  DeviceRangeCheck is_device_range = nullptr;
  bool joined = false;
  std::deque<Call> queue;  // called, not yet finished, in call order
  int64_t finished = 0;    // the number of the last collective finished
  bool front_posted = false;
  ncclResult_t failure = ncclSuccess;  // sticky: a failed communicator can only be aborted
  std::string last_error;
  Clock::time_point next_liveness_check{};
};

namespace {

ncclResult_t refuse(ncclComm_t comm, ncclResult_t result, const std::string& why) {
  (comm ? comm->last_error : last_error_without_comm) = "emulated NCCL: " + why;
  return result;
}

// A failure of the communicator itself: every later call returns it.
ncclResult_t fail(ncclComm_t comm, ncclResult_t result, const std::string& why) {
  comm->failure = result;
  return refuse(comm, result, why);
}

size_t type_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

char* slot_of(ncclComm_t comm, int rank) {
  return reinterpret_cast<char*>(comm->header) + kHeaderBytes + size_t(rank) * comm->slot_bytes;
}

template <typename T>
T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclProd:
      return T(a * b);
    case ncclMax:
      return a > b ? a : b;
    case ncclMin:
      return a < b ? a : b;
    default:  // sum, and avg before its division
      return T(a + b);
  }
}

// out[i] = slot_0[i] op slot_1[i] op ... in rank order, from element `first` of every slot.
template <typename T>
void reduce_slots(ncclComm_t comm, const Call& call, size_t first, char* out_bytes) {
  std::vector<T> acc(call.count);
  std::memcpy(acc.data(), slot_of(comm, 0) + first * sizeof(T), call.count * sizeof(T));
  for (int q = 1; q < comm->world; ++q) {
    const T* in = reinterpret_cast<const T*>(slot_of(comm, q)) + first;
    for (size_t i = 0; i < call.count; ++i) acc[i] = combine(acc[i], in[i], call.op);
  }
  if (call.op == ncclAvg) {
    for (T& v : acc) v = T(v / T(comm->world));
  }
  std::memcpy(out_bytes, acc.data(), call.count * sizeof(T));
}

void reduce_slots(ncclComm_t comm, const Call& call, size_t first, char* out) {
  switch (call.type) {
    case ncclInt8:
      return reduce_slots<int8_t>(comm, call, first, out);
    case ncclUint8:
      return reduce_slots<uint8_t>(comm, call, first, out);
    case ncclInt32:
      return reduce_slots<int32_t>(comm, call, first, out);
    case ncclUint32:
      return reduce_slots<uint32_t>(comm, call, first, out);
    case ncclInt64:
      return reduce_slots<int64_t>(comm, call, first, out);
    case ncclUint64:
      return reduce_slots<uint64_t>(comm, call, first, out);
    case ncclFloat32:
      return reduce_slots<float>(comm, call, first, out);
    default:
      return reduce_slots<double>(comm, call, first, out);  // ncclFloat64 (enqueue checked)
  }
}

// Bytes this rank puts in its slot for `call`, and bytes the call writes to recv on this rank.
size_t input_bytes(const ncclComm_t comm, const Call& call) {
  const size_t bytes = call.count * type_bytes(call.type);
  switch (call.kind) {
    case Kind::Broadcast:
      return comm->rank == call.root ? bytes : 0;
    case Kind::ReduceScatter:
      return bytes * size_t(comm->world);
    default:
      return bytes;
  }
}

size_t output_bytes(const ncclComm_t comm, const Call& call) {
  const size_t bytes = call.count * type_bytes(call.type);
  switch (call.kind) {
    case Kind::Reduce:
      return comm->rank == call.root ? bytes : 0;
    case Kind::AllGather:
      return bytes * size_t(comm->world);
    default:
      return bytes;
  }
}

void post(ncclComm_t comm, const Call& call) {
  const size_t bytes = input_bytes(comm, call);
  if (bytes > 0) std::memcpy(slot_of(comm, comm->rank), call.send, bytes);
}

void finish(ncclComm_t comm, const Call& call) {
  const size_t bytes = call.count * type_bytes(call.type);
  switch (call.kind) {
    case Kind::AllReduce:
      return reduce_slots(comm, call, 0, call.recv);
    case Kind::Reduce:
      if (comm->rank == call.root) reduce_slots(comm, call, 0, call.recv);
      return;
    case Kind::ReduceScatter:
      return reduce_slots(comm, call, size_t(comm->rank) * call.count, call.recv);
    case Kind::Broadcast:
      std::memcpy(call.recv, slot_of(comm, call.root), bytes);
      return;
    case Kind::AllGather:
      for (int q = 0; q < comm->world; ++q) {
        std::memcpy(call.recv + size_t(q) * bytes, slot_of(comm, q), bytes);
      }
      return;
  }
}

bool process_alive(int32_t pid) {
  return pid == 0 || kill(pid, 0) == 0 || errno == EPERM;
}

// ncclSuccess once `ready(q)` holds for every rank q; ncclInProgress while it does not; a
// failure once a rank aborted, or a rank `ready` waits for has no process any more.
ncclResult_t ranks_ready(ncclComm_t comm, const std::function<bool(int)>& ready,
                         const char* waiting_for) {
  bool all = true;
  for (int q = 0; q < comm->world && all; ++q) all = ready(q);
  if (all) return ncclSuccess;
  if (const int by = comm->header->aborted_by.load(std::memory_order_acquire); by != 0) {
    return fail(comm, ncclRemoteError,
                "rank " + std::to_string(by - 1) + " aborted its communicator");
  }
  const Clock::time_point now = Clock::now();
  if (now < comm->next_liveness_check) return ncclInProgress;
  comm->next_liveness_check = now + std::chrono::milliseconds(50);
  for (int q = 0; q < comm->world; ++q) {
    const int32_t pid = comm->header->ranks[q].pid.load(std::memory_order_acquire);
    // Read `ready` again after finding the process gone: it may have finished, then exited.
    if (!ready(q) && !process_alive(pid) && !ready(q)) {
      return fail(comm, ncclRemoteError,
                  "rank " + std::to_string(q) + " (process " + std::to_string(pid) +
                      ") exited while this rank waited for it to " + waiting_for);
    }
  }
  return ncclInProgress;
}

ncclResult_t finish_joining(ncclComm_t comm) {
  SharedHeader& h = *comm->header;
  const ncclResult_t joined = ranks_ready(
      comm, [&](int) { return h.joined.load(std::memory_order_acquire) >= comm->world; },
      "join the communicator");
  if (joined != ncclSuccess) return joined;
  shm_unlink(comm->segment.c_str());  // every rank has it mapped; the name is no longer needed
  const int32_t device = h.ranks[comm->rank].device.load();
  for (int q = 0; q < comm->world; ++q) {
    if (q != comm->rank && h.ranks[q].device.load() == device) {
      return fail(comm, ncclInvalidUsage,
                  "duplicate GPU: rank " + std::to_string(q) + " and rank " +
                      std::to_string(comm->rank) + " are both on CUDA device " +
                      std::to_string(device) + " (each rank needs its own GPU)");
    }
  }
  comm->joined = true;
  return ncclSuccess;
}

// Runs the queued calls as far as the other ranks allow, without waiting.
ncclResult_t progress(ncclComm_t comm) {
  if (comm->failure != ncclSuccess) return comm->failure;
  if (!comm->joined) {
    if (const ncclResult_t r = finish_joining(comm); r != ncclSuccess) return r;
  }
  SharedHeader& h = *comm->header;
  while (!comm->queue.empty()) {
    const Call& call = comm->queue.front();
    const int64_t n = comm->finished + 1;
    if (!comm->front_posted) {
      const ncclResult_t r = ranks_ready(
          comm, [&](int q) { return h.ranks[q].consumed.load(std::memory_order_acquire) >= n - 1; },
          "read its last input");
      if (r != ncclSuccess) return r;
      post(comm, call);
      h.ranks[comm->rank].posted.store(n, std::memory_order_release);
      comm->front_posted = true;
    }
    const ncclResult_t r = ranks_ready(
        comm, [&](int q) { return h.ranks[q].posted.load(std::memory_order_acquire) >= n; },
        "call its collective");
    if (r != ncclSuccess) return r;
    finish(comm, call);
    h.ranks[comm->rank].consumed.store(n, std::memory_order_release);
    comm->finished = n;
    comm->front_posted = false;
    comm->queue.pop_front();
  }
  return ncclSuccess;
}

// After a call: a blocking communicator waits for it, a non-blocking one reports progress.
ncclResult_t complete(ncclComm_t comm) {
  ncclResult_t r = progress(comm);
  while (comm->blocking && r == ncclInProgress) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    r = progress(comm);
  }
  return r;
}

bool overlaps(const char* a, size_t a_bytes, const char* b, size_t b_bytes) {
  return a_bytes > 0 && b_bytes > 0 && a < b + b_bytes && b < a + a_bytes;
}

// NCCL's in-place forms: the same buffer, or this rank's part of the larger one.
bool in_place(const ncclComm_t comm, const Call& call) {
  const size_t part = call.count * type_bytes(call.type) * size_t(comm->rank);
  switch (call.kind) {
    case Kind::ReduceScatter:
      return call.recv == call.send + part;
    case Kind::AllGather:
      return call.send == call.recv + part;
    default:
      return call.send == call.recv;
  }
}

ncclResult_t check_call(ncclComm_t comm, const Call& call, const char* name) {
  const std::string what = std::string(name) + ": ";
  if (type_bytes(call.type) == 0) {
    return refuse(comm, ncclInvalidArgument,
                  what + "unknown data type " + std::to_string(call.type));
  }
  const bool reduces = call.kind != Kind::Broadcast && call.kind != Kind::AllGather;
  if (reduces) {
    if (int(call.op) < 0 || int(call.op) >= int(ncclNumOps)) {
      return refuse(comm, ncclInvalidArgument,
                    what + "unknown reduction " + std::to_string(int(call.op)));
    }
    if (call.type == ncclFloat16 || call.type == ncclBfloat16 || call.type == ncclFloat8e4m3 ||
        call.type == ncclFloat8e5m2) {
      return refuse(comm, ncclInvalidArgument,
                    what + "the emulation reduces integers, float32 and float64 only");
    }
  }
  if ((call.kind == Kind::Broadcast || call.kind == Kind::Reduce) &&
      (call.root < 0 || call.root >= comm->world)) {
    return refuse(comm, ncclInvalidArgument,
                  what + "root " + std::to_string(call.root) + " is not a rank of " +
                      std::to_string(comm->world));
  }
  const size_t in = input_bytes(comm, call), out = output_bytes(comm, call);
  if (int64_t(in) > comm->slot_bytes) {
    return refuse(comm, ncclInvalidArgument,
                  what + std::to_string(in) + " bytes are more than the emulation's " +
                      std::to_string(comm->slot_bytes) + " per rank (GNMR_EMULATED_NCCL_SLOT_MB)");
  }
  if ((in > 0 && comm->is_device_range(call.send, in) == 0) ||
      (out > 0 && comm->is_device_range(call.recv, out) == 0)) {
    return refuse(comm, ncclInvalidArgument,
                  what + "sendbuff or recvbuff is not device memory, or is smaller than " +
                      std::to_string(in) + " / " + std::to_string(out) + " bytes");
  }
  if (overlaps(call.send, in, call.recv, out) && !in_place(comm, call)) {
    return refuse(comm, ncclInvalidArgument,
                  what + "sendbuff and recvbuff overlap but are not the in-place form");
  }
  return ncclSuccess;
}

ncclResult_t enqueue(ncclComm_t comm, const Call& call, const char* name) {
  if (comm == nullptr) return refuse(nullptr, ncclInvalidArgument, std::string(name) + ": no comm");
  if (comm->failure != ncclSuccess) return comm->failure;
  if (call.count == 0) return ncclSuccess;  // nothing moves, nothing is numbered
  if (const ncclResult_t bad = check_call(comm, call, name); bad != ncclSuccess) return bad;
  comm->queue.push_back(call);
  if (group_depth > 0) {
    bool listed = false;
    for (ncclComm_t c : group_comms) listed = listed || c == comm;
    if (!listed) group_comms.push_back(comm);
    return ncclSuccess;
  }
  return complete(comm);
}

// The segment named in the id, mapped whole, with this rank registered in it.
ncclResult_t join(ncclComm_t comm, const UniqueIdContents& id, int32_t device) {
  comm->segment = std::string(id.segment, strnlen(id.segment, sizeof(id.segment)));
  comm->fd = shm_open(comm->segment.c_str(), O_RDWR | O_CREAT, 0600);
  if (comm->fd < 0) {
    return refuse(comm, ncclSystemError,
                  "shm_open(" + comm->segment + "): " + std::strerror(errno));
  }
  const auto grow_to = [&](size_t bytes) {
    struct stat st {};
    if (fstat(comm->fd, &st) != 0) return false;
    return size_t(st.st_size) >= bytes || ftruncate(comm->fd, off_t(bytes)) == 0;
  };
  if (!grow_to(kHeaderBytes)) {
    return refuse(comm, ncclSystemError, "sizing " + comm->segment + ": " + std::strerror(errno));
  }
  void* header = mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, comm->fd, 0);
  if (header == MAP_FAILED) {
    return refuse(comm, ncclSystemError, "mapping " + comm->segment + ": " + std::strerror(errno));
  }
  comm->header = static_cast<SharedHeader*>(header);
  comm->mapped_bytes = kHeaderBytes;
  SharedHeader& h = *comm->header;
  // The first rank sets the slot size, then the world; the others wait for the world and agree.
  int32_t expected = 0;
  if (h.slot_bytes.load() == 0) {
    int64_t unset = 0;
    h.slot_bytes.compare_exchange_strong(unset, comm->slot_bytes);
  }
  if (!h.world.compare_exchange_strong(expected, comm->world) && expected != comm->world) {
    return refuse(comm, ncclInvalidArgument,
                  "rank " + std::to_string(comm->rank) + " was given " +
                      std::to_string(comm->world) + " ranks, another rank " +
                      std::to_string(expected));
  }
  comm->slot_bytes = h.slot_bytes.load();
  const size_t whole = kHeaderBytes + size_t(comm->world) * size_t(comm->slot_bytes);
  munmap(comm->header, kHeaderBytes);
  comm->header = nullptr;
  if (!grow_to(whole)) {
    return refuse(comm, ncclSystemError, "sizing " + comm->segment + ": " + std::strerror(errno));
  }
  void* all = mmap(nullptr, whole, PROT_READ | PROT_WRITE, MAP_SHARED, comm->fd, 0);
  if (all == MAP_FAILED) {
    return refuse(comm, ncclSystemError, "mapping " + comm->segment + ": " + std::strerror(errno));
  }
  comm->header = static_cast<SharedHeader*>(all);
  comm->mapped_bytes = whole;
  SharedRank& me = comm->header->ranks[comm->rank];
  int32_t nobody = 0;
  if (!me.pid.compare_exchange_strong(nobody, int32_t(getpid()))) {
    return refuse(comm, ncclInvalidUsage,
                  "rank " + std::to_string(comm->rank) + " joined twice (process " +
                      std::to_string(nobody) + " has it)");
  }
  me.device.store(device);
  comm->header->joined.fetch_add(1, std::memory_order_acq_rel);
  return ncclSuccess;
}

void release(ncclComm_t comm) {
  if (comm->header != nullptr) munmap(comm->header, comm->mapped_bytes);
  if (comm->fd >= 0) close(comm->fd);
  delete comm;
}

int64_t slot_bytes_from_env() {
  const char* text = std::getenv("GNMR_EMULATED_NCCL_SLOT_MB");
  const long mb = text != nullptr ? std::strtol(text, nullptr, 10) : 0;
  return int64_t(mb > 0 ? mb : 256) << 20;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return refuse(nullptr, ncclInvalidArgument, "ncclGetVersion: null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (unique_id == nullptr) return refuse(nullptr, ncclInvalidArgument, "ncclGetUniqueId: null");
  UniqueIdContents id{};
  std::memcpy(id.magic, kIdMagic, sizeof(kIdMagic));
  std::random_device random;
  const uint64_t tag = (uint64_t(random()) << 32) ^ random();
  std::snprintf(id.segment, sizeof(id.segment), "/gnmr-nccl-%d-%016llx", int(getpid()),
                static_cast<unsigned long long>(tag));
  std::memset(unique_id, 0, sizeof(*unique_id));
  std::memcpy(unique_id, &id, sizeof(id));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config) {
  if (comm == nullptr) return refuse(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: null");
  *comm = nullptr;
  if (nranks < 1 || nranks > kMostRanks || rank < 0 || rank >= nranks) {
    return refuse(nullptr, ncclInvalidArgument,
                  "rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                      " (the emulation takes 1 to " + std::to_string(kMostRanks) + " ranks)");
  }
  UniqueIdContents id;
  std::memcpy(&id, &comm_id, sizeof(id));
  if (std::memcmp(id.magic, kIdMagic, sizeof(kIdMagic)) != 0) {
    return refuse(nullptr, ncclInvalidArgument, "the unique id is not one ncclGetUniqueId made");
  }
  if (config != nullptr && config->magic != kConfigMagic) {
    return refuse(nullptr, ncclInvalidArgument,
                  "the config was not initialized with NCCL_CONFIG_INITIALIZER");
  }
  // The emulated runtime must be in this program: its device memory is what the calls move.
  const auto is_device_range =
      reinterpret_cast<DeviceRangeCheck>(dlsym(RTLD_DEFAULT, "gnmr_emulated_is_device_range"));
  const auto current_device =
      reinterpret_cast<CurrentDevice>(dlsym(RTLD_DEFAULT, "gnmr_emulated_current_device"));
  if (is_device_range == nullptr || current_device == nullptr) {
    return refuse(nullptr, ncclInvalidUsage,
                  "this program has no emulated CUDA runtime (tests/emulated_cuda); the "
                  "emulated NCCL serves only an emulated build (GNMR_CUDA_EMULATED)");
  }
  ncclComm_t c = new ncclComm;
  c->rank = rank;
  c->world = nranks;
  c->blocking = config == nullptr || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking;
  c->slot_bytes = slot_bytes_from_env();
  c->is_device_range = is_device_range;
  if (const ncclResult_t r = join(c, id, current_device()); r != ncclSuccess) {
    last_error_without_comm = c->last_error;
    release(c);
    return r;
  }
  *comm = c;
  return complete(c);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) {
    return refuse(comm, ncclInvalidArgument, "ncclCommGetAsyncError: null");
  }
  *async_error = progress(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return refuse(nullptr, ncclInvalidArgument, "ncclCommFinalize: no comm");
  return complete(comm);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm != nullptr) release(comm);
  return ncclSuccess;
}

// Ends this rank's part: ranks waiting for it fail with ncclRemoteError (as NCCL's peers see a
// closed connection), and the segment's name goes (it may not have been unlinked yet).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (comm->header != nullptr) {
    int32_t nobody = 0;
    comm->header->aborted_by.compare_exchange_strong(nobody, comm->rank + 1);
    shm_unlink(comm->segment.c_str());
  }
  release(comm);
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  return (comm ? comm->last_error : last_error_without_comm).c_str();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  return enqueue(comm,
                 {Kind::AllReduce, static_cast<const char*>(sendbuff), static_cast<char*>(recvbuff),
                  count, datatype, op, 0},
                 "ncclAllReduce");
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t) {
  return enqueue(comm,
                 {Kind::Broadcast, static_cast<const char*>(sendbuff), static_cast<char*>(recvbuff),
                  count, datatype, ncclSum, root},
                 "ncclBroadcast");
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t) {
  return enqueue(comm,
                 {Kind::Reduce, static_cast<const char*>(sendbuff), static_cast<char*>(recvbuff),
                  count, datatype, op, root},
                 "ncclReduce");
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t) {
  return enqueue(comm,
                 {Kind::ReduceScatter, static_cast<const char*>(sendbuff),
                  static_cast<char*>(recvbuff), recvcount, datatype, op, 0},
                 "ncclReduceScatter");
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t) {
  return enqueue(comm,
                 {Kind::AllGather, static_cast<const char*>(sendbuff), static_cast<char*>(recvbuff),
                  sendcount, datatype, ncclSum, 0},
                 "ncclAllGather");
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

// The group's calls run now, in call order; the first failure, else in progress while any
// non-blocking communicator has calls left.
ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return refuse(nullptr, ncclInvalidUsage, "ncclGroupEnd without a start");
  if (--group_depth > 0) return ncclSuccess;
  std::vector<ncclComm_t> comms;
  comms.swap(group_comms);
  ncclResult_t result = ncclSuccess;
  for (ncclComm_t comm : comms) {
    const ncclResult_t r = complete(comm);
    if (r != ncclSuccess && (result == ncclSuccess || result == ncclInProgress)) result = r;
  }
  return result;
}

}  // extern "C"
