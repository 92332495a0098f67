// Hugging Face LlamaForCausalLM folders: config.json + model.safetensors (or sharded
// model-XXXXX-of-YYYYY.safetensors with model.safetensors.index.json) + tokenizer.model.
// gnmr parameter names are the HF names, so a checkpoint's weights map one to one.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "config/config.h"
#include "model/llama.h"

namespace gnmr {

// True when DIR holds an HF model (config.json with model_type "llama").
bool is_hf_model_dir(const std::string& dir);

nlohmann::json hf_config_from_model(const ModelConfig& model, const std::string& torch_dtype);

// The model section of a gnmr config equivalent to an HF config.json, checked against the
// gnmr schema. Unsupported features (rope_scaling, biases, tied embeddings), a missing or
// mistyped field and a model gnmr cannot build (e.g. heads that do not divide the hidden
// size) are Checkpoint errors naming WHERE and the key.
nlohmann::json model_section_from_hf(const nlohmann::json& hf_config, const std::string& where);

// Loads every parameter of `model` from a gnmr checkpoint or an HF folder by name.
void load_model_weights(const std::string& dir, Backend& backend, LlamaModel& model);

// `gnmr export`: writes OUT_DIR (must not exist) atomically. dtype: "float32" or "bfloat16".
void export_hf_model(const std::string& checkpoint_dir, const std::string& out_dir,
                     const std::string& dtype);

}  // namespace gnmr
