// trainer/train/json_text.h: a DeepSpeed config's text read as DeepSpeed reads it.
//
// DeepSpeed loads a config file with hjson and a hook that refuses duplicate keys
// (deepspeed/runtime/config.py, DeepSpeedConfig.__init__; config_utils.py,
// dict_raise_error_on_duplicate_keys). So configs in the wild carry comments and trailing commas.
// This reader takes JSON plus:
//   - comments: `#` and `//` to the end of the line, `/* ... */`;
//   - a comma before `}` or `]`.
// It refuses, with one line naming the file and the line:
//   - a key given twice in one object (both lines named, as DeepSpeed refuses it);
//   - nesting deeper than kMaxConfigDepth (a stack bound: 100,000 levels once crashed zt);
//   - hjson's other forms (quoteless keys and strings, multi-line strings): JSON's error, with its line.
// May call: nlohmann-json. Called by: deepspeed_config.cpp, zt repro init.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "zt/common/status.h"

namespace zt::trainer {

inline constexpr int kMaxConfigDepth = 64;

// Parses `text` (from `path`, named in errors) into *out.
Status parse_config_text(const std::string& text, const std::string& path, nlohmann::json* out);

// A JSON value as an error message quotes it: whole when short, else its first 60 characters and
// its length ("[1, 2, ... (40,068 characters)").
std::string quote_value(const nlohmann::json& v);

}  // namespace zt::trainer
