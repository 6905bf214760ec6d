// trainer/cuda/gemm_bf16.cpp: see gemm_bf16.h.
#include "cuda/gemm_bf16.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/kernels.h"
#include "cuda/runtime.h"

namespace zt::cuda {

namespace {

// cuBLASLt, loaded on first use as gemm.cpp loads cuBLAS (a process that never computes in bf16
// on a GPU never maps it for us; libcublas maps its own copy when it is loaded).
struct LtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

const LtApi& lt() {
  static LtApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = open_cuda_library(soname, "cuBLASLt", &error);
    if (!lib) return;
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
      if (!f && error.empty()) error = "cuBLASLt (" + soname + ") has no symbol " + name;
    };
    sym(api.create, "cublasLtCreate");
    sym(api.destroy, "cublasLtDestroy");
    sym(api.desc_create, "cublasLtMatmulDescCreate");
    sym(api.desc_destroy, "cublasLtMatmulDescDestroy");
    sym(api.desc_set, "cublasLtMatmulDescSetAttribute");
    sym(api.layout_create, "cublasLtMatrixLayoutCreate");
    sym(api.layout_destroy, "cublasLtMatrixLayoutDestroy");
    sym(api.pref_create, "cublasLtMatmulPreferenceCreate");
    sym(api.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    sym(api.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    sym(api.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(api.matmul, "cublasLtMatmul");
  });
  if (!error.empty()) throw std::runtime_error(error);
  return api;
}

void check_lt(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(call) + ": " + cublas_status_text(int(s)));
}

cudaDataType_t lt_type(DType t) {
  if (t == DType::F32) return CUDA_R_32F;
  if (t == DType::BF16) return CUDA_R_16BF;
  throw std::invalid_argument("cuBLASLt products here take fp32 or bf16 outputs");
}

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::DGelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

}  // namespace

bool cublaslt_loadable(std::string* why) {
  try {
    (void)lt();
    return true;
  } catch (const std::runtime_error& e) {
    if (why) *why = e.what();
    return false;
  }
}

// One distinct product: its descriptors, and the algorithm chosen for them (none: cuBLASLt has no
// algorithm, the product runs unfused from then on).
struct LtMatmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;
  ~Plan() {
    if (desc == nullptr) return;  // nothing was created (lt() never loaded)
    const LtApi& api = lt();
    for (cublasLtMatrixLayout_t l : {a, b, c, d})
      if (l) (void)api.layout_destroy(l);
    (void)api.desc_destroy(desc);
  }
  // The product's descriptor (compute fp32, scale fp32, the transposes, the epilogue with its
  // pointers) and the four matrix layouts (A and B bf16, C and D of D's type). Host calls only.
  void build(const Call& call) {
    const LtApi& api = lt();
    const ColumnMajorGemm& g = call.g;
    check_lt(api.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value, const char* what) {
      check_lt(api.desc_set(desc, attr, &value, sizeof value), what);
    };
    set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(g.ta ? CUBLAS_OP_T : CUBLAS_OP_N), "cublasLtMatmulDescSetAttribute (TRANSA)");
    set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t(g.tb ? CUBLAS_OP_T : CUBLAS_OP_N), "cublasLtMatmulDescSetAttribute (TRANSB)");
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(lt_epilogue(call.epilogue)), "cublasLtMatmulDescSetAttribute (EPILOGUE)");
    if (call.epilogue == Epilogue::Bias || call.epilogue == Epilogue::GeluAuxBias)  // of D's type (the default)
      set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, call.bias, "cublasLtMatmulDescSetAttribute (BIAS_POINTER)");
    if (call.epilogue == Epilogue::GeluAuxBias || call.epilogue == Epilogue::DGelu) {  // of D's type (bf16)
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux, "cublasLtMatmulDescSetAttribute (AUX_POINTER)");
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, call.aux_ld, "cublasLtMatmulDescSetAttribute (AUX_LD)");
    }
    const cudaDataType_t dt = lt_type(call.d_t);
    check_lt(api.layout_create(&a, CUDA_R_16BF, uint64_t(g.a_rows()), uint64_t(g.a_cols()), g.lda),
             "cublasLtMatrixLayoutCreate (A)");
    check_lt(api.layout_create(&b, CUDA_R_16BF, uint64_t(g.b_rows()), uint64_t(g.b_cols()), g.ldb),
             "cublasLtMatrixLayoutCreate (B)");
    check_lt(api.layout_create(&c, dt, uint64_t(g.m), uint64_t(g.n), g.ldd), "cublasLtMatrixLayoutCreate (C)");
    check_lt(api.layout_create(&d, dt, uint64_t(g.m), uint64_t(g.n), g.ldd), "cublasLtMatrixLayoutCreate (D)");
  }
};

