// trainer/cuda/gemm.h: GPT-2's GEMMs through cuBLAS (cublasGemmEx), in fp32, bf16 or fp16 with
// fp32 accumulation, mirroring model/kernels.h's matmul_forward and matmul_backward.
//
// Owns: one cuBLAS handle per Blas object (a handle is not thread-safe: one per rank thread).
// May call: cuBLAS, kernels.h (bias rows, column sums). Called by: the CUDA path of the model.
//
// Row-major tensors are handed to column-major cuBLAS as their transposes (llm.c's mapping):
//   out[N, OC] = inp[N, IC] @ w[OC, IC]^T   is  out^T = w^T(op T) * inp^T      (m=OC, n=N, k=IC)
//   dinp[N, IC] = dout[N, OC] @ w[OC, IC]   is  dinp^T = w^T * dout^T          (m=IC, n=N, k=OC)
//   dw[OC, IC] += dout^T @ inp              is  dw^T += inp^T * dout(op T)     (m=IC, n=OC, k=N)
// Precision: compute type CUBLAS_COMPUTE_32F everywhere (fp32 accumulation); for fp32 tensors
// that is true fp32 (no TF32: the default math mode, so parity with the CPU reference holds),
// unless the Blas's matmul precision says otherwise (for fp32 tensors only: High is
// CUBLAS_COMPUTE_32F_FAST_TF32, Medium CUBLAS_COMPUTE_32F_FAST_16BF).
// Outputs out and dinp are in the tensors' dtype; dw and dbias are fp32 (gradients accumulate in
// fp32, as the reference's). The bias is written into out first and the GEMM adds with beta = 1,
// as the reference does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "cuda/gemm_mapping.h"

typedef struct cublasContext* cublasHandle_t;

namespace zt::cuda {

using trainer::DType;

class Blas {
 public:
  explicit Blas(int device);  // creates the handle on `device`; throws CudaError (cuBLAS status text)
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cublasHandle_t handle() const { return handle_; }
  int device() const { return device_; }
  // cuBLAS's workspace from memory we own (256-byte aligned; null: cuBLAS's own pool), so that
  // it is inside the caching allocator's figures and cap. Makes no CUDA call: every GEMM sets it
  // again after setting its stream (cublasSetStream resets the workspace to cuBLAS's pool).
  void set_workspace(void* memory, size_t bytes);
  void* workspace() const { return workspace_; }
  // How fp32 GEMMs run, as torch.set_float32_matmul_precision (core/dtype.h): Highest (default)
  // true fp32, what the parity tests hold to 1e-4; High on TF32 tensor cores
  // (CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to a 10-bit mantissa, as
  // torch.backends.cuda.matmul.allow_tf32); Medium as PyTorch's (CUBLAS_COMPUTE_32F_FAST_16BF:
  // bf16 inputs where cuBLAS has a faster kernel for them, else TF32; on the H100 with cuBLAS 13.0
  // it ran the TF32 kernels). fp32 accumulation and output in all three; bf16/fp16 GEMMs are unaffected.
  void set_matmul_precision(trainer::MatmulPrecision p) { matmul_ = p; }
  trainer::MatmulPrecision matmul_precision() const { return matmul_; }
  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  int device_;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  trainer::MatmulPrecision matmul_ = trainer::MatmulPrecision::Highest;
};

// out[N, OC] = inp[N, IC] @ w[OC, IC]^T + bias[OC] (bias may be null); with accumulate, out +=.
// ld_out: the row stride of out in elements (0: OC; larger only without a bias). A stride that is
// a multiple of 16 bytes keeps cuBLAS on its aligned kernels when OC is odd (the LM head's vocab).
void matmul_forward(Blas& blas, void* out, const void* inp, const void* w, const void* bias, int64_t N, int64_t IC,
                    int64_t OC, DType t, cudaStream_t stream, bool accumulate = false, int64_t ld_out = 0);
// dinp[N, IC] = dout @ w (or += with accumulate_dinp; skipped when dinp is null);
// dw[OC, IC] += dout^T @ inp (fp32; skipped when null); dbias[OC] += column sums of dout (fp32; skipped when null).
// ld_dout: the row stride of dout (0: OC; larger only without dbias).
void matmul_backward(Blas& blas, void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const void* w,
                     int64_t N, int64_t IC, int64_t OC, DType t, cudaStream_t stream, bool accumulate_dinp = false,
                     int64_t ld_dout = 0);

// One column-major product (gemm_mapping.h) through cublasGemmEx: D (ldd) = op(A) op(B) + beta D,
// A and B of type ab, D of type d_t (fp32 accumulation, CUBLAS_COMPUTE_32F; fp32 inputs follow the
// Blas's matmul precision). The mixed products of bf16 compute (bf16 inputs, fp32 output) and its
// unfused epilogues (gemm_bf16.h) go through it; matmul_forward/backward above are its same-type cases.
void gemm_ex(Blas& blas, const ColumnMajorGemm& g, const void* a, const void* b, DType ab, float beta, void* d,
             DType d_t, cudaStream_t stream, const char* what);

// Causal self-attention in fp32 on cuBLAS: the same contract as kernels.h's attention_forward /
// attention_backward (qkv [B, T, 3C], att [B, H, T, T] probabilities kept for the backward, zero
// above the diagonal; dqkv overwritten; scratch B*H*T*T floats), computed as strided-batched GEMMs
// (scores = scale * Q K^T, out = att V; datt = dY V^T, dQ = g K, dK = g^T Q, dV = att^T dY) around
// kernels.h's causal_softmax_rows / causal_softmax_backward_rows. The scores are computed for the
// whole square (the masked half is overwritten by the softmax). What CudaModelPasses runs; the
// one-block-per-row kernels of kernels.h stay for bf16/fp16 storage. TF32 follows the Blas.
void attention_forward(Blas& blas, float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                       cudaStream_t stream);
void attention_backward(Blas& blas, float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                        int64_t B, int64_t T, int64_t C, int64_t H, cudaStream_t stream);

// Whether cuBLAS (loaded on first use with dlopen, not linked) and the functions used here can be
// found; *why says what is missing. Needs no GPU.
bool cublas_loadable(std::string* why = nullptr);

// dlopen of a CUDA library (libcublas, libcublasLt) by its soname, then from the toolkit's library
// directory: the handle, or null with *error "<what> could not be loaded: <each try's dlerror>".
void* open_cuda_library(const std::string& soname, const char* what, std::string* error);

// The text of a cuBLAS status, "CUBLAS_STATUS_NOT_SUPPORTED: the functionality requested is not supported".
const char* cublas_status_text(int status);

}  // namespace zt::cuda
