// optim/cpu_adam.h: the vectorized CPU AdamW of the ZeRO offload path (DeepSpeed's CPUAdam): one
// fused pass over a rank's shard of fp32 master weights p, fp32 gradients g and fp32 moments m, v,
// optionally writing the updated weights, converted to bf16 or fp16, in the same pass.
//
// Semantics: exactly zt::model::adamw_step (model/adamw.h: torch 1.13 AdamW, decoupled weight decay,
// bias corrections, hyperparameters as double rounded once to fp32), in the same order of operations:
//   p  = p * (1 - lr*wd)
//   m  = m * beta1 + g * (1 - beta1)
//   v  = v * beta2 + (g * g) * (1 - beta2)
//   p -= step_size * (m / (sqrt(v) / sqrt(1 - beta2^step) + eps)),  step_size = lr / (1 - beta1^step)
// Every ISA computes these with separate IEEE multiplies, adds, divides and square roots (no FMA, no
// reciprocal approximations; the per-ISA files are compiled with -ffp-contract=off), each correctly
// rounded in fp32, so every path gives p, m and v BIT-IDENTICAL to the reference (tolerance: 0 ulp)
// for every finite input, and a NaN wherever the reference has one (a NaN's payload and sign may
// differ). FMA would not buy speed: the step is bound by memory bandwidth (28 bytes per parameter).
// The result does not depend on the thread count (element-wise; chunks only split the range).
//
// Inputs: cpu_adamw_step takes fp32 grads; cpu_adamw_step_grads takes them in bf16 or fp16 too,
// with a scale, as they land from the device (no fp32 copy, no separate widening pass: 26 bytes a
// parameter instead of 28 + 6). Pointers need no alignment; p, g, m, v (and low_out) must not overlap
// one another. step counts from 1.
//
// Fused low-precision output (low_out != nullptr, low != LowDType::None): low_out[i] receives the
// updated p[i] rounded to nearest even, bit-identical to zt::trainer::float_to_bf16 / float_to_fp16
// (trainer/core/dtype.h): overflow goes to infinity, fp16 subnormals are kept, a NaN stays a NaN
// (bf16: the top 16 bits with the quiet bit set; fp16: sign | 0x7e00). Where low_out is 32-byte
// aligned the AVX2/AVX-512 kernels write it with non-temporal stores (an sfence before returning):
// it bypasses the cache, being written once for someone else to read.
//
// Threads: OpenMP (omp_get_max_threads(), or the caller's num_threads / OMP_NUM_THREADS); shards
// below 64Ki elements run on the calling thread. Schedule "dynamic" (the default): chunks of 16Ki
// elements, each taken by the next free thread, so a thread that the OS preempts for another team
// on the same cores (the trainer's background AdamW beside the rank thread's own) holds the pass up
// by one chunk at most; "static": one contiguous range per thread, the pass as slow as its most
// preempted thread. ZT_CPU_ADAM_SCHEDULE=static|dynamic (read once) or cpu_adam_force_schedule()
// picks one (benchmarks, A/B on a GPU host). No schedule changes any result.
//
// ISA: chosen at run time (__builtin_cpu_supports): "avx512" (AVX-512F), else "avx2" (AVX2 + F16C),
// else "scalar". The environment variable ZT_CPU_ADAM_ISA=scalar|avx2|avx512 (read once, at the
// first call) or cpu_adam_force_isa() picks one explicitly (tests, benchmarks, bisecting).
#pragma once

#include <cstdint>

namespace zt::optim {

struct AdamParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled (AdamW); 0 for tensors excluded from decay
};

// Storage type of the optional fused output (the compute dtype of the parameters on the device).
enum class LowDType : uint8_t { None, BF16, F16 };

// Storage type of the gradient cpu_adamw_step_grads reads.
enum class GradDType : uint8_t { F32, BF16, F16 };

enum class CpuAdamIsa : uint8_t { Scalar, Avx2, Avx512 };

enum class CpuAdamSchedule : uint8_t { Static, Dynamic };

