// bench_checkpoint: what the manifest's CRC-32 costs next to writing a checkpoint.
//   bench_checkpoint [model config=configs/models/llama2-60m.json] [repeats=3]
// Saves the checkpoint of a freshly initialised model (synthetic data, no training) REPEATS
// times under a scratch run directory and prints, per save, the whole save_checkpoint time
// and the time of hashing the saved files again (write_checkpoint_manifest, which is what
// save_checkpoint does before publishing), and of verify_checkpoint (what resume, eval and
// export add before reading).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "config/config.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/session.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const std::string model = argc > 1 ? argv[1] : GNMR_SOURCE_DIR "/configs/models/llama2-60m.json";
  const int repeats = argc > 2 ? std::stoi(argv[2]) : 3;
  gnmr::RunConfig config =
      gnmr::load_run_config(model, {"data.seq_len=16", "train.micro_batch=1",
                                    "train.global_batch_tokens=16", "checkpoint.keep=1"});
  gnmr::TrainingSession session(config, /*synthetic_data=*/true);
  session.save_controller_state();
  const std::string run = (fs::current_path() / "scratch" / "bench_checkpoint").string();
  fs::remove_all(run);
  for (int i = 1; i <= repeats; ++i) {
    session.state().step = i;
    auto t0 = Clock::now();
    const std::string dir = gnmr::save_checkpoint(run, config, session.backend(), session.model(),
                                                  session.optimizer(), session.state());
    const double save_s = seconds_since(t0);
    uint64_t bytes = 0;
    for (const auto& entry : fs::directory_iterator(dir)) bytes += entry.file_size();
    t0 = Clock::now();
    gnmr::write_checkpoint_manifest(dir);
    const double manifest_s = seconds_since(t0);
    t0 = Clock::now();
    gnmr::verify_checkpoint(dir);
    const double verify_s = seconds_since(t0);
    std::printf(
        "%s: %.1f MB; save_checkpoint %.3f s (manifest included), manifest %.3f s (%.0f%% of "
        "the save, %.2f GB/s), verify %.3f s\n",
        config.model.name.c_str(), double(bytes) / 1e6, save_s, manifest_s,
        100.0 * manifest_s / save_s, double(bytes) / manifest_s / 1e9, verify_s);
  }
  fs::remove_all(run);
  return 0;
}
