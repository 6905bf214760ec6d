// trainer/train/model_shape.h: the bug reports' real models as module tables, for virtual
// mode (issue 9). A ModelShape (train_config.h) describes a transformer by width, layers,
// heads, kv-heads, FFN, vocab and experts; this file turns it into the per-module parameter
// counts the ZeRO engine partitions (the activation memory is zero/ds_memory.h's).
// Owns: those formulas and the checks that refuse impossible shapes. Nothing here does math
// on weights: a shape is for sizes only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layout.h"
#include "train/train_config.h"
#include "zt/common/status.h"

namespace zt::trainer {

// Every field of a ModelShape by its name in scenario files, --config YAML and the trace's JSON
// (one table: readers and writers iterate it). Exactly one of the three members is set.
struct ShapeField {
  const char* name;
  int64_t ModelShape::*integer = nullptr;
  bool ModelShape::*flag = nullptr;
  std::string ModelShape::*text = nullptr;
};
const std::vector<ShapeField>& shape_fields();
// "name, width, layers, ..." (for messages that list the keys).
std::string shape_field_list();

// GPT-2's layout as a shape (kv_heads = heads, ffn = 4 width, tied embeddings, learned positions).
ModelShape shape_of(const model::Config& gpt2, const std::string& name);

// Ok, or one line naming the field: positive sizes, heads dividing width, kv_heads dividing
// heads, experts with an expert_ffn, counts that fit int64.
Status validate_shape(const ModelShape& s);

// The modules, in the engine's order: "embeddings" (token embedding, plus learned positions
// when the shape is GPT-2's), "block0".."block{L-1}" (attention with grouped KV heads, two
// norms, a dense or gated FFN, or a router with routed and shared experts after the first
// dense_layers), "final_ln", and "lm_head" when the embeddings are not tied.
std::vector<model::ModuleSpec> shape_modules(const ModelShape& s, bool learned_positions);
// The same modules' parameters (nn.Parameters: the units DeepSpeed partitions, buckets and keeps
// whole below its persistence threshold), each module's in a pre-LN block's order (norm, attention
// with its biases and q/k norms, cross-attention, norm, FFN or experts and router); a module's
// numel in shape_modules is the sum of its list.
std::vector<std::vector<int64_t>> shape_module_parameters(const ModelShape& s, bool learned_positions);

int64_t shape_params(const ModelShape& s, bool learned_positions);
// Transformer blocks of the shape: its layers, and an encoder-decoder's encoder layers before them.
int64_t shape_blocks(const ModelShape& s);
// LoRA's adapter parameters of block `block` (in shape_modules' order of blocks) at rank `rank`:
// r x (in + out) for each targeted linear layer. targets: "qv" (q and v: PEFT's default for Llama),
// "attention" (q, k, v, o, and cross-attention's), "all" (every linear of the block: PEFT's
// all-linear, the MLP's or every expert's and the router).
int64_t lora_params(const ModelShape& s, int64_t block, int64_t rank, const std::string& targets);
// The same adapters as parameters: lora_A (r x in) and lora_B (out x r) of each targeted linear.
std::vector<int64_t> lora_parameters(const ModelShape& s, int64_t block, int64_t rank, const std::string& targets);
// An upper bound of shape_params, in long double, for any shape (no product can overflow): the
// embeddings (tied or not, with learned positions), each layer's attention, norms, and its dense
// FFN or experts and router, whichever is larger. A reader of shapes (zt repro's scenarios)
// refuses a shape whose bound would not fit int64 before anything computes shape_params.
long double shape_params_bound(const ModelShape& s);
// The limits every reader of shapes applies before it computes from them (zt repro's scenarios,
// Hugging Face configs): real models are far inside them (~130 layers, ~1 T parameters).
constexpr int64_t kMaxShapeLayers = int64_t(1) << 16;
constexpr int64_t kMaxShapeParams = int64_t(1) << 44;  // ~17.6 T parameters

// Bytes of activations kept for backward by one micro-batch of B sequences of T tokens, in a
// 16-bit dtype (Korthikanti et al. 2022, no sequence parallelism): per layer T*B*width*34 +
// 5*heads*T^2*B, without the second term under flash attention; with activation checkpointing each layer keeps only its
// input (2*T*B*width) and one layer's full set is live during its recomputation.
int64_t activation_bytes(const ModelShape& s, int64_t B, int64_t T, bool checkpointing, bool flash_attention = false);
// An encoder-decoder's activations (shape.encoder_layers > 0): encoder layers over T_enc tokens,
// decoder layers over T_dec with cross-attention over the encoder's output (kept for every decoder
// layer), per layer 18 sbh + 4 sbf (6 gated) + the attention's own tensors at heads x head size, and
// 5 a s^2 b of scores (none with flash attention); with checkpointing each layer keeps its input and
// the largest layer's full set is live during its recomputation. (Korthikanti et al.'s terms, the
// FFN and head widths taken from the shape.)
int64_t encoder_decoder_activation_bytes(const ModelShape& s, int64_t B, int64_t T_enc, int64_t T_dec, bool checkpointing,
                                         bool flash_attention = false);
// (The bound a reader of shapes checks before any of these is zero/ds_memory.h's activation_bytes_bound.)

// "Yi-34B: 34.39 B parameters, 60 layers, width 7168, 56 heads (8 KV), FFN 20480, vocab 64000".
std::string describe_shape(const ModelShape& s, bool learned_positions);

}  // namespace zt::trainer
