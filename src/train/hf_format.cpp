#include "train/hf_format.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "precision/bf16.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/safetensors.h"
#include "util/atomic_file.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gnmr {

namespace {

json read_json(const fs::path& path) {
  json j = json::parse(read_file(path.string()), nullptr, false);
  if (j.is_discarded()) throw Error(ErrorKind::Checkpoint, path.string() + ": invalid JSON");
  return j;
}

// name -> file holding it, for single-file and sharded HF layouts and gnmr checkpoints.
std::map<std::string, std::string> weight_files(const fs::path& dir) {
  std::map<std::string, std::string> out;
  fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    json j = read_json(index);
    for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) {
      out[it.key()] = (dir / it->get<std::string>()).string();
    }
    return out;
  }
  fs::path single = dir / "model.safetensors";
  if (!fs::exists(single)) {
    throw Error(ErrorKind::Checkpoint, dir.string() + ": no model.safetensors (or index) found");
  }
  for (const auto& name : SafetensorsFile(single.string()).names()) out[name] = single.string();
  return out;
}

// The files of an HF folder, written into TMP (the temporary directory).
void write_hf_files(const SafetensorsFile& weights, const ModelConfig& model,
                    const std::string& checkpoint_dir, const fs::path& tmp,
                    const std::string& dtype) {
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<uint16_t>> b16;
  std::vector<SafetensorsTensor> tensors;
  for (const auto& name : weights.names()) {
    const auto& shape = weights.shape(name);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    f32.emplace_back(size_t(n));
    weights.read_f32(name, shape, f32.back().data());
    if (dtype == "bfloat16") {
      b16.emplace_back(size_t(n));
      for (int64_t i = 0; i < n; ++i) b16.back()[size_t(i)] = encode_bf16(f32.back()[size_t(i)]);
      tensors.push_back({name, "BF16", shape, b16.back().data()});
      f32.back().clear();
      f32.back().shrink_to_fit();
    } else {
      tensors.push_back({name, "F32", shape, f32.back().data()});
    }
  }
  write_safetensors((tmp / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_file_atomic((tmp / "config.json").string(),
                    hf_config_from_model(model, dtype).dump(2) + "\n");
  json generation = {{"bos_token_id", 1}, {"eos_token_id", 2}};
  write_file_atomic((tmp / "generation_config.json").string(), generation.dump(2) + "\n");
  fs::path tokenizer = fs::path(checkpoint_dir) / "tokenizer.model";
  if (fs::exists(tokenizer)) fs::copy_file(tokenizer, tmp / "tokenizer.model");
}

}  // namespace

bool is_hf_model_dir(const std::string& dir) {
  fs::path config = fs::path(dir) / "config.json";
  if (!fs::exists(config)) return false;
  json j = json::parse(read_file(config.string()), nullptr, false);
  return j.is_object() && j.contains("model_type") && j["model_type"] == "llama";
}

json hf_config_from_model(const ModelConfig& m, const std::string& torch_dtype) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", m.dim},
          {"intermediate_size", m.ffn_dim},
          {"num_attention_heads", m.n_heads},
          {"num_key_value_heads", m.n_kv_heads},
          {"num_hidden_layers", m.n_layers},
          {"vocab_size", m.vocab_size},
          {"max_position_embeddings", m.max_seq_len},
          {"rms_norm_eps", m.norm_eps},
          {"rope_theta", m.rope_theta},
          {"initializer_range", m.init_std},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"tie_word_embeddings", false},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"torch_dtype", torch_dtype}};
}

