// trainer/cuda/gemm.cpp: see gemm.h.
#include "cuda/gemm.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <climits>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "cuda/kernels.h"
#include "cuda/runtime.h"

namespace zt::cuda {

namespace {

// cuBLAS is loaded on first use (dlopen), not linked: mapping libcublas and libcublasLt costs
// about 150 MiB of resident memory in every process that links them, and most runs of zt (the
// simulated GPU, zt db, zt check) never multiply a matrix on a GPU.
struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t) = nullptr;
  cublasStatus_t (*set_workspace)(cublasHandle_t, void*, size_t) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

const CublasApi& cublas() {
  static CublasApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = nullptr;
    std::string tried;
    for (const std::string& path : {soname, std::string(ZT_CUDA_LIBRARY_DIR) + "/" + soname}) {
      if ((lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
      const char* e = dlerror();
      tried += (tried.empty() ? "" : "; ") + (e ? std::string(e) : path);
    }
    if (!lib) {
      error = "cuBLAS could not be loaded: " + tried;
      return;
    }
    auto sym = [&](const char* name) {
      void* f = dlsym(lib, name);
      if (!f && error.empty()) error = "cuBLAS (" + soname + ") has no symbol " + name;
      return f;
    };
    api.create = reinterpret_cast<decltype(api.create)>(sym("cublasCreate_v2"));
    api.destroy = reinterpret_cast<decltype(api.destroy)>(sym("cublasDestroy_v2"));
    api.set_stream = reinterpret_cast<decltype(api.set_stream)>(sym("cublasSetStream_v2"));
    api.set_math_mode = reinterpret_cast<decltype(api.set_math_mode)>(sym("cublasSetMathMode"));
    api.set_workspace = reinterpret_cast<decltype(api.set_workspace)>(sym("cublasSetWorkspace_v2"));
    api.gemm_ex = reinterpret_cast<decltype(api.gemm_ex)>(sym("cublasGemmEx"));
  });
  if (!error.empty()) throw std::runtime_error(error);
  return api;
}

void check_blas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(call) + ": " + cublas_status_text(int(s)));
}

cudaDataType_t data_type(DType t, const char* op) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: break;
  }
  throw std::invalid_argument(std::string(op) + ": dtype must be fp32, bf16 or fp16");
}

// C (ldc) = alpha * op(A) op(B) + beta * C, column-major, A and B of type ab, C of type c,
// fp32 accumulation.
void gemm(Blas& blas, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
          const void* a, int64_t lda, const void* b, int64_t ldb, cudaDataType_t ab, float beta, void* c, int64_t ldc,
          cudaDataType_t ct, const char* what) {
  for (int64_t d : {m, n, k, lda, ldb, ldc})
    if (d > INT_MAX) throw std::invalid_argument(std::string(what) + ": a dimension does not fit cuBLAS's int");
  const CublasApi& api = cublas();
  check_blas(api.set_stream(blas.handle(), stream), "cublasSetStream");
  if (blas.workspace() != nullptr)
    check_blas(api.set_workspace(blas.handle(), blas.workspace(), blas.workspace_bytes()), "cublasSetWorkspace");
  const float alpha = 1.0f;
  check_blas(api.gemm_ex(blas.handle(), ta, tb, int(m), int(n), int(k), &alpha, a, ab, int(lda), b, ab, int(ldb), &beta,
                         c, ct, int(ldc), ab == CUDA_R_32F && blas.tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
             what);
}

void require_dims(const char* op, int64_t N, int64_t IC, int64_t OC) {
  if (N < 0 || IC < 0 || OC < 0) throw std::invalid_argument(std::string(op) + ": N, IC and OC must be >= 0");
}

}  // namespace

bool cublas_loadable(std::string* why) {
  try {
    (void)cublas();
    return true;
  } catch (const std::runtime_error& e) {
    if (why) *why = e.what();
    return false;
  }
}

const char* cublas_status_text(int status) {
  switch (cublasStatus_t(status)) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED: cuBLAS could not initialize (no GPU or driver?)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED: cuBLAS could not allocate its memory";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE: an argument was out of range";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH: the GPU lacks a feature this call needs";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR: GPU memory could not be accessed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED: the kernel failed to run";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED: this type/shape combination is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

Blas::Blas(int device) : device_(device) {
  DeviceGuard guard(device);
  const CublasApi& api = cublas();
  check_blas(api.create(&handle_), "cublasCreate");
  // No TF32 for fp32 GEMMs: the default math mode, stated explicitly (see gemm.h).
  check_blas(api.set_math_mode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

void Blas::set_workspace(void* memory, size_t bytes) {
  if (memory != nullptr && reinterpret_cast<uintptr_t>(memory) % 256 != 0)
    throw std::invalid_argument("Blas::set_workspace: cuBLAS needs a 256-byte aligned workspace");
  workspace_ = memory;
  workspace_bytes_ = memory != nullptr ? bytes : 0;
}

Blas::~Blas() {
  if (handle_) (void)cublas().destroy(handle_);
}

void matmul_forward(Blas& blas, void* out, const void* inp, const void* w, const void* bias, int64_t N, int64_t IC,
                    int64_t OC, DType t, cudaStream_t stream, bool accumulate) {
  require_dims("matmul_forward", N, IC, OC);
  const cudaDataType_t dt = data_type(t, "matmul_forward");
  if (N == 0 || OC == 0) return;
  if (bias != nullptr) add_bias_rows(out, bias, N, OC, accumulate, t, stream);
  const float beta = (bias != nullptr || accumulate) ? 1.0f : 0.0f;
  if (IC == 0) {
    if (beta == 0.0f) check(cudaMemsetAsync(out, 0, size_t(N * OC) * dtype_size(t), stream), "cudaMemsetAsync");
    return;
  }
  gemm(blas, stream, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, IC, inp, IC, dt, beta, out, OC, dt,
       "cublasGemmEx (matmul_forward)");
}

void matmul_backward(Blas& blas, void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const void* w,
                     int64_t N, int64_t IC, int64_t OC, DType t, cudaStream_t stream, bool accumulate_dinp) {
  require_dims("matmul_backward", N, IC, OC);
  const cudaDataType_t dt = data_type(t, "matmul_backward");
  if (dinp != nullptr && N > 0 && IC > 0) {
    if (OC == 0) {
      if (!accumulate_dinp)
        check(cudaMemsetAsync(dinp, 0, size_t(N * IC) * dtype_size(t), stream), "cudaMemsetAsync");
    } else {
      gemm(blas, stream, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, IC, dout, OC, dt, accumulate_dinp ? 1.0f : 0.0f, dinp,
           IC, dt, "cublasGemmEx (matmul_backward dinp)");
    }
  }
  if (N > 0 && IC > 0 && OC > 0)
    gemm(blas, stream, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, IC, dout, OC, dt, 1.0f, dw, IC, CUDA_R_32F,
         "cublasGemmEx (matmul_backward dw)");
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC, t, stream);
}

}  // namespace zt::cuda
