// trainer/cuda/gemm.cpp: see gemm.h.
#include "cuda/gemm.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
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
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                            const void*, const void*, cudaDataType, int, long long, const void*,
                                            cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                            long long, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

const CublasApi& cublas() {
  static CublasApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = open_cuda_library(soname, "cuBLAS", &error);
    if (!lib) return;
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
    api.gemm_strided_batched_ex =
        reinterpret_cast<decltype(api.gemm_strided_batched_ex)>(sym("cublasGemmStridedBatchedEx"));
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

// Before every product: the dimensions fit cuBLAS's int, the handle is on `stream`, and our
// workspace is set again (cublasSetStream resets it to cuBLAS's own pool).
const CublasApi& prepare(Blas& blas, cudaStream_t stream, std::initializer_list<int64_t> dims, const char* what) {
  for (int64_t d : dims)
    if (d > INT_MAX) throw std::invalid_argument(std::string(what) + ": a dimension does not fit cuBLAS's int");
  const CublasApi& api = cublas();
  check_blas(api.set_stream(blas.handle(), stream), "cublasSetStream");
  if (blas.workspace() != nullptr)
    check_blas(api.set_workspace(blas.handle(), blas.workspace(), blas.workspace_bytes()), "cublasSetWorkspace");
  return api;
}

// The compute type of a GEMM on inputs of type ab: fp32 inputs follow the Blas's matmul precision.
cublasComputeType_t compute_type(const Blas& blas, cudaDataType_t ab) {
  if (ab != CUDA_R_32F) return CUBLAS_COMPUTE_32F;
  switch (blas.matmul_precision()) {
    case trainer::MatmulPrecision::High: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case trainer::MatmulPrecision::Medium: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case trainer::MatmulPrecision::Highest: break;
  }
  return CUBLAS_COMPUTE_32F;
}

// C (ldc) = alpha * op(A) op(B) + beta * C, column-major, A and B of type ab, C of type c,
// fp32 accumulation.
void gemm(Blas& blas, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
          const void* a, int64_t lda, const void* b, int64_t ldb, cudaDataType_t ab, float beta, void* c, int64_t ldc,
          cudaDataType_t ct, const char* what) {
  const CublasApi& api = prepare(blas, stream, {m, n, k, lda, ldb, ldc}, what);
  const float alpha = 1.0f;
  check_blas(api.gemm_ex(blas.handle(), ta, tb, int(m), int(n), int(k), &alpha, a, ab, int(lda), b, ab, int(ldb), &beta,
                         c, ct, int(ldc), compute_type(blas, ab), CUBLAS_GEMM_DEFAULT),
             what);
}

// The same in fp32, `batch` times: the i-th product reads A + i*sa, B + i*sb and writes C + i*sc.
void gemm_batched_f32(Blas& blas, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                      int64_t k, float alpha, const float* a, int64_t lda, int64_t sa, const float* b, int64_t ldb,
                      int64_t sb, float* c, int64_t ldc, int64_t sc, int64_t batch, const char* what) {
  const CublasApi& api = prepare(blas, stream, {m, n, k, lda, ldb, ldc, batch}, what);
  const float beta = 0.0f;
  check_blas(api.gemm_strided_batched_ex(blas.handle(), ta, tb, int(m), int(n), int(k), &alpha, a, CUDA_R_32F, int(lda),
                                         sa, b, CUDA_R_32F, int(ldb), sb, &beta, c, CUDA_R_32F, int(ldc), sc,
                                         int(batch),
                                         compute_type(blas, CUDA_R_32F), CUBLAS_GEMM_DEFAULT),
             what);
}

void require_dims(const char* op, int64_t N, int64_t IC, int64_t OC) {
  if (N < 0 || IC < 0 || OC < 0) throw std::invalid_argument(std::string(op) + ": N, IC and OC must be >= 0");
}

}  // namespace

void* open_cuda_library(const std::string& soname, const char* what, std::string* error) {
  std::string tried;
  for (const std::string& path : {soname, std::string(ZT_CUDA_LIBRARY_DIR) + "/" + soname}) {
    if (void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
    const char* e = dlerror();
    tried += (tried.empty() ? "" : "; ") + (e ? std::string(e) : path);
  }
  *error = std::string(what) + " could not be loaded: " + tried;
  return nullptr;
}

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
                    int64_t OC, DType t, cudaStream_t stream, bool accumulate, int64_t ld_out) {
  require_dims("matmul_forward", N, IC, OC);
  const cudaDataType_t dt = data_type(t, "matmul_forward");
  if (ld_out == 0) ld_out = OC;
  if (ld_out < OC || (ld_out != OC && (bias != nullptr || IC == 0)))
    throw std::invalid_argument("matmul_forward: ld_out must be >= OC, and equal to it with a bias or IC = 0");
  if (N == 0 || OC == 0) return;
  if (bias != nullptr) add_bias_rows(out, bias, N, OC, accumulate, t, stream);
  const float beta = (bias != nullptr || accumulate) ? 1.0f : 0.0f;
  if (IC == 0) {
    if (beta == 0.0f) check(cudaMemsetAsync(out, 0, size_t(N * OC) * dtype_size(t), stream), "cudaMemsetAsync");
    return;
  }
  gemm(blas, stream, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, IC, inp, IC, dt, beta, out, ld_out, dt,
       "cublasGemmEx (matmul_forward)");
}

