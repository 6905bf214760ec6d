// trainer/train/hf_config.h: a Hugging Face config.json read into a ModelShape.
//
// Owns: the families zerotrace reads (gpt2, llama, mistral, mixtral, qwen2, qwen2_moe, qwen3,
// qwen3_moe, deepseek_v2, deepseek_v3, t5, bart), each key as the family's configuration class
// reads it (its defaults where the file leaves a key out), and each family's own parameter-count
// formula, written apart from the shape's module table (model_shape.h): the two must agree to the
// parameter, or the file is refused (a shape that miscounts would replay another model's memory).
// A key that changes the layout and that zerotrace does not model is refused by name, never
// dropped. Sizes only: nothing here reads weights.
// May call: nlohmann::json, model_shape.h. Called by: zt repro's scenario reader (model: {hf_config}),
// `zt repro init`, the tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/train_config.h"
#include "zt/common/status.h"

namespace zt::trainer {

struct HfModel {
  ModelShape shape;
  std::string family;          // the file's model_type: "llama", "qwen3_moe", "t5", ...
  std::string dtype;           // the checkpoint's dtype as zerotrace names it (bf16, fp16, fp32); "" if not given
  std::string attention;       // attn_implementation (eager, sdpa, flash_attention_2); "" if not given
  double attention_dropout = 0;  // attention_dropout (attn_pdrop: GPT-2; dropout_rate: T5); 0 if not given
  int64_t formula_params = 0;  // the family's own formula over the file's fields
  std::vector<std::string> notes;  // what is approximated (MLA's RoPE split, ...), one line each
};

// Reads `path` (a config.json). Errors name the file and the key.
Status read_hf_config(const std::string& path, HfModel* out);
// The same from parsed JSON; `origin` names it in messages.
Status hf_config_from_json(const nlohmann::json& j, const std::string& origin, HfModel* out);
// The families read, as "gpt2, llama, ...".
std::string hf_families();

}  // namespace zt::trainer
