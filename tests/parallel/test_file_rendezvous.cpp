// The file rendezvous with real processes on this machine (fork) sharing one directory: 2 and
// 4 ranks get rank 0's bytes and leave no file behind; files of another job or an earlier
// attempt are never read; a rank that never starts makes every started rank fail within the
// deadline naming it; a file under this job's name that disagrees, and a directory that is
// missing or not writable, are clear errors. Bounded: nothing may hang.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "forked_ranks.h"
#include "parallel/file_rendezvous.h"
#include "parallel/launch_env.h"
#include "test_paths.h"
#include "util/error.h"

namespace gnmr {
namespace {

namespace fs = std::filesystem;

using gnmr_test::Launch;
using gnmr_test::Outcome;

// Runs each launch in its own process against `directory`; returns their outcomes (written to
// `results`, another directory, so they cannot be taken for rendezvous files).
std::vector<Outcome> run_ranks(const std::vector<Launch>& launches, const std::string& directory,
                               double timeout_s, const std::string& results) {
  return gnmr_test::run_forked_ranks(
      launches, results, [&](const Launch& l, const std::vector<uint8_t>& payload) {
        RendezvousOptions o;
        o.method = "file";
        o.rank = l.rank, o.world_size = l.world, o.job_id = l.job, o.attempt = l.attempt;
        o.directory = directory;
        o.timeout_s = timeout_s;
        return file_rendezvous_broadcast(o, payload);
      });
}

std::vector<std::string> files_in(const std::string& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

void plant(const std::string& directory, const std::string& job, const std::string& attempt,
           const std::string& kind, int rank, int world, const std::string& body) {
  std::ofstream(directory + "/" + file_rendezvous_name(job, attempt, kind, rank), std::ios::binary)
      << file_rendezvous_contents(kind, job, attempt, world, rank < 0 ? 0 : rank,
                                  std::vector<uint8_t>(body.begin(), body.end()));
}

TEST(FileRendezvous, EveryRankGetsRankZerosBytesAndTheFilesAreRemoved) {
  for (int world : {2, 4}) {
    SCOPED_TRACE(std::to_string(world) + " ranks");
    const std::string dir = gnmr_test::scratch_dir("file_rdv_ok" + std::to_string(world));
    const std::string results =
        gnmr_test::scratch_dir("file_rdv_ok_results" + std::to_string(world));
    std::vector<Launch> launches;
    for (int r = world - 1; r >= 0; --r) launches.push_back({r, world, "job-7"});  // rank 0 last
    for (const Outcome& o : run_ranks(launches, dir, 20.0, results)) {
      EXPECT_EQ(o.exit_code, 0) << o.message;
    }
    EXPECT_TRUE(files_in(dir).empty()) << "left behind: " << files_in(dir).front();
  }
}

TEST(FileRendezvous, NeverReadsTheFilesOfAnotherJobOrAnEarlierAttempt) {
  const std::string dir = gnmr_test::scratch_dir("file_rdv_stale");
  const std::string results = gnmr_test::scratch_dir("file_rdv_stale_results");
  // What a requeued job's first attempt and another job left: a payload with other bytes, a
  // failure, and join files that would make rank 0 think rank 1 had come.
  plant(dir, "job-11", "restart0", "payload", -1, 2, "the first attempt's id");
  plant(dir, "job-11", "restart0", "fail", -1, 2, "rank(s) 1 did not join");
  plant(dir, "job-11", "restart0", "join", 1, 2, "");
  plant(dir, "job-12", "restart1", "payload", -1, 2, "another job's id");
  plant(dir, "job-12", "restart1", "join", 1, 2, "");
  const auto planted = files_in(dir);
  // Rank 0 alone first: the stale join files must not count for rank 1.
  const auto alone = run_ranks({{0, 2, "job-11", "restart1"}}, dir, 1.0, results);
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(alone[0].exit_code, 1);
  EXPECT_NE(alone[0].message.find("rank(s) 1 did not join within 1.0 s"), std::string::npos)
      << alone[0].message;
  ::unlink((dir + "/" + file_rendezvous_name("job-11", "restart1", "fail", -1)).c_str());
  // Both ranks of the second attempt: rank 0's bytes, not a stale payload or failure.
  const auto both =
      run_ranks({{1, 2, "job-11", "restart1"}, {0, 2, "job-11", "restart1"}}, dir, 20.0, results);
  for (const Outcome& o : both) EXPECT_EQ(o.exit_code, 0) << o.message;
  EXPECT_EQ(files_in(dir).size(), planted.size()) << "the stale files were touched";
}

TEST(FileRendezvous, ARankThatNeverStartsFailsEveryoneWithinTheDeadline) {
  const std::string dir = gnmr_test::scratch_dir("file_rdv_missing");
  const std::string results = gnmr_test::scratch_dir("file_rdv_missing_results");
  std::vector<Outcome> out;
  gnmr_test::expect_a_missing_rank_fails_everyone([&] {
    out = run_ranks({{0, 3, "job-8"}, {1, 3, "job-8"}}, dir, 1.5, results);  // no rank 2
    return out;
  });
  ASSERT_EQ(out.size(), 2u);
  EXPECT_NE(out[1].message.find("rank 0 gave up: rank(s) 2 did not join"), std::string::npos)
      << out[1].message;
  // The failure stays, so a rank that starts late fails at once instead of waiting.
  const auto late = run_ranks({{2, 3, "job-8"}}, dir, 20.0, results);
  EXPECT_EQ(late[0].exit_code, 1);
  EXPECT_NE(late[0].message.find("rank 0 gave up"), std::string::npos) << late[0].message;
}

TEST(FileRendezvous, ARankWithoutRankZeroGivesUpAtItsDeadline) {
  const std::string dir = gnmr_test::scratch_dir("file_rdv_noroot");
  const std::string results = gnmr_test::scratch_dir("file_rdv_noroot_results");
  const auto out = run_ranks({{1, 2, "job-10"}}, dir, 1.0, results);
  EXPECT_EQ(out[0].exit_code, 1);
  EXPECT_NE(out[0].message.find("rank 0 wrote neither the payload nor a failure within 1.0 s"),
            std::string::npos)
      << out[0].message;
  EXPECT_TRUE(files_in(dir).empty()) << "the join file was not withdrawn";
}

TEST(FileRendezvous, AFileOfThisJobWithAnotherWorldSizeStopsEveryoneAtOnce) {
  const std::string dir = gnmr_test::scratch_dir("file_rdv_world");
  const std::string results = gnmr_test::scratch_dir("file_rdv_world_results");
  plant(dir, "job-13", "restart0", "join", 1, 3, "");  // rank 1 thinks the world has 3 ranks
  const auto start = std::chrono::steady_clock::now();
  const auto out = run_ranks({{0, 2, "job-13"}}, dir, 20.0, results);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  EXPECT_EQ(out[0].exit_code, 1);
  EXPECT_NE(out[0].message.find("says world \"3\", this rank expects world \"2\""),
            std::string::npos)
      << out[0].message;
  EXPECT_TRUE(fs::exists(dir + "/" + file_rendezvous_name("job-13", "restart0", "fail", -1)));
}

TEST(FileRendezvous, AMissingOrUnwritableDirectoryIsAUsageErrorBeforeAnyWait) {
  const std::string results = gnmr_test::scratch_dir("file_rdv_baddir_results");
  const std::string missing = gnmr_test::scratch_dir("file_rdv_baddir") + "/none";
  for (int rank : {0, 1}) {
    const auto out = run_ranks({{rank, 2, "job-14"}}, missing, 20.0, results);
    EXPECT_EQ(out[0].exit_code, 2) << out[0].message;
    EXPECT_NE(
        out[0].message.find("dist.rendezvous_dir \"" + missing + "\": No such file or directory"),
        std::string::npos)
        << out[0].message;
  }
  // Root writes through permission bits; sysfs refuses new files even to root.
  std::string read_only = gnmr_test::scratch_dir("file_rdv_readonly");
  if (geteuid() == 0) {
    read_only = "/sys";
  } else {
    ::chmod(read_only.c_str(), 0555);
  }
  const auto start = std::chrono::steady_clock::now();
  const auto out = run_ranks({{0, 2, "job-14"}}, read_only, 20.0, results);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  EXPECT_EQ(out[0].exit_code, 2) << out[0].message;
  EXPECT_NE(out[0].message.find("dist.rendezvous_dir \"" + read_only + "\" is not writable"),
            std::string::npos)
      << out[0].message;
  ::chmod(read_only.c_str(), 0755);
}

// The launch environment decides the options: a file rendezvous needs a directory and a job id.
TEST(FileRendezvous, OptionsComeFromTheLaunchAndRefuseWhatTheyLack) {
  LaunchEnv env;
  env.rank = 1, env.world_size = 2, env.world_size_variable = "SLURM_NTASKS";
  env.job_id = "4242", env.attempt = "restart1.step0";
  const RendezvousOptions o = rendezvous_options_for(env, "file", "/shared/rdv", 30.0);
  EXPECT_EQ(o.method, "file");
  EXPECT_EQ(o.directory, "/shared/rdv");
  EXPECT_EQ(o.job_id, "4242");
  EXPECT_EQ(o.attempt, "restart1.step0");
  EXPECT_EQ(o.timeout_s, 30.0);
  EXPECT_EQ(file_rendezvous_name("42/x", "restart1.step0", "join", 3),
            "gnmr-rendezvous.42_x.restart1.step0.join.3");
  env.job_id = "";
  try {
    rendezvous_options_for(env, "file", "/shared/rdv", 30.0);
    ADD_FAILURE() << "no error without a job id";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("needs a job id"), std::string::npos) << e.what();
  }
  try {
    rendezvous_options_for(env, "tcp", "", 30.0);  // no MASTER_ADDR, no node list
    ADD_FAILURE() << "no error without an address";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("dist.rendezvous=file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gnmr
