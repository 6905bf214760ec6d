// model/config.cpp: presets and validation (see config.h).
#include "model/config.h"

#include <limits>

#include "model/layout.h"

namespace zt::model {
namespace {

struct Named {
  const char* name;
  Config config;
};

// GPT-2's four released sizes, plus "tiny": byte-level (vocab 256) so any text is a corpus, and
// small enough to learn a pattern in a few hundred CPU steps.
constexpr Named kPresets[] = {
    {"tiny", {256, 64, 2, 4, 64}},
    {"124M", {50257, 1024, 12, 12, 768}},
    {"350M", {50257, 1024, 24, 16, 1024}},
    {"774M", {50257, 1024, 36, 20, 1280}},
    {"1.5B", {50257, 1024, 48, 25, 1600}},
};

}  // namespace

std::optional<Config> preset(std::string_view name) {
  for (const Named& p : kPresets) {
    if (name == p.name) return p.config;
  }
  return std::nullopt;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Named& p : kPresets) names.emplace_back(p.name);
  return names;
}

std::string describe(const Config& c) {
  return "layers=" + std::to_string(c.layers) + " heads=" + std::to_string(c.heads) +
         " width=" + std::to_string(c.width) + " vocab=" + std::to_string(c.vocab) +
         " context=" + std::to_string(c.context);
}

Status validate(const Config& c) {
  const std::string where = "GPT-2 config (" + describe(c) + "): ";
  struct Field {
    const char* name;
    int64_t value;
  };
  for (const Field& f : {Field{"vocab", c.vocab}, Field{"context", c.context},
                         Field{"layers", c.layers}, Field{"heads", c.heads},
                         Field{"width", c.width}}) {
    if (f.value <= 0) {
      return Status::Error(where + f.name + " is " + std::to_string(f.value) +
                           "; it must be at least 1");
    }
  }
  if (c.width % c.heads != 0) {
    return Status::Error(where + "width " + std::to_string(c.width) +
                         " is not divisible by heads " + std::to_string(c.heads) +
                         "; pick a width that is a multiple of the head count");
  }
  // The kernels hand sizes to cblas as int and index with int64: keep every matrix dimension
  // (4C for the MLP, vocab for the head) and every tensor within int range, and the total within
  // int64 with a wide margin.
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (c.width > kIntMax / 4 || c.vocab > kIntMax || c.context > kIntMax ||
      c.layers > (1 << 20) || c.vocab > kIntMax / c.width || c.context > kIntMax / c.width ||
      4 * c.width > kIntMax / c.width) {
    return Status::Error(where + "a tensor would hold more than 2^31-1 elements, which the CPU "
                         "reference (cblas int sizes) cannot address; use a smaller shape");
  }
  return Status::Ok();
}

int64_t num_params(const Config& c) {
  const int64_t C = c.width;
  const int64_t per_block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) +
                            (4 * C * C + C);
  return c.vocab * C + c.context * C + c.layers * per_block + 2 * C;
}

}  // namespace zt::model
