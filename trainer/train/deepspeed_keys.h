// trainer/train/deepspeed_keys.h: every key DeepSpeed reads, and what zerotrace does with it.
//
// Owns two tables, taken from DeepSpeed's own config code (deepspeed/runtime/config.py,
// precision_config.py, zero/config.py, zero/offload_config.py; release 0.19): the aliases DeepSpeed
// accepts (pydantic Field(alias=...) names, the older names kept for compatibility, the deprecated
// fields and what they turn into), and each key's effect here: modeled (the reader sets a
// setting from it), no memory effect (logging, schedules, NVMe-only options: said in a note), or
// a memory effect zerotrace does not model (named in TrainConfig::unmodeled_memory_keys, so that
// a zt repro verdict from such a config is INCONCLUSIVE, never silently NOT REPRODUCED).
// Invariant: an alias is rewritten to the one name the reader reads before anything is read, so a
// report's config written with DeepSpeed's older names means what it meant to DeepSpeed.
// May call: nothing of the trainer. Called by: deepspeed_config.cpp (the reader).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zt/common/status.h"

namespace zt::trainer {

// Rewrites DeepSpeed's alternative names in `j` (a whole DeepSpeed config) to the names the reader
// reads, as DeepSpeed itself resolves them: `bfloat16` (bf16's older name; ignored when bf16 is
// there too), `zero_optimization: true/false` (the deprecated boolean form: stage 1 or 0, with
// `allgather_size`), the zero_optimization field names without their `stage3_` aliases,
// `stage3_gather_fp16_weights_on_model_save`, `cpu_offload`, `cpu_offload_param` (deprecated: an
// offload of the optimizer or parameters to the CPU), `cpu_offload_params` (DeepSpeed 0.3-0.6's name)
// and `cpu_offload_use_pin_memory` (deprecated; DeepSpeed warns and ignores it). Each rewrite is a
// note in `notes`. A deprecated key given with its replacement is refused, as DeepSpeed refuses it
// ("Cannot provide deprecated parameter ... together").
Status resolve_deepspeed_aliases(nlohmann::json& j, const std::string& path, std::vector<std::string>* notes);

// What a config leaves to DeepSpeed's defaults where they changed between releases (an offload
// block without pin_memory: pageable before 0.19.5, pinned since), one line each, for the writer of
// a scenario to decide (zt repro init); the reader takes today's defaults without a word.
std::vector<std::string> deepspeed_version_notes(nlohmann::json j, const std::string& path);

// The keys of `obj` (the block at `where`: "" for the top level, "zero_optimization.", "fp16.", ...)
// that the reader does not read itself (`read`): each known one noted with its effect, each that
// changes memory in a way zerotrace does not model (at its value here) appended to `unmodeled` as
// "where+key (why)", and each DeepSpeed does not know noted as such. `block` is the enclosing
// object a key's effect may depend on (zero_optimization for its keys: overlap_comm matters at
// stages 1-2 only).
void classify_deepspeed_keys(const std::string& where, const nlohmann::json& obj, const std::vector<std::string>& read,
                             const nlohmann::json& block, const std::string& path, std::vector<std::string>* notes,
                             std::vector<std::string>* unmodeled);

// Every alias of the table, as "old -> new" (for the docs and the tests: one source of truth).
std::vector<std::pair<std::string, std::string>> deepspeed_aliases();

}  // namespace zt::trainer