// What the heuristic may choose: our workspace at most, and algorithms that take the pointers'
// actual alignments (cuBLASLt assumes 256 bytes unless told). Host calls only.
struct LtMatmul::Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference(const Call& call, size_t workspace_bytes) {
    const LtApi& api = lt();
    check_lt(api.pref_create(&p), "cublasLtMatmulPreferenceCreate");
    auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
      check_lt(api.pref_set(p, attr, &value, sizeof value), "cublasLtMatmulPreferenceSetAttribute");
    };
    set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(workspace_bytes));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(call.a));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(call.b));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(call.c ? call.c : call.d));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(call.d));
  }
  ~Preference() {
    if (p) (void)lt().pref_destroy(p);
  }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
};

void LtMatmul::check_descriptors(const Call& call, size_t workspace_bytes) {
  if (std::string why = epilogue_problem(call.epilogue, call.g, call.aux_ld, call.beta); !why.empty())
    throw std::invalid_argument(std::string("cuBLASLt ") + epilogue_name(call.epilogue) + " product: " + why);
  Plan plan;
  plan.build(call);
  const Preference pref(call, workspace_bytes);
}

LtMatmul::LtMatmul(Blas& blas) : blas_(blas) {}

LtMatmul::~LtMatmul() {
  plans_.clear();
  if (handle_ != nullptr) (void)lt().destroy(static_cast<cublasLtHandle_t>(handle_));
}

LtMatmul::Plan* LtMatmul::plan_for(const Call& call) {
  const ColumnMajorGemm& g = call.g;
  // Everything the choice of algorithm depends on: shapes, types, the epilogue, whether there is
  // a C, and every pointer's alignment class (the heuristic assumes the alignments it is told).
  const std::vector<int64_t> key = {int64_t(call.epilogue), g.ta, g.tb, g.m, g.n, g.k, g.lda, g.ldb, g.ldd,
                                    int64_t(call.d_t), call.beta != 0.0f, call.aux_ld,
                                    alignment_of(call.a), alignment_of(call.b), alignment_of(call.c ? call.c : call.d),
                                    alignment_of(call.d), alignment_of(call.bias), alignment_of(call.aux)};
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();

  const LtApi& api = lt();
  if (handle_ == nullptr) {
    DeviceGuard guard(blas_.device());
    cublasLtHandle_t h = nullptr;
    check_lt(api.create(&h), "cublasLtCreate");
    handle_ = h;
  }
  auto plan = std::make_unique<Plan>();
  plan->build(call);
  const Preference pref(call, blas_.workspace_bytes());
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = api.heuristic(static_cast<cublasLtHandle_t>(handle_), plan->desc, plan->a, plan->b,
                                         plan->c, plan->d, pref.p, 1, &result, &found);
  // Any refusal (NOT_SUPPORTED, INVALID_VALUE for a combination this cuBLASLt does not take, or
  // nothing found): the product runs unfused from now on, and the first refusal is kept to be told.
  plan->usable = s == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (plan->usable)
    plan->algo = result.algo;
  else
    refuse(call, std::string("cublasLtMatmulAlgoGetHeuristic: ") +
                     (s != CUBLAS_STATUS_SUCCESS ? cublas_status_text(int(s)) : "no algorithm"));
  Plan* p = plan.get();
  plans_.emplace(key, std::move(plan));
  return p;
}