json model_section_from_hf(const json& hf, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorKind::Checkpoint, where + ": config.json " + what);
  };
  auto unsupported = [&](const std::string& key) {
    return bad("\"" + key + "\" is not supported by gnmr");
  };
  if (!hf.is_object()) throw bad("is not a JSON object");
  json section;
  try {
    if (hf.contains("rope_scaling") && !hf["rope_scaling"].is_null())
      throw unsupported("rope_scaling");
    if (hf.value("tie_word_embeddings", false)) throw unsupported("tie_word_embeddings");
    if (hf.value("attention_bias", false)) throw unsupported("attention_bias");
    if (hf.value("mlp_bias", false)) throw unsupported("mlp_bias");
    if (hf.value("hidden_act", "silu") != "silu") throw unsupported("hidden_act");
    // Values are copied as JSON: the gnmr schema checks their types and ranges below, so a
    // fraction or a huge number is an error here rather than a conversion.
    const json heads = hf.at("num_attention_heads");
    section = {{"name", hf.value("_name_or_path", "hf")},
               {"dim", hf.at("hidden_size")},
               {"n_layers", hf.at("num_hidden_layers")},
               {"n_heads", heads},
               {"n_kv_heads", hf.value("num_key_value_heads", heads)},
               {"ffn_dim", hf.at("intermediate_size")},
               {"vocab_size", hf.at("vocab_size")},
               {"max_seq_len", hf.value("max_position_embeddings", 2048)},
               {"norm_eps", hf.value("rms_norm_eps", 1e-6)},
               {"rope_theta", hf.value("rope_theta", 10000.0)}};
  } catch (const json::exception& e) {
    throw bad(std::string("lacks a required field or has one of the wrong type: ") + e.what());
  }
  try {
    run_config_from_json({{"model", section}});
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Config) throw;
    throw bad(std::string("does not describe a model gnmr can build: ") + e.what());
  }
  return section;
}

void load_model_weights(const std::string& dir, Backend& backend, LlamaModel& model) {
  std::map<std::string, std::string> files = weight_files(dir);
  // A weight the model has no place for is another shape (a 2-layer checkpoint into a 1-layer
  // model once loaded silently without its second layer). Older HF folders also store RoPE's
  // inverse frequencies, which the model computes: those are not weights.
  std::set<std::string> names;
  for (const auto& p : model.params()) names.insert(p.name);
  for (const auto& [name, file] : files) {
    const std::string inv_freq = "rotary_emb.inv_freq";
    const bool rope_table =
        name.size() >= inv_freq.size() &&
        name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0;
    if (names.count(name) == 0 && !rope_table) {
      throw Error(ErrorKind::Checkpoint,
                  dir + ": tensor \"" + name + "\" (" + file +
                      ") is not a parameter of the model the config describes (model.n_layers "
                      "= " +
                      std::to_string(model.config().n_layers) +
                      "): the weights are of another model shape");
    }
  }
  std::map<std::string, std::unique_ptr<SafetensorsFile>> open;
  std::vector<float> host;
  for (const auto& p : model.params()) {
    auto it = files.find(p.name);
    if (it == files.end())
      throw Error(ErrorKind::Checkpoint, dir + ": missing tensor \"" + p.name + "\"");
    auto& file = open[it->second];
    if (!file) file = std::make_unique<SafetensorsFile>(it->second);
    host.resize(size_t(p.weight.numel()));
    file->read_f32(p.name, p.shape, host.data());
    Tensor w = p.weight;
    backend.copy_from_host(w, host.data());
  }
}

void export_hf_model(const std::string& checkpoint_dir, const std::string& out_dir,
                     const std::string& dtype) {
  if (dtype != "float32" && dtype != "bfloat16") {
    throw Error(ErrorKind::Usage, "--dtype must be float32 or bfloat16, got \"" + dtype + "\"");
  }
  if (fs::exists(out_dir)) {
    throw Error(ErrorKind::Checkpoint, "export: --out " + out_dir +
                                           " already exists; choose a new folder (export "
                                           "never overwrites)");
  }
  verify_checkpoint(checkpoint_dir);
  json config = read_checkpoint_config(checkpoint_dir);
  RunConfig run = run_config_from_json(config);
  SafetensorsFile weights((fs::path(checkpoint_dir) / "model.safetensors").string());

  fs::path out = fs::absolute(without_trailing_separator(out_dir));
  fs::create_directories(out.parent_path());
  const std::string tmp_prefix = ".tmp_" + out.filename().string() + "_";
  remove_stale_temp_dirs(out.parent_path().string(), tmp_prefix);
  fs::path tmp = out.parent_path() / (tmp_prefix + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    write_hf_files(weights, run.model, checkpoint_dir, tmp, dtype);
    publish_directory(tmp.string(), out.string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a failed export (disk full) leaves nothing behind
    throw;
  }
  spdlog::info("exported {} -> {} ({})", checkpoint_dir, out.string(), dtype);
}

}  // namespace gnmr
