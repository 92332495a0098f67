// The signals that ask a long command to stop at a clean point, for an object's lifetime:
// `gnmr train` checkpoints after its step, `gnmr prepare` stops after its batch and removes its
// shards. A signal the launcher set to be ignored (nohup's SIGHUP, SIGINT of a script's
// background job) stays ignored, and the handlers in place before come back at the end.
#pragma once

#include <atomic>
#include <initializer_list>
#include <vector>

namespace gnmr {

// Holds SIGTERM, SIGUSR1, SIGINT and SIGHUP back (blocked, so they wait) from main's first line
// until a command installs its StopSignals or says it takes none (release_stop_signals): one
// that came in the ~0.2 s before the trainer's handlers (the BLAS re-exec, the config) once
// killed it, and the job script did not requeue. The blocked set survives the re-exec.
void hold_stop_signals();
// Unblocks them in this thread: a held one is delivered now, to the handlers in place.
void release_stop_signals();

class StopSignals {
 public:
  // REPEATABLE: each arrival only records the signal (SIGUSR1: a scheduler's notice). ONCE: the
  // first arrival records it and restores the default action, so a second one ends the process
  // at once (Ctrl-C twice; SIGTERM twice, as to a set-up that hangs). Releases the held signals
  // once its handlers are in.
  StopSignals(std::initializer_list<int> repeatable, std::initializer_list<int> once);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The last signal recorded since the newest StopSignals was made; 0 when none.
  static int received() { return flag().load(); }
  static const std::atomic<int>& flag();

 private:
  std::vector<int> signals_;
  std::vector<void (*)(int)> previous_;
};

}  // namespace gnmr
