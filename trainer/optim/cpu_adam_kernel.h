// optim/cpu_adam_kernel.h: internal to optim/: the one AdamW loop that every ISA instantiates with
// its own vector type (cpu_adam.cpp: scalar, cpu_adam_avx2.cpp, cpu_adam_avx512.cpp, each compiled
// with its own -m flags). Not a public header.
//
// Everything defined here has internal linkage (anonymous namespace): an inline function shared by
// name between a -mavx2 object and a baseline object could have the linker keep the AVX2 copy for
// both, and the scalar fallback would then die with SIGILL on an old CPU. For the same reason the
// per-ISA files call no std:: inline functions or templates.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype_bits.h"
#include "optim/cpu_adam.h"

// Set by optim/CMakeLists.txt to 1 where the per-ISA file is compiled.
#ifndef ZT_OPTIM_HAVE_AVX2
#define ZT_OPTIM_HAVE_AVX2 0
#endif
#ifndef ZT_OPTIM_HAVE_AVX512
#define ZT_OPTIM_HAVE_AVX512 0
#endif

namespace zt::optim::detail {

// The hyperparameters as the reference rounds them to fp32 (cpu_adam.h, adam_consts).
using AdamConsts = optim::AdamConsts;

// The gradient as one ISA's kernel reads it: g points at n elements of `gt` (cpu_adam.h's
// GradDType); gscale multiplies each widened element unless gt is F32 and gscale is 1 (see
// cpu_adamw_step_grads). low_out is null when low is None.
struct GradRef {
  const void* g;
  GradDType gt;
  float gscale;
};

// Where one AdamW reads and writes its state: p, m, v read from the *_in arrays and the updated ones
// written to the *_out arrays. In place, each out is its in; out of place (the engine's AdamW during
// backward, which keeps the state it read until the step's norm says the update stands), no out
// overlaps any in.
struct AdamIO {
  const float* p_in;
  const float* m_in;
  const float* v_in;
  float* p_out;
  float* m_out;
  float* v_out;
  AdamIO at(int64_t i) const { return {p_in + i, m_in + i, v_in + i, p_out + i, m_out + i, v_out + i}; }
};
inline AdamIO in_place(float* p, float* m, float* v) { return {p, m, v, p, m, v}; }

// One ISA's kernel: n elements on the calling thread.
using AdamKernel = void (*)(AdamIO io, GradRef g, uint16_t* low_out, int64_t n, const AdamConsts& c, LowDType low);

void adam_kernel_scalar(AdamIO io, GradRef g, uint16_t* low_out, int64_t n, const AdamConsts& c, LowDType low);
#if ZT_OPTIM_HAVE_AVX2
void adam_kernel_avx2(AdamIO io, GradRef g, uint16_t* low_out, int64_t n, const AdamConsts& c, LowDType low);
#endif
#if ZT_OPTIM_HAVE_AVX512
void adam_kernel_avx512(AdamIO io, GradRef g, uint16_t* low_out, int64_t n, const AdamConsts& c, LowDType low);
#endif

namespace {

#if defined(__AVX__)  // the AVX2 and AVX-512 files (each includes <immintrin.h> first)
// 16 narrowed lanes (32 bytes) to out; NT: non-temporal, out 32-byte aligned.
template <bool NT>
inline void put32(uint16_t* out, __m256i x) {
  if constexpr (NT) _mm256_stream_si256(reinterpret_cast<__m256i*>(out), x);
  else _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), x);
}
#endif

// Scalar conversions: core/dtype_bits.h's (header-only, shared with the host's dtype.h and the
// CUDA kernels), so every AdamW rounds its fused output identically.
inline uint16_t round_to_bf16(float f) { return trainer::bits::float_to_bf16(f); }
inline uint16_t round_to_fp16(float f) { return trainer::bits::float_to_fp16(f); }
inline float widen_bf16(uint16_t h) { return trainer::bits::bf16_to_float(h); }
inline float widen_fp16(uint16_t h) { return trainer::bits::fp16_to_float(h); }

// How the kernel reads the gradient: fp32 as it is, fp32 times a scale, or bf16/fp16 widened to
// fp32 (exact) and multiplied by the scale (always: x * 1.0f is x for every x but a signalling NaN,
// which comes out quiet, so an unscaled one is the same).
enum class GradKind { F32, F32Scaled, BF16, F16 };

