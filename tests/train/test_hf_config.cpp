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

bool is_hf_dir_with_config(const std::string& name, const std::string& text) {
  const std::string dir = gnmr_test::scratch_dir(name);
  std::ofstream(dir + "/config.json") << text;
  return gnmr::is_hf_model_dir(dir);
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

// Found by fuzz_hf_config: a config.json that is JSON but not an object, or whose
// model_type is not a string, escaped from is_hf_model_dir as a json::type_error.
TEST(HfConfig, NonObjectOrOddModelTypeIsNotAnHfFolder) {
  EXPECT_TRUE(is_hf_dir_with_config("hf_llama", kTinyLlama.dump()));
  EXPECT_FALSE(is_hf_dir_with_config("hf_array", "[1]"));
  EXPECT_FALSE(is_hf_dir_with_config("hf_number_type", R"({"model_type": 7})"));
  EXPECT_FALSE(is_hf_dir_with_config("hf_not_json", "{"));
  expect_bad_hf(json::array({1}), "is not a JSON object");
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
