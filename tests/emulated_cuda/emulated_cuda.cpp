// The block scheduler behind emulated_cuda.h: a block's threads run on fibers (fiber_switch.h)
// in one OS thread. A fiber takes the next thread not yet started and runs it until it returns
// (then takes the next one, on the same stack, with no switch) or waits at a barrier
// (__syncthreads, or the warp barrier of a shuffle or an mma): then the scheduler starts another
// fiber for the threads not yet started, and resumes the waiting threads, in thread order, once the
// last thread to arrive has released them. A kernel without barriers thus runs a whole block on one
// fiber. A pass that finds nothing to run while threads still wait is a barrier some threads
// never reach: an error naming the block.
#include "emulated_cuda/emulated_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/mma_fragment.h"
#include "backend/wgmma_operand.h"
#include "emulated_cuda/fiber_switch.h"
#include "precision/bf16.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define GNMR_EMULATED_CUDA_ASAN 1
#endif

namespace gnmr::cuda {

EmulatedDim threadIdx, blockIdx, blockDim, gridDim;

namespace {

// cudaError_t values the emulated launch reports (driver_types.h), without the CUDA headers.
constexpr int kCudaErrorInvalidValue = 1;
constexpr int kCudaErrorInvalidConfiguration = 9;

// A kernel's locals plus the sanitizers' frames.
constexpr size_t kFiberStackBytes = 256 * 1024;
constexpr size_t kMaxShuffleBytes = 16;
// Below a finished fiber's last frame address: its own locals (give_back_stack).
constexpr size_t kExitFrameMargin = 4096;

enum class ThreadState { kNotStarted, kRunning, kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  FiberContext context;
  std::unique_ptr<char[]> stack;
  void* asan_fake_stack = nullptr;  // ASan's record of the fiber's stack while switched out
  bool finished = false;            // no thread left to take: never resumed again
  // Where the fiber's last frame was when it finished: ASan's marks on the stack lie above it
  // (give_back_stack).
  char* exit_frame = nullptr;
};

// What the lanes of one warp hand each other in a shuffle or an mma. Two of them per warp, used
// in turn by each lane: a lane can only reach its next exchange after every lane has arrived
// at this one, so it never overwrites what a slower lane has still to read.
struct WarpExchange {
  unsigned char bytes[kWarpSize][kMaxShuffleBytes];
  // mma: the A and B matrices, each element decoded by the lane whose fragment holds it.
  float a[kMmaM][kMmaK];
  float b[kMmaK][kMmaN];
  uint16_t rows[kWarpSize][kLdmatrixRows];  // ldmatrix: the row at each lane's address
};

// A wgmma a thread issued and has not yet waited for: its accumulators, what they become, and
// the words of shared memory its share read, which the GPU may read until the wait
// (SharedWordAccess::wgmma_in_flight).
struct PendingWgmma {
  float (*d)[kMmaCElements];
  float result[kWgmmaN / kMmaN][kMmaCElements];
  std::vector<uint32_t> words;
};

constexpr int kWarpgroupThreads = 4 * kWarpSize;

// A wgmma as one thread issued it: which form, its descriptors (A's 0 in registers) and scale_d.
// Every thread of a warpgroup issues the same ones in the same order (.sync.aligned).
struct WgmmaIssue {
  bool a_in_registers;
  uint64_t a_desc, b_desc;
  int scale_d;
  bool operator==(const WgmmaIssue& o) const {
    return a_in_registers == o.a_in_registers && a_desc == o.a_desc && b_desc == o.b_desc &&
           scale_d == o.scale_d;
  }
};

// A cp.async copy a thread issued and has not yet waited for.
struct AsyncCopy {
  void* dst;
  const void* src;
  int size, src_bytes;
};

struct BlockRun {
  const std::function<void()>* kernel = nullptr;
  int threads = 0;
  std::vector<ThreadState> state;
  std::vector<Fiber*> fiber_of;  // the fiber running each started thread
  std::vector<std::unique_ptr<Fiber>> fibers;
  int next_unstarted = 0, done = 0;
  // Threads in state kReady: a pass of the scheduler stops looking once none is left (most
  // passes, while a block's threads start one by one and wait at their warp's first shuffle,
  // find none: scanning every thread in each was 12% of an emulated training step).
  int ready = 0;
  int current = -1;  // the running thread
  Fiber* current_fiber = nullptr;
  FiberContext scheduler;
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
  int block_arrived = 0;
  std::vector<int> warp_arrived;
  std::vector<WarpExchange> warp_exchanges;  // two per warp
  std::vector<unsigned char> exchange_turn;  // per thread: which of its warp's two is next
  // Per thread: its committed cp.async groups, oldest first, and the group still open.
  std::vector<std::vector<std::vector<AsyncCopy>>> async_committed;
  std::vector<std::vector<AsyncCopy>> async_open;
  // The same for its wgmma groups.
  std::vector<std::vector<std::vector<PendingWgmma>>> wgmma_committed;
  std::vector<std::vector<PendingWgmma>> wgmma_open;
  // Per thread: the fence.proxy.async it has run so far.
  std::vector<uint64_t> proxy_fences;
  // Per thread: a wgmma.fence since its start or its last wgmma.wait_group (wgmma_fence).
  std::vector<unsigned char> wgmma_fenced;
  // Per warpgroup, the wgmma its threads issued, in order; per thread, how many it has.
  std::vector<std::vector<WgmmaIssue>> warpgroup_wgmma;
  std::vector<size_t> wgmma_issued;
  uint64_t barriers = 0;  // __syncthreads completed so far: the block's epoch
  std::string failure;    // set by a thread that found an error; the scheduler throws it
};

// What the asynchronous copies, ldmatrix and wgmma did to one 4-byte word of shared memory, for
// the races between threads of a block that no barrier orders (shared_word_races): a cp.async
// writes its words from its issue until it lands at its thread's wait, and the others may read
// them only after a __syncthreads that follows the landing. A wgmma reads its operands from its
// issue until its thread's wgmma.wait_group (the tensor cores read shared memory
// asynchronously, through the async proxy): no copy may write them in between, not even its own
// thread's, and another thread's only after a __syncthreads that follows the wait. And a copy's
// bytes reach a wgmma (the async proxy) only once the copying thread has run a
// fence.proxy.async.shared::cta after its landing (cp.async writes through the generic proxy):
// its count of those then exceeds the one the word kept at the landing.
struct SharedWordAccess {
  static constexpr uint64_t kPending = ~uint64_t{0};
  int writer = -1;             // the thread of the last cp.async to the word, -1: none
  uint64_t landed = 0;         // the epoch it landed in, kPending until its thread waits
  int reader = -1;             // the thread of the last read of the word in `read`, -2: many
  uint64_t read = kPending;    // the epoch of that read (a wgmma's: of its wait)
  int wgmma_in_flight = 0;     // wgmma shares that read the word and are not yet waited for
  int wgmma_reader = -1;       // the thread of the last of them
  uint64_t writer_fences = 0;  // the writer's proxy_fences when the copy landed
};

BlockRun* running = nullptr;
std::vector<std::unique_ptr<char[]>> free_stacks;
std::vector<float> shared_memory;
std::vector<SharedWordAccess> shared_access;  // per word of shared_memory
int launch_error = 0;
std::string launch_error_text;
std::map<const void*, int> max_dynamic_shared_bytes;

std::string dim_text(const EmulatedDim& d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

int warp_lanes(const BlockRun& run, int warp) {
  return std::min(kWarpSize, run.threads - warp * kWarpSize);
}

void set_current_thread(BlockRun& run, int t) {
  run.current = t;
  const unsigned linear = static_cast<unsigned>(t);
  threadIdx = EmulatedDim(linear % blockDim.x, linear / blockDim.x % blockDim.y,
                          linear / (blockDim.x * blockDim.y));
}

// Fiber side: back to the scheduler; returns when the scheduler resumes this fiber. `exiting`:
// the fiber is never resumed.
void switch_to_scheduler(bool exiting) {
  BlockRun& run = *running;
  Fiber& fiber = *run.current_fiber;
#ifdef GNMR_EMULATED_CUDA_ASAN
  if (exiting) fiber.exit_frame = static_cast<char*>(__builtin_frame_address(0));
  __sanitizer_start_switch_fiber(exiting ? nullptr : &fiber.asan_fake_stack,
                                 run.scheduler_stack_bottom, run.scheduler_stack_size);
#else
  (void)exiting;
#endif
  fiber_switch(fiber.context, run.scheduler);
#ifdef GNMR_EMULATED_CUDA_ASAN
  __sanitizer_finish_switch_fiber(fiber.asan_fake_stack, &running->scheduler_stack_bottom,
                                  &running->scheduler_stack_size);
#endif
}

// Fiber side: stop the running thread with an error the scheduler throws. Thrown inside the
// fiber and caught where it starts, so the thread's frames unwind (nothing they own leaks).
struct ThreadFailure {
  std::string what;
};

[[noreturn]] void fail_in_thread(const std::string& what) {
  throw ThreadFailure{"block " + dim_text(blockIdx) + ", thread " + dim_text(threadIdx) + ": " +
                      what};
}

void fiber_entry() {
#ifdef GNMR_EMULATED_CUDA_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &running->scheduler_stack_bottom,
                                  &running->scheduler_stack_size);
#endif
  BlockRun& run = *running;
  try {
    while (run.next_unstarted < run.threads) {
      const int t = run.next_unstarted++;
      set_current_thread(run, t);
      run.fiber_of[size_t(t)] = run.current_fiber;
      run.state[size_t(t)] = ThreadState::kRunning;
      (*run.kernel)();
      if (!run.async_open[size_t(t)].empty() || !run.async_committed[size_t(t)].empty()) {
        fail_in_thread("returned with cp.async copies it never waited for");
      }
      if (!run.wgmma_open[size_t(t)].empty() || !run.wgmma_committed[size_t(t)].empty()) {
        fail_in_thread("returned with wgmma products it never waited for");
      }
      run.state[size_t(t)] = ThreadState::kDone;
      ++run.done;
    }
  } catch (const ThreadFailure& failure) {
    run.failure = failure.what;
  } catch (const std::exception& e) {
    run.failure = "block " + dim_text(blockIdx) + ", thread " + dim_text(threadIdx) +
                  ": the kernel threw: " + e.what();
  }
  run.current_fiber->finished = true;
  switch_to_scheduler(true);
  std::abort();  // never resumed
}

std::unique_ptr<char[]> take_stack() {
  if (free_stacks.empty()) return std::make_unique<char[]>(kFiberStackBytes);
  std::unique_ptr<char[]> stack = std::move(free_stacks.back());
  free_stacks.pop_back();
  return stack;
}

void give_back_stack(std::unique_ptr<char[]> stack, const char* exit_frame) {
#ifdef GNMR_EMULATED_CUDA_ASAN
  // A finished fiber's frames never returned (fiber_entry's and switch_to_scheduler's): clear
  // what ASan marked in them. Every frame below them returned and cleared its own marks, so
  // only the stack above the last frame, and a margin below it for that frame's locals, is
  // cleared: the whole 256 KiB, 32 KiB of ASan's shadow, for each of a block's fibers was 15%
  // of an emulated training step's time.
  const char* top = stack.get() + kFiberStackBytes;
  const char* from = stack.get();
  if (exit_frame != nullptr && exit_frame - stack.get() > ptrdiff_t(kExitFrameMargin)) {
    from = exit_frame - kExitFrameMargin;
  }
  ASAN_UNPOISON_MEMORY_REGION(from, size_t(top - from));
#else
  (void)exit_frame;
#endif
  free_stacks.push_back(std::move(stack));
}

// Scheduler side: run `fiber` until it waits or finishes.
void resume(BlockRun& run, Fiber& fiber) {
  run.current_fiber = &fiber;
#ifdef GNMR_EMULATED_CUDA_ASAN
  void* scheduler_fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&scheduler_fake_stack, fiber.stack.get(), kFiberStackBytes);
#endif
  fiber_switch(run.scheduler, fiber.context);
#ifdef GNMR_EMULATED_CUDA_ASAN
  __sanitizer_finish_switch_fiber(scheduler_fake_stack, nullptr, nullptr);
#endif
  if (fiber.finished) give_back_stack(std::move(fiber.stack), fiber.exit_frame);
}

// Scheduler side: a new fiber for the threads not yet started.
Fiber& new_fiber(BlockRun& run) {
  run.fibers.push_back(std::make_unique<Fiber>());
  Fiber& fiber = *run.fibers.back();
  fiber.stack = take_stack();
  fiber_prepare(fiber.context, fiber.stack.get(), kFiberStackBytes, fiber_entry);
  return fiber;
}

std::string stuck_text(const BlockRun& run) {
  int at_block = 0, at_warp = 0;
  for (const ThreadState s : run.state) {
    at_block += s == ThreadState::kAtBlockBarrier;
    at_warp += s == ThreadState::kAtWarpBarrier;
  }
  return "block " + dim_text(blockIdx) + " of " + std::to_string(run.threads) +
         " threads cannot go on: " + std::to_string(at_block) + " wait at __syncthreads, " +
         std::to_string(at_warp) + " at a warp-wide shuffle or mma, " + std::to_string(run.done) +
         " returned (a barrier in code some threads of the block or warp never reach: a hang "
         "or undefined behaviour on a GPU)";
}

void throw_failure(const std::string& what) {
  running = nullptr;
  throw std::logic_error("emulated CUDA: " + what);
}

void run_block(const std::function<void()>& kernel, int threads) {
  BlockRun run;
  run.kernel = &kernel;
  run.threads = threads;
  run.state.assign(size_t(threads), ThreadState::kNotStarted);
  run.fiber_of.assign(size_t(threads), nullptr);
  const int warps = (threads + kWarpSize - 1) / kWarpSize;
  run.warp_arrived.assign(size_t(warps), 0);
  run.warp_exchanges.resize(size_t(2 * warps));
  run.exchange_turn.assign(size_t(threads), 0);
  run.async_committed.resize(size_t(threads));
  run.async_open.resize(size_t(threads));
  run.wgmma_committed.resize(size_t(threads));
  run.wgmma_open.resize(size_t(threads));
  run.proxy_fences.assign(size_t(threads), 0);
  run.wgmma_fenced.assign(size_t(threads), 0);
  run.warpgroup_wgmma.resize(size_t((threads + kWarpgroupThreads - 1) / kWarpgroupThreads));
  run.wgmma_issued.assign(size_t(threads), 0);
  running = &run;
  while (run.done < threads) {
    bool ran = false;
    for (int t = 0; t < threads && run.ready > 0; ++t) {
      if (run.state[size_t(t)] != ThreadState::kReady) continue;
      set_current_thread(run, t);
      run.state[size_t(t)] = ThreadState::kRunning;
      --run.ready;
      resume(run, *run.fiber_of[size_t(t)]);
      ran = true;
      if (!run.failure.empty()) throw_failure(run.failure);
    }
    if (run.next_unstarted < threads) {
      resume(run, new_fiber(run));
      ran = true;
      if (!run.failure.empty()) throw_failure(run.failure);
    }
    if (!ran) throw_failure(stuck_text(run));
  }
  for (int t = 0; t < threads; ++t) {
    const size_t group_issued = run.warpgroup_wgmma[size_t(t / kWarpgroupThreads)].size();
    if (run.wgmma_issued[size_t(t)] != group_issued) {
      throw_failure("block " + dim_text(blockIdx) + ": thread " + std::to_string(t) + " issued " +
                    std::to_string(run.wgmma_issued[size_t(t)]) + " wgmma, another of its " +
                    "warpgroup " + std::to_string(group_issued) +
                    " (every thread of a warpgroup issues the same wgmma: .sync.aligned)");
    }
  }
  running = nullptr;
}

void run_grid(const std::function<void()>& kernel, EmulatedDim grid, EmulatedDim block,
              size_t shared_floats) {
  gridDim = grid;
  blockDim = block;
  const int threads = static_cast<int>(block.volume());
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = EmulatedDim(x, y, z);
        shared_memory.assign(std::max<size_t>(shared_floats, 1), std::nanf(""));
        shared_access.assign(shared_memory.size(), SharedWordAccess{});
        run_block(kernel, threads);
      }
    }
  }
}