// W gradient elements at element offset i of g, widened and scaled as K says.
template <class V, GradKind K>
__attribute__((always_inline)) inline typename V::reg load_grad(const void* g, int64_t i, typename V::reg scale) {
  if constexpr (K == GradKind::F32) return V::load(static_cast<const float*>(g) + i);
  if constexpr (K == GradKind::F32Scaled) return V::mul(V::load(static_cast<const float*>(g) + i), scale);
  if constexpr (K == GradKind::BF16) return V::mul(V::load_bf16(static_cast<const uint16_t*>(g) + i), scale);
  if constexpr (K == GradKind::F16) return V::mul(V::load_fp16(static_cast<const uint16_t*>(g) + i), scale);
}

// One vector of W elements, gradient gv; returns the updated p. V supplies reg, W, load/store/set1/
// mul/add/sub/div/sqrt, load_bf16/load_fp16, store_bf16<NT>/store_fp16<NT>, stream and fence() (and
// may supply store_bf16x2<NT>, see adam_loop). With NT the fused output's stores are non-temporal (to
// an output aligned as adam_grad_dispatch checks), which V may ignore; with NTF so are the fp32 p, m
// and v (out of place only: in place each line was just read, and the write-back costs nothing more). The operations and their
// order are the reference's, one IEEE operation each (the per-ISA files are compiled with
// -ffp-contract=off, so no multiply and add get fused).
template <class V, LowDType L, bool NT = false, bool NTF = false>
__attribute__((always_inline)) inline typename V::reg adam_vector(const AdamIO& io, typename V::reg gv, uint16_t* lo,
                                                                  const typename V::reg* k) {
  using R = typename V::reg;
  R pv = V::mul(V::load(io.p_in), k[0]);                                            // p * decay
  const R mv = V::add(V::mul(V::load(io.m_in), k[1]), V::mul(gv, k[3]));            // m*b1 + g*(1-b1)
  const R vv = V::add(V::mul(V::load(io.v_in), k[2]), V::mul(V::mul(gv, gv), k[4]));  // v*b2 + g*g*(1-b2)
  const R denom = V::add(V::div(V::sqrt(vv), k[5]), k[6]);                          // sqrt(v)/bc2 + eps
  pv = V::sub(pv, V::mul(k[7], V::div(mv, denom)));                                 // p -= s * (m/denom)
  if constexpr (NTF) {
    V::stream(io.m_out, mv);
    V::stream(io.v_out, vv);
    V::stream(io.p_out, pv);
  } else {
    V::store(io.m_out, mv);
    V::store(io.v_out, vv);
    V::store(io.p_out, pv);
  }
  if constexpr (L == LowDType::BF16) V::template store_bf16<NT>(lo, pv);
  if constexpr (L == LowDType::F16) V::template store_fp16<NT>(lo, pv);
  return pv;
}

template <class V, LowDType L, GradKind K, bool NT, bool NTF>
inline void adam_loop(const AdamIO& io, const void* g, float gscale, uint16_t* lo, int64_t n, const AdamConsts& c) {
  using R = typename V::reg;
  constexpr int W = V::W;
  const R k[8] = {V::set1(c.decay),           V::set1(c.beta1),
                  V::set1(c.beta2),           V::set1(c.one_minus_beta1),
                  V::set1(c.one_minus_beta2), V::set1(c.bias_correction2_sqrt),
                  V::set1(c.eps),             V::set1(c.step_size)};
  const R gs = V::set1(gscale);
  int64_t i = 0;
  // Where V narrows two vectors of bf16 at once (AVX2: one pack and one permute per 16 instead of
  // an extract and a pack per 8), pairs first: measured 10-18% more bf16 throughput in cache.
  if constexpr (L == LowDType::BF16 && requires(uint16_t* o, R a) { V::template store_bf16x2<NT>(o, a, a); }) {
    for (; i + 2 * W <= n; i += 2 * W) {
      const R a = adam_vector<V, LowDType::None, false, NTF>(io.at(i), load_grad<V, K>(g, i, gs), nullptr, k);
      const R b = adam_vector<V, LowDType::None, false, NTF>(io.at(i + W), load_grad<V, K>(g, i + W, gs), nullptr, k);
      V::template store_bf16x2<NT>(lo + i, a, b);
    }
  }
  for (; i + W <= n; i += W)
    adam_vector<V, L, NT, NTF>(io.at(i), load_grad<V, K>(g, i, gs), L == LowDType::None ? nullptr : lo + i, k);
  // Non-temporal stores are weakly ordered: all of them are visible before the caller signals
  // anyone (another thread, or a DMA engine reading the output).
  if constexpr (NT || NTF) V::fence();
  if constexpr (W > 1) {
    if (i < n) {
      // The tail (fewer than W elements) through the same vector code on zero-padded copies.
      const size_t r = size_t(n - i);
      constexpr size_t gsize = K == GradKind::F32 || K == GradKind::F32Scaled ? 4 : 2;
      alignas(64) float tp[W] = {}, tm[W] = {}, tv[W] = {};
      alignas(64) unsigned char tg[W * 4] = {};
      alignas(64) uint16_t tl[W] = {};
      __builtin_memcpy(tp, io.p_in + i, r * 4);
      __builtin_memcpy(tg, static_cast<const unsigned char*>(g) + size_t(i) * gsize, r * gsize);
      __builtin_memcpy(tm, io.m_in + i, r * 4);
      __builtin_memcpy(tv, io.v_in + i, r * 4);
      adam_vector<V, L>(in_place(tp, tm, tv), load_grad<V, K>(tg, 0, gs), tl, k);
      __builtin_memcpy(io.p_out + i, tp, r * 4);
      __builtin_memcpy(io.m_out + i, tm, r * 4);
      __builtin_memcpy(io.v_out + i, tv, r * 4);
      if constexpr (L != LowDType::None) __builtin_memcpy(lo + i, tl, r * 2);
    }
  }
}

