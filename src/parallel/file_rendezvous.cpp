// The file rendezvous (file_rendezvous.h). A file is a text header, an empty line, the body:
//   gnmr-rendezvous 1
//   kind payload            (join | payload | ack | fail)
//   job 123456
//   attempt restart0.step0
//   world 4
//   rank 0                  (the writer's)
//   bytes 128
//
//   <bytes bytes: the payload for "payload", the reason for "fail", nothing otherwise>
#include "parallel/file_rendezvous.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "util/atomic_file.h"
#include "util/error.h"

namespace gnmr {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kFormatVersion = 1;
constexpr size_t kMaxPayload = size_t{1} << 20;
// How often a waiting rank looks for the next file: a few stats per rank per second.
constexpr auto kPollInterval = std::chrono::milliseconds(50);

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

[[noreturn]] void fail(const RendezvousOptions& o, ErrorKind kind, const std::string& what) {
  throw Error(kind, "file rendezvous (rank " + std::to_string(o.rank) + " of " +
                        std::to_string(o.world_size) + ", job \"" + o.job_id + "\", attempt \"" +
                        o.attempt + "\", " + o.directory + "): " + what);
}

std::string path_of(const RendezvousOptions& o, const std::string& kind, int rank) {
  return o.directory + "/" + file_rendezvous_name(o.job_id, o.attempt, kind, rank);
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

// Error(Usage) unless the directory exists and this rank can create a file in it: a probe
// file, written and removed as the real ones will be (access(2) can say yes where the server,
// e.g. an NFS export that squashes root, says no).
void check_directory(const RendezvousOptions& o) {
  struct stat info {};
  if (::stat(o.directory.c_str(), &info) != 0) {
    fail(o, ErrorKind::Usage,
         "dist.rendezvous_dir \"" + o.directory + "\": " + std::strerror(errno) +
             "; create it on a filesystem every node shares, or fix the path");
  }
  if (!S_ISDIR(info.st_mode)) {
    fail(o, ErrorKind::Usage, "dist.rendezvous_dir \"" + o.directory + "\" is not a directory");
  }
  const std::string probe = path_of(o, "probe", o.rank);
  try {
    write_file_atomic(probe, std::string("probe"));
  } catch (const Error& e) {
    fail(o, ErrorKind::Usage,
         "dist.rendezvous_dir \"" + o.directory + "\" is not writable by this rank (" + e.what() +
             "); give every rank write access, or choose another directory");
  }
  ::unlink(probe.c_str());
}

void write_file(const RendezvousOptions& o, const std::string& kind, int rank,
                const std::vector<uint8_t>& body) {
  write_file_atomic(path_of(o, kind, rank), file_rendezvous_contents(kind, o.job_id, o.attempt,
                                                                     o.world_size, o.rank, body));
}

// The body of file `kind` (of `rank`; -1 for payload and fail), or false when it does not exist
// yet. Error(Runtime) naming the file and the field when it exists but is not this job's
// kind, job, attempt or world, or not this format.
bool read_file_if_there(const RendezvousOptions& o, const std::string& kind, int rank,
                        std::vector<uint8_t>& body) {
  const std::string path = path_of(o, kind, rank);
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  const size_t end = text.find("\n\n");
  if (end == std::string::npos) fail(o, ErrorKind::Runtime, path + ": no header");
  std::istringstream header(text.substr(0, end + 1));
  std::string line;
  std::vector<std::pair<std::string, std::string>> fields;
  while (std::getline(header, line)) {
    const size_t space = line.find(' ');
    fields.emplace_back(line.substr(0, space),
                        space == std::string::npos ? "" : line.substr(space + 1));
  }
  const int writer = rank < 0 ? 0 : rank;
  const std::pair<std::string, std::string> expected[] = {
      {"gnmr-rendezvous", std::to_string(kFormatVersion)},
      {"kind", kind},
      {"job", o.job_id},
      {"attempt", o.attempt},
      {"world", std::to_string(o.world_size)},
      {"rank", std::to_string(writer)}};
  const size_t want = sizeof expected / sizeof expected[0];
  if (fields.size() != want + 1 || fields[want].first != "bytes") {
    fail(o, ErrorKind::Runtime,
         path + ": not a gnmr rendezvous file of format " + std::to_string(kFormatVersion));
  }
  for (size_t i = 0; i < want; ++i) {
    if (fields[i].first != expected[i].first || fields[i].second != expected[i].second) {
      fail(o, ErrorKind::Runtime,
           path + ": says " + fields[i].first + " \"" + fields[i].second +
               "\", this rank expects " + expected[i].first + " \"" + expected[i].second +
               "\" (every rank must run the same gnmr with the same world size; two jobs whose "
               "ids differ only in characters outside [A-Za-z0-9._-] share file names)");
    }
  }
  const size_t bytes = size_t(std::strtoull(fields[want].second.c_str(), nullptr, 10));
  if (bytes > kMaxPayload || text.size() != end + 2 + bytes) {
    fail(o, ErrorKind::Runtime,
         path + ": says " + fields[want].second + " bytes, holds " +
             std::to_string(text.size() - end - 2));
  }
  body.assign(text.begin() + std::ptrdiff_t(end + 2), text.end());
  return true;
}

void sleep_until_next_poll(Clock::time_point deadline) {
  std::this_thread::sleep_for(std::min<Clock::duration>(
      kPollInterval, std::max<Clock::duration>(Clock::duration(0), deadline - Clock::now())));
}

// Rank 0: removes every file of this attempt that the ranks wrote.
void remove_files(const RendezvousOptions& o) {
  ::unlink(path_of(o, "payload", -1).c_str());
  for (int r = 1; r < o.world_size; ++r) {
    ::unlink(path_of(o, "join", r).c_str());
    ::unlink(path_of(o, "ack", r).c_str());
  }
}

std::vector<uint8_t> serve(const RendezvousOptions& o, const std::vector<uint8_t>& payload,
                           Clock::time_point deadline) {
  std::vector<bool> joined(size_t(o.world_size), false);
  std::vector<int> missing;
  std::vector<uint8_t> body;
  for (;;) {
    missing.clear();
    for (int r = 1; r < o.world_size; ++r) {
      if (joined[size_t(r)]) continue;
      try {
        joined[size_t(r)] = read_file_if_there(o, "join", r, body);
      } catch (const Error& e) {
        // A rank that disagrees (world size, format) cannot take part: stop everyone now.
        const std::string why =
            std::string("rank ") + std::to_string(r) + "'s join file: " + e.what();
        write_file(o, "fail", -1, std::vector<uint8_t>(why.begin(), why.end()));
        throw;
      }
      if (!joined[size_t(r)]) missing.push_back(r);
    }
    if (missing.empty() || Clock::now() >= deadline) break;
    sleep_until_next_poll(deadline);
  }
  if (!missing.empty()) {
    const std::string why =
        "rank(s) " + ranks_text(missing) + " did not join within " + seconds(o.timeout_s);
    write_file(o, "fail", -1, std::vector<uint8_t>(why.begin(), why.end()));
    fail(o, ErrorKind::Runtime,
         why +
             " (every rank must start with the same job id, attempt and dist.rendezvous_dir; "
             "the rendezvous files stay in the directory)");
  }
  write_file(o, "payload", -1, payload);
  // The files go once every rank has read the payload; a rank that has not said so by then may
  // still be reading, so they stay.
  const Clock::time_point ack_deadline =
      Clock::now() + std::chrono::milliseconds(int64_t(o.timeout_s * 1000));
  for (;;) {
    missing.clear();
    for (int r = 1; r < o.world_size; ++r) {
      if (!read_file_if_there(o, "ack", r, body)) missing.push_back(r);
    }
    if (missing.empty() || Clock::now() >= ack_deadline) break;
    sleep_until_next_poll(ack_deadline);
  }
  if (missing.empty()) {
    remove_files(o);
  } else {
    spdlog::warn(
        "file rendezvous: rank(s) {} did not acknowledge the payload within {}; the files stay "
        "in {} ({}; remove them once the job has ended)",
        ranks_text(missing), seconds(o.timeout_s), o.directory,
        file_rendezvous_name(o.job_id, o.attempt, "*", -1));
  }
  return payload;
}

std::vector<uint8_t> join(const RendezvousOptions& o, Clock::time_point deadline) {
  write_file(o, "join", o.rank, {});
  // Rank 0 gives its verdict at its own deadline, which may fall a little after this rank's:
  // wait a grace period longer, so that verdict (naming the missing ranks) is what this rank
  // reports.
  const Clock::time_point verdict_deadline = deadline + std::chrono::seconds(2);
  std::vector<uint8_t> body;
  for (;;) {
    if (read_file_if_there(o, "fail", -1, body)) {
      fail(o, ErrorKind::Runtime, "rank 0 gave up: " + std::string(body.begin(), body.end()));
    }
    if (read_file_if_there(o, "payload", -1, body)) {
      write_file(o, "ack", o.rank, {});
      return body;
    }
    if (Clock::now() >= verdict_deadline) break;
    sleep_until_next_poll(verdict_deadline);
  }
  // Withdrawn, so that a rank 0 starting later counts this rank as missing, not as joined.
  ::unlink(path_of(o, "join", o.rank).c_str());
  fail(o, ErrorKind::Runtime,
       "rank 0 wrote neither the payload nor a failure within " + seconds(o.timeout_s) +
           " (every rank must start, with the same job id, attempt and dist.rendezvous_dir; "
           "rank 0 waits for all of them)");
}

std::string file_name_part(const std::string& text) {
  std::string out = text;
  for (char& c : out) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '_' || c == '-';
    if (!plain) c = '_';
  }
  return out;
}

}  // namespace

