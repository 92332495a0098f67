// `gnmr wgmma-trial` (hidden): the wgmma attention kernels' trial, run by a training process in
// a child process before `auto` offers them (train/wgmma_trial.h). Exits 0 where every wgmma
// pass gave the mma.sync passes' bits at the shape; 1 with the reason where not.
#include <iostream>

#include "cli/commands.h"
#include "train/wgmma_trial.h"
#include "util/error.h"

namespace gnmr {

CommandAction add_wgmma_trial_command(CLI::App& app) {
  auto device = std::make_shared<int>(0);
  auto shape = std::make_shared<AttentionShape>(AttentionShape{1, 0, 0, 0, 0});
  app.add_option("--device", *device, "the GPU")->required();
  app.add_option("--batch", shape->batch, "batch")->required()->check(CLI::PositiveNumber);
  app.add_option("--seq", shape->seq, "sequence length")->required()->check(CLI::PositiveNumber);
  app.add_option("--heads", shape->heads, "query heads")->required()->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", shape->kv_heads, "key and value heads")
      ->required()
      ->check(CLI::PositiveNumber);
  app.add_option("--head-dim", shape->head_dim, "head dim")->required()->check(CLI::PositiveNumber);
  return [device, shape] {
    const std::string problem = wgmma_trial_in_this_process(*device, *shape);
    if (!problem.empty()) throw Error(ErrorKind::Runtime, problem);
    std::cout << "wgmma trial at " << attention_shape_text(*shape)
              << ": every wgmma pass gave the mma.sync passes' bits\n";
  };
}

}  // namespace gnmr
