// model/layout.h: the one parameter table of GPT-2 (llm.c's habit: one explicit list of tensors).
//
// Owns the layout of the flat fp32 parameter buffer, which gradients, Adam moments and checkpoints
// share. Every other fact about where a tensor lives (kernel offsets, Hugging Face export, ZeRO
// module partitions) is derived from param_table(); nothing else hardcodes an offset.
//
// Invariants (tested in layout_test):
//   - tensors are packed with no gaps, in table order; offsets start at 0; the sum of numel is
//     num_params(config);
//   - every tensor belongs to one module; a module's tensors are contiguous and modules appear in
//     order: 0 = "embeddings" (wte, wpe), 1..L = "block0".."block{L-1}", L+1 = "final_ln";
//   - every block has the same internal layout, so offsets relative to a block's start
//     (block_offsets) hold for every layer;
//   - our weights are [out, in] row-major (nn.Linear's convention); Hugging Face's GPT-2 stores its
//     Conv1D weights [in, out], so those entries have hf_transposed = true and hf_shape reversed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace zt::model {

struct ParamSpec {
  std::string name;               // ours: "wte", "block3.attn.qkv.weight", "final_ln.bias"
  std::string hf_name;            // Hugging Face GPT-2: "transformer.h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;     // ours, row-major
  std::vector<int64_t> hf_shape;  // as stored in a Hugging Face checkpoint
  bool hf_transposed = false;     // true when hf_shape is shape reversed (Conv1D weights)
  int64_t numel = 0;
  int64_t offset = 0;             // elements from the start of the flat buffer
  int64_t offset_in_module = 0;   // elements from the start of its module
  int module = 0;                 // index into module_table()
};

struct ModuleSpec {
  std::string name;  // "embeddings", "block0", ..., "final_ln"
  int index = 0;
  int64_t offset = 0;  // elements from the start of the flat buffer
  int64_t numel = 0;
  int first_param = 0;  // index into param_table() of its first tensor
  int num_params = 0;   // how many consecutive tensors
};

// Both require validate(config).ok().
std::vector<ParamSpec> param_table(const Config& config);
std::vector<ModuleSpec> module_table(const Config& config);

// Offsets of each tensor inside one block's parameters (and inside its gradient buffer), relative
// to the block's start, derived from param_table's block0 entries. numel is the block's size.
struct BlockOffsets {
  int64_t ln1_w, ln1_b, qkv_w, qkv_b, attn_proj_w, attn_proj_b;
  int64_t ln2_w, ln2_b, fc_w, fc_b, mlp_proj_w, mlp_proj_b;
  int64_t numel;
};
BlockOffsets block_offsets(const Config& config);

// Offsets inside the embeddings module (wte then wpe) and the final LayerNorm module.
struct EmbeddingOffsets {
  int64_t wte, wpe, numel;
};
EmbeddingOffsets embedding_offsets(const Config& config);
struct FinalOffsets {
  int64_t ln_w, ln_b, numel;
};
FinalOffsets final_offsets(const Config& config);

}  // namespace zt::model
