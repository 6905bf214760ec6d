// tests/cuda/cuda_test_util.h: what the GPU tests share: the skip when there is no usable GPU,
// seeded inputs, dtype round trips and the closeness check with its stated tolerances.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../test_util.h"
#include "core/dtype.h"
#include "cuda/runtime.h"

// Skips the test, saying why, when cuda_available() is false (no driver, no device, a GPU older
// than sm_80). Use at the top of a test body or in SetUp().
#define ZT_REQUIRE_GPU()                                           \
  do {                                                             \
    std::string zt_why_;                                           \
    if (!zt::cuda::cuda_available(&zt_why_))                       \
      GTEST_SKIP() << "no usable GPU: " << zt_why_;                \
  } while (0)

namespace zt::cuda::test {

using trainer::DType;

inline std::vector<float> normal(size_t n, uint64_t seed, float stddev = 1.0f, float mean = 0.0f) {
  return zt::test::normal_values(n, seed, stddev, mean);
}
inline std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// The values a tensor of dtype t holds after storing v (the CPU's round to nearest even).
inline std::vector<float> rounded(const std::vector<float>& v, DType t) {
  if (t == DType::F32) return v;
  std::vector<uint16_t> tmp(v.size());
  std::vector<float> out(v.size());
  trainer::from_float(t, v.data(), tmp.data(), v.size());
  trainer::to_float(t, tmp.data(), out.data(), v.size());
  return out;
}

// A device tensor of dtype t holding v (rounded), and back.
inline DeviceBuffer upload(const std::vector<float>& v, DType t) {
  DeviceBuffer b(std::max<size_t>(1, v.size() * trainer::dtype_size(t)));
  if (t == DType::F32) {
    b.upload(v.data(), v.size() * 4);
  } else {
    std::vector<uint16_t> tmp(v.size());
    trainer::from_float(t, v.data(), tmp.data(), v.size());
    b.upload(tmp.data(), v.size() * 2);
  }
  return b;
}
inline std::vector<float> download(const DeviceBuffer& b, size_t n, DType t) {
  std::vector<float> out(n);
  if (t == DType::F32) {
    b.download(out.data(), n * 4);
  } else {
    std::vector<uint16_t> tmp(n);
    b.download(tmp.data(), n * 2);
    trainer::to_float(t, tmp.data(), out.data(), n);
  }
  return out;
}

// The tolerances every parity check states. An element passes when
//   |got - want| <= rtol * |want| + atol * max_i |want_i|
// (atol is relative to the tensor's largest magnitude, so it means the same for logits and for
// 1/V-sized probabilities). `want` is the fp32 CPU reference run on the same inputs the GPU saw
// (already rounded to the storage dtype), so what is left is the GPU's own rounding:
//  - outputs stored in fp32 (fp32 tensors; statistics, probabilities, losses and parameter
//    gradients in every dtype): fp32 summation order and libm (tanhf, expf vs the reference's
//    exp-based tanh and double sums): 1e-4 / 1e-4;
//  - outputs stored in fp16: rounding to 11 significant bits (half an ulp is 2^-11 = 4.9e-4
//    relative) plus the fp32 differences above: 2e-3 / 2e-3;
//  - outputs stored in bf16: 8 significant bits (half an ulp is 2^-8 = 3.9e-3): 1e-2 / 1e-2.
struct Tolerance {
  double rtol, atol;
};
inline Tolerance tolerance_for(DType stored) {
  switch (stored) {
    case DType::F16: return {2e-3, 2e-3};
    case DType::BF16: return {1e-2, 1e-2};
    default: return {1e-4, 1e-4};
  }
}

inline ::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want, Tolerance tol,
                                        const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values, expected " << want.size();
  double max_want = 0;
  for (float w : want) max_want = std::max(max_want, double(std::fabs(w)));
  size_t bad = 0, first = 0;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const double allowed = tol.rtol * std::fabs(double(want[i])) + tol.atol * max_want;
    if (!(err <= allowed)) {  // also catches NaN
      if (bad++ == 0) first = i;
    }
    if (!(err <= worst)) {
      worst = err;
      worst_i = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os << what << ": " << bad << " of " << got.size() << " values outside rtol " << tol.rtol << " / atol " << tol.atol
     << " x max|want| " << max_want << "; first at [" << first << "]: got " << got[first] << ", want " << want[first]
     << "; largest error " << worst << " at [" << worst_i << "]";
  return ::testing::AssertionFailure() << os.str();
}

inline const char* name_of(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    default: return "int32";
  }
}

}  // namespace zt::cuda::test

namespace zt::trainer {
// gtest prints test parameters with this ("fp32" rather than "1-byte object <00>").
inline void PrintTo(DType t, std::ostream* os) { *os << zt::cuda::test::name_of(t); }
}  // namespace zt::trainer
