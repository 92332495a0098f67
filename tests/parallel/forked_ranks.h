// The ranks of a rendezvous as forked processes of the test (test_tcp_rendezvous.cpp,
// test_file_rendezvous.cpp): each runs the rendezvous in its own process, so a rank that
// never starts, dies or waits is a real one, and the test reads back each rank's exit code
// and the message of the error it threw.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "util/error.h"

namespace gnmr_test {

struct Launch {
  int rank;
  int world;
  std::string job;
  std::string attempt = "restart0";
};

struct Outcome {
  int exit_code;        // 0: got the payload; 1: Runtime error; 2: Usage error; 3: other bytes
  std::string message;  // the error a failed rank threw
};

// A TCP port no socket on this machine holds now: the one the kernel assigns to a socket bound
// to port 0 on 127.0.0.1, closed again before the ranks start. (A port made from the test's
// pid could be one another process was using: its rank 0 then failed to listen and the others
// waited out their deadline.)
inline int unused_tcp_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0) << "socket()";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  close(fd);
  EXPECT_TRUE(ok) << "binding a socket to port 0 on 127.0.0.1";
  return ok ? int(ntohs(address.sin_port)) : 0;
}

inline std::vector<uint8_t> test_payload() {
  std::vector<uint8_t> p(128);  // an NCCL unique id's size
  for (size_t i = 0; i < p.size(); ++i) p[i] = uint8_t(i * 37 + 11);
  return p;
}

// rendezvous(launch, payload): rank 0 is given test_payload(), the others nothing; returns what
// the rank received.
using RendezvousCall =
    std::function<std::vector<uint8_t>(const Launch&, const std::vector<uint8_t>& payload)>;

// Forks one process per launch, in order, and waits for all. Each writes its error's message
// to results_dir/rankR_JOB (a directory of its own, so it is never taken for a rendezvous file).
inline std::vector<Outcome> run_forked_ranks(const std::vector<Launch>& launches,
                                             const std::string& results_dir,
                                             const RendezvousCall& rendezvous) {
  auto result_file = [&](const Launch& l) {
    return results_dir + "/rank" + std::to_string(l.rank) + "_" + l.job;
  };
  std::vector<pid_t> pids;
  for (const Launch& l : launches) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      std::string message;
      try {
        const std::vector<uint8_t> got =
            rendezvous(l, l.rank == 0 ? test_payload() : std::vector<uint8_t>{});
        code = got == test_payload() ? 0 : 3;
      } catch (const gnmr::Error& e) {
        code = e.kind() == gnmr::ErrorKind::Usage ? 2 : 1;
        message = e.what();
      }
      std::ofstream(result_file(l)) << message;
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<Outcome> out;
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    std::ifstream in(result_file(launches[i]));
    std::stringstream s;
    s << in.rdbuf();
    out.push_back({WIFEXITED(status) ? WEXITSTATUS(status) : -1, s.str()});
  }
  return out;
}

// The contract every rendezvous keeps when rank 2 of 3 never starts (`run` starts ranks 0 and
// 1 with a 1.5 s deadline): both fail well within 10 s, rank 0 naming rank 2, rank 1 saying
// that rank 0 gave up.
inline void expect_a_missing_rank_fails_everyone(const std::function<std::vector<Outcome>()>& run) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Outcome> out = run();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].exit_code, 1);
  EXPECT_NE(out[0].message.find("rank(s) 2 did not join within 1.5 s"), std::string::npos)
      << out[0].message;
  EXPECT_EQ(out[1].exit_code, 1);
  EXPECT_NE(out[1].message.find("rank 0 gave up"), std::string::npos) << out[1].message;
}

}  // namespace gnmr_test
