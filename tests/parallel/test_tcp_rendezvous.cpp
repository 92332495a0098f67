// The TCP rendezvous with real processes on this machine (fork): 2 and 4 ranks get rank 0's
// bytes; a rank that never starts, and a connection from another job, make every started rank
// fail within the deadline, with a message that names the problem. Bounded: nothing may hang.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/launch_env.h"
#include "parallel/tcp_rendezvous.h"
#ifdef GNMR_WITH_NCCL
#include "parallel/nccl_communicator.h"
#endif
#include "forked_ranks.h"
#include "test_paths.h"
#include "util/error.h"

namespace gnmr {
namespace {

using gnmr_test::Launch;
using gnmr_test::Outcome;

// Runs each launch in its own process against one port; returns their outcomes.
std::vector<Outcome> run_ranks(const std::vector<Launch>& launches, double timeout_s,
                               const std::string& name) {
  const int port = gnmr_test::unused_tcp_port();
  return gnmr_test::run_forked_ranks(launches, gnmr_test::scratch_dir("rendezvous_" + name),
                                     [&](const Launch& l, const std::vector<uint8_t>& payload) {
                                       RendezvousOptions o;
                                       o.rank = l.rank, o.world_size = l.world, o.port = port,
                                       o.job_id = l.job;
                                       o.timeout_s = timeout_s;
                                       return tcp_rendezvous_broadcast(o, payload);
                                     });
}

TEST(TcpRendezvous, EveryRankGetsRankZerosBytes) {
  for (int world : {2, 4}) {
    std::vector<Launch> launches;
    for (int r = world - 1; r >= 0; --r) launches.push_back({r, world, "job-7"});  // rank 0 last
    for (const Outcome& o : run_ranks(launches, 20.0, "ok" + std::to_string(world))) {
      EXPECT_EQ(o.exit_code, 0) << o.message;
    }
  }
}

TEST(TcpRendezvous, ARankThatNeverStartsFailsEveryoneWithinTheDeadline) {
  gnmr_test::expect_a_missing_rank_fails_everyone([] {
    return run_ranks({{0, 3, "job-8"}, {1, 3, "job-8"}}, 1.5, "missing");
  });
}

TEST(TcpRendezvous, AnotherJobCannotTakeARanksPlace) {
  const std::vector<Outcome> out =
      run_ranks({{0, 2, "job-9"}, {1, 2, "stale-job"}}, 1.5, "foreign");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].exit_code, 1);
  EXPECT_NE(out[1].message.find("refused this rank: job \"stale-job\" is not this job"),
            std::string::npos)
      << out[1].message;
  EXPECT_EQ(out[0].exit_code, 1);
  EXPECT_NE(out[0].message.find("rank(s) 1 did not join"), std::string::npos) << out[0].message;
  EXPECT_NE(out[0].message.find("refused"), std::string::npos) << out[0].message;
}

TEST(TcpRendezvous, ANonRootRankWithoutRankZeroGivesUpAtItsDeadline) {
  const std::vector<Outcome> out = run_ranks({{1, 2, "job-10"}}, 1.0, "noroot");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].exit_code, 1);
  EXPECT_NE(out[0].message.find("rank 0 did not listen within 1.0 s"), std::string::npos)
      << out[0].message;
}

#ifdef GNMR_WITH_NCCL
// A launch without MPI (srun without PMIx, torchrun): rank 0's NCCL id reaches every rank over
// the rendezvous at the launch environment's address. Needs no GPU.
TEST(TcpRendezvous, HandsRankZerosNcclUniqueIdToEveryRank) {
  const std::string dir = gnmr_test::scratch_dir("rendezvous_nccl_id");
  const int world = 3;
  const int port = gnmr_test::unused_tcp_port();
  std::vector<pid_t> pids;
  for (int rank = world - 1; rank >= 0; --rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        LaunchEnv env;
        env.source = "torchrun";
        env.rank = rank;
        env.world_size = world;
        env.world_size_variable = "WORLD_SIZE";
        env.rendezvous_host = "127.0.0.1";
        env.rendezvous_port = port;
        env.job_id = "nccl-id-test";
        CommunicatorOptions options;
        options.timeout_s = 20.0;
        const std::vector<uint8_t> id = share_nccl_unique_id(env, options, nullptr);
        std::ofstream(dir + "/id" + std::to_string(rank), std::ios::binary)
            .write(reinterpret_cast<const char*>(id.data()), std::streamsize(id.size()));
      } catch (const Error&) {
        code = 1;
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::vector<std::string> ids;
  for (int rank = 0; rank < world; ++rank) {
    std::ifstream in(dir + "/id" + std::to_string(rank), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    ids.push_back(bytes.str());
  }
  ASSERT_EQ(ids[0].size(), kNcclUniqueIdBytes);
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(ids[2], ids[0]);
}
#endif

}  // namespace
}  // namespace gnmr