// Fiber side: wait until all `expected` threads counted by `arrived` are here.
void arrive_and_wait(int& arrived, int expected, ThreadState waiting) {
  BlockRun& run = *running;
  if (++arrived == expected) {
    arrived = 0;
    const bool whole_block = waiting == ThreadState::kAtBlockBarrier;
    if (whole_block) ++run.barriers;
    const int first = whole_block ? 0 : run.current / kWarpSize * kWarpSize;
    const int last = whole_block ? run.threads : first + kWarpSize;
    for (int t = first; t < last; ++t) {
      if (run.state[size_t(t)] == waiting) {
        run.state[size_t(t)] = ThreadState::kReady;
        ++run.ready;
      }
    }
    return;
  }
  run.state[size_t(run.current)] = waiting;
  switch_to_scheduler(false);
}

// Fiber side: the running thread's next exchange of its warp.
WarpExchange& next_exchange(int warp) {
  BlockRun& run = *running;
  unsigned char& turn = run.exchange_turn[size_t(run.current)];
  WarpExchange& x = run.warp_exchanges[size_t(2 * warp + turn)];
  turn ^= 1;
  return x;
}

// Fiber side: a warp-wide operation needs all 32 lanes.
int full_warp(unsigned mask, const char* what) {
  BlockRun& run = *running;
  const int warp = run.current / kWarpSize;
  if (mask != 0xFFFFFFFFu) {
    fail_in_thread(std::string(what) + " with a partial lane mask: the emulation has full-warp " +
                   "operations only");
  }
  if (warp_lanes(run, warp) != kWarpSize) {
    fail_in_thread(std::string(what) + " in a warp of " + std::to_string(warp_lanes(run, warp)) +
                   " threads (the block's size is not a multiple of 32)");
  }
  return warp;
}

}  // namespace

