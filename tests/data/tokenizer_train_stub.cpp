// Stand-in for `gnmr tokenizer train` until the CLI wires that subcommand to
// train_tokenizer(): same arguments, so scripts/build_brown_corpus.sh runs against either:
//   tokenizer_train_stub tokenizer train --vocab-size N --out PREFIX [--threads T] INPUT...
#include <cstdio>
#include <string>

#include "data/tokenizer.h"
#include "util/error.h"

int main(int argc, char** argv) {
  gnmr::TokenizerTrainOptions options;
  int arg = 1;
  if (argc > 2 && std::string(argv[1]) == "tokenizer" && std::string(argv[2]) == "train") arg = 3;
  for (; arg < argc; ++arg) {
    const std::string flag = argv[arg];
    if (flag == "--vocab-size" && arg + 1 < argc) {
      options.vocab_size = std::stoi(argv[++arg]);
    } else if (flag == "--out" && arg + 1 < argc) {
      options.out_prefix = argv[++arg];
    } else if (flag == "--threads" && arg + 1 < argc) {
      options.threads = std::stoi(argv[++arg]);
    } else {
      options.inputs.push_back(flag);
    }
  }
  try {
    gnmr::train_tokenizer(options);
  } catch (const gnmr::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
