// model/kernels.cpp: see kernels.h. GEMMs go to OpenBLAS; everything else is OpenMP loops whose
// reductions run in a fixed order.
#include "model/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zt::model::kernels {
namespace {

// Column-chunk width for the column reductions: 64 floats = one 256-byte run per row, so each
// thread streams contiguous memory while the sum over rows stays in row order.
constexpr int64_t kColumnChunk = 64;

}  // namespace

void column_sums_accumulate(float* sums, const float* in, int64_t rows, int64_t cols) {
  const int64_t chunks = (cols + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static) if(rows * cols >= kMinParallelElements)
  for (int64_t ch = 0; ch < chunks; ch++) {
    const int64_t c0 = ch * kColumnChunk;
    const int64_t c1 = std::min(cols, c0 + kColumnChunk);
    float acc[kColumnChunk];
    for (int64_t c = c0; c < c1; c++) acc[c - c0] = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
      const float* row = in + r * cols;
      for (int64_t c = c0; c < c1; c++) acc[c - c0] += row[c];
    }
    for (int64_t c = c0; c < c1; c++) sums[c] += acc[c - c0];
  }
}

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int64_t N,
                    int64_t IC, int64_t OC, bool accumulate) {
  // Put the bias (or zero) into out first, then let sgemm add inp @ w^T with beta = 1: one pass
  // over out instead of a separate bias pass after the GEMM.
  if (bias != nullptr) {
#pragma omp parallel for schedule(static) if(N * OC >= kMinParallelElements)
    for (int64_t n = 0; n < N; n++) {
      float* row = out + n * OC;
      if (accumulate) {
        for (int64_t o = 0; o < OC; o++) row[o] += bias[o];
      } else {
        std::memcpy(row, bias, sizeof(float) * OC);
      }
    }
  }
  const float beta = (bias != nullptr || accumulate) ? 1.0f : 0.0f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)IC, 1.0f, inp, (int)IC,
              w, (int)IC, beta, out, (int)OC);
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int64_t N, int64_t IC, int64_t OC, bool accumulate_dinp) {
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)IC, (int)OC, 1.0f, dout,
                (int)OC, w, (int)IC, accumulate_dinp ? 1.0f : 0.0f, dinp, (int)IC);
  }
  if (dw != nullptr)  // null: a frozen weight (no gradient wanted)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)IC, (int)N, 1.0f, dout, (int)OC,
                inp, (int)IC, 1.0f, dw, (int)IC);
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int64_t N, int64_t C) {
  constexpr double kEps = 1e-5;  // GPT-2's layer_norm_epsilon
#pragma omp parallel for schedule(static) if(N * C >= kMinParallelElements)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    // Two passes in double: the statistics carry no cancellation error, for a few cycles per
    // element next to the GEMMs.
    double s = 0.0;
    for (int64_t i = 0; i < C; i++) s += x[i];
    const double m = s / (double)C;
    double v = 0.0;
    for (int64_t i = 0; i < C; i++) {
      const double d = x[i] - m;
      v += d * d;
    }
    const double r = 1.0 / std::sqrt(v / (double)C + kEps);
    float* y = out + n * C;
    const float mf = (float)m, rf = (float)r;
    for (int64_t i = 0; i < C; i++) y[i] = (x[i] - mf) * rf * w[i] + b[i];
    mean[n] = mf;
    rstd[n] = rf;
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                        bool accumulate_dinp) {
#pragma omp parallel for schedule(static) if(N * C >= kMinParallelElements)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    const float* dy = dout + n * C;
    const float m = mean[n], r = rstd[n];
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (int64_t i = 0; i < C; i++) {
      const float norm = (x[i] - m) * r;
      const float dnorm = w[i] * dy[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += (double)dnorm * norm;
    }
    const float a = (float)(dnorm_mean / (double)C);
    const float bb = (float)(dnorm_norm_mean / (double)C);
    float* dx = dinp + n * C;
    for (int64_t i = 0; i < C; i++) {
      const float norm = (x[i] - m) * r;
      const float g = (w[i] * dy[i] - a - norm * bb) * r;
      dx[i] = accumulate_dinp ? dx[i] + g : g;
    }
  }
  if (dw == nullptr && db == nullptr) return;  // a frozen norm: its input's gradient only
  // dw and db reduce over rows: columns in fixed chunks, rows in order (see kernels.h).
  const int64_t chunks = (C + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static) if(N * C >= kMinParallelElements)
  for (int64_t ch = 0; ch < chunks; ch++) {
    const int64_t c0 = ch * kColumnChunk;
    const int64_t c1 = std::min(C, c0 + kColumnChunk);
    float accw[kColumnChunk], accb[kColumnChunk];
    for (int64_t c = c0; c < c1; c++) accw[c - c0] = accb[c - c0] = 0.0f;
    for (int64_t n = 0; n < N; n++) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      const float m = mean[n], r = rstd[n];
      for (int64_t c = c0; c < c1; c++) {
        accw[c - c0] += (x[c] - m) * r * dy[c];
        accb[c - c0] += dy[c];
      }
    }
    for (int64_t c = c0; c < c1; c++) {
      dw[c] += accw[c - c0];
      db[c] += accb[c - c0];
    }
  }
}

