// model/adamw.h: the reference AdamW step, the one a vectorized CPU Adam and the CUDA Adam are
// checked against. Scalar and plain on purpose: one loop, no threads, no intrinsics.
//
// Semantics are torch.optim.AdamW's (torch 1.13, single-tensor path, amsgrad off, maximize off),
// including its operation order, so results match PyTorch to float rounding:
//   p *= 1 - lr * weight_decay                      (decoupled weight decay, before the moments)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// step counts from 1 (the first update has step = 1). m and v start at zero. Which tensors get
// weight decay is the caller's choice: call per tensor with weight_decay = 0 to exclude one.
#pragma once

#include <cstdint>

namespace zt::model {

// Hyperparameters are double, as PyTorch's are Python floats: 1 - beta2 is formed in double and
// only then rounded to fp32 (1 - 0.999f would differ from torch's 0.001f by 1.3e-5 relative).
void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step);

}  // namespace zt::model
