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

int64_t shape_params(const ModelShape& s, bool learned_positions);
// An upper bound of shape_params, in long double, for any shape (no product can overflow): the
// embeddings (tied or not, with learned positions), each layer's attention, norms, and its dense
// FFN or experts and router, whichever is larger. A reader of shapes (zt repro's scenarios)
// refuses a shape whose bound would not fit int64 before anything computes shape_params.
long double shape_params_bound(const ModelShape& s);

// "Yi-34B: 34.39 B parameters, 60 layers, width 7168, 56 heads (8 KV), FFN 20480, vocab 64000".
std::string describe_shape(const ModelShape& s, bool learned_positions);

}  // namespace zt::trainer
