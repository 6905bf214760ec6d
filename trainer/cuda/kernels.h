// trainer/cuda/kernels.h: the CUDA kernels of GPT-2 and of the ZeRO engine's optimizer step.
//
// Each op mirrors one CPU reference in trainer/model/kernels.h or gpt2.cpp (same shapes, same
// row-major layouts, same accumulate/overwrite conventions) and is checked against it by
// tests/cuda/cuda_kernels_test.cpp with the tolerances stated there. GEMMs are in gemm.h.
//
// Conventions of every function below:
//  - pointers are device pointers; every call is asynchronous on `stream` and throws CudaError
//    when the launch fails (the kernel's own faults surface at the next synchronizing call);
//  - `t` is the storage dtype of activations and parameters (fp32, bf16 or fp16; int32 is
//    refused with std::invalid_argument); the math is fp32; LayerNorm statistics, attention
//    probabilities, per-row losses and parameter gradients are fp32;
//  - "+=" means the op accumulates into that output, as the CPU reference does;
//  - deterministic: no atomics; every reduction runs in an order fixed by the shapes alone, so a
//    run repeats bit for bit on the same GPU (not across GPU models: the GEMMs' order is cuBLAS's).
// Sizes are int64_t; a dimension must be >= 0 and rows of C elements must fit in an int.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "optim/cpu_adam.h"

namespace zt::cuda {

using trainer::DType;

// ---- elementwise and reductions (the engine's casts, unscale, global norm) ----

// dst[i] = src[i] converted (round to nearest even; NaN stays NaN, overflow becomes inf).
// Any pair of fp32, bf16, fp16; the same dtype is a copy. src and dst must not overlap unless equal.
void cast(void* dst, DType dst_t, const void* src, DType src_t, int64_t n, cudaStream_t stream);
// x[i] *= a, in place (fp32 math, rounded back to t).
void scale_inplace(void* x, DType t, int64_t n, float a, cudaStream_t stream);
// *out (device) = sum of x[i]^2 in fp64, or += with accumulate. `scratch` holds
// kSquaredNormBlocks doubles: each block's partial sum, added in block order by a second kernel.
inline constexpr int kSquaredNormBlocks = 256;
void squared_norm(double* out, double* scratch, const void* x, DType t, int64_t n, cudaStream_t stream,
                  bool accumulate = false);
// sums[c] += sum over rows r (in order) of in[r, c]. The bias gradient of a GEMM.
void column_sums_accumulate(float* sums, const void* in, int64_t rows, int64_t cols, DType t, cudaStream_t stream);
// out[n, :] = bias (or += bias with accumulate), for every row n of [N, OC]: the GEMM's bias.
void add_bias_rows(void* out, const void* bias, int64_t N, int64_t OC, bool accumulate, DType t, cudaStream_t stream);

// dst := src converted (fp32 to dst_t, round to nearest even) for up to kMaxCastSegments
// segments in one launch: bf16 compute's staging of a module's weights (model_passes.cpp).
// Segments must not overlap one another.
struct CastSegment {
  const float* src = nullptr;
  void* dst = nullptr;
  int64_t n = 0;
  DType dst_t = DType::BF16;
};
inline constexpr int kMaxCastSegments = 8;
void cast_segments(const CastSegment* segments, int count, cudaStream_t stream);

// ---- GPT-2's ops ----

// out[N, C] = (inp - mean) * rstd * w + b per row (eps 1e-5); mean[N], rstd[N] kept (fp32).
void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b,
                       int64_t N, int64_t C, DType t, cudaStream_t stream);
// The same with the output stored as out_t (inp, w, b in t): bf16 compute's LayerNorm, fp32 in and
// bf16 out (the GEMM's input). out_t == t is the call above.
void layernorm_forward(void* out, DType out_t, float* mean, float* rstd, const void* inp, const void* w, const void* b,
                       int64_t N, int64_t C, DType t, cudaStream_t stream);
// dinp = (or += with accumulate_dinp) the input gradient (t); dw, db += (fp32).
void layernorm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp, const void* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C, bool accumulate_dinp, DType t,
                        cudaStream_t stream);

// GELU, tanh approximation. dinp may alias dout.
void gelu_forward(void* out, const void* inp, int64_t n, DType t, cudaStream_t stream);
void gelu_backward(void* dinp, const void* inp, const void* dout, int64_t n, DType t, cudaStream_t stream);

// The attention kernels' limits (checked by them, and up front by CudaModelPasses).
inline constexpr int64_t kMaxAttnT = 8192;       // T: shared memory holds (T + head size) floats
inline constexpr int64_t kMaxHeadSize = 1024;    // C / H: one thread per channel of a head
inline constexpr int64_t kMaxGridY = 65535;      // B and H: CUDA's grid y/z dimensions

