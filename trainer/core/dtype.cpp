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
    case DType::U8: return "uint8";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "float32" || s == "f32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "fp16" || s == "float16" || s == "f16" || s == "half") return DType::F16;
  return std::nullopt;
}

std::string_view matmul_precision_name(MatmulPrecision p) {
  switch (p) {
    case MatmulPrecision::Highest: return "highest";
    case MatmulPrecision::High: return "high";
    case MatmulPrecision::Medium: return "medium";
  }
  return "?";
}

std::optional<MatmulPrecision> parse_matmul_precision(std::string_view s) {
  if (s == "highest") return MatmulPrecision::Highest;
  if (s == "high") return MatmulPrecision::High;
  if (s == "medium") return MatmulPrecision::Medium;
  return std::nullopt;
}

void to_float(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::I32:
      throw std::logic_error("int32 tensors do not convert to fp32");
    case DType::U8:
      throw std::logic_error("uint8 tensors do not convert to fp32");
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
    case DType::U8:
      throw std::logic_error("fp32 does not convert to uint8 tensors");
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
