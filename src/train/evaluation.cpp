#include "train/evaluation.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "config/config.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "model/llama.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/hf_format.h"
#include "train/make_backend.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/json_integer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gnmr {

namespace {

// A window source: fills row `i` of a batch (inputs and targets of model_seq_len tokens).
using WindowFiller = std::function<void(int64_t window, int32_t* tokens, int32_t* targets)>;

EvalResult run_windows(LlamaModel& model, int batch, int model_seq_len, int64_t windows,
                       const WindowFiller& fill) {
  std::vector<int32_t> tokens(size_t(batch) * model_seq_len), targets(tokens.size());
  double loss_sum = 0;
  int64_t predicted = 0;
  for (int64_t first = 0; first < windows; first += batch) {
    int rows = int(std::min<int64_t>(batch, windows - first));
    for (int r = 0; r < batch; ++r) {
      int32_t* t = tokens.data() + size_t(r) * model_seq_len;
      int32_t* y = targets.data() + size_t(r) * model_seq_len;
      if (r < rows) {
        fill(first + r, t, y);
      } else {  // padding rows of the last batch: ignored targets, excluded from the mean
        std::fill(t, t + model_seq_len, 0);
        std::fill(y, y + model_seq_len, -1);
      }
    }
    const int64_t valid = int64_t(rows) * model_seq_len;
    loss_sum += double(model.forward_loss(tokens.data(), targets.data())) * double(valid);
    predicted += valid;
  }
  EvalResult r;
  r.tokens = predicted;
  r.loss = loss_sum / double(predicted);
  r.ppl = std::exp(r.loss);
  return r;
}

}  // namespace

