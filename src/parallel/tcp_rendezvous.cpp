// The TCP rendezvous (tcp_rendezvous.h). Messages, all integers little-endian as the host's:
//   hello  (rank r -> rank 0): "GNMRRDV1", int32 rank, int32 world size, uint32 n, n bytes job id
//   answer (rank 0 -> rank r): 4-byte tag "OK  " | "FAIL" | "REJ ", uint32 n, n bytes
//                              (the payload for OK, the reason otherwise)
#include "parallel/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "util/error.h"

namespace gnmr {

namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[8] = {'G', 'N', 'M', 'R', 'R', 'D', 'V', '1'};
constexpr uint32_t kMaxMessage = 1u << 20;

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : int(left.count());
}

// Closes the descriptor when it goes out of scope.
struct Socket {
  int fd = -1;
  explicit Socket(int f = -1) : fd(f) {}
  ~Socket() {
    if (fd >= 0) close(fd);
  }
  Socket(Socket&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
};

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

bool read_exact(int fd, void* buffer, size_t bytes, Clock::time_point deadline) {
  char* p = static_cast<char*>(buffer);
  while (bytes > 0) {
    if (!wait_for(fd, POLLIN, deadline)) return false;
    const ssize_t n = recv(fd, p, bytes, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return false;  // closed or failed
    }
    p += n, bytes -= size_t(n);
  }
  return true;
}

bool write_all(int fd, const void* buffer, size_t bytes) {
  const char* p = static_cast<const char*>(buffer);
  while (bytes > 0) {
    const ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n, bytes -= size_t(n);
  }
  return true;
}

bool send_answer(int fd, const char tag[4], const void* body, uint32_t bytes) {
  return write_all(fd, tag, 4) && write_all(fd, &bytes, sizeof bytes) &&
         (bytes == 0 || write_all(fd, body, bytes));
}

std::string where(const RendezvousOptions& o) {
  return o.host + ":" + std::to_string(o.port);
}

[[noreturn]] void fail(const RendezvousOptions& o, const std::string& what) {
  throw Error(ErrorKind::Runtime, "rendezvous (rank " + std::to_string(o.rank) + " of " +
                                      std::to_string(o.world_size) + ", job \"" + o.job_id +
                                      "\", " + where(o) + "): " + what);
}

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

std::vector<uint8_t> serve(const RendezvousOptions& o, const std::vector<uint8_t>& payload,
                           Clock::time_point deadline) {
  Socket listener(socket(AF_INET, SOCK_STREAM, 0));
  if (listener.fd < 0) fail(o, std::string("socket: ") + std::strerror(errno));
  const int yes = 1;
  setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(uint16_t(o.port));
  if (bind(listener.fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    fail(o, "cannot listen on port " + std::to_string(o.port) + ": " + std::strerror(errno) +
                " (another job on this node? set MASTER_PORT)");
  }
  if (listen(listener.fd, o.world_size) != 0)
    fail(o, std::string("listen: ") + std::strerror(errno));

  std::vector<Socket> joined(size_t(o.world_size));
  int count = 1;  // rank 0 itself
  std::string refused;
  while (count < o.world_size && wait_for(listener.fd, POLLIN, deadline)) {
    Socket peer(accept(listener.fd, nullptr, nullptr));
    if (peer.fd < 0) continue;
    char magic[8];
    int32_t rank = -1, world = -1;
    uint32_t job_bytes = 0;
    // A peer gets at most 2 s to say who it is, so a stray connection cannot stall the job.
    const Clock::time_point hello_deadline =
        std::min(deadline, Clock::now() + std::chrono::seconds(2));
    if (!read_exact(peer.fd, magic, sizeof magic, hello_deadline) ||
        std::memcmp(magic, kMagic, sizeof magic) != 0 ||
        !read_exact(peer.fd, &rank, sizeof rank, hello_deadline) ||
        !read_exact(peer.fd, &world, sizeof world, hello_deadline) ||
        !read_exact(peer.fd, &job_bytes, sizeof job_bytes, hello_deadline) || job_bytes > 4096) {
      refused += " a connection that is not a gnmr rank;";
      continue;
    }
    std::string job(job_bytes, '\0');
    if (!read_exact(peer.fd, job.data(), job_bytes, hello_deadline)) continue;
    std::string why;
    if (job != o.job_id) {
      why = "job \"" + job + "\" is not this job (\"" + o.job_id + "\")";
    } else if (world != o.world_size) {
      why = "rank " + std::to_string(rank) + " says the world has " + std::to_string(world) +
            " ranks, rank 0 says " + std::to_string(o.world_size);
    } else if (rank < 1 || rank >= o.world_size) {
      why = "rank " + std::to_string(rank) + " is not in 1.." + std::to_string(o.world_size - 1);
    } else if (joined[size_t(rank)].fd >= 0) {
      why = "rank " + std::to_string(rank) + " joined twice";
    }
    if (!why.empty()) {
      send_answer(peer.fd, "REJ ", why.data(), uint32_t(why.size()));
      refused += " " + why + ";";
      continue;
    }
    joined[size_t(rank)] = std::move(peer);
    ++count;
  }
  if (count < o.world_size) {
    std::string missing;
    for (int r = 1; r < o.world_size; ++r) {
      if (joined[size_t(r)].fd < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    const std::string why = "rank(s) " + missing + " did not join within " + seconds(o.timeout_s) +
                            (refused.empty() ? "" : " (refused:" + refused + ")");
    for (const Socket& s : joined) {
      if (s.fd >= 0) send_answer(s.fd, "FAIL", why.data(), uint32_t(why.size()));
    }
    fail(o, why);
  }
  for (const Socket& s : joined) {
    if (s.fd >= 0 && !send_answer(s.fd, "OK  ", payload.data(), uint32_t(payload.size()))) {
      fail(o, "a rank hung up before it received the payload");
    }
  }
  return payload;
}

// A connected socket to rank 0, retrying until it listens; -1 at the deadline.
Socket connect_to_root(const RendezvousOptions& o, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  while (ms_left(deadline) > 0) {
    addrinfo* found = nullptr;
    if (getaddrinfo(o.host.c_str(), std::to_string(o.port).c_str(), &hints, &found) == 0) {
      Socket s(socket(AF_INET, SOCK_STREAM, 0));
      // Non-blocking connect: a host that drops SYNs must not outlast the deadline.
      fcntl(s.fd, F_SETFL, fcntl(s.fd, F_GETFL) | O_NONBLOCK);
      int r = connect(s.fd, found->ai_addr, found->ai_addrlen);
      freeaddrinfo(found);
      bool connected = r == 0;
      if (!connected && errno == EINPROGRESS && wait_for(s.fd, POLLOUT, deadline)) {
        int error = 0;
        socklen_t len = sizeof error;
        getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &error, &len);
        connected = error == 0;
      }
      if (connected) {
        fcntl(s.fd, F_SETFL, fcntl(s.fd, F_GETFL) & ~O_NONBLOCK);
        return s;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, ms_left(deadline))));
  }
  return Socket();
}

std::vector<uint8_t> join(const RendezvousOptions& o, Clock::time_point deadline) {
  Socket s = connect_to_root(o, deadline);
  if (s.fd < 0) fail(o, "rank 0 did not listen within " + seconds(o.timeout_s));
  const int32_t rank = o.rank, world = o.world_size;
  const uint32_t job_bytes = uint32_t(o.job_id.size());
  if (!write_all(s.fd, kMagic, sizeof kMagic) || !write_all(s.fd, &rank, sizeof rank) ||
      !write_all(s.fd, &world, sizeof world) || !write_all(s.fd, &job_bytes, sizeof job_bytes) ||
      !write_all(s.fd, o.job_id.data(), job_bytes)) {
    fail(o, "rank 0 hung up while this rank said hello");
  }
  // Rank 0 gives its verdict at its own deadline, which may fall a little after this rank's:
  // wait a grace period longer for the answer, so that verdict (naming the missing ranks) is
  // what this rank reports.
  const Clock::time_point answer_deadline = deadline + std::chrono::seconds(2);
  char tag[4];
  uint32_t bytes = 0;
  if (!read_exact(s.fd, tag, 4, answer_deadline) ||
      !read_exact(s.fd, &bytes, sizeof bytes, answer_deadline)) {
    fail(o, "rank 0 did not answer within " + seconds(o.timeout_s) +
                " (every rank must start; rank 0 waits for all of them)");
  }
  if (bytes > kMaxMessage) fail(o, "rank 0 sent a message of " + std::to_string(bytes) + " bytes");
  std::vector<uint8_t> body(bytes);
  if (bytes > 0 && !read_exact(s.fd, body.data(), bytes, answer_deadline)) {
    fail(o, "rank 0 hung up mid-message");
  }
  if (std::memcmp(tag, "OK  ", 4) == 0) return body;
  fail(o, std::string(std::memcmp(tag, "REJ ", 4) == 0 ? "rank 0 refused this rank: "
                                                       : "rank 0 gave up: ") +
              std::string(body.begin(), body.end()));
}

}  // namespace

std::vector<uint8_t> tcp_rendezvous_broadcast(const RendezvousOptions& options,
                                              const std::vector<uint8_t>& payload) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    fail(options, "rank and world size do not fit");
  }
  if (payload.size() > kMaxMessage) fail(options, "payload over 1 MiB");
  if (options.world_size == 1) return payload;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(int64_t(options.timeout_s * 1000));
  return options.rank == 0 ? serve(options, payload, deadline) : join(options, deadline);
}

}  // namespace gnmr
