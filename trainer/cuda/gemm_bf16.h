// trainer/cuda/gemm_bf16.h: the linear layers of bf16 compute (zt train --matmul-dtype bf16) on
// bf16 tensor cores: bf16 inputs (activations and weights), fp32 accumulation
// (CUBLAS_COMPUTE_32F), outputs in fp32 or bf16 as the caller asks; the forward's bias, the
// residual add and GELU, and the backward's GELU derivative fused into cuBLASLt epilogues
// (CUBLASLT_EPILOGUE_BIAS, _GELU_AUX_BIAS, _DGELU) where cuBLASLt has an algorithm for them.
//
// Owns: LtMatmul, one per rank thread (a cuBLASLt handle, created on first use, and its plans:
// each distinct product's descriptors and the algorithm cuBLASLt's heuristic chose for it,
// chosen once and reused, so a step does not pay the heuristic's host time per GEMM).
// Every product with an epilogue is tried on cuBLASLt first; where cuBLASLt refuses it (no
// algorithm for that shape, type or alignment) the same result is composed the unfused way:
// cublasGemmEx (gemm.h's gemm_ex) with kernels.h's add_bias_rows, gelu_forward, gelu_backward. Which
// way each ran is counted (LtMatmul::routes) and the unfused way can be forced (set_fused(false):
// the A/B and the tests of both ways).
// Semantics (row-major, model/kernels.h's): see each function. Products without an epilogue
// (the weight gradients, the LM head) are cublasGemmEx's. cuBLASLt's workspace is the Blas's (our
// memory, CudaModelPasses::bytes()); nothing here allocates device memory.
// Not thread-safe (one per rank thread, as Blas). May call: cuBLASLt (dlopen), gemm.h, kernels.h,
// gemm_mapping.h. Called by: model_passes.cpp (bf16 compute), the GPU tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/gemm_mapping.h"

namespace zt::cuda {

class LtMatmul {
 public:
  // Makes no CUDA call; `blas` (its device, workspace and handle) must outlive it.
  explicit LtMatmul(Blas& blas);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // One product with an epilogue (gemm_mapping.h): D = epilogue(op(A) op(B) + beta C). A and B
  // bf16; C (null: none, beta 0) and D of type d_t (fp32 or bf16); bias of type d_t (m values);
  // aux bf16 (aux_ld). Queues it and returns true; returns false, queueing nothing, when the
  // epilogue is switched off (set_fused(false)) or cuBLASLt refuses it (no algorithm, or
  // NOT_SUPPORTED / INVALID_VALUE: the plan is then marked, and routes().first_refusal says which
  // and why). Throws std::invalid_argument for a product the epilogue's rules refuse
  // (epilogue_problem), and std::runtime_error naming the call when cuBLASLt fails otherwise.
  struct Call {
    ColumnMajorGemm g;
    Epilogue epilogue = Epilogue::None;
    const void* a = nullptr;
    const void* b = nullptr;
    const void* c = nullptr;
    float beta = 0.0f;
    void* d = nullptr;
    DType d_t = DType::F32;
    const void* bias = nullptr;
    void* aux = nullptr;
    int64_t aux_ld = 0;
  };
  bool try_run(const Call& call, cudaStream_t stream);
  // Builds the descriptors, layouts and preference try_run would give `call`, and destroys them:
  // cuBLASLt's own checks of every attribute's type and size, on the host, without a GPU. Throws
  // as try_run does (std::runtime_error naming the call cuBLASLt refused).
  static void check_descriptors(const Call& call, size_t workspace_bytes);

  // How many products ran fused on cuBLASLt and how many the unfused way, by epilogue (Epilogue's
  // values as indices).
  struct Routes {
    int64_t fused[4] = {};
    int64_t unfused[4] = {};
    std::string first_refusal;  // the first product cuBLASLt refused, and its reason ("" when none)
  };
  const Routes& routes() const { return routes_; }
  void count_unfused(Epilogue e) { ++routes_.unfused[int(e)]; }
  // false: every epilogue the unfused way (cuBLASLt is not used at all).
  void set_fused(bool fused) { fused_ = fused; }
  bool fused() const { return fused_; }
  Blas& blas() { return blas_; }

