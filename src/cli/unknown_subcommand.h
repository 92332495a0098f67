// CLI11 answers a misspelt subcommand (`gnmr trian`, `gnmr tokenizer trian`) with only "A
// subcommand is required". After a failed parse this finds the word that should have been a
// subcommand and names it with the nearest real one.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace gnmr {

// `unknown subcommand "trian" (did you mean "train"?); gnmr --help lists them`, or "" when
// the parse failed for another reason.
std::string unknown_subcommand_message(const CLI::App& app);

}  // namespace gnmr