void emulated_kernel_launch(const std::function<void()>& kernel, const void* kernel_id,
                            EmulatedDim grid, EmulatedDim block, size_t shared_bytes,
                            const void* /*stream*/) {
  const auto fail = [](int error, const std::string& text) {
    launch_error = error;
    launch_error_text = "emulated launch: " + text;
  };
  if (grid.volume() == 0 || block.volume() == 0) {
    return fail(kCudaErrorInvalidConfiguration,
                "empty grid " + dim_text(grid) + " or block " + dim_text(block));
  }
  if (block.x > 1024 || block.y > 1024 || block.z > 64 || block.volume() > 1024) {
    return fail(kCudaErrorInvalidConfiguration,
                "block " + dim_text(block) + " exceeds 1024 threads or a dimension's limit");
  }
  if (grid.x > 0x7FFFFFFFu || grid.y > 65535 || grid.z > 65535) {
    return fail(kCudaErrorInvalidConfiguration, "grid " + dim_text(grid) + " exceeds a limit");
  }
  const auto raised = max_dynamic_shared_bytes.find(kernel_id);
  const size_t limit = raised == max_dynamic_shared_bytes.end()
                           ? size_t{kEmulatedSharedBytesDefault}
                           : size_t(std::max(raised->second, kEmulatedSharedBytesDefault));
  if (shared_bytes > limit) {
    return fail(kCudaErrorInvalidValue,
                std::to_string(shared_bytes) + " bytes of dynamic shared memory, above the " +
                    std::to_string(limit) +
                    " the kernel may use (cudaFuncSetAttribute raises it up to " +
                    std::to_string(kEmulatedSharedBytesOptin) + ")");
  }
  run_grid(kernel, grid, block, (shared_bytes + sizeof(float) - 1) / sizeof(float));
}

