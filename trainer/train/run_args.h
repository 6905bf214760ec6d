// trainer/train/run_args.h: the run's own arguments, by the Hugging Face Trainer's names.
//
// A DeepSpeed config written for the HF Trainer or accelerate says "auto" where the run's
// TrainingArguments decide (transformers' HfTrainerDeepSpeedConfig.trainer_config_process).
// RunArgs holds those arguments and where they came from, so that each "auto" is filled from a
// value somebody gave, never from a number zerotrace picked.
// Sources: `zt train --hf-args` (a TrainingArguments JSON file, or name=value,...), zt train's
// own flags, a scenario's `train_args:` and `train:` blocks.
// Invariant: a name is one of kHfArgNames; a value has that name's type (checked on entry).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zt/common/status.h"

namespace zt::trainer {

struct HfArgDefault {
  const char* name;
  const char* type;  // "int", "float" or "bool"
  double value;      // TrainingArguments' default (transformers 4.x, training_args.py)
};
// The TrainingArguments the HF integration reads from, with their defaults.
const std::vector<HfArgDefault>& hf_arg_defaults();

struct RunArgs {
  struct Value {
    double value = 0;
    std::string source;  // "--hf-args", "my.yaml:12 train_args", "--micro-batch", ...
  };
  std::map<std::string, Value> given;
  // TrainingArguments given whole (a JSON of them, or --hf-args defaults): a name not given takes
  // its default, said as such. Otherwise a name not given fills nothing.
  bool whole = false;
  // A scenario's train: block describes the run, and its deepspeed: block is often an excerpt: a
  // batch key, precision block or gradient_clipping the excerpt leaves out is taken from here
  // (its source says so), where the real config would have had it.
  bool fill_absent = false;

  // The value for `name`, and its source; nullopt when nothing gives it.
  std::optional<Value> get(const std::string& name) const;
  bool empty() const { return given.empty() && !whole; }
};

struct TrainConfig;
// The arguments zt's own settings give (micro_batch, grad_accum, grad_clip, lr, weight_decay,
// precision; named as `zt train`'s flags or a scenario's train: keys), each where `source(setting)`
// says it was given (nullopt: not given, so it fills nothing). A name already in `out` is kept.
void add_settings_as_args(const TrainConfig& c,
                          const std::function<std::optional<std::string>(const std::string& setting)>& source,
                          RunArgs* out);

// Reads --hf-args: a path to a JSON object (TrainingArguments.to_json_string(); names zerotrace
// does not read are ignored), `defaults` (TrainingArguments() as it is), or name=value pairs
// separated by commas (an unknown name is refused). Errors name `flag` and the value.
Status parse_hf_args(const std::string& text, const std::string& flag, RunArgs* out);
// Sets one argument from a JSON value, checked against its type (`source` names it in errors).
Status set_hf_arg(const std::string& name, const nlohmann::json& v, const std::string& source, RunArgs* out);

}  // namespace zt::trainer
