// trainer/core/dtype.h: the storage dtypes (fp32, bf16, fp16) and conversions to and from
// fp32, the math type. Conversions round to nearest even, as PyTorch's do; bf16 and fp16
// keep NaN a NaN and overflow to infinity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "core/dtype_bits.h"

namespace zt::trainer {

// I32 holds token ids; U8 an 8-bit optimizer's quantized state (bitsandbytes' uint8 moments, sized
// by the memory model only). Neither converts to or from fp32.
enum class DType : uint8_t { F32, BF16, F16, I32, U8 };

// How a GPU multiplies fp32 matrices, as torch.set_float32_matmul_precision: Highest is true fp32
// (the CPU reference's results), High rounds the inputs to TF32 (10-bit mantissa) and Medium lets
// the GEMM library round them to bf16 (8-bit mantissa), or to TF32 where it has no faster bf16
// kernel (cuBLAS 13.0 on an H100 did so); fp32 accumulation and fp32 results in all three.
enum class MatmulPrecision : uint8_t { Highest, High, Medium };
std::string_view matmul_precision_name(MatmulPrecision p);  // "highest", "high", "medium"
std::optional<MatmulPrecision> parse_matmul_precision(std::string_view name);

constexpr size_t dtype_size(DType t) { return t == DType::U8 ? 1 : t == DType::BF16 || t == DType::F16 ? 2 : 4; }
std::string_view dtype_name(DType t);                        // "fp32", "bf16", "fp16", "int32", "uint8"
std::optional<DType> parse_dtype(std::string_view name);     // also "float32", "bfloat16", "float16"

// The conversions themselves live in dtype_bits.h, shared with the CUDA kernels.
inline uint16_t float_to_bf16(float f) { return bits::float_to_bf16(f); }
inline float bf16_to_float(uint16_t h) { return bits::bf16_to_float(h); }
inline uint16_t float_to_fp16(float f) { return bits::float_to_fp16(f); }
inline float fp16_to_float(uint16_t h) { return bits::fp16_to_float(h); }

// Converts n elements between a buffer of `t` (a float dtype) and fp32.
void to_float(DType t, const void* src, float* dst, size_t n);
void from_float(DType t, const float* src, void* dst, size_t n);

}  // namespace zt::trainer
