// One function per `gnmr` subcommand. Each registers its flags on a CLI11 subcommand and
// returns the action to run once parsing succeeds. Errors are thrown as gnmr::Error; main
// maps them to exit codes (README "Exit codes").
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace gnmr {

using CommandAction = std::function<void()>;

CommandAction add_train_command(CLI::App& app);
CommandAction add_prepare_command(CLI::App& app);
CommandAction add_tokenizer_command(CLI::App& app);
CommandAction add_eval_command(CLI::App& app);
CommandAction add_export_command(CLI::App& app);
CommandAction add_bench_command(CLI::App& app);
CommandAction add_config_command(CLI::App& app);
CommandAction add_checkpoint_command(CLI::App& app);
CommandAction add_version_command(CLI::App& app);
CommandAction add_wgmma_trial_command(CLI::App& app);  // hidden: train/wgmma_trial.h

}  // namespace gnmr