bool LtMatmul::try_run(const Call& call, cudaStream_t stream) {
  const ColumnMajorGemm& g = call.g;
  if (std::string why = epilogue_problem(call.epilogue, g, call.aux_ld, call.beta); !why.empty())
    throw std::invalid_argument(std::string("cuBLASLt ") + epilogue_name(call.epilogue) + " product: " + why);
  if (!fused_) return false;
  Plan* p = plan_for(call);
  if (!p->usable) return false;
  const LtApi& api = lt();
  // The pointers of this call (the plan was chosen for pointers of the same alignment classes).
  if (call.epilogue == Epilogue::Bias || call.epilogue == Epilogue::GeluAuxBias)
    check_lt(api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof call.bias),
             "cublasLtMatmulDescSetAttribute (bias)");
  if (call.epilogue == Epilogue::GeluAuxBias || call.epilogue == Epilogue::DGelu)
    check_lt(api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux, sizeof call.aux),
             "cublasLtMatmulDescSetAttribute (aux)");
  const float alpha = 1.0f, beta = call.beta;
  const cublasStatus_t s = api.matmul(static_cast<cublasLtHandle_t>(handle_), p->desc, &alpha, call.a, p->a, call.b,
                                      p->b, &beta, call.c ? call.c : call.d, p->c, call.d, p->d, &p->algo,
                                      blas_.workspace(), blas_.workspace_bytes(), stream);
  // Refused before anything was queued (its arguments are checked on the host): unfused from now on.
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
    p->usable = false;
    refuse(call, std::string("cublasLtMatmul: ") + cublas_status_text(int(s)));
    return false;
  }
  check_lt(s, (std::string("cublasLtMatmul (") + epilogue_name(call.epilogue) + ")").c_str());
  ++routes_.fused[int(call.epilogue)];
  return true;
}

void LtMatmul::refuse(const Call& call, const std::string& why) {
  if (!routes_.first_refusal.empty()) return;
  const ColumnMajorGemm& g = call.g;
  routes_.first_refusal = std::string(epilogue_name(call.epilogue)) + " (m=" + std::to_string(g.m) +
                          " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) + ", D " +
                          (call.d_t == DType::F32 ? "fp32" : "bf16") + "): " + why;
}

// ---- the linear layers ----------------------------------------------------------------------------

namespace {
void require_shape(const char* op, int64_t N, int64_t IC, int64_t OC) {
  if (N < 1 || IC < 1 || OC < 1) throw std::invalid_argument(std::string(op) + ": N, IC and OC must be >= 1");
}
}  // namespace

LtMatmul::Call bias_product(float* out, const float* residual, const void* inp, const void* w, const float* bias,
                            int64_t N, int64_t IC, int64_t OC) {
  return {.g = linear_forward_gemm(N, IC, OC), .epilogue = Epilogue::Bias, .a = w, .b = inp, .c = residual,
          .beta = residual != nullptr ? 1.0f : 0.0f, .d = out, .d_t = DType::F32, .bias = bias};
}

LtMatmul::Call gelu_product(void* out, void* pre, const void* inp, const void* w, const void* bias, int64_t N,
                            int64_t IC, int64_t OC) {
  return {.g = linear_forward_gemm(N, IC, OC), .epilogue = Epilogue::GeluAuxBias, .a = w, .b = inp, .d = out,
          .d_t = DType::BF16, .bias = bias, .aux = pre, .aux_ld = OC};
}

LtMatmul::Call dgelu_product(void* dinp, const void* dout, const void* w, const void* gelu_pre, int64_t N, int64_t IC,
                             int64_t OC, int64_t ld_dout) {
  return {.g = linear_dinp_gemm(N, IC, OC, ld_dout), .epilogue = Epilogue::DGelu, .a = w, .b = dout, .d = dinp,
          .d_t = DType::BF16, .aux = const_cast<void*>(gelu_pre), .aux_ld = IC};
}

