// model/kernels.h: the fp32 CPU kernels of GPT-2 (private to trainer/model; gpt2.cpp composes them).
//
// Each kernel is the plain reference the CUDA kernels will be checked against. Shapes are row-major;
// N = B*T rows. Invariants: no atomics and no reduction whose order depends on the OpenMP thread
// count (column sums run over rows in order inside a fixed chunk of columns), so results are
// bit-identical run to run. "+=" in a comment means the kernel accumulates into that output.
#pragma once

#include <cstdint>

namespace zt::model::kernels {

// Loops over fewer elements than this run on one thread (an `if` clause on each parallel loop).
// A parallel region waits at its barrier for its slowest thread: on a loaded machine (ctest -j, a
// shared CI box) a descheduled worker turns a 10 us loop into a scheduler time slice, and spinning
// OpenMP workers compete with OpenBLAS's threads for the same cores. Measured on 2 loaded cores:
// the tiny preset ran 15x slower with every loop parallel. 1M elements is several hundred
// microseconds of work, where a team's wake-up is noise.
constexpr int64_t kMinParallelElements = int64_t{1} << 20;

// out[N, OC] = inp[N, IC] @ w[OC, IC]^T + bias (bias may be null). With accumulate, out += instead.
void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int64_t N,
                    int64_t IC, int64_t OC, bool accumulate = false);
// dinp[N, IC] = dout @ w (or += with accumulate_dinp; skipped when dinp is null),
// dw[OC, IC] += dout^T @ inp, dbias[OC] += column sums of dout (each skipped when null: a frozen weight).
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int64_t N, int64_t IC, int64_t OC, bool accumulate_dinp = false);

// out[N, C] = (inp - mean) * rstd * w + b over each row; mean[N], rstd[N] kept for the backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int64_t N, int64_t C);
// dinp = (or += with accumulate_dinp) the input gradient; dw, db += (both null: skipped, a frozen norm).
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                        bool accumulate_dinp);

// Causal self-attention. qkv [B, T, 3C] (q | k | v, head h at columns h*hs..), att [B, H, T, T]
// softmax probabilities (zero above the diagonal), out [B, T, C].
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t H);
// dqkv = (overwritten) the gradient w.r.t. qkv; scratch holds B*H*T floats.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t H);

// GELU, tanh approximation (GPT-2's): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, int64_t n);
// dinp = dout * gelu'(inp); dinp may alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);

// out[rows, cols] column sums: sums[c] += sum_r in[r, c], rows in order.
void column_sums_accumulate(float* sums, const float* in, int64_t rows, int64_t cols);

}  // namespace zt::model::kernels
