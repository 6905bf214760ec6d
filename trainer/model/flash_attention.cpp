// trainer/model/flash_attention.cpp: see flash_attention.h. The loops follow the CUDA kernels
// (cuda/flash_attention.cu): one (batch, head) at a time, query tiles outside and key tiles
// inside for the forward, key tiles outside and query tiles inside for the backward, with the
// same roundings to bf16 at the same places.
#include "model/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype_bits.h"

namespace zt::model {

namespace {

constexpr int64_t kTile = kFlashTile;

float bf16_round(float x) { return trainer::bits::bf16_to_float(trainer::bits::float_to_bf16(x)); }

// rows [row0, row0 + kTile) of a [T, ld] matrix's first `width` columns from `src`, rounded to
// bf16, zeros past T: one tile as the kernels load it into shared memory.
void load_tile(std::vector<float>& dst, const float* src, int64_t ld, int64_t row0, int64_t T, int64_t width) {
  dst.assign(size_t(kTile * width), 0.0f);
  for (int64_t r = 0; r < kTile && row0 + r < T; ++r)
    for (int64_t d = 0; d < width; ++d) dst[size_t(r * width + d)] = bf16_round(src[(row0 + r) * ld + d]);
}

// out[r][c] = sum over d of a[r][d] * b[c][d] (a: rows x width, b: kTile x width), fp32.
void products(std::vector<float>& out, const std::vector<float>& a, const std::vector<float>& b, int64_t width) {
  out.assign(size_t(kTile * kTile), 0.0f);
  for (int64_t r = 0; r < kTile; ++r)
    for (int64_t c = 0; c < kTile; ++c) {
      float s = 0.0f;
      for (int64_t d = 0; d < width; ++d) s += a[size_t(r * width + d)] * b[size_t(c * width + d)];
      out[size_t(r * kTile + c)] = s;
    }
}

}  // namespace

void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t hs = C / H, C3 = 3 * C, tiles = (T + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt((float)hs);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const float* base = qkv + b * T * C3;
      std::vector<float> q, k, v, s;
      std::vector<float> o(static_cast<size_t>(kTile * hs)), pv(static_cast<size_t>(hs)), p(static_cast<size_t>(kTile)),
          m(static_cast<size_t>(kTile)), l(static_cast<size_t>(kTile));
      for (int64_t qt = 0; qt < tiles; ++qt) {
        const int64_t q0 = qt * kTile;
        load_tile(q, base + h * hs, C3, q0, T, hs);
        std::fill(o.begin(), o.end(), 0.0f);
        std::fill(m.begin(), m.end(), -INFINITY);
        std::fill(l.begin(), l.end(), 0.0f);
        for (int64_t kt = 0; kt <= qt; ++kt) {
          const int64_t k0 = kt * kTile;
          load_tile(k, base + C + h * hs, C3, k0, T, hs);
          load_tile(v, base + 2 * C + h * hs, C3, k0, T, hs);
          products(s, q, k, hs);
          for (int64_t r = 0; r < kTile && q0 + r < T; ++r) {
            const int64_t t = q0 + r;
            float mx = -INFINITY;
            for (int64_t c = 0; c < kTile; ++c)
              if (k0 + c <= t) mx = std::max(mx, s[size_t(r * kTile + c)] * scale);
            const float m_new = std::max(m[size_t(r)], mx);
            float sum = 0.0f;
            for (int64_t c = 0; c < kTile; ++c) {
              const float e = k0 + c <= t ? std::exp(s[size_t(r * kTile + c)] * scale - m_new) : 0.0f;
              sum += e;
              p[size_t(c)] = bf16_round(e);
            }
            const float alpha = std::exp(m[size_t(r)] - m_new);
            l[size_t(r)] = l[size_t(r)] * alpha + sum;
            m[size_t(r)] = m_new;
            std::fill(pv.begin(), pv.end(), 0.0f);
            for (int64_t c = 0; c < kTile; ++c)
              for (int64_t d = 0; d < hs; ++d) pv[size_t(d)] += p[size_t(c)] * v[size_t(c * hs + d)];
            for (int64_t d = 0; d < hs; ++d) o[size_t(r * hs + d)] = o[size_t(r * hs + d)] * alpha + pv[size_t(d)];
          }
        }
        for (int64_t r = 0; r < kTile && q0 + r < T; ++r) {
          const float inv = 1.0f / l[size_t(r)];
          float* y = out + (b * T + q0 + r) * C + h * hs;
          for (int64_t d = 0; d < hs; ++d) y[d] = o[size_t(r * hs + d)] * inv;
          lse[(b * H + h) * T + q0 + r] = m[size_t(r)] + std::log(l[size_t(r)]);
        }
      }
    }
  }
}

