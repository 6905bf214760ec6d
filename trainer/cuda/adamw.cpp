// trainer/cuda/adamw.cpp: see adamw.h. The constants are optim::adam_consts's, the CPU's own.
#include "cuda/adamw.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace zt::cuda {

AdamWConsts adamw_consts(const optim::AdamParams& hp, int64_t step) { return optim::adam_consts(hp, step); }

void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, const optim::AdamParams& hp,
                int64_t step, void* low_out, optim::LowDType low, cudaStream_t stream) {
  const AdamWConsts c = adamw_consts(hp, step);
  if (low != optim::LowDType::None && low_out == nullptr)
    throw std::invalid_argument("cuda adamw_step: a bf16/fp16 output was asked for but low_out is null");
  if (n <= 0) return;
  const DType low_t = low == optim::LowDType::BF16 ? DType::BF16 : low == optim::LowDType::F16 ? DType::F16 : DType::F32;
  adamw_step(params, grads, m, v, n, c, low_t == DType::F32 ? nullptr : low_out, low_t, stream);
}

}  // namespace zt::cuda