void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t H) {
  const int64_t hs = C / H;
  const int64_t C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
#pragma omp parallel for collapse(2) schedule(static) if(B * T * T * C >= kMinParallelElements)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < H; h++) {
      const float* base = qkv + b * T * C3;
      float* att_bh = att + (b * H + h) * T * T;
      for (int64_t t = 0; t < T; t++) {
        const float* q = base + t * C3 + h * hs;
        float* row = att_bh + t * T;
        float maxv = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; t2++) {
          const float* k = base + t2 * C3 + C + h * hs;
          float s = 0.0f;
          // simd: a fixed vector-width reassociation, chosen at compile time, so still
          // deterministic run to run (the scalar loop would not vectorize without it).
#pragma omp simd reduction(+ : s)
          for (int64_t i = 0; i < hs; i++) s += q[i] * k[i];
          s *= scale;
          row[t2] = s;
          maxv = std::max(maxv, s);
        }
        double sum = 0.0;
        for (int64_t t2 = 0; t2 <= t; t2++) {
          const float e = std::exp(row[t2] - maxv);
          row[t2] = e;
          sum += e;
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t t2 = 0; t2 <= t; t2++) row[t2] *= inv;
        // Zeros above the diagonal keep att a plain dense [T, T] matrix for whoever reads it.
        for (int64_t t2 = t + 1; t2 < T; t2++) row[t2] = 0.0f;

        float* y = out + (b * T + t) * C + h * hs;
        for (int64_t i = 0; i < hs; i++) y[i] = 0.0f;
        for (int64_t t2 = 0; t2 <= t; t2++) {
          const float* v = base + t2 * C3 + 2 * C + h * hs;
          const float a = row[t2];
#pragma omp simd
          for (int64_t i = 0; i < hs; i++) y[i] += a * v[i];
        }
      }
    }
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t hs = C / H;
  const int64_t C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
  // Each (b, h) writes only its own columns of dqkv for its own batch rows, so the (b, h) tasks
  // are independent and each one's sums run in a fixed order.
#pragma omp parallel for collapse(2) schedule(static) if(B * T * T * C >= kMinParallelElements)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < H; h++) {
      const float* base = qkv + b * T * C3;
      float* dbase = dqkv + b * T * C3;
      const float* att_bh = att + (b * H + h) * T * T;
      float* dpre = scratch + (b * H + h) * T;
      for (int64_t t = 0; t < T; t++) {
        float* dq = dbase + t * C3 + h * hs;
        float* dk = dbase + t * C3 + C + h * hs;
        float* dv = dbase + t * C3 + 2 * C + h * hs;
        for (int64_t i = 0; i < hs; i++) dq[i] = dk[i] = dv[i] = 0.0f;
      }
      for (int64_t t = 0; t < T; t++) {
        const float* dy = dout + (b * T + t) * C + h * hs;
        const float* row = att_bh + t * T;
        // datt[t2] = dy . v[t2]; dv[t2] += att[t, t2] * dy
        double dot = 0.0;  // sum_t2 att * datt, the softmax backward's row constant
        for (int64_t t2 = 0; t2 <= t; t2++) {
          const float* v = base + t2 * C3 + 2 * C + h * hs;
          float* dv = dbase + t2 * C3 + 2 * C + h * hs;
          float s = 0.0f;
          const float a = row[t2];
#pragma omp simd reduction(+ : s)
          for (int64_t i = 0; i < hs; i++) {
            s += dy[i] * v[i];
            dv[i] += a * dy[i];
          }
          dpre[t2] = s;
          dot += (double)row[t2] * s;
        }
        // dpreatt = att * (datt - dot), then through the scale into q and k.
        const float* q = base + t * C3 + h * hs;
        float* dq = dbase + t * C3 + h * hs;
        for (int64_t t2 = 0; t2 <= t; t2++) {
          const float g = row[t2] * (dpre[t2] - (float)dot) * scale;
          const float* k = base + t2 * C3 + C + h * hs;
          float* dk = dbase + t2 * C3 + C + h * hs;
#pragma omp simd
          for (int64_t i = 0; i < hs; i++) {
            dq[i] += g * k[i];
            dk[i] += g * q[i];
          }
        }
      }
    }
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
// A tanh costs about as much as 16 of the additions the parallel threshold is counted in.
constexpr int64_t kTanhCost = 16;

// tanh through one expf: glibc's tanhf (via expm1f) measured ~35 ns per call, a third of the
// 124M model's non-GEMM forward time; expf is several times cheaper. The cancellation near u = 0
// costs absolute accuracy ~1e-7 only, which GELU's 1 + tanh absorbs (checked against PyTorch's
// float64 GELU in torch_parity_test). Saturates correctly: exp overflow gives 1, underflow -1.
inline float fast_tanh(float u) { return 1.0f - 2.0f / (std::exp(2.0f * u) + 1.0f); }
}

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for schedule(static) if(n * kTanhCost >= kMinParallelElements)
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + fast_tanh(kGeluScale * (x + cube)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for schedule(static) if(n * kTanhCost >= kMinParallelElements)
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float th = fast_tanh(u);
    const float sech2 = 1.0f - th * th;
    const float local = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = local * dout[i];
  }
}

}  // namespace zt::model::kernels
