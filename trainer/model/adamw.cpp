// model/adamw.cpp: see adamw.h.
#include "model/adamw.h"

#include <cmath>

namespace zt::model {

void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  // Scalars are formed in double and rounded once to fp32, where torch's CPU kernels apply them.
  const double bias_correction1 = 1.0 - std::pow(beta1, (double)step);
  const double bias_correction2 = 1.0 - std::pow(beta2, (double)step);
  const float step_size = (float)(lr / bias_correction1);
  const float bias_correction2_sqrt = (float)std::sqrt(bias_correction2);
  const float decay = (float)(1.0 - lr * weight_decay);
  const float b1 = (float)beta1, b2 = (float)beta2, epsf = (float)eps;
  const float one_minus_beta1 = (float)(1.0 - beta1);
  const float one_minus_beta2 = (float)(1.0 - beta2);
  for (int64_t i = 0; i < n; i++) {
    const float g = grads[i];
    float p = params[i] * decay;
    m[i] = m[i] * b1 + g * one_minus_beta1;
    v[i] = v[i] * b2 + g * g * one_minus_beta2;
    const float denom = std::sqrt(v[i]) / bias_correction2_sqrt + epsf;
    p -= step_size * (m[i] / denom);
    params[i] = p;
  }
}

}  // namespace zt::model
