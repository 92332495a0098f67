// An HF folder's config.json read the way `gnmr eval` reads it: is_hf_model_dir, then
// model_section_from_hf. Every damaged file found by the fuzz target
// (tests/fuzz/fuzz_hf_config.cpp) is a Checkpoint error naming the folder.
#include <gtest/gtest.h>

#include <fstream>

#include "expect_error.h"
#include "test_paths.h"
#include "train/hf_format.h"

using nlohmann::json;

namespace {

const json kTinyLlama = {{"model_type", "llama"},    {"hidden_size", 64},
                         {"intermediate_size", 172}, {"num_attention_heads", 4},
                         {"num_key_value_heads", 2}, {"num_hidden_layers", 2},
                         {"vocab_size", 4096},       {"max_position_embeddings", 256}};

json with(const std::string& key, const json& value) {
  json hf = kTinyLlama;
  hf[key] = value;
  return hf;
}

void expect_bad_hf(const json& hf, const std::string& needle) {
  gnmr_test::expect_error([&] { gnmr::model_section_from_hf(hf, "models/x"); },
                          gnmr::ErrorKind::Checkpoint, {"models/x: config.json", needle});
}

std::string dir_with_config(const std::string& name, const std::string& text) {
  const std::string dir = gnmr_test::scratch_dir(name);
  std::ofstream(dir + "/config.json") << text;
  return dir;
}

}  // namespace

TEST(HfConfig, MapsALlamaConfigToTheModelSection) {
  const json section = gnmr::model_section_from_hf(kTinyLlama, "models/x");
  EXPECT_EQ(section["dim"], 64);
  EXPECT_EQ(section["n_heads"], 4);
  EXPECT_EQ(section["n_kv_heads"], 2);
  EXPECT_EQ(section["ffn_dim"], 172);
  EXPECT_EQ(section["max_seq_len"], 256);
}

// A folder with a config.json that is no gnmr checkpoint is read as an HF folder, and what is
// wrong with its config.json is said: a damaged or non-llama one once made the folder a gnmr
// checkpoint, reported as "optimizer.safetensors is missing". (Found by fuzz_hf_config: JSON
// that is not an object, or a model_type that is not a string, escaped as a json::type_error.)
TEST(HfConfig, AFolderWithAConfigJsonIsReadAsHfAndItsFaultsNamed) {
  const std::string llama = dir_with_config("hf_llama", kTinyLlama.dump());
  EXPECT_TRUE(gnmr::is_hf_model_dir(llama));
  EXPECT_EQ(gnmr::read_hf_model_section(llama)["dim"], 64);
  const std::string not_json = dir_with_config("hf_not_json", "{\"model_type\": \"llama\",");
  EXPECT_TRUE(gnmr::is_hf_model_dir(not_json));
  gnmr_test::expect_error([&] { gnmr::read_hf_model_section(not_json); },
                          gnmr::ErrorKind::Checkpoint, {"config.json", "invalid JSON"});
  // A gnmr checkpoint's folder is not an HF folder, whatever its config.json says.
  const std::string checkpoint = dir_with_config("hf_gnmr_checkpoint", kTinyLlama.dump());
  std::ofstream(checkpoint + "/trainer.json") << "{}";
  EXPECT_FALSE(gnmr::is_hf_model_dir(checkpoint));
  expect_bad_hf(json::array({1}), "is not a JSON object");
  expect_bad_hf(with("model_type", 7), "has model_type 7");
  expect_bad_hf(with("model_type", "mistral"), "gnmr reads \"llama\" models only");
}

// transformers 5 saves RoPE's base as rope_parameters.rope_theta and no top-level rope_theta:
// it was read as the default 10000. Scaled kinds, and a head size of their own, are refused.
TEST(HfConfig, ReadsRopeParametersAndRefusesWhatGnmrsRopeIsNot) {
  json v5 = kTinyLlama;
  v5["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "default"}};
  EXPECT_EQ(gnmr::model_section_from_hf(v5, "models/x")["rope_theta"], 500000.0);
  EXPECT_EQ(gnmr::model_section_from_hf(with("rope_theta", 100.0), "models/x")["rope_theta"],
            100.0);
  expect_bad_hf(with("rope_parameters", {{"rope_type", "linear"}, {"factor", 4.0}}),
                "rope_type \"linear\"");
  expect_bad_hf(with("rope_parameters", {{"rope_theta", 1e4}, {"partial_rotary_factor", 0.5}}),
                "\"partial_rotary_factor\"");
  json two_bases = v5;
  two_bases["rope_theta"] = 10000.0;
  expect_bad_hf(two_bases, "two RoPE bases");
  expect_bad_hf(with("head_dim", 32), "has head_dim 32");
  EXPECT_EQ(gnmr::model_section_from_hf(with("head_dim", 16), "models/x")["n_heads"], 4);
}

// An export's config.json reads back as the model, floats without float noise (1e-5f once
// printed as 9.999999747378752e-06), with the tokenizer's special ids when given.
TEST(HfConfig, AnExportsConfigReadsBackAsTheSameModel) {
  gnmr::ModelConfig model;
  model.norm_eps = 1e-5f;
  model.rope_theta = 500000.0f;
  model.init_std = 0.02f;
  const json hf = gnmr::hf_config_from_model(model, "float32", 2, 3);
  EXPECT_EQ(hf["rms_norm_eps"].dump(), "1e-05");
  EXPECT_EQ(hf["initializer_range"].dump(), "0.02");
  EXPECT_EQ(hf["bos_token_id"], 2);
  EXPECT_EQ(hf["eos_token_id"], 3);
  EXPECT_FALSE(gnmr::hf_config_from_model(model, "float32", -1, -1).contains("bos_token_id"));
  const gnmr::ModelConfig back =
      gnmr::run_config_from_json({{"model", gnmr::model_section_from_hf(hf, "models/x")}}).model;
  EXPECT_EQ(back.norm_eps, model.norm_eps);
  EXPECT_EQ(back.rope_theta, model.rope_theta);
  EXPECT_EQ(back.dim, model.dim);
  EXPECT_EQ(back.n_kv_heads, model.n_kv_heads);
}

// Found by fuzz_hf_config: a model gnmr cannot build (head dim 7) was a Config error (exit
// 3) naming a gnmr key, not a Checkpoint error naming the folder.
TEST(HfConfig, ModelGnmrCannotBuildIsACheckpointError) {
  expect_bad_hf(with("hidden_size", 28), "must leave an even head dim");
  expect_bad_hf(with("num_key_value_heads", 3), "model.n_kv_heads");
  expect_bad_hf(with("vocab_size", 0), "model.vocab_size");
}

// Found by fuzz_hf_config: num_attention_heads 1e300 was converted to int (UB); a flag of
// the wrong type escaped as a json::type_error.
TEST(HfConfig, FieldsOfTheWrongTypeAreCheckpointErrors) {
  expect_bad_hf(with("num_attention_heads", 1e300), "model.n_heads");
  expect_bad_hf(with("hidden_size", "64"), "model.dim");
  expect_bad_hf(with("hidden_size", 4294967360LL), "model.dim");
  expect_bad_hf(with("tie_word_embeddings", "no"), "wrong type");
  expect_bad_hf(with("_name_or_path", 3), "wrong type");
  json no_heads = kTinyLlama;
  no_heads.erase("num_attention_heads");
  expect_bad_hf(no_heads, "lacks a required field");
  expect_bad_hf(with("rope_scaling", {{"type", "linear"}}), "\"rope_scaling\" is not supported");
}