void emulated_launch(int64_t blocks, int threads, int64_t shared_floats,
                     const std::function<void()>& kernel) {
  if (threads <= 0 || threads % kWarpSize != 0) {
    throw std::invalid_argument("emulated_launch: " + std::to_string(threads) +
                                " threads per block, not a positive multiple of 32");
  }
  run_grid(kernel, EmulatedDim(blocks), EmulatedDim(threads),
           size_t(std::max<int64_t>(shared_floats, 0)));
}

float* emulated_shared_memory() {
  return shared_memory.data();
}

void emulated_syncthreads() {
  arrive_and_wait(running->block_arrived, running->threads, ThreadState::kAtBlockBarrier);
}

void emulated_syncwarp() {
  const int warp = full_warp(0xFFFFFFFFu, "__syncwarp");
  arrive_and_wait(running->warp_arrived[size_t(warp)], kWarpSize, ThreadState::kAtWarpBarrier);
}

int emulated_take_launch_error(bool clear) {
  const int error = launch_error;
  if (clear) launch_error = 0;
  return error;
}

const char* emulated_launch_error_text() {
  return launch_error_text.c_str();
}

void emulated_set_max_dynamic_shared_bytes(const void* kernel_id, int bytes) {
  max_dynamic_shared_bytes[kernel_id] = bytes;
}

void emulated_shfl_xor(unsigned mask, const void* in, void* out, size_t bytes, int lane_mask) {
  const int warp = full_warp(mask, "__shfl_xor_sync");
  if (bytes > kMaxShuffleBytes) fail_in_thread("a shuffle of more than 16 bytes");
  const int lane = running->current % kWarpSize, source = lane ^ lane_mask;
  WarpExchange& x = next_exchange(warp);
  std::memcpy(x.bytes[lane], in, bytes);
  emulated_syncwarp();
  // A source lane outside the warp returns the caller's own value, as CUDA defines it.
  std::memcpy(out, x.bytes[source >= 0 && source < kWarpSize ? source : lane], bytes);
}