void flash_attention_backward(float* dqkv, float* dsum, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t hs = C / H, C3 = 3 * C, tiles = (T + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt((float)hs);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = b * H + h;
      const float* base = qkv + b * T * C3;
      float* dbase = dqkv + b * T * C3;
      for (int64_t t = 0; t < T; ++t) {  // dsum = rowsum(bf16(dout) * out), in fp32 (dout as dP rounds it)
        const float* g = dout + (b * T + t) * C + h * hs;
        const float* y = out + (b * T + t) * C + h * hs;
        float acc = 0.0f;
        for (int64_t d = 0; d < hs; ++d) acc += bf16_round(g[d]) * y[d];
        dsum[bh * T + t] = acc;
      }
      std::vector<float> dq(size_t(T * hs), 0.0f);
      std::vector<float> q, k, v, g, s, dp;
      std::vector<float> p(size_t(kTile * kTile)), ds(size_t(kTile * kTile));
      std::vector<float> dk(size_t(kTile * hs)), dv(size_t(kTile * hs));
      for (int64_t kt = 0; kt < tiles; ++kt) {
        const int64_t k0 = kt * kTile;
        load_tile(k, base + C + h * hs, C3, k0, T, hs);
        load_tile(v, base + 2 * C + h * hs, C3, k0, T, hs);
        std::fill(dk.begin(), dk.end(), 0.0f);
        std::fill(dv.begin(), dv.end(), 0.0f);
        for (int64_t qt = kt; qt < tiles; ++qt) {
          const int64_t q0 = qt * kTile;
          load_tile(q, base + h * hs, C3, q0, T, hs);
          load_tile(g, dout + b * T * C + h * hs, C, q0, T, hs);
          products(s, q, k, hs);
          products(dp, g, v, hs);
          for (int64_t r = 0; r < kTile; ++r) {
            const int64_t t = q0 + r;
            const float L = t < T ? lse[bh * T + t] : 0.0f, D = t < T ? dsum[bh * T + t] : 0.0f;
            for (int64_t c = 0; c < kTile; ++c) {
              const size_t i = size_t(r * kTile + c);
              const float pr = k0 + c <= t && t < T ? std::exp(s[i] * scale - L) : 0.0f;
              p[i] = bf16_round(pr);
              ds[i] = bf16_round(pr * (dp[i] - D));
            }
          }
          for (int64_t c = 0; c < kTile; ++c)  // dV += P^T dO, dK += dS^T Q (scaled at the end)
            for (int64_t d = 0; d < hs; ++d) {
              float av = dv[size_t(c * hs + d)], ak = dk[size_t(c * hs + d)];
              for (int64_t r = 0; r < kTile; ++r) {
                av += p[size_t(r * kTile + c)] * g[size_t(r * hs + d)];
                ak += ds[size_t(r * kTile + c)] * q[size_t(r * hs + d)];
              }
              dv[size_t(c * hs + d)] = av, dk[size_t(c * hs + d)] = ak;
            }
          for (int64_t r = 0; r < kTile && q0 + r < T; ++r)  // dQ += scale * dS K
            for (int64_t d = 0; d < hs; ++d) {
              float a = 0.0f;
              for (int64_t c = 0; c < kTile; ++c) a += ds[size_t(r * kTile + c)] * k[size_t(c * hs + d)];
              dq[size_t((q0 + r) * hs + d)] += scale * a;
            }
        }
        for (int64_t c = 0; c < kTile && k0 + c < T; ++c)
          for (int64_t d = 0; d < hs; ++d) {
            dbase[(k0 + c) * C3 + C + h * hs + d] = scale * dk[size_t(c * hs + d)];
            dbase[(k0 + c) * C3 + 2 * C + h * hs + d] = dv[size_t(c * hs + d)];
          }
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < hs; ++d) dbase[t * C3 + h * hs + d] = dq[size_t(t * hs + d)];
    }
  }
}

}  // namespace zt::model