// Causal self-attention with the softmax fused into one kernel per query row: scores, row max,
// exp, normalization and the weighted sum of values never leave the block. qkv [B, T, 3C]
// (q | k | v, head h at columns h*hs..), att [B, H, T, T] fp32 probabilities (zero above the
// diagonal, kept for the backward), out [B, T, C]. T up to 8192 (shared memory: (T + hs) floats).
void attention_forward(void* out, float* att, const void* qkv, int64_t B, int64_t T, int64_t C, int64_t H, DType t,
                       cudaStream_t stream);
// dqkv [B, T, 3C] overwritten. scratch: B*H*T*T floats (the softmax's input gradient; more than
// the CPU reference's B*H*T, because rows and columns are reduced by different kernels here).
void attention_backward(void* dqkv, float* scratch, const void* dout, const void* qkv, const float* att, int64_t B,
                        int64_t T, int64_t C, int64_t H, DType t, cudaStream_t stream);

// The row halves of gemm.h's attention, in place over att-shaped [B, H, T, T] fp32 rows (one block
// per row): scaled scores -> causal softmax probabilities (zero above the diagonal); and
// datt -> the scores' gradient att * (datt - sum att*datt) * scale (zero above the diagonal).
void causal_softmax_rows(float* att, int64_t B, int64_t T, int64_t H, cudaStream_t stream);
void causal_softmax_backward_rows(float* grad, const float* att, int64_t B, int64_t T, int64_t H, float scale,
                                  cudaStream_t stream);

// losses[n] = logsumexp(logits[n, :]) - logits[n, targets[n]] (fp32), logits [N, V].
// Targets must be in 0..V-1 (not checked, as in the CPU reference).
void cross_entropy_forward(float* losses, const void* logits, const int32_t* targets, int64_t N, int64_t V, DType t,
                           cudaStream_t stream);
// The same losses, and dlogits = (softmax(logits) - onehot(target)) * dscale (t). dlogits may
// be logits itself (in place, as the CPU LM head does).
// ld: the row stride of logits and dlogits in elements (0: V).
void cross_entropy_forward_backward(float* losses, void* dlogits, const void* logits, const int32_t* targets,
                                    int64_t N, int64_t V, float dscale, DType t, cudaStream_t stream, int64_t ld = 0);
// The same with dlogits of type dlogits_t (logits in t) in a buffer of its own: bf16 compute's LM
// head (fp32 logits, bf16 gradient for the GEMMs). Columns V..ld-1 of dlogits are not written.
void cross_entropy_forward_backward(float* losses, void* dlogits, DType dlogits_t, const void* logits,
                                    const int32_t* targets, int64_t N, int64_t V, float dscale, DType t,
                                    cudaStream_t stream, int64_t ld = 0);

// x[b, t, :] = wte[tokens[b, t]] + wpe[t]. wte [V, C], wpe [>= T, C], x [B*T, C], all dtype t.
void embedding_forward(void* x, const int32_t* tokens, const void* wte, const void* wpe, int64_t B, int64_t T,
                       int64_t C, DType t, cudaStream_t stream);
// dwte[tokens[n]] += dx[n], dwpe[t] += sum over b of dx[b, t] (fp32 gradients). Without atomics:
// each block owns a set of channels and of token ids (token % 32) and walks the positions in order.
void embedding_backward(float* dwte, float* dwpe, const int32_t* tokens, const void* dx, int64_t B, int64_t T,
                        int64_t C, DType t, cudaStream_t stream);

// ---- the engine's optimizer step and gradient accumulation: bit-identical to the CPU ----
// These two are exact twins, not tolerance twins: every operation is one IEEE fp32 operation
// (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn: nvcc cannot contract them into FMA),
// in the CPU's order, and the bf16/fp16 roundings are core/dtype_bits.h's integer code (the host's own). Equal to the
// bit for every non-NaN result; a NaN where the CPU has one (its payload and sign may differ: the
// GPU's arithmetic returns the canonical NaN, as cpu_adam.h allows between its own ISAs).

// The fp32 constants of one AdamW step: optim::adam_consts's, the ones every CPU ISA uses.
using AdamWConsts = optim::AdamConsts;
// One AdamW step over n elements, in place on params, m and v (all fp32; grads fp32), in
// cpu_adamw_step's order: p = p*decay; m = m*b1 + g*(1-b1); v = v*b2 + (g*g)*(1-b2);
// p -= step_size * (m / (sqrt(v)/bc2_sqrt + eps)). low_t F32 means no fused output (low_out
// ignored); BF16 or F16 writes the updated p rounded to low_out (which must then not be null).
// None of the buffers may overlap.
void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, const AdamWConsts& c, void* low_out,
                DType low_t, cudaStream_t stream);
// dst[i] = dst[i] + src[i] in fp32, rounded back to dst_t (fp32: one add; bf16/fp16: widened,
// added, rounded to nearest even): the engine's add_into (zero/engine.cpp) on the device.
void add_inplace(void* dst, DType dst_t, const float* src, int64_t n, cudaStream_t stream);

}  // namespace zt::cuda
