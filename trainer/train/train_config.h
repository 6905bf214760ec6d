// trainer/train/train_config.h: everything a training run is told, from flags or a YAML file.
// Owns: the names, defaults and validation of `zt train`'s settings. A config file uses the
// flags' names (with '_' or '-'); an unknown key is an error naming the file and line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zt/common/status.h"

namespace zt::trainer {

struct TrainConfig {
  std::string device = "sim";   // sim | cpu | cuda
  std::string model = "tiny";   // tiny | 124M | 350M | 774M | 1.5B
  int64_t steps = 0;            // optimizer steps; 0 = use epochs
  int64_t epochs = 0;           // 0 with steps 0 = one epoch
  int64_t micro_batch = 4;
  int64_t grad_accum = 1;
  int64_t world_size = 1;
  int64_t seq_len = 0;          // 0 = the model's context
  uint64_t seed = 1;
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (storage; math is fp32)
  uint64_t device_memory = 80ull << 30;
  uint64_t host_memory = 0;        // 0 = no cap
  std::string data;                // text or token file; empty = the built-in synthetic corpus
  int64_t max_doc_tokens = 0;      // cut each document to this many tokens (0 = off)
  int64_t synthetic_bytes = 1 << 20;
  std::string trace;               // trace file to write; empty = no trace
  double lr = 3e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 0.0;          // 0 = off
  bool activation_checkpointing = false;
  bool quiet = false;
  std::string config_file;         // where it was loaded from, for messages
};

// Reads a YAML mapping into `cfg` (keys as the flags: micro_batch or micro-batch).
Status load_train_config(const std::string& path, TrainConfig* cfg);
// Checks ranges and combinations; the message names the setting and what to do.
Status validate(const TrainConfig& cfg);
// The resolved configuration as JSON (written into the trace's run row).
std::string to_json(const TrainConfig& cfg);

}  // namespace zt::trainer
