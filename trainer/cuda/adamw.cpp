// trainer/cuda/adamw.cpp: see adamw.h. Compiled with -ffp-contract=off (CMakeLists.txt), as
// optim/ is, so the double expressions below round exactly as cpu_adam.cpp's do.
#include "cuda/adamw.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace zt::cuda {

AdamWConsts adamw_consts(const optim::AdamParams& hp, int64_t step) {
  if (step < 1) throw std::invalid_argument("cuda adamw_step: step counts from 1, got " + std::to_string(step));
  // Exactly as cpu_adamw_step (and zt::model::adamw_step) forms them: in double, rounded once.
  const double bias_correction1 = 1.0 - std::pow(hp.beta1, (double)step);
  const double bias_correction2 = 1.0 - std::pow(hp.beta2, (double)step);
  AdamWConsts c;
  c.step_size = (float)(hp.lr / bias_correction1);
  c.bias_correction2_sqrt = (float)std::sqrt(bias_correction2);
  c.decay = (float)(1.0 - hp.lr * hp.weight_decay);
  c.beta1 = (float)hp.beta1;
  c.beta2 = (float)hp.beta2;
  c.eps = (float)hp.eps;
  c.one_minus_beta1 = (float)(1.0 - hp.beta1);
  c.one_minus_beta2 = (float)(1.0 - hp.beta2);
  return c;
}

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
