// NCCL loaded at run time (parallel/nccl_library.h): where it is looked for, the errors that
// name what went wrong, and the real library of this build's CUDA toolkit loading and
// answering ncclGetVersion. None of it needs a GPU.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "parallel/nccl_library.h"
#include "util/error.h"

namespace gnmr {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string load_error(const std::vector<std::string>& candidates) {
  try {
    load_nccl_api(candidates);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    return e.what();
  }
  ADD_FAILURE() << "load_nccl_api did not throw";
  return "";
}

TEST(NcclLibrary, TheLoadersSearchComesFirstAndTheBuildsLibraryLast) {
  EXPECT_EQ(nccl_library_candidates(env_of({}), "/opt/cuda/lib64/libnccl.so.2.28.5"),
            (std::vector<std::string>{"libnccl.so.2", "/opt/cuda/lib64/libnccl.so.2.28.5"}));
  EXPECT_EQ(nccl_library_candidates(env_of({}), ""), (std::vector<std::string>{"libnccl.so.2"}));
  EXPECT_EQ(nccl_library_candidates(env_of({{"GNMR_NCCL_LIBRARY", ""}}), "/b/libnccl.so"),
            (std::vector<std::string>{"libnccl.so.2", "/b/libnccl.so"}));
}

TEST(NcclLibrary, ANamedLibraryIsTheOnlyOneTried) {
  EXPECT_EQ(nccl_library_candidates(env_of({{"GNMR_NCCL_LIBRARY", "/site/nccl/libnccl.so.2"}}),
                                    "/opt/cuda/lib64/libnccl.so.2"),
            (std::vector<std::string>{"/site/nccl/libnccl.so.2"}));
}

TEST(NcclLibrary, AMissingLibraryNamesEveryPathTriedAndHowToPointAtOne) {
  const std::string message =
      load_error({"/nonexistent/a/libnccl.so.2", "/nonexistent/b/libnccl.so.2"});
  EXPECT_NE(message.find("/nonexistent/a/libnccl.so.2"), std::string::npos) << message;
  EXPECT_NE(message.find("/nonexistent/b/libnccl.so.2"), std::string::npos) << message;
  EXPECT_NE(message.find("GNMR_NCCL_LIBRARY"), std::string::npos) << message;
}

TEST(NcclLibrary, ALibraryThatIsNotNcclIsRefusedByName) {
  const std::string message = load_error({"libm.so.6"});
  EXPECT_NE(message.find("has no ncclGetVersion"), std::string::npos) << message;
}

// A library that opens but is not a usable NCCL (first on the loader's path, say) is passed
// over: the next candidate loads, and a failure names both.
TEST(NcclLibrary, ALibraryThatOpensButCannotServeIsPassedOverForTheNext) {
  const std::string message = load_error({"libm.so.6", "/nonexistent/libnccl.so.2"});
  EXPECT_NE(message.find("libm.so.6"), std::string::npos) << message;
  EXPECT_NE(message.find("has no ncclGetVersion"), std::string::npos) << message;
  EXPECT_NE(message.find("/nonexistent/libnccl.so.2"), std::string::npos) << message;
  if (nccl_build_library().empty()) GTEST_SKIP() << "the build found nccl.h but no libnccl";
  const NcclApi api = load_nccl_api({"libm.so.6", nccl_build_library()});
  EXPECT_EQ(api.version / 10000, NCCL_MAJOR);
}

// The build found the CUDA toolkit's libnccl: it loads, every entry point resolves, and its
// version has the header's major. (The loader's search may find another NCCL first, e.g. a
// cluster module's; any one that loads must pass the same checks.)
TEST(NcclLibrary, TheBuildsLibraryLoadsWithEveryEntryPoint) {
  if (nccl_build_library().empty()) GTEST_SKIP() << "the build found nccl.h but no libnccl";
  const NcclApi api = load_nccl_api({nccl_build_library()});
  EXPECT_EQ(api.version / 10000, NCCL_MAJOR);
  EXPECT_GE(api.version, kOldestNcclVersion);
  EXPECT_FALSE(api.path.empty());
  for (const void* f :
       {reinterpret_cast<const void*>(api.GetUniqueId),
        reinterpret_cast<const void*>(api.AllReduce),
        reinterpret_cast<const void*>(api.CommInitRankConfig),
        reinterpret_cast<const void*>(api.CommAbort), reinterpret_cast<const void*>(api.Reduce),
        reinterpret_cast<const void*>(api.ReduceScatter),
        reinterpret_cast<const void*>(api.AllGather), reinterpret_cast<const void*>(api.GroupStart),
        reinterpret_cast<const void*>(api.GroupEnd)}) {
    EXPECT_NE(f, nullptr);
  }
  EXPECT_STREQ(api.GetErrorString(ncclSuccess), "no error");
  const std::string described = describe_nccl(api);
  EXPECT_EQ(described.rfind("NCCL " + std::to_string(NCCL_MAJOR) + ".", 0), 0u) << described;
  EXPECT_NE(described.find(api.path), std::string::npos) << described;
  // This process's NCCL loads too and is one of the same major.
  EXPECT_EQ(nccl_api().version / 10000, NCCL_MAJOR);
}

}  // namespace
}  // namespace gnmr
