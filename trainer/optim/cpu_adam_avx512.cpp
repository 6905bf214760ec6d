// optim/cpu_adam_avx512.cpp: the AVX-512 kernel (16 floats a vector), compiled with -mavx512f
// -ffp-contract=off and called only when the CPU has AVX-512F (cpu_adam.cpp checks). Uses AVX-512F
// instructions only (no BW/VL/DQ/BF16): tails go through the shared zero-padded path, and bf16
// rounding is done in integers (vcvtneps2bf16 would flush subnormals, unlike the reference).
// -mavx512f enables FMA in GCC: -ffp-contract=off keeps multiplies and adds separate.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics start from a self-initialized "undefined" vector, which -O2 reports as
// maybe-uninitialized (GCC PR 105593, fixed in 12.3 and 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "optim/cpu_adam_kernel.h"

namespace zt::optim::detail {
namespace {

struct Avx512 {
  using reg = __m512;
  static constexpr int W = 16;
  static reg load(const float* x) { return _mm512_loadu_ps(x); }
  static void store(float* x, reg a) { _mm512_storeu_ps(x, a); }
  static void stream(float* x, reg a) { _mm512_stream_ps(x, a); }  // 64-byte aligned
  static reg set1(float a) { return _mm512_set1_ps(a); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg sqrt(reg a) { return _mm512_sqrt_ps(a); }
  // Widening is exact: bf16 is the top half of an fp32; vcvtph2ps converts every fp16 exactly.
  static reg load_bf16(const uint16_t* x) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static reg load_fp16(const uint16_t* x) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))); }

  static void fence() { _mm_sfence(); }

  // bf16, round to nearest even: (u + 0x7fff + ((u >> 16) & 1)) >> 16; a NaN: (u >> 16) | 0x40.
  template <bool NT>
  static void store_bf16(uint16_t* out, reg a) {
    const __m512i u = _mm512_castps_si512(a);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i nan = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    const __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, nan);  // mask bit set: nan
    // vpmovdw: every lane is <= 0xffff, so truncation to 16 bits is exact.
    put32<NT>(out, _mm512_cvtepi32_epi16(r));
  }

  // fp16 by vcvtps2ph, round to nearest even. A NaN is first made sign | 0x7fc00000, which converts
  // to sign | 0x7e00 as the software converter gives.
  template <bool NT>
  static void store_fp16(uint16_t* out, reg a) {
    const __mmask16 is_nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    const __m512i u = _mm512_castps_si512(a);
    const __m512i canonical = _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32(int(0x80000000u))),
                                              _mm512_set1_epi32(0x7fc00000));
    const __m512 x = _mm512_mask_blend_ps(is_nan, a, _mm512_castsi512_ps(canonical));
    put32<NT>(out, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

}  // namespace

void adam_kernel_avx512(AdamIO io, GradRef g, uint16_t* low_out, int64_t n, const AdamConsts& c, LowDType low) {
  adam_dispatch<Avx512>(io, g, low_out, n, c, low);
}

}  // namespace zt::optim::detail