std::string file_rendezvous_name(const std::string& job_id, const std::string& attempt,
                                 const std::string& kind, int rank) {
  return "gnmr-rendezvous." + file_name_part(job_id) + "." + file_name_part(attempt) + "." + kind +
         (rank < 0 ? "" : "." + std::to_string(rank));
}

std::string file_rendezvous_contents(const std::string& kind, const std::string& job_id,
                                     const std::string& attempt, int world_size, int rank,
                                     const std::vector<uint8_t>& body) {
  std::string text = "gnmr-rendezvous " + std::to_string(kFormatVersion) + "\nkind " + kind +
                     "\njob " + job_id + "\nattempt " + attempt + "\nworld " +
                     std::to_string(world_size) + "\nrank " + std::to_string(rank) + "\nbytes " +
                     std::to_string(body.size()) + "\n\n";
  text.append(body.begin(), body.end());
  return text;
}

std::vector<uint8_t> file_rendezvous_broadcast(const RendezvousOptions& options,
                                               const std::vector<uint8_t>& payload) {
  const RendezvousOptions& o = options;
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    fail(o, ErrorKind::Runtime, "rank and world size do not fit");
  }
  if (payload.size() > kMaxPayload) fail(o, ErrorKind::Runtime, "payload over 1 MiB");
  if (o.world_size == 1) return payload;
  for (const std::string* text : {&o.job_id, &o.attempt}) {
    if (text->empty() || text->find('\n') != std::string::npos) {
      fail(o, ErrorKind::Usage, "the job id and attempt must be non-empty single lines");
    }
  }
  check_directory(o);
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(int64_t(o.timeout_s * 1000));
  return o.rank == 0 ? serve(o, payload, deadline) : join(o, deadline);
}

}  // namespace gnmr