namespace {

// Element i of a bf16 fragment whose pairs are `pairs` (element 2 j in pair j's low half).
float fragment_element(const uint32_t pairs[], int i) {
  const uint32_t pair = pairs[i / 2];
  return decode_bf16(i % 2 == 0 ? bf16_pair_low(pair) : bf16_pair_high(pair));
}

// The lane's A fragment (mma.sync m16n8k16's, also a register-A wgmma's) into its warp's
// exchange: each lane places its own elements (every element of A is one lane's), so they are
// decoded once a warp, not by every lane (the long-sequence tensor-core attention test, emulated
// preset: 179 s when each lane decoded all of them, 79 s then).
void place_a_fragment(WarpExchange& x, const uint32_t a[4], int lane) {
  for (int i = 0; i < kMmaAElements; ++i) {
    x.a[mma_a_row(lane, i)][mma_a_col(lane, i)] = fragment_element(a, i);
  }
}

}  // namespace

void mma_bf16_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  const int warp = full_warp(0xFFFFFFFFu, "mma.sync");
  const int lane = running->current % kWarpSize;
  WarpExchange& x = next_exchange(warp);
  place_a_fragment(x, a, lane);
  for (int i = 0; i < kMmaBElements; ++i) {
    x.b[mma_b_row(lane, i)][mma_b_col(lane, i)] = fragment_element(b, i);
  }
  emulated_syncwarp();
  for (int i = 0; i < kMmaCElements; ++i) {  // d is the lane's own: read, then written
    const int row = mma_c_row(lane, i), col = mma_c_col(lane, i);
    double sum = d[i];
    for (int kk = 0; kk < kMmaK; ++kk) sum += double(x.a[row][kk]) * double(x.b[kk][col]);
    d[i] = float(sum);
  }
}

namespace {

// Races on shared memory between the cp.async copies and the ldmatrix reads of a block's
// threads (SharedWordAccess): two accesses of one word by different threads, at least one a
// copy, conflict unless a __syncthreads lies between them, and the copy's side of it is its
// landing (its thread's wait), not its issue. The GPU's outcome would depend on timing; here it
// is an error naming both threads.
size_t shared_word(const void* at) {
  const auto* start = reinterpret_cast<const unsigned char*>(shared_memory.data());
  return size_t(static_cast<const unsigned char*>(at) - start) / sizeof(float);
}

std::string thread_text(int thread) {
  return thread == -2 ? "other threads" : "thread " + std::to_string(thread);
}

// Thread `me` reads the word now (an ldmatrix, or a wgmma's share at its wait).
void note_shared_read(SharedWordAccess& a, int me) {
  a.reader = a.read == running->barriers && a.reader != me ? -2 : me;
  a.read = running->barriers;
}

// The running thread reads `bytes` at `at` (an ldmatrix row, a vector load, or a word a wgmma
// reads at its issue; emulated_wgmma_wait_group records the wgmma's read again at its wait).
// `what` and `lane` name the instruction; the text is made only for an error (this runs for
// every ldmatrix, and a string a call was a heap allocation each).
void check_shared_read(const void* at, size_t bytes, const char* what, int lane) {
  const BlockRun& run = *running;
  const int me = run.current;
  const auto name = [&] { return std::string(what) + " (lane " + std::to_string(lane) + ")"; };
  for (size_t w = shared_word(at), end = w + bytes / sizeof(float); w < end; ++w) {
    SharedWordAccess& a = shared_access[w];
    if (a.writer >= 0 && a.landed == SharedWordAccess::kPending) {
      fail_in_thread(name() + " reads byte " + std::to_string(4 * w) + " of shared memory, which " +
                     thread_text(a.writer) +
                     "'s cp.async is still writing (no cp.async.wait_group of its group yet)");
    }
    if (a.writer >= 0 && a.writer != me && a.landed == run.barriers) {
      fail_in_thread(name() + " reads byte " + std::to_string(4 * w) + " of shared memory, which " +
                     thread_text(a.writer) +
                     "'s cp.async wrote with no __syncthreads between its wait and this read");
    }
    note_shared_read(a, me);
  }
}

// A cp.async's name in an error; made only for one (a string a call was a heap allocation).
std::string cp_async_text(size_t bytes) {
  return "cp.async of " + std::to_string(bytes) + " bytes";
}

// The running thread issues a cp.async of `bytes` to `at`.
void check_shared_write(const void* at, size_t bytes) {
  const BlockRun& run = *running;
  const int me = run.current;
  const auto name = [bytes] { return cp_async_text(bytes); };
  for (size_t w = shared_word(at), end = w + bytes / sizeof(float); w < end; ++w) {
    SharedWordAccess& a = shared_access[w];
    if (a.wgmma_in_flight > 0) {
      fail_in_thread(name() + " overwrites byte " + std::to_string(4 * w) +
                     " of shared memory, which " + thread_text(a.wgmma_reader) +
                     "'s wgmma is still reading (no wgmma.wait_group of its group yet)");
    }
    if (a.read == run.barriers && a.reader != me) {
      fail_in_thread(
          name() + " overwrites byte " + std::to_string(4 * w) + " of shared memory, which " +
          thread_text(a.reader) +
          " read (ldmatrix, wgmma or a vector load) with no __syncthreads between (the copy may "
          "land first)");
    }
    if (a.writer >= 0 && a.writer != me &&
        (a.landed == SharedWordAccess::kPending || a.landed == run.barriers)) {
      fail_in_thread(name() + " writes byte " + std::to_string(4 * w) +
                     " of shared memory, which " + thread_text(a.writer) +
                     "'s cp.async also writes with no __syncthreads between");
    }
    a.writer = me;
    a.landed = SharedWordAccess::kPending;
  }
}

// The running thread's copy to `at` landed (its wait).
void mark_landed(const void* at, size_t bytes) {
  const uint64_t fences = running->proxy_fences[size_t(running->current)];
  for (size_t w = shared_word(at), end = w + bytes / sizeof(float); w < end; ++w) {
    shared_access[w].landed = running->barriers;
    shared_access[w].writer_fences = fences;
  }
}

void ldmatrix_m8n8_x4(uint32_t r[4], const uint16_t* row, bool trans) {
  const char* what = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
  const int warp = full_warp(0xFFFFFFFFu, what);
  const int lane = running->current % kWarpSize;
  const auto* start = reinterpret_cast<const unsigned char*>(shared_memory.data());
  const auto* at = reinterpret_cast<const unsigned char*>(row);
  constexpr size_t kRowBytes = kLdmatrixRows * sizeof(uint16_t);
  if (at < start || at + kRowBytes > start + shared_memory.size() * sizeof(float)) {
    fail_in_thread(std::string(what) + ": lane " + std::to_string(lane) +
                   "'s row address is outside the block's dynamic shared memory");
  }
  if ((at - start) % 16 != 0) {
    fail_in_thread(std::string(what) + ": lane " + std::to_string(lane) +
                   "'s row address is not 16-byte aligned (byte " + std::to_string(at - start) +
                   " of shared memory)");
  }
  check_shared_read(row, kRowBytes, what, lane);
  // Each lane reads its own row now, so what the warp receives is shared memory as it was at
  // the instruction, whatever a lane that runs on first writes afterwards.
  WarpExchange& x = next_exchange(warp);
  std::memcpy(x.rows[lane], row, kRowBytes);
  emulated_syncwarp();
  for (int j = 0; j < kLdmatrixMatrices; ++j) {
    uint16_t half_value[2];
    for (int half = 0; half < 2; ++half) {
      const int provider = kLdmatrixRows * j + ldmatrix_element_row(lane, half, trans);
      half_value[half] = x.rows[provider][ldmatrix_element_col(lane, half, trans)];
    }
    r[j] = pack_bf16_pair(half_value[0], half_value[1]);
  }
}

}  // namespace