void linear_forward_bf16(LtMatmul& lt, float* out, const float* residual, const void* inp, const void* w,
                         const float* bias, int64_t N, int64_t IC, int64_t OC, cudaStream_t stream) {
  require_shape("linear_forward_bf16", N, IC, OC);
  const ColumnMajorGemm g = linear_forward_gemm(N, IC, OC);
  if (bias != nullptr) {
    if (lt.try_run(bias_product(out, residual, inp, w, bias, N, IC, OC), stream)) return;
    lt.count_unfused(Epilogue::Bias);
  }
  if (residual != nullptr && residual != out)
    check(cudaMemcpyAsync(out, residual, size_t(N * OC) * sizeof(float), cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync (residual)");
  if (bias != nullptr) add_bias_rows(out, bias, N, OC, /*accumulate=*/residual != nullptr, DType::F32, stream);
  const float beta = (residual != nullptr || bias != nullptr) ? 1.0f : 0.0f;
  gemm_ex(lt.blas(), g, w, inp, DType::BF16, beta, out, DType::F32, stream, "cublasGemmEx (linear_forward_bf16)");
}

void linear_gelu_forward_bf16(LtMatmul& lt, void* out, void* pre, const void* inp, const void* w, const void* bias,
                              int64_t N, int64_t IC, int64_t OC, cudaStream_t stream) {
  require_shape("linear_gelu_forward_bf16", N, IC, OC);
  if (bias == nullptr) throw std::invalid_argument("linear_gelu_forward_bf16: the bias is required");
  const ColumnMajorGemm g = linear_forward_gemm(N, IC, OC);
  if (lt.try_run(gelu_product(out, pre, inp, w, bias, N, IC, OC), stream)) return;
  lt.count_unfused(Epilogue::GeluAuxBias);
  add_bias_rows(pre, bias, N, OC, /*accumulate=*/false, DType::BF16, stream);
  gemm_ex(lt.blas(), g, w, inp, DType::BF16, 1.0f, pre, DType::BF16, stream, "cublasGemmEx (linear_gelu_forward_bf16)");
  gelu_forward(out, pre, N * OC, DType::BF16, stream);
}

void linear_dinp_bf16(LtMatmul& lt, void* dinp, DType dinp_t, const void* dout, const void* w, const void* gelu_pre,
                      int64_t N, int64_t IC, int64_t OC, cudaStream_t stream, int64_t ld_dout) {
  require_shape("linear_dinp_bf16", N, IC, OC);
  const ColumnMajorGemm g = linear_dinp_gemm(N, IC, OC, ld_dout);
  if (gelu_pre != nullptr) {
    if (dinp_t != DType::BF16) throw std::invalid_argument("linear_dinp_bf16: the GELU's gradient is bf16");
    if (lt.try_run(dgelu_product(dinp, dout, w, gelu_pre, N, IC, OC, ld_dout), stream)) return;
    lt.count_unfused(Epilogue::DGelu);
  }
  gemm_ex(lt.blas(), g, w, dout, DType::BF16, 0.0f, dinp, dinp_t, stream, "cublasGemmEx (linear_dinp_bf16)");
  if (gelu_pre != nullptr) gelu_backward(dinp, gelu_pre, dinp, N * IC, DType::BF16, stream);
}

void linear_dweight_bf16(Blas& blas, float* dw, const void* dout, const void* inp, int64_t N, int64_t IC, int64_t OC,
                         cudaStream_t stream, int64_t ld_dout) {
  require_shape("linear_dweight_bf16", N, IC, OC);
  gemm_ex(blas, linear_dweight_gemm(N, IC, OC, ld_dout), inp, dout, DType::BF16, 1.0f, dw, DType::F32, stream,
          "cublasGemmEx (linear_dweight_bf16)");
}

}  // namespace zt::cuda
