#include "train/hf_format.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "data/tokenizer.h"
#include "precision/bf16.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/safetensors.h"
#include "train/zero_checkpoint.h"
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
  require_existing_model_dir(dir.string());
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
  // The special ids are the tokenizer's (a sentencepiece model may put BOS and EOS anywhere):
  // generation stops at eos_token_id. Without a tokenizer the folder has none to name.
  const fs::path tokenizer_file = fs::path(checkpoint_dir) / "tokenizer.model";
  std::optional<Tokenizer> tokenizer;
  if (fs::exists(tokenizer_file)) {
    tokenizer = Tokenizer::load(tokenizer_file.string());
  } else {
    spdlog::warn(
        "export: {} has no tokenizer.model; the folder has no tokenizer and no "
        "bos/eos ids",
        checkpoint_dir);
  }
  const int bos = tokenizer ? tokenizer->bos_id() : -1;
  const int eos = tokenizer ? tokenizer->eos_id() : -1;
  write_file_atomic((tmp / "config.json").string(),
                    hf_config_from_model(model, dtype, bos, eos).dump(2) + "\n");
  json generation = json::object();
  if (bos >= 0) generation["bos_token_id"] = bos;
  if (eos >= 0) generation["eos_token_id"] = eos;
  write_file_atomic((tmp / "generation_config.json").string(), generation.dump(2) + "\n");
  if (!tokenizer) return;
  fs::copy_file(tokenizer_file, tmp / "tokenizer.model");
  // Without tokenizer_config.json, transformers 5 loads tokenizer.model as a tokenizer that
  // adds no BOS, while every document gnmr trains on starts with one (and LLaMA-2's does).
  // No tokenizer_class: transformers 5's LlamaTokenizer drops a leading space that
  // sentencepiece (and gnmr) encode; without the class its ids are sentencepiece's.
  json tokenizer_config = {{"add_bos_token", bos >= 0},
                           {"add_eos_token", false},
                           {"model_max_length", model.max_seq_len},
                           {"clean_up_tokenization_spaces", false}};
  if (bos >= 0) tokenizer_config["bos_token"] = tokenizer->piece(bos);
  if (eos >= 0) tokenizer_config["eos_token"] = tokenizer->piece(eos);
  if (tokenizer->unk_id() >= 0)
    tokenizer_config["unk_token"] = tokenizer->piece(tokenizer->unk_id());
  write_file_atomic((tmp / "tokenizer_config.json").string(), tokenizer_config.dump(2) + "\n");
}

// The shortest decimal that reads back as F. A float printed as a double carries the float's
// rounding (1e-5f is 9.999999747378752e-06), which a reader of config.json takes for the value.
double shortest_decimal(float f) {
  char text[32];
  for (int digits = 1; digits <= 9; ++digits) {  // 9 digits always round-trip a float
    std::snprintf(text, sizeof text, "%.*g", digits, double(f));
    if (std::strtof(text, nullptr) == f) break;
  }
  return std::strtod(text, nullptr);
}

// A folder gnmr wrote (a checkpoint, whole or damaged, or a run directory): any of a
// checkpoint's own files, or a config.json that is a gnmr config (a "model" section, no HF
// model_type). Any other folder with a config.json is read as an HF model folder.
bool is_gnmr_folder(const fs::path& dir) {
  for (const char* name : {"trainer.json", "optimizer.safetensors", "controller.bin",
                           "manifest.json", kZeroShardsIndexName, "checkpoints"}) {
    if (fs::exists(dir / name)) return true;
  }
  const json config = json::parse(read_file((dir / "config.json").string()), nullptr, false);
  return config.is_object() && config.contains("model") && config["model"].is_object() &&
         !config.contains("model_type");
}

}  // namespace

bool is_hf_model_dir(const std::string& dir) {
  return fs::exists(fs::path(dir) / "config.json") && !is_gnmr_folder(dir);
}