namespace {

// cp.async of `size` bytes (4 or 16, aligned to it), `src_bytes` of them read, the rest zero.
void record_cp_async(void* dst, const void* src, int size, int src_bytes) {
  BlockRun& run = *running;
  const auto* start = reinterpret_cast<const unsigned char*>(shared_memory.data());
  const auto* at = static_cast<const unsigned char*>(dst);
  const auto what = [size] { return cp_async_text(size_t(size)); };
  if (at < start || at + size > start + shared_memory.size() * sizeof(float)) {
    fail_in_thread(what() + " to an address outside the block's dynamic shared memory");
  }
  if ((at - start) % size != 0 || reinterpret_cast<uintptr_t>(src) % uintptr_t(size) != 0) {
    fail_in_thread(what() + " with an address off a " + std::to_string(size) + "-byte boundary");
  }
  if (src_bytes != 0 && src_bytes != size) {
    fail_in_thread(what() + " with a source size of " + std::to_string(src_bytes) +
                   " bytes (the kernels copy all or zero-fill)");
  }
  check_shared_write(dst, size_t(size));
  run.async_open[size_t(run.current)].push_back(AsyncCopy{dst, src, size, src_bytes});
}

}  // namespace

void cp_async_16(void* dst, const void* src, int src_bytes) {
  record_cp_async(dst, src, 16, src_bytes);
}

void cp_async_4(void* dst, const void* src, int src_bytes) {
  record_cp_async(dst, src, 4, src_bytes);
}

void cp_async_commit_group() {
  BlockRun& run = *running;
  auto& open = run.async_open[size_t(run.current)];
  run.async_committed[size_t(run.current)].push_back(std::move(open));
  open.clear();
}

void emulated_cp_async_wait_group(int pending) {
  BlockRun& run = *running;
  auto& groups = run.async_committed[size_t(run.current)];
  while (int(groups.size()) > pending) {
    for (const AsyncCopy& c : groups.front()) {
      std::memcpy(c.dst, c.src, size_t(c.src_bytes));
      std::memset(static_cast<unsigned char*>(c.dst) + c.src_bytes, 0,
                  size_t(c.size - c.src_bytes));
      mark_landed(c.dst, size_t(c.size));
    }
    groups.erase(groups.begin());
  }
}

namespace {

// A vector load from shared memory is a read the races are checked against, as an ldmatrix's.
void check_vector_load(const float* p, size_t bytes, const char* what) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  const auto start = reinterpret_cast<uintptr_t>(shared_memory.data());
  if (at >= start && at + bytes <= start + shared_memory.size() * sizeof(float)) {
    check_shared_read(p, bytes, what, running->current % kWarpSize);
  }
}

}  // namespace

void load_float4(const float* p, float v[4]) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    fail_in_thread("a 16-byte load from an address off a 16-byte boundary");
  }
  check_vector_load(p, 16, "a 16-byte load");
  for (int i = 0; i < 4; ++i) v[i] = p[i];
}

void load_float2(const float* p, float v[2]) {
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0) {
    fail_in_thread("an 8-byte load from an address off an 8-byte boundary");
  }
  check_vector_load(p, 8, "an 8-byte load");
  v[0] = p[0], v[1] = p[1];
}

void store_bf16x4(uint16_t* p, uint32_t low, uint32_t high) {
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0) {
    fail_in_thread("an 8-byte store to an address off an 8-byte boundary");
  }
  p[0] = uint16_t(low), p[1] = uint16_t(low >> 16), p[2] = uint16_t(high),
  p[3] = uint16_t(high >> 16);
}