 private:
  struct Plan;
  struct Preference;
  Plan* plan_for(const Call& call);
  void refuse(const Call& call, const std::string& why);

  Blas& blas_;
  void* handle_ = nullptr;  // cublasLtHandle_t, created on the first fused product
  bool fused_ = true;
  Routes routes_;
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans_;
};

// The cuBLASLt products the three fused layers below try first (their arguments as theirs).
LtMatmul::Call bias_product(float* out, const float* residual, const void* inp, const void* w, const float* bias,
                            int64_t N, int64_t IC, int64_t OC);
LtMatmul::Call gelu_product(void* out, void* pre, const void* inp, const void* w, const void* bias, int64_t N,
                            int64_t IC, int64_t OC);
LtMatmul::Call dgelu_product(void* dinp, const void* dout, const void* w, const void* gelu_pre, int64_t N, int64_t IC,
                             int64_t OC, int64_t ld_dout = 0);

// out[N, OC] (fp32) = inp[N, IC] @ w[OC, IC]^T + bias[OC] (fp32; may be null) + residual[N, OC]
// (fp32; null: nothing; may be out itself). inp and w bf16. Fused: CUBLASLT_EPILOGUE_BIAS with
// C = residual, D = out (no copy of the residual, no bias kernel). Unfused: the residual copied
// to out, add_bias_rows, cublasGemmEx with beta 1.
void linear_forward_bf16(LtMatmul& lt, float* out, const float* residual, const void* inp, const void* w,
                         const float* bias, int64_t N, int64_t IC, int64_t OC, cudaStream_t stream);

// pre[N, OC] = inp @ w^T + bias and out[N, OC] = gelu(pre) (GPT-2's tanh GELU), all bf16 (bias
// bf16, OC values). Fused: CUBLASLT_EPILOGUE_GELU_AUX_BIAS (out = D, pre = its aux matrix; the
// GELU is taken of the fp32 sum, pre stored rounded). Unfused: add_bias_rows and cublasGemmEx
// into pre, then gelu_forward from the rounded pre. OC must be a multiple of 8 (the aux matrix's
// leading dimension; GPT-2's 4C always is).
void linear_gelu_forward_bf16(LtMatmul& lt, void* out, void* pre, const void* inp, const void* w, const void* bias,
                              int64_t N, int64_t IC, int64_t OC, cudaStream_t stream);

// dinp[N, IC] = dout[N, OC] @ w[OC, IC], dout and w bf16; dinp of type dinp_t (fp32 or bf16).
// With gelu_pre (bf16 [N, IC], a linear_gelu_forward_bf16's pre): dinp (bf16) is that product
// times gelu'(gelu_pre), the gradient at the GELU's input. Fused: CUBLASLT_EPILOGUE_DGELU.
// Unfused: cublasGemmEx into dinp, then gelu_backward in place. ld_dout: dout's row stride (0: OC).
void linear_dinp_bf16(LtMatmul& lt, void* dinp, DType dinp_t, const void* dout, const void* w, const void* gelu_pre,
                      int64_t N, int64_t IC, int64_t OC, cudaStream_t stream, int64_t ld_dout = 0);

// dw[OC, IC] (fp32) += dout[N, OC]^T @ inp[N, IC], dout and inp bf16 (cublasGemmEx, beta 1).
void linear_dweight_bf16(Blas& blas, float* dw, const void* dout, const void* inp, int64_t N, int64_t IC, int64_t OC,
                         cudaStream_t stream, int64_t ld_dout = 0);

// Whether cuBLASLt (libcublasLt, loaded on first use) and its functions used here can be found.
bool cublaslt_loadable(std::string* why = nullptr);

}  // namespace zt::cuda
