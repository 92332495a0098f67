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

// True when DIR is read as an HF model folder: it has a config.json and is not a gnmr
// checkpoint (which holds trainer.json and optimizer.safetensors). Whether that config.json
// describes a model gnmr can build is read_hf_model_section's to say, with the reason.
bool is_hf_model_dir(const std::string& dir);

// The config.json of an export. BOS_ID / EOS_ID are the tokenizer's (-1: not written).
nlohmann::json hf_config_from_model(const ModelConfig& model, const std::string& torch_dtype,
                                    int bos_id, int eos_id);

// The model section of a gnmr config equivalent to an HF config.json, checked against the
// gnmr schema. Unsupported features (rope_scaling, biases, tied embeddings), a missing or
// mistyped field and a model gnmr cannot build (e.g. heads that do not divide the hidden
// size) are Checkpoint errors naming WHERE and the key.
nlohmann::json model_section_from_hf(const nlohmann::json& hf_config, const std::string& where);

// model_section_from_hf of DIR/config.json; a file that is not JSON is a Checkpoint error.
nlohmann::json read_hf_model_section(const std::string& dir);

// A saved model section (a checkpoint's or an HF folder's) with model.attention = "auto": the
// kernel that trained a model says how its attention was computed, not what, and a CUDA-only
// one ("flash") is refused by the config check of a cpu run that reads the model.
nlohmann::json with_any_attention_kernel(nlohmann::json model_section);

// `gnmr train --init DIR` (a gnmr checkpoint or an HF folder): the weights must have been
// trained as the model CONFIG builds, in every field that changes what they compute beyond
// their shapes (heads, norm epsilon), and with its tokenizer (data.tokenizer against
// DIR/tokenizer.model, byte for byte): Checkpoint errors naming both. A different RoPE base
// or context length is allowed (extending the context changes them) and logged.
void check_init_source(const std::string& dir, const RunConfig& config);

// Loads every parameter of `model` from a gnmr checkpoint or an HF folder by name.
void load_model_weights(const std::string& dir, Backend& backend, LlamaModel& model);

// `gnmr export`: writes OUT_DIR (must not exist) atomically. dtype: "float32" or "bfloat16".
void export_hf_model(const std::string& checkpoint_dir, const std::string& out_dir,
                     const std::string& dtype);

}  // namespace gnmr
