// optim/cpu_adam_avx2.cpp: the AVX2 kernel (8 floats a vector), compiled with -mavx2 -mf16c
// -ffp-contract=off and called only when the CPU has AVX2 and F16C (cpu_adam.cpp checks).
// No -mfma: the kernel uses separate multiplies and adds to stay bit-identical to the reference.
#include <immintrin.h>

#include "optim/cpu_adam_kernel.h"

namespace zt::optim::detail {
namespace {

struct Avx2 {
  using reg = __m256;
  static constexpr int W = 8;
  static reg load(const float* x) { return _mm256_loadu_ps(x); }
  static void store(float* x, reg a) { _mm256_storeu_ps(x, a); }
  static void stream(float* x, reg a) { _mm256_stream_ps(x, a); }  // 32-byte aligned
  static reg set1(float a) { return _mm256_set1_ps(a); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg sqrt(reg a) { return _mm256_sqrt_ps(a); }
  // Widening is exact: bf16 is the top half of an fp32; F16C converts every fp16 exactly.
  static reg load_bf16(const uint16_t* x) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static reg load_fp16(const uint16_t* x) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))); }

  // bf16, round to nearest even: (u + 0x7fff + ((u >> 16) & 1)) >> 16; a NaN: (u >> 16) | 0x40.
  // Every lane of the result is <= 0xffff, so the unsigned-saturating packs below only narrow.
  static __m256i bf16_bits(reg a) {
    const __m256i u = _mm256_castps_si256(a);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256 is_nan = _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
    return _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(nan), is_nan));
  }
  // 8 narrowed lanes (16 bytes) to out; NT: non-temporal, out 16-byte aligned (32 bytes: put32).
  template <bool NT>
  static void put16(uint16_t* out, __m128i x) {
    if constexpr (NT) _mm_stream_si128(reinterpret_cast<__m128i*>(out), x);
    else _mm_storeu_si128(reinterpret_cast<__m128i*>(out), x);
  }
  static void fence() { _mm_sfence(); }
  template <bool NT>
  static void store_bf16(uint16_t* out, reg a) {
    const __m256i r = bf16_bits(a);
    put16<NT>(out, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
  // Two vectors: the in-lane pack gives a0-3 b0-3 a4-7 b4-7; the permute puts a before b.
  template <bool NT>
  static void store_bf16x2(uint16_t* out, reg a, reg b) {
    const __m256i packed = _mm256_packus_epi32(bf16_bits(a), bf16_bits(b));
    put32<NT>(out, _mm256_permute4x64_epi64(packed, 0xd8));
  }

  // fp16 with F16C, round to nearest even (subnormals, overflow to inf by the hardware). A NaN is
  // first made sign | 0x7fc00000, which converts to sign | 0x7e00 as the software converter gives.
  template <bool NT>
  static void store_fp16(uint16_t* out, reg a) {
    const __m256 is_nan = _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
    const __m256 sign = _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u))));
    const __m256 canonical = _mm256_or_ps(sign, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
    const __m256 x = _mm256_blendv_ps(a, canonical, is_nan);
    put16<NT>(out, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
};

}  // namespace

void adam_kernel_avx2(AdamIO io, GradRef g, uint16_t* low_out, int64_t n, const AdamConsts& c, LowDType low) {
  adam_dispatch<Avx2>(io, g, low_out, n, c, low);
}

}  // namespace zt::optim::detail
