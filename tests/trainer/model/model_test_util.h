// tests/trainer/model/model_test_util.h: shared fixtures for the GPT-2 reference tests: small
// configs, randomized parameters (so no path is degenerate: non-zero biases, LayerNorm weights
// away from 1), tokens, and comparisons that report the worst element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/gpt2.h"

namespace zt::model::testing {

// Small enough that a finite-difference sweep over every tensor takes well under a second, with
// T < context so some wpe rows get no gradient, and two heads so head slicing is exercised.
inline Config small_config() { return Config{32, 8, 2, 2, 16}; }

// GPT-2 init plus noise on every tensor: biases and LayerNorm parameters become non-trivial, so
// their gradients are checked on values that exercise every term.
inline std::vector<float> random_params(const Config& config, uint64_t seed, float noise = 0.1f) {
  std::vector<float> params((size_t)num_params(config));
  init_params(config, seed, params.data());
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> u(-noise, noise);
  for (float& p : params) p += u(rng);
  return params;
}

inline std::vector<int32_t> random_tokens(const Config& config, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = (int32_t)(rng() % (uint64_t)config.vocab);
  return t;
}

struct MaxDiff {
  double abs = 0;   // max |a - b|
  double rel = 0;   // max |a - b| / max |b| over the whole range (scale of the tensor)
  int64_t at = -1;  // element of the max abs difference
};

inline MaxDiff max_diff(const float* a, const float* b, int64_t n) {
  MaxDiff d;
  double scale = 0;
  for (int64_t i = 0; i < n; i++) {
    scale = std::max(scale, std::fabs((double)b[i]));
    const double e = std::fabs((double)a[i] - (double)b[i]);
    if (e > d.abs) {
      d.abs = e;
      d.at = i;
    }
  }
  d.rel = scale > 0 ? d.abs / scale : d.abs;
  return d;
}

inline bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
           return std::memcmp(&x, &y, sizeof(float)) == 0;
         });
}

}  // namespace zt::model::testing