EvalResult evaluate_saved_model(const EvalOptions& o) {
  if (o.data_glob.empty() == o.text_file.empty()) {
    throw Error(ErrorKind::Usage, "eval: give exactly one of --data SHARD_GLOB or --text FILE");
  }
  if (o.batch < 1) throw Error(ErrorKind::Usage, "eval: --batch must be >= 1");
  json model_section;
  int seq_len = o.seq_len;
  const bool hf = is_hf_model_dir(o.model_dir);
  if (hf) {
    model_section = read_hf_model_section(o.model_dir);
    if (seq_len == 0) seq_len = std::min(1024, model_section["max_seq_len"].get<int>());
  } else {
    verify_checkpoint(o.model_dir, CheckpointUse::Weights);
    json saved = read_checkpoint_config(o.model_dir);
    model_section = saved.at("model");
    if (seq_len == 0) {
      const json data = saved.value("data", json::object());
      const json saved_seq_len = data.is_object() ? data.value("seq_len", json()) : json();
      const std::optional<int64_t> seq_len_value = json_int64(saved_seq_len);
      if (!seq_len_value || *seq_len_value < 2 || *seq_len_value > 1 << 30) {
        throw Error(ErrorKind::Checkpoint, o.model_dir + "/config.json: \"data.seq_len\" is " +
                                               saved_seq_len.dump() +
                                               ", not a sequence length; give --seq-len");
      }
      seq_len = int(*seq_len_value);
    }
  }
  RunConfig config = run_config_from_json({{"model", with_any_attention_kernel(model_section)}});
  if (seq_len < 2 || seq_len > config.model.max_seq_len) {
    throw Error(ErrorKind::Usage,
                "eval: --seq-len must be in [2, " + std::to_string(config.model.max_seq_len) + "]");
  }

  config.backend = o.backend;
  config.train.threads = o.threads;
  // fp32 throughout: fp32 GEMMs (the config's default) and the attention auto picks under
  // them, whichever kernel trained the model (with_any_attention_kernel above).
  // Made once the batch is known: the model's attention shape goes with it (make_backend.h).
  std::string evaluated_on;  // "cuda (NVIDIA H200 (sm_90, 139 GiB))", for the log
  auto make_eval_backend = [&config, &evaluated_on](int batch, int model_seq_len) {
    std::unique_ptr<Backend> backend =
        make_backend(config, llama_attention_shape(config.model, batch, model_seq_len));
    evaluated_on = backend->name() + " (" + backend->device() + ")";
    return backend;
  };
  EvalResult result;
  if (!o.data_glob.empty()) {
    TokenLoader loader(o.data_glob, seq_len, config.model.vocab_size, "sequential", 0, 0, 1);
    check_prepared_shards("eval --data", loader.shard_paths());
    // The model's tokenizer (the checkpoint's copy) must be the one the shards were made with:
    // a loss over ids that mean other words is no perplexity of the model.
    const fs::path model_tokenizer = fs::path(o.model_dir) / "tokenizer.model";
    if (fs::exists(model_tokenizer)) {
      const int pieces = Tokenizer::load(model_tokenizer.string()).vocab_size();
      if (pieces != loader.shard_vocab_size()) {
        throw Error(ErrorKind::Data,
                    "eval: shards " + o.data_glob + " were made with a tokenizer of " +
                        std::to_string(loader.shard_vocab_size()) +
                        " pieces (their header), the model was trained with " +
                        model_tokenizer.string() + " of " + std::to_string(pieces));
      }
    }
    int64_t windows = loader.num_eval_windows();
    if (o.tokens > 0) windows = std::min(windows, std::max<int64_t>(1, o.tokens / seq_len));
    if (windows < 1)
      throw Error(ErrorKind::Data,
                  o.data_glob + ": fewer tokens than one window of " + std::to_string(seq_len + 1));
    int batch = int(std::min<int64_t>(o.batch, windows));
    std::unique_ptr<Backend> backend = make_eval_backend(batch, seq_len);
    LlamaModel model(config.model, *backend, batch, seq_len, PrecisionRecipe{},
                     SavedInputSharing::kShared, 1, ModelGradients::kNone);
    load_model_weights(o.model_dir, *backend, model);
    result = run_windows(model, batch, seq_len, windows,
                         [&](int64_t w, int32_t* t, int32_t* y) { loader.eval_window(w, t, y); });
  } else {
    const std::string model_tokenizer = (fs::path(o.model_dir) / "tokenizer.model").string();
    const std::string tokenizer_path = o.tokenizer.empty() ? model_tokenizer : o.tokenizer;
    Tokenizer tokenizer = Tokenizer::load(tokenizer_path);
    // --tokenizer is for a model folder without one: another tokenizer than the model's gives
    // ids that mean other words to it, and a loss that is no perplexity of the model.
    if (!o.tokenizer.empty() && fs::exists(model_tokenizer) &&
        read_file(model_tokenizer) != read_file(o.tokenizer)) {
      throw Error(ErrorKind::Data, "eval: --tokenizer " + o.tokenizer +
                                       " is not the model's tokenizer (" + model_tokenizer +
                                       "); leave --tokenizer out to use the model's");
    }
    if (tokenizer.vocab_size() > config.model.vocab_size) {
      throw Error(ErrorKind::Data,
                  "tokenizer " + tokenizer_path + " has " + std::to_string(tokenizer.vocab_size()) +
                      " pieces, the model only " + std::to_string(config.model.vocab_size));
    }
    std::vector<int32_t> stream = tokenizer.encode(read_file(o.text_file));
    int64_t windows = int64_t(stream.size()) / seq_len;  // a last partial window is dropped
    if (o.tokens > 0) windows = std::min(windows, std::max<int64_t>(1, o.tokens / seq_len));
    if (windows < 1) {
      throw Error(ErrorKind::Data, o.text_file + ": " + std::to_string(stream.size()) +
                                       " tokens, fewer than one window of " +
                                       std::to_string(seq_len));
    }
    const int model_seq_len = seq_len - 1;
    int batch = int(std::min<int64_t>(o.batch, windows));
    std::unique_ptr<Backend> backend = make_eval_backend(batch, model_seq_len);
    LlamaModel model(config.model, *backend, batch, model_seq_len, PrecisionRecipe{},
                     SavedInputSharing::kShared, 1, ModelGradients::kNone);
    load_model_weights(o.model_dir, *backend, model);
    result =
        run_windows(model, batch, model_seq_len, windows, [&](int64_t w, int32_t* t, int32_t* y) {
          const int32_t* window = stream.data() + w * seq_len;
          std::copy(window, window + model_seq_len, t);
          std::copy(window + 1, window + seq_len, y);
        });
  }
  spdlog::info("eval {} on {}: loss {:.4f}, ppl {:.3f} over {} tokens", o.model_dir, evaluated_on,
               result.loss, result.ppl, result.tokens);
  return result;
}

}  // namespace gnmr
