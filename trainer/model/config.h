// model/config.h: the shape of a GPT-2 model (Config), the named presets, and the checks that
// refuse impossible shapes before any buffer is sized from them.
//
// Owns: nothing but the five numbers. Everything sized from a Config (the parameter table, the
// workspace) assumes validate(config).ok(); the presets all pass it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zt/common/status.h"

namespace zt::model {

struct Config {
  int64_t vocab = 0;    // V: token ids are 0..V-1; the LM head has V outputs
  int64_t context = 0;  // maximum sequence length T (rows of the position embedding)
  int64_t layers = 0;   // L transformer blocks
  int64_t heads = 0;    // H attention heads; width % heads == 0
  int64_t width = 0;    // C channels of the residual stream; the MLP is 4C wide

  int64_t head_size() const { return width / heads; }
  bool operator==(const Config&) const = default;
};

// Presets by name: "tiny" (byte-level, learnable in seconds on a CPU), "124M", "350M", "774M", "1.5B"
// (the OpenAI GPT-2 sizes, vocab 50257, context 1024). Returns nullopt for any other name.
std::optional<Config> preset(std::string_view name);
std::vector<std::string> preset_names();

// Ok, or one line naming the field and why the shape cannot be built (zero or negative sizes,
// width not divisible by heads, sizes whose buffers would overflow int64 element counts).
Status validate(const Config& config);

// Total number of fp32 parameters (the LM head is tied to the token embedding, so it adds none).
int64_t num_params(const Config& config);

// "layers=12 heads=12 width=768 vocab=50257 context=1024", for messages.
std::string describe(const Config& config);

}  // namespace zt::model
