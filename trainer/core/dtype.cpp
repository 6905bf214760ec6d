#include "dtype.h"

#include <cmath>
#include <stdexcept>

namespace zt::trainer {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::I32: return "int32";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "float32" || s == "f32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "fp16" || s == "float16" || s == "f16" || s == "half") return DType::F16;
  return std::nullopt;
}

uint16_t float_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x007fffffu;
  int32_t exp = int32_t((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));  // inf / NaN
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: inf
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);  // underflow: signed zero
    mant |= 0x00800000u;                               // subnormal: make the implicit bit explicit
    uint32_t shift = uint32_t(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (uint32_t(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: correct
  return static_cast<uint16_t>(half);
}

float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {
      // Subnormal: normalize.
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      out = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

void to_float(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::I32:
      throw std::logic_error("int32 tensors do not convert to fp32");
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
#pragma omp parallel for if (n > (1u << 16))
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
      return;
    }
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
#pragma omp parallel for if (n > (1u << 16))
      for (size_t i = 0; i < n; ++i) dst[i] = fp16_to_float(s[i]);
      return;
    }
  }
}

void from_float(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::I32:
      throw std::logic_error("fp32 does not convert to int32 tensors");
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for if (n > (1u << 16))
      for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
      return;
    }
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for if (n > (1u << 16))
      for (size_t i = 0; i < n; ++i) d[i] = float_to_fp16(src[i]);
      return;
    }
  }
}

}  // namespace zt::trainer