uint32_t pack_bf16x2_rn(float low, float high) {
  return pack_bf16_pair(encode_bf16(low), encode_bf16(high));
}

uint32_t shared_space_address(const void* p) {
  const auto* start = reinterpret_cast<const unsigned char*>(shared_memory.data());
  const auto* at = static_cast<const unsigned char*>(p);
  if (at < start || at >= start + shared_memory.size() * sizeof(float)) {
    fail_in_thread("cvta.to.shared of an address outside the block's dynamic shared memory");
  }
  return uint32_t(at - start);
}

namespace {

constexpr int kWgmmaColumnBlocks = kWgmmaN / kMmaN;
// At most the words a thread's share of a wgmma reads: two rows of A and 16 columns of B, 16
// elements each, one word apiece at worst.
constexpr int kWgmmaReadWords = (2 + 2 * kWgmmaColumnBlocks) * kWgmmaK;

// The bf16 element at shared-state-space byte `address`, as a wgmma reads it: inside the
// block's shared memory, and no cp.async still writing it (check_shared_read). Its word joins
// `words`, those the wgmma reads until its wait.
float wgmma_shared_element(uint32_t address, const char* what, int lane,
                           std::vector<uint32_t>& words) {
  const size_t bytes = shared_memory.size() * sizeof(float);
  if (size_t(address) + 2 > bytes) {
    fail_in_thread(std::string(what) + ": lane " + std::to_string(lane) + " reads byte " +
                   std::to_string(address) + ", outside the block's " + std::to_string(bytes) +
                   " bytes of dynamic shared memory");
  }
  const auto* start = reinterpret_cast<const unsigned char*>(shared_memory.data());
  if (words.empty() || words.back() != address / 4) {  // the word's checks, once in a row
    check_shared_read(start + (address & ~3u), 4, what, lane);
    const SharedWordAccess& a = shared_access[address / 4];
    if (a.writer >= 0 && running->proxy_fences[size_t(a.writer)] == a.writer_fences) {
      fail_in_thread(std::string(what) + ": lane " + std::to_string(lane) + " reads byte " +
                     std::to_string(address) + " of shared memory, which " + thread_text(a.writer) +
                     "'s cp.async wrote with no fence.proxy.async.shared::cta after it landed "
                     "(the tensor cores may read the old bytes)");
    }
    words.push_back(address / 4);
  }
  uint16_t code;
  std::memcpy(&code, start + address, sizeof code);
  return decode_bf16(code);
}

void check_wgmma_descriptor(uint64_t desc, const char* what) {
  if (wgmma_descriptor_swizzle(desc) != 0 || wgmma_descriptor_base_offset(desc) != 0) {
    fail_in_thread(std::string(what) +
                   ": a descriptor with a swizzle or base offset, which the emulation does not "
                   "read (src/backend/wgmma_operand.h describes no-swizzle operands only)");
  }
}

// emulated_set_wgmma_rounds_toward_zero: a test's stand-in for a GPU whose wgmma rounds its
// sums otherwise than its mma.sync.
bool wgmma_rounds_toward_zero = false;

// x rounded to a float toward zero.
float float_toward_zero(double x) {
  const float f = float(x);
  return std::fabs(double(f)) > std::fabs(x) ? std::nextafter(f, 0.0f) : f;
}

// The running thread's share of a wgmma: its 32 outputs (rows mma_c_row of its warp's 16,
// columns 8 j + mma_c_col), from `a_rows` (its two rows of A: row group and group + 8, 16
// elements each) and B read through `b_desc`, onto d's pending product if one is in flight.
// `words`: those A's rows were read from (none for A in registers); with B's, they stay the
// wgmma's (wgmma_in_flight) until the wait.
void issue_wgmma(float d[][kMmaCElements], const float a_rows[2][kWgmmaK], uint64_t b_desc,
                 bool b_mn_major, int scale_d, const char* what, std::vector<uint32_t> words) {
  BlockRun& run = *running;
  const int me = run.current, lane = me % kWarpSize;
  check_wgmma_descriptor(b_desc, what);
  const float(*acc)[kMmaCElements] = d;
  for (const auto& group : run.wgmma_committed[size_t(me)]) {
    for (const PendingWgmma& p : group) {
      if (p.d == d) acc = p.result;
    }
  }
  for (const PendingWgmma& p : run.wgmma_open[size_t(me)]) {
    if (p.d == d) acc = p.result;
  }
  PendingWgmma pending{d, {}, {}};
  for (int j = 0; j < kWgmmaColumnBlocks; ++j) {
    // The lane's two columns of B, read in the order that meets each word's two elements one
    // after the other (wgmma_shared_element checks a word once in a row): along K where K is
    // contiguous, across the column pair where N is.
    float b[2][kWgmmaK];
    const auto read = [&](int c, int k) {
      b[c][k] = wgmma_shared_element(
          wgmma_operand_byte(b_desc, b_mn_major, kMmaN * j + mma_c_col(lane, c), k), what, lane,
          words);
    };
    for (int outer = 0; outer < (b_mn_major ? kWgmmaK : 2); ++outer) {
      for (int inner = 0; inner < (b_mn_major ? 2 : kWgmmaK); ++inner) {
        b_mn_major ? read(inner, outer) : read(outer, inner);
      }
    }
    for (int c = 0; c < 2; ++c) {
      for (int half = 0; half < 2; ++half) {
        const int i = 2 * half + c;  // element (row group + 8 half, column 8 j + mma_c_col)
        double sum = scale_d != 0 ? double(acc[j][i]) : 0.0;
        for (int k = 0; k < kWgmmaK; ++k) sum += double(a_rows[half][k]) * double(b[c][k]);
        pending.result[j][i] = wgmma_rounds_toward_zero ? float_toward_zero(sum) : float(sum);
      }
    }
  }
  for (const uint32_t w : words) {
    ++shared_access[w].wgmma_in_flight;
    shared_access[w].wgmma_reader = me;
  }
  pending.words = std::move(words);
  run.wgmma_open[size_t(me)].push_back(std::move(pending));
}

// An empty list for a wgmma's words, with room for them.
std::vector<uint32_t> wgmma_words() {
  std::vector<uint32_t> words;
  words.reserve(kWgmmaReadWords);
  return words;
}

// The warp that issues a wgmma: a whole one, in a block of whole warpgroups, fenced since its
// last wait (wgmma_fence), and the same wgmma as the warpgroup's other threads issued as their
// same-numbered one (the block's end checks that none issued more).
int wgmma_warp(const char* what, const WgmmaIssue& issue) {
  BlockRun& run = *running;
  const int me = run.current;
  if (!run.wgmma_fenced[size_t(me)]) {
    fail_in_thread(std::string(what) +
                   " with no wgmma.fence since the thread began or last ran wgmma.wait_group");
  }
  const int warp = full_warp(0xFFFFFFFFu, what);
  if (run.threads % kWarpgroupThreads != 0) {
    fail_in_thread(std::string(what) + " in a block of " + std::to_string(run.threads) +
                   " threads, not whole warpgroups of 128");
  }
  std::vector<WgmmaIssue>& issued = run.warpgroup_wgmma[size_t(me / kWarpgroupThreads)];
  size_t& n = run.wgmma_issued[size_t(me)];
  if (n == issued.size()) {
    issued.push_back(issue);
  } else if (!(issued[n] == issue)) {
    fail_in_thread(std::string(what) + " number " + std::to_string(n + 1) +
                   " of the thread differs from its warpgroup's (form, descriptors or scale_d): " +
                   "every thread of a warpgroup issues the same wgmma (.sync.aligned)");
  }
  ++n;
  return warp;
}

}  // namespace