// The fp32 constants of one step, rounded once from the double hyperparameters exactly as the
// reference (model/adamw.cpp) forms them. Every AdamW here (each CPU ISA, the CUDA kernel) takes
// them from adam_consts(), so they cannot drift apart.
struct AdamConsts {
  float decay;                  // (float)(1 - lr * weight_decay)
  float beta1, beta2;           // (float)beta1, (float)beta2
  float one_minus_beta1;        // (float)(1 - beta1)
  float one_minus_beta2;        // (float)(1 - beta2)
  float bias_correction2_sqrt;  // (float)sqrt(1 - beta2^step)
  float eps;                    // (float)eps
  float step_size;              // (float)(lr / (1 - beta1^step))
};
// Throws std::invalid_argument when step < 1.
AdamConsts adam_consts(const AdamParams& hp, int64_t step);

// One AdamW step over n elements of a shard, in place on params, m and v. Throws
// std::invalid_argument when step < 1, or when low != None and low_out is null.
void cpu_adamw_step(float* params, const float* grads, float* m, float* v, int64_t n,
                    const AdamParams& hp, int64_t step, void* low_out = nullptr,
                    LowDType low = LowDType::None);

// The same step on a gradient stored as `grad_t`, each element widened to fp32 (exact) and, unless
// it is fp32 and grad_scale is 1, multiplied by grad_scale in fp32, then used as cpu_adamw_step uses
// its fp32 gradient. So p, m, v (and low_out) are bit-identical to widening the gradient into an
// fp32 buffer, scaling it there (x * grad_scale, one fp32 multiply per element: the engine's
// unscale-and-clip) and calling cpu_adamw_step on it. Throws as cpu_adamw_step does.
void cpu_adamw_step_grads(float* params, const void* grads, GradDType grad_t, float grad_scale, float* m, float* v,
                          int64_t n, const AdamParams& hp, int64_t step, void* low_out = nullptr,
                          LowDType low = LowDType::None);

// The same step out of place: p, m, v read from p_in, m_in, v_in (left as they were) and the updated
// ones written to p_out, m_out, v_out, bit for bit what cpu_adamw_step_grads writes in place. No out
// may overlap an in, another out or the gradient. Where the three outs are 64-byte aligned they are
// written with non-temporal stores (memory nobody reads in the pass: the stores need not read each
// line first), so the pass moves the bytes of the in-place one. The engine's AdamW during backward
// (engine.h) runs it: the state it read stays until the step's norm says the update stands.
void cpu_adamw_step_grads_into(const float* p_in, const float* m_in, const float* v_in, float* p_out, float* m_out,
                               float* v_out, const void* grads, GradDType grad_t, float grad_scale, int64_t n,
                               const AdamParams& hp, int64_t step, void* low_out = nullptr,
                               LowDType low = LowDType::None);

// The ISA cpu_adamw_step uses now: "avx512", "avx2" or "scalar".
const char* cpu_adam_isa();
CpuAdamIsa cpu_adam_active_isa();
const char* cpu_adam_isa_name(CpuAdamIsa isa);
// Whether this CPU and OS can run `isa` (and this build compiled it). Scalar is always supported.
bool cpu_adam_isa_supported(CpuAdamIsa isa);
// The widest supported ISA: what is used unless forced.
CpuAdamIsa cpu_adam_best_isa();
// Forces `isa` for every later call, process-wide (not meant to be changed while another thread is
// in cpu_adamw_step). Throws std::invalid_argument if this CPU cannot run it.
void cpu_adam_force_isa(CpuAdamIsa isa);
// Back to the default: ZT_CPU_ADAM_ISA if it names a supported ISA, else cpu_adam_best_isa().
void cpu_adam_unforce_isa();

// How a shard is split among the OpenMP threads (above): the one in use, its name ("static",
// "dynamic"), forcing one process-wide, and back to the default (ZT_CPU_ADAM_SCHEDULE, else dynamic).
CpuAdamSchedule cpu_adam_active_schedule();
const char* cpu_adam_schedule_name(CpuAdamSchedule s);
void cpu_adam_force_schedule(CpuAdamSchedule s);
void cpu_adam_unforce_schedule();

}  // namespace zt::optim
