#include "util/stop_signals.h"

#include <pthread.h>

#include <csignal>

namespace gnmr {

namespace {

std::atomic<int> g_received{0};

void record(int signal) {
  g_received.store(signal);
}

void record_once(int signal) {
  g_received.store(signal);
  std::signal(signal, SIG_DFL);
}

sigset_t held_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int signal : {SIGTERM, SIGUSR1, SIGINT, SIGHUP}) sigaddset(&set, signal);
  return set;
}

}  // namespace

void hold_stop_signals() {
  const sigset_t set = held_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void release_stop_signals() {
  const sigset_t set = held_signals();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

StopSignals::StopSignals(std::initializer_list<int> repeatable, std::initializer_list<int> once) {
  g_received.store(0);
  auto install = [this](int signal, void (*handler)(int)) {
    void (*previous)(int) = std::signal(signal, handler);
    if (previous == SIG_IGN) std::signal(signal, SIG_IGN);
    signals_.push_back(signal);
    previous_.push_back(previous);
  };
  for (int signal : repeatable) install(signal, record);
  for (int signal : once) install(signal, record_once);
  release_stop_signals();
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < signals_.size(); ++i) std::signal(signals_[i], previous_[i]);
}

const std::atomic<int>& StopSignals::flag() {
  return g_received;
}

}  // namespace gnmr
