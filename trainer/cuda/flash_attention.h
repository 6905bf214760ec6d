// trainer/cuda/flash_attention.h: causal self-attention on bf16 tensor cores without the T x T
// matrices (FlashAttention-2's algorithm): the CUDA twin of model/flash_attention.h, which
// states the algorithm, the layouts and where values are rounded to bf16; these kernels round
// at the same places (Q, K, V and dout as they are loaded into shared memory, P and dS before
// their products) and multiply with WMMA (16x16x16 bf16 fragments, fp32 accumulators, sm_80+).
//
// Memory: the forward keeps lse [B, H, T] for the backward instead of the [B, H, T, T]
// probabilities of the cuBLAS attention (gemm.h), and the backward needs dsum [B, H, T] of
// scratch instead of another [B, H, T, T].
// Differences from kernels.h's conventions: the inputs and outputs are fp32 (the CUDA passes'
// activations); dQ is summed over key tiles with atomicAdd, so it is not bit-reproducible run
// to run (the last bits move; everything else is). Every call is asynchronous on `stream` and
// throws std::invalid_argument for an unsupported shape, CudaError when a launch fails.
// May call: runtime.h. Called by: model_passes.cpp, the GPU tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace zt::cuda {

// Empty when the kernels take (B, T, C, H); else why not (head size C / H must be 16, 32 or 64;
// B * H and the tile count must fit CUDA's grid).
std::string flash_attention_unsupported(int64_t B, int64_t T, int64_t C, int64_t H);

// out [B, T, C] (overwritten), lse [B, H, T]; qkv [B, T, 3C].
void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                             cudaStream_t stream);

// dqkv [B, T, 3C] overwritten; out and lse from the forward; dsum: B*H*T floats of scratch.
void flash_attention_backward(float* dqkv, float* dsum, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t H, cudaStream_t stream);

}  // namespace zt::cuda