template <class V, LowDType L, bool NT, bool NTF>
inline void adam_grad_loop(const AdamIO& io, GradRef g, uint16_t* lo, int64_t n, const AdamConsts& c) {
  switch (g.gt) {
    case GradDType::F32:
      if (g.gscale == 1.0f) adam_loop<V, L, GradKind::F32, NT, NTF>(io, g.g, g.gscale, lo, n, c);
      else adam_loop<V, L, GradKind::F32Scaled, NT, NTF>(io, g.g, g.gscale, lo, n, c);
      return;
    case GradDType::BF16: adam_loop<V, L, GradKind::BF16, NT, NTF>(io, g.g, g.gscale, lo, n, c); return;
    case GradDType::F16: adam_loop<V, L, GradKind::F16, NT, NTF>(io, g.g, g.gscale, lo, n, c); return;
  }
}

// The fused output is written once and read by someone else (an H2D copy, the next step): where it
// is 32-byte aligned (every vector store is then aligned to its own 16 or 32 bytes: stores start at
// multiples of W elements, W 8 or 16, and the thread split at multiples of 64), its stores are
// non-temporal, which spares the read of each line before it is written (measured on an AVX-512
// host: 4% more parameters/s with the bf16 output). Out of place, the fp32 state goes out the same
// way where p_out, m_out and v_out are each 64-byte aligned: written to memory nobody reads in this
// pass, ordinary stores would first read each line (12 more bytes a parameter). Same values either way.
template <class V, LowDType L, bool NT>
inline void adam_state_dispatch(const AdamIO& io, GradRef g, uint16_t* lo, int64_t n, const AdamConsts& c) {
  auto aligned64 = [](const float* x) { return (reinterpret_cast<uintptr_t>(x) & 63) == 0; };
  if (io.p_out != io.p_in && aligned64(io.p_out) && aligned64(io.m_out) && aligned64(io.v_out))
    adam_grad_loop<V, L, NT, true>(io, g, lo, n, c);
  else
    adam_grad_loop<V, L, NT, false>(io, g, lo, n, c);
}

template <class V, LowDType L>
inline void adam_grad_dispatch(const AdamIO& io, GradRef g, uint16_t* lo, int64_t n, const AdamConsts& c) {
  if (L != LowDType::None && (reinterpret_cast<uintptr_t>(lo) & 31) == 0)
    adam_state_dispatch<V, L, true>(io, g, lo, n, c);
  else
    adam_state_dispatch<V, L, false>(io, g, lo, n, c);
}

template <class V>
inline void adam_dispatch(const AdamIO& io, GradRef g, uint16_t* lo, int64_t n, const AdamConsts& c, LowDType low) {
  switch (low) {
    case LowDType::None: adam_grad_dispatch<V, LowDType::None>(io, g, lo, n, c); return;
    case LowDType::BF16: adam_grad_dispatch<V, LowDType::BF16>(io, g, lo, n, c); return;
    case LowDType::F16: adam_grad_dispatch<V, LowDType::F16>(io, g, lo, n, c); return;
  }
}

}  // namespace
}  // namespace zt::optim::detail
