#include "parallel/nccl_library.h"

#include <dlfcn.h>
#include <link.h>

#include <memory>
#include <mutex>

#include "util/error.h"

#ifndef GNMR_NCCL_BUILD_LIBRARY
#define GNMR_NCCL_BUILD_LIBRARY ""
#endif

// An emulated CUDA build (GNMR_CUDA_EMULATED; docs/DESIGN.md §6) keeps "device" memory in host
// memory, which only the emulated NCCL (tests/emulated_cuda/emulated_nccl.cpp) can move; a GPU
// build's memory only a real NCCL can. Each refuses the other's, by the emulation's mark.
#ifdef GNMR_NCCL_EMULATED
constexpr bool kEmulatedBuild = true;
#else
constexpr bool kEmulatedBuild = false;
#endif

namespace gnmr {

namespace {

std::string version_text(int code) {
  // NCCL >= 2.9 codes versions as major * 10000 + minor * 100 + patch.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

template <typename Function>
void resolve(void* handle, const std::string& path, const char* symbol, Function& out) {
  dlerror();  // clear
  void* address = dlsym(handle, symbol);
  if (address == nullptr) {
    const char* why = dlerror();
    throw Error(ErrorKind::Runtime, std::string("NCCL library ") + path + " has no " + symbol +
                                        (why != nullptr ? std::string(" (") + why + ")" : "") +
                                        ": it is not an NCCL gnmr can use");
  }
  out = reinterpret_cast<Function>(address);
}

// The file the loader actually opened (a soname resolves through the search path).
std::string opened_path(void* handle, const std::string& fallback) {
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

}  // namespace

std::vector<std::string> nccl_library_candidates(const EnvLookup& lookup,
                                                 const std::string& build_library) {
  if (const auto named = lookup("GNMR_NCCL_LIBRARY"); named && !named->empty()) return {*named};
  std::vector<std::string> candidates = {"libnccl.so.2"};
  if (!build_library.empty()) candidates.push_back(build_library);
  return candidates;
}

namespace {

// The API of the library `handle` (opened as `candidate`): every entry point, and a version
// gnmr can use; Error(Runtime) naming the library otherwise.
NcclApi api_of(void* handle, const std::string& candidate) {
  NcclApi api;
  api.path = opened_path(handle, candidate);
  resolve(handle, api.path, "ncclGetVersion", api.GetVersion);
  resolve(handle, api.path, "ncclGetUniqueId", api.GetUniqueId);
  resolve(handle, api.path, "ncclCommInitRankConfig", api.CommInitRankConfig);
  resolve(handle, api.path, "ncclCommFinalize", api.CommFinalize);
  resolve(handle, api.path, "ncclCommDestroy", api.CommDestroy);
  resolve(handle, api.path, "ncclCommAbort", api.CommAbort);
  resolve(handle, api.path, "ncclCommGetAsyncError", api.CommGetAsyncError);
  resolve(handle, api.path, "ncclGetErrorString", api.GetErrorString);
  resolve(handle, api.path, "ncclGetLastError", api.GetLastError);
  resolve(handle, api.path, "ncclAllReduce", api.AllReduce);
  resolve(handle, api.path, "ncclBroadcast", api.Broadcast);
  resolve(handle, api.path, "ncclReduce", api.Reduce);
  resolve(handle, api.path, "ncclReduceScatter", api.ReduceScatter);
  resolve(handle, api.path, "ncclAllGather", api.AllGather);
  resolve(handle, api.path, "ncclGroupStart", api.GroupStart);
  resolve(handle, api.path, "ncclGroupEnd", api.GroupEnd);
  dlerror();
  const bool emulated = dlsym(handle, "gnmr_emulated_nccl") != nullptr;
  if (emulated != kEmulatedBuild) {
    throw Error(
        ErrorKind::Runtime,
        "NCCL library " + api.path +
            (kEmulatedBuild ? " is a real NCCL, and this is an emulated CUDA build (its "
                              "device memory is host memory): it takes the emulated NCCL"
                            : " is the emulated NCCL of a test build (tests/emulated_cuda), "
                              "which cannot move GPU memory"));
  }
  if (api.GetVersion(&api.version) != ncclSuccess) {
    throw Error(ErrorKind::Runtime, "NCCL library " + api.path + ": ncclGetVersion failed");
  }
  // The major version is the ABI (ncclConfig_t, the enums); within it newer libraries take
  // the configs of older headers.
  if (api.version / 10000 != NCCL_MAJOR || api.version < kOldestNcclVersion) {
    throw Error(ErrorKind::Runtime, "NCCL library " + api.path + " is version " +
                                        version_text(api.version) + "; gnmr needs " +
                                        std::to_string(NCCL_MAJOR) + ".x, at least " +
                                        version_text(kOldestNcclVersion));
  }
  return api;
}

}  // namespace

NcclApi load_nccl_api(const std::vector<std::string>& candidates) {
  GNMR_CHECK(!candidates.empty(), "load_nccl_api: no candidates");
  // A library that opens but cannot serve (too old, not NCCL: an old libnccl.so.2 first on the
  // loader's path) is passed over like one that does not open, so the build's own comes next.
  std::string tried;
  for (const std::string& candidate : candidates) {
    // RTLD_LOCAL: NCCL's symbols stay out of the global scope, so nothing else binds to them.
    void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + candidate + ": " + (why != nullptr ? why : "not loadable");
      continue;
    }
    try {
      return api_of(handle, candidate);
    } catch (const Error& e) {
      tried += "\n  " + candidate + ": " + e.what();
      dlclose(handle);
    }
  }
  throw Error(ErrorKind::Runtime,
              "NCCL could not be loaded; tried:" + tried +
                  "\nset GNMR_NCCL_LIBRARY to its libnccl.so.2 (a cluster module's, the CUDA "
                  "toolkit's, or PyTorch's site-packages/nvidia/nccl/lib/libnccl.so.2), or add "
                  "its directory to LD_LIBRARY_PATH");
}

std::string nccl_build_library() {
  return GNMR_NCCL_BUILD_LIBRARY;
}

const NcclApi& nccl_api() {
  static std::mutex mutex;
  static std::unique_ptr<NcclApi> api;
  std::lock_guard<std::mutex> lock(mutex);
  if (!api) {
    api = std::make_unique<NcclApi>(
        load_nccl_api(nccl_library_candidates(process_environment(), nccl_build_library())));
  }
  return *api;
}

std::string describe_nccl(const NcclApi& api) {
  return "NCCL " + version_text(api.version) + " (" + api.path + ")";
}

}  // namespace gnmr