void matmul_backward(Blas& blas, void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const void* w,
                     int64_t N, int64_t IC, int64_t OC, DType t, cudaStream_t stream, bool accumulate_dinp,
                     int64_t ld_dout) {
  require_dims("matmul_backward", N, IC, OC);
  const cudaDataType_t dt = data_type(t, "matmul_backward");
  if (ld_dout == 0) ld_dout = OC;
  if (ld_dout < OC || (ld_dout != OC && dbias != nullptr))
    throw std::invalid_argument("matmul_backward: ld_dout must be >= OC, and equal to it with dbias");
  if (dinp != nullptr && N > 0 && IC > 0) {
    if (OC == 0) {
      if (!accumulate_dinp)
        check(cudaMemsetAsync(dinp, 0, size_t(N * IC) * dtype_size(t), stream), "cudaMemsetAsync");
    } else {
      gemm(blas, stream, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, IC, dout, ld_dout, dt, accumulate_dinp ? 1.0f : 0.0f,
           dinp, IC, dt, "cublasGemmEx (matmul_backward dinp)");
    }
  }
  if (dw != nullptr && N > 0 && IC > 0 && OC > 0)
    gemm(blas, stream, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, IC, dout, ld_dout, dt, 1.0f, dw, IC, CUDA_R_32F,
         "cublasGemmEx (matmul_backward dw)");
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC, t, stream);
}

void gemm_ex(Blas& blas, const ColumnMajorGemm& g, const void* a, const void* b, DType ab, float beta, void* d,
             DType d_t, cudaStream_t stream, const char* what) {
  if (g.m < 0 || g.n < 0 || g.k < 0) throw std::invalid_argument(std::string(what) + ": m, n and k must be >= 0");
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) throw std::invalid_argument(std::string(what) + ": k must be >= 1");  // cuBLAS would leave D as it is
  gemm(blas, stream, g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, a, g.lda, b,
       g.ldb, data_type(ab, what), beta, d, g.ldd, data_type(d_t, what), what);
}

// ---- attention on cuBLAS (see gemm.h) ----
// Row-major [T, hs] slices of qkv (row stride 3C) and of out/dout (row stride C) are column-major
// [hs, T] matrices to cuBLAS; a row-major [T, T] att row block (ld T) is its column-major transpose.
// One strided-batched product per sequence b, batched over the heads (stride hs in qkv, T*T in att).

// Both attentions' shape check: throws naming `op` for an impossible shape; false when there is
// nothing to compute.
static bool attention_shape(int64_t B, int64_t T, int64_t C, int64_t H, const char* op) {
  if (B < 0 || T < 0 || C < 0 || H < 1 || C % H != 0)
    throw std::invalid_argument(std::string(op) + ": B, T, C must be >= 0, H >= 1 and C a multiple of H");
  return B != 0 && T != 0 && C != 0;
}

void attention_forward(Blas& blas, float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                       cudaStream_t stream) {
  if (!attention_shape(B, T, C, H, "attention_forward")) return;
  const int64_t hs = C / H, C3 = 3 * C, TT = T * T;
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * C3;
    float* a = att + b * H * TT;
    // scores[t, t2] = scale * q_t . k_t2   (column-major: scores^T = K^T(op T) * Q)
    gemm_batched_f32(blas, stream, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, q + C, C3, hs, q, C3, hs, a, T, TT, H,
                     "cublasGemmStridedBatchedEx (attention scores)");
  }
  causal_softmax_rows(att, B, T, H, stream);
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * C3;
    // out[t, :] = sum over t2 of att[t, t2] v_t2   (out^T = V^T * att^T)
    gemm_batched_f32(blas, stream, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, q + 2 * C, C3, hs, att + b * H * TT, T, TT,
                     out + b * T * C, C, hs, H, "cublasGemmStridedBatchedEx (attention values)");
  }
}

void attention_backward(Blas& blas, float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                        int64_t B, int64_t T, int64_t C, int64_t H, cudaStream_t stream) {
  if (!attention_shape(B, T, C, H, "attention_backward")) return;
  const int64_t hs = C / H, C3 = 3 * C, TT = T * T;
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int64_t b = 0; b < B; ++b) {
    // datt[t, t2] = dy_t . v_t2   (datt^T = V^T(op T) * dY)
    gemm_batched_f32(blas, stream, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, qkv + b * T * C3 + 2 * C, C3, hs,
                     dout + b * T * C, C, hs, scratch + b * H * TT, T, TT, H,
                     "cublasGemmStridedBatchedEx (attention datt)");
  }
  causal_softmax_backward_rows(scratch, att, B, T, H, scale, stream);  // scratch: the scores' gradient g
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * C3;
    float* dq = dqkv + b * T * C3;
    const float* g = scratch + b * H * TT;
    // dq_t = sum over t2 of g[t, t2] k_t2   (dQ^T = K^T * g^T)
    gemm_batched_f32(blas, stream, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, q + C, C3, hs, g, T, TT, dq, C3, hs, H,
                     "cublasGemmStridedBatchedEx (attention dq)");
    // dk_t2 = sum over t of g[t, t2] q_t   (dK^T = Q^T * g)
    gemm_batched_f32(blas, stream, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, q, C3, hs, g, T, TT, dq + C, C3, hs, H,
                     "cublasGemmStridedBatchedEx (attention dk)");
    // dv_t2 = sum over t of att[t, t2] dy_t   (dV^T = dY^T * att)
    gemm_batched_f32(blas, stream, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dout + b * T * C, C, hs, att + b * H * TT,
                     T, TT, dq + 2 * C, C3, hs, H, "cublasGemmStridedBatchedEx (attention dv)");
  }
}

}  // namespace zt::cuda