json read_hf_model_section(const std::string& dir) {
  return model_section_from_hf(read_json(fs::path(dir) / "config.json"), dir);
}

json with_any_attention_kernel(json model_section) {
  if (model_section.is_object()) model_section["attention"] = "auto";
  return model_section;
}

json hf_config_from_model(const ModelConfig& m, const std::string& torch_dtype, int bos_id,
                          int eos_id) {
  json hf = {{"architectures", {"LlamaForCausalLM"}},
             {"model_type", "llama"},
             {"hidden_size", m.dim},
             {"intermediate_size", m.ffn_dim},
             {"num_attention_heads", m.n_heads},
             {"num_key_value_heads", m.n_kv_heads},
             {"num_hidden_layers", m.n_layers},
             {"vocab_size", m.vocab_size},
             {"max_position_embeddings", m.max_seq_len},
             {"head_dim", m.head_dim()},
             {"rms_norm_eps", shortest_decimal(m.norm_eps)},
             {"rope_theta", shortest_decimal(m.rope_theta)},
             {"initializer_range", shortest_decimal(m.init_std)},
             {"hidden_act", "silu"},
             {"attention_bias", false},
             {"mlp_bias", false},
             {"tie_word_embeddings", false},
             {"torch_dtype", torch_dtype}};
  if (bos_id >= 0) hf["bos_token_id"] = bos_id;
  if (eos_id >= 0) hf["eos_token_id"] = eos_id;
  return hf;
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
    if (hf.value("model_type", json()) != "llama") {
      throw bad("has model_type " + hf.value("model_type", json()).dump() +
                ": gnmr reads \"llama\" models only");
    }
    if (hf.contains("rope_scaling") && !hf["rope_scaling"].is_null())
      throw unsupported("rope_scaling");
    // transformers 5 writes RoPE's base inside rope_parameters, with its scaling kind (4.x:
    // top-level rope_theta and rope_scaling). Only the unscaled kind is gnmr's RoPE.
    json rope_theta = hf.value("rope_theta", json(10000.0));
    if (hf.contains("rope_parameters") && !hf["rope_parameters"].is_null()) {
      const json& rope = hf["rope_parameters"];
      if (!rope.is_object()) throw bad("\"rope_parameters\" is not an object");
      const json type = rope.value("rope_type", json("default"));
      if (type != "default") {
        throw bad("\"rope_parameters\" has rope_type " + type.dump() +
                  ": gnmr's RoPE is unscaled (\"default\") only");
      }
      for (const auto& [key, value] : rope.items()) {
        if (key != "rope_type" && key != "rope_theta") {
          throw bad("\"rope_parameters\" holds \"" + key + "\", which gnmr's RoPE does not have");
        }
      }
      if (rope.contains("rope_theta")) {
        if (hf.contains("rope_theta") && hf["rope_theta"] != rope["rope_theta"]) {
          throw bad("gives two RoPE bases: rope_theta " + hf["rope_theta"].dump() +
                    " and rope_parameters.rope_theta " + rope["rope_theta"].dump());
        }
        rope_theta = rope["rope_theta"];
      }
    }
    // A head size other than hidden_size / num_attention_heads is another attention shape.
    const json heads = hf.at("num_attention_heads");
    if (hf.contains("head_dim") && !hf["head_dim"].is_null() && heads.is_number_integer() &&
        heads.get<int64_t>() > 0 && hf.at("hidden_size").is_number_integer() &&
        hf["head_dim"] != json(hf["hidden_size"].get<int64_t>() / heads.get<int64_t>())) {
      throw bad("has head_dim " + hf["head_dim"].dump() +
                ", not hidden_size / num_attention_heads: gnmr's heads split the hidden size");
    }
    if (hf.value("tie_word_embeddings", false)) throw unsupported("tie_word_embeddings");
    if (hf.value("attention_bias", false)) throw unsupported("attention_bias");
    if (hf.value("mlp_bias", false)) throw unsupported("mlp_bias");
    if (hf.value("hidden_act", "silu") != "silu") throw unsupported("hidden_act");
    // Values are copied as JSON: the gnmr schema checks their types and ranges below, so a
    // fraction or a huge number is an error here rather than a conversion.
    section = {{"name", hf.value("_name_or_path", "hf")},
               {"dim", hf.at("hidden_size")},
               {"n_layers", hf.at("num_hidden_layers")},
               {"n_heads", heads},
               {"n_kv_heads", hf.value("num_key_value_heads", heads)},
               {"ffn_dim", hf.at("intermediate_size")},
               {"vocab_size", hf.at("vocab_size")},
               {"max_seq_len", hf.value("max_position_embeddings", 2048)},
               {"norm_eps", hf.value("rms_norm_eps", 1e-6)},
               {"rope_theta", rope_theta}};
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

void check_init_source(const std::string& dir, const RunConfig& config) {
  const json section = with_any_attention_kernel(
      is_hf_model_dir(dir) ? read_hf_model_section(dir)
                           : read_checkpoint_config(dir).value("model", json()));
  ModelConfig source;
  try {
    source = run_config_from_json({{"model", section}}).model;
  } catch (const Error& e) {
    throw Error(ErrorKind::Checkpoint,
                dir + "/config.json: its model section is not valid: " + std::string(e.what()));
  }
  const ModelConfig& model = config.model;
  auto refuse = [&](const std::string& key, const std::string& theirs, const std::string& ours) {
    throw Error(ErrorKind::Checkpoint, "--init " + dir + ": its weights were trained with model." +
                                           key + " = " + theirs + ", this run's is " + ours +
                                           " (set model." + key + "=" + theirs + " to load them)");
  };
  const std::pair<const char*, std::pair<int, int>> shapes[] = {
      {"dim", {source.dim, model.dim}},
      {"n_layers", {source.n_layers, model.n_layers}},
      {"n_heads", {source.n_heads, model.n_heads}},
      {"n_kv_heads", {source.n_kv_heads, model.n_kv_heads}},
      {"ffn_dim", {source.ffn_dim, model.ffn_dim}},
      {"vocab_size", {source.vocab_size, model.vocab_size}}};
  for (const auto& [key, values] : shapes) {
    if (values.first != values.second)
      refuse(key, std::to_string(values.first), std::to_string(values.second));
  }
  if (source.norm_eps != model.norm_eps) {
    refuse("norm_eps", json(shortest_decimal(source.norm_eps)).dump(),
           json(shortest_decimal(model.norm_eps)).dump());
  }
  if (source.rope_theta != model.rope_theta || source.max_seq_len != model.max_seq_len) {
    spdlog::info(
        "--init {}: trained with model.rope_theta {} and max_seq_len {}; this run uses "
        "{} and {}",
        dir, shortest_decimal(source.rope_theta), source.max_seq_len,
        shortest_decimal(model.rope_theta), model.max_seq_len);
  }

  // The tokenizer: ids that meant other words in training mean nothing to this run's data.
  if (config.data.tokenizer.empty()) return;
  const fs::path theirs = fs::path(dir) / "tokenizer.model";
  if (!fs::exists(theirs)) {
    spdlog::warn(
        "--init {}: no tokenizer.model there, so nothing says its weights were trained "
        "with data.tokenizer {}",
        dir, config.data.tokenizer);
    return;
  }
  if (read_file(theirs.string()) != read_file(config.data.tokenizer)) {
    throw Error(ErrorKind::Checkpoint,
                "--init " + dir + ": its weights were trained with " + theirs.string() +
                    ", another tokenizer than data.tokenizer " + config.data.tokenizer +
                    ": the same ids would mean other words");
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
  verify_checkpoint(checkpoint_dir, CheckpointUse::Weights);
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
