// trainer/cuda/adamw.h: optim::cpu_adamw_step's contract on device pointers: the same checks, the
// same fp32 constants (optim::adam_consts, which every CPU ISA uses), and
// kernels.h's adamw_step, which applies them with one IEEE operation each in the same order. So a
// step on the GPU gives p, m, v (and the fused bf16/fp16 copy) bit-identical to the CPU for every
// non-NaN value, and a NaN wherever the CPU has one.
// May call: kernels.h, optim/cpu_adam.h (AdamParams, LowDType). Called by: the CUDA DeviceOps.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/kernels.h"
#include "optim/cpu_adam.h"

namespace zt::cuda {

// The constants cpu_adamw_step uses for step `step` (counting from 1). Throws
// std::invalid_argument when step < 1.
AdamWConsts adamw_consts(const optim::AdamParams& hp, int64_t step);

// One AdamW step over n elements on device pointers, asynchronous on `stream`. Throws
// std::invalid_argument as cpu_adamw_step does (step < 1; low != None with low_out null); n <= 0
// does nothing. low_out (device) receives the updated params as bf16/fp16 when low != None.
void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, const optim::AdamParams& hp,
                int64_t step, void* low_out, optim::LowDType low, cudaStream_t stream);

}  // namespace zt::cuda
