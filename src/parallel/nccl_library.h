// NCCL, loaded when a run first asks for it (dlopen), not linked (docs/DESIGN.md §7).
//
// Why not linked: a binary linked to libnccl does not start on a node without it, even for a
// CPU run; and the GPU check bundle (scripts/gpu_bundle.sh) cannot carry NCCL's 200 MB, so
// a linked build had to leave the nccl communicator out of it. Loaded, the same binary runs
// everywhere, and NCCL is found where the machine keeps it: a cluster's module
// (LD_LIBRARY_PATH), the CUDA toolkit gnmr was built against, or PyTorch's copy
// (GNMR_NCCL_LIBRARY=.../site-packages/nvidia/nccl/lib/libnccl.so.2).
//
// Only nccl.h's types come from the header; every call goes through NcclApi, whose members
// have the header's exact signatures (decltype of the declarations).
#pragma once

#include <nccl.h>

#include <string>
#include <vector>

#include "parallel/launch_env.h"

namespace gnmr {

struct NcclApi {
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&::ncclCommFinalize) CommFinalize = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclReduce) Reduce = nullptr;
  decltype(&::ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&::ncclAllGather) AllGather = nullptr;
  decltype(&::ncclGroupStart) GroupStart = nullptr;
  decltype(&::ncclGroupEnd) GroupEnd = nullptr;
  std::string path;  // the file the dynamic loader opened
  int version = 0;   // ncclGetVersion's code, e.g. 22805 for 2.28.5
};

// The oldest NCCL gnmr runs on: non-blocking communicators with a config
// (ncclCommInitRankConfig, ncclConfig_t.blocking) and ncclCommFinalize came in 2.14.
constexpr int kOldestNcclVersion = 21400;

// Where to look, in order. GNMR_NCCL_LIBRARY, when set, is the only candidate (the user
// named a file; falling back to another NCCL would hide that it is not used). Otherwise the
// dynamic loader's own search for libnccl.so.2 (LD_LIBRARY_PATH, ldconfig), then the
// library the build found (`build_library`, "" when none).
std::vector<std::string> nccl_library_candidates(const EnvLookup& lookup,
                                                 const std::string& build_library);

// Opens the first candidate that loads, resolves every NcclApi member and checks the version
// (major = the header's, at least kOldestNcclVersion). Throws Error(Runtime) naming every
// candidate tried with the loader's reason, a missing symbol, or the version. Never unloads.
NcclApi load_nccl_api(const std::vector<std::string>& candidates);

// The NCCL library the build found ("" when it found only the header): the last candidate.
std::string nccl_build_library();

// This process's NCCL: loaded on the first call from this environment's candidates, then the
// same. A failed load throws on every call (nothing is cached but success).
const NcclApi& nccl_api();

// "NCCL 2.28.5 (/usr/local/cuda/lib64/libnccl.so.2)", for the run log.
std::string describe_nccl(const NcclApi& api);

}  // namespace gnmr
