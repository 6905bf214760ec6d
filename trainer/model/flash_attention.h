// trainer/model/flash_attention.h: causal self-attention without the T x T matrices (FlashAttention-2's
// algorithm), on the CPU: the reference of the CUDA kernels in cuda/flash_attention.h, step for
// step, and the CPU passes' attention under `--attention flash`.
//
// Owns: the tiled algorithm and where it rounds. Queries and keys go in tiles of kFlashTile rows;
// the forward keeps a running row max and sum (online softmax) and the normalized output, and
// stores per row only the log-sum-exp of the scaled scores (lse [B, H, T]); the backward
// recomputes each tile's probabilities from it (P = exp(s * scale - lse)) and needs
// dsum = rowsum(bf16(dout) * out) [B, H, T] (computed here into the caller's scratch; dout rounded
// as the product dP = dout V^T rounds it, so dP - dsum vanishes where it should: a single key).
// Precision, as the kernels' tensor cores: Q, K, V, dout, the probabilities P and the score
// gradients dS are rounded to bf16 before each product; every product accumulates in fp32; the
// softmax statistics, lse, dsum and all outputs are fp32. So results agree with the fp32
// reference (kernels.h attention_forward/backward) to bf16 accuracy, not bit for bit.
// Layouts as kernels.h: qkv [B, T, 3C] (q | k | v, head h at columns h*hs..), out and dout
// [B, T, C], dqkv [B, T, 3C] overwritten. Any T >= 1 (a last partial tile is masked); the head
// size C / H is free here (the CUDA kernels take 16, 32 or 64).
// Deterministic (fixed order, no threads sharing an output). May call: core/dtype_bits.h.
#pragma once

#include <cstdint>

namespace zt::model {

inline constexpr int64_t kFlashTile = 64;

// out [B, T, C] (overwritten), lse [B, H, T].
void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t H);

// dqkv [B, T, 3C] overwritten; out and lse from the forward; dsum: B*H*T floats of scratch.
void flash_attention_backward(float* dqkv, float* dsum, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t H);

}  // namespace zt::model