void wgmma_m64n64k16_ss(float d[][kMmaCElements], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  const char* what = "wgmma.m64n64k16 (A, B in shared memory)";
  const int warp = wgmma_warp(what, {false, a_desc, b_desc, scale_d});
  const int lane = running->current % kWarpSize;
  check_wgmma_descriptor(a_desc, what);
  float a_rows[2][kWgmmaK];
  std::vector<uint32_t> words = wgmma_words();
  for (int half = 0; half < 2; ++half) {
    const int m = kMmaM * (warp % 4) + mma_group(lane) + 8 * half;
    for (int k = 0; k < kWgmmaK; ++k) {
      a_rows[half][k] =
          wgmma_shared_element(wgmma_operand_byte(a_desc, false, m, k), what, lane, words);
    }
  }
  emulated_syncwarp();  // .sync.aligned: the whole warp issues it
  issue_wgmma(d, a_rows, b_desc, false, scale_d, what, std::move(words));
}

void wgmma_m64n64k16_rs_trans_b(float d[][kMmaCElements], const uint32_t a[4], uint64_t b_desc,
                                int scale_d) {
  const char* what = "wgmma.m64n64k16 (A in registers, B MN-major)";
  const int warp = wgmma_warp(what, {true, 0, b_desc, scale_d});
  const int lane = running->current % kWarpSize;
  WarpExchange& x = next_exchange(warp);
  place_a_fragment(x, a, lane);
  emulated_syncwarp();
  float a_rows[2][kWgmmaK];
  for (int half = 0; half < 2; ++half) {
    for (int k = 0; k < kWgmmaK; ++k) a_rows[half][k] = x.a[mma_group(lane) + 8 * half][k];
  }
  issue_wgmma(d, a_rows, b_desc, true, scale_d, what, wgmma_words());
}

void emulated_set_wgmma_rounds_toward_zero(bool on) {
  wgmma_rounds_toward_zero = on;
}

void wgmma_fence() {
  running->wgmma_fenced[size_t(running->current)] = 1;
}

void fence_proxy_async_shared() {
  ++running->proxy_fences[size_t(running->current)];
}

void wgmma_commit_group() {
  BlockRun& run = *running;
  auto& open = run.wgmma_open[size_t(run.current)];
  run.wgmma_committed[size_t(run.current)].push_back(std::move(open));
  open.clear();
}

void emulated_wgmma_wait_group(int pending) {
  BlockRun& run = *running;
  run.wgmma_fenced[size_t(run.current)] = 0;
  auto& groups = run.wgmma_committed[size_t(run.current)];
  while (int(groups.size()) > pending) {
    for (const PendingWgmma& p : groups.front()) {
      std::memcpy(p.d, p.result, sizeof p.result);
      for (const uint32_t w : p.words) {  // read until now: a copy needs a barrier after this
        SharedWordAccess& a = shared_access[w];
        --a.wgmma_in_flight;
        note_shared_read(a, run.current);
      }
    }
    groups.erase(groups.begin());
  }
}

void ldmatrix_x4(uint32_t r[4], const uint16_t* row) {
  ldmatrix_m8n8_x4(r, row, false);
}

void ldmatrix_x4_trans(uint32_t r[4], const uint16_t* row) {
  ldmatrix_m8n8_x4(r, row, true);
}

}  // namespace gnmr::cuda
