// `gnmr eval`: perplexity of a gnmr checkpoint or a Hugging Face LLaMA folder on token
// shards or on a raw text file (README "`gnmr eval`": --text windows of seq_len tokens, no BOS,
// every token after a window's first is predicted from those before it). In fp32 on either
// backend: the model's weights as they are, whatever recipe trained them.
#pragma once

#include <cstdint>
#include <string>

namespace gnmr {

struct EvalOptions {
  std::string model_dir;  // checkpoint dir or HF folder
  std::string data_glob;  // token shards, or
  std::string text_file;  // a raw text file
  std::string tokenizer;  // default: MODEL_DIR/tokenizer.model
  int64_t tokens = 0;     // token budget; 0 = everything
  int seq_len = 0;  // 0 = the checkpoint's data.seq_len (HF: min(1024, max_position_embeddings))
  int batch = 4;    // windows per forward pass
  int threads = 0;  // the cpu backend's threads (0 = all cores)
  std::string backend = "cpu";  // or "cuda": the GPU make_backend gives this process
};

struct EvalResult {
  double loss = 0;
  double ppl = 0;
  int64_t tokens = 0;  // predicted tokens
};

EvalResult evaluate_saved_model(const EvalOptions& options);

}  // namespace gnmr
