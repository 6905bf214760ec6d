// trainer/cuda/gemm_mapping.h: the row-major GEMMs of a linear layer as the column-major products
// cuBLAS and cuBLASLt compute, as plain data (no CUDA), so the mapping and the epilogues' shape
// rules are unit-tested on the CPU (tests/cuda/gemm_mapping_test.cpp runs them through a plain
// column-major GEMM against model/kernels.h's matmul_forward / matmul_backward).
//
// llm.c's mapping (gemm.h states it too): a row-major [R, C] tensor is a column-major [C, R] one.
//   forward  out[N, OC] = inp[N, IC] @ w[OC, IC]^T   D = op_T(A = w) * B = inp      (m=OC, n=N, k=IC)
//   dinp     dinp[N, IC] = dout[N, OC] @ w[OC, IC]   D = A = w * B = dout           (m=IC, n=N, k=OC)
//   dweight  dw[OC, IC] += dout^T @ inp              D = A = inp * op_T(B = dout)   (m=IC, n=OC, k=N)
// A bias of a forward is one value per column-major row of D (per output channel): cuBLASLt's
// CUBLASLT_EPILOGUE_BIAS vector, of length m. A GELU epilogue's auxiliary matrix (the
// pre-activation, written by the forward's GELU_AUX_BIAS and read by the backward's DGELU) has
// D's shape, m x n, with its own leading dimension, which cuBLASLt wants a multiple of 8 elements
// and at least m (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD).
// Invariants: every field is >= 0; lda/ldb/ldd are at least the stored rows of their matrix.
// May call: nothing. Called by: gemm_bf16.cpp, the tests.
#pragma once

#include <cstdint>
#include <string>

namespace zt::cuda {

// One column-major product D[m, n] = op(A)[m, k] * op(B)[k, n] (+ beta C, C laid out as D).
struct ColumnMajorGemm {
  bool ta = false, tb = false;  // op(X) = X^T when set
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  // The stored shape of A and B (rows x cols, column-major), as cublasLtMatrixLayoutCreate takes it.
  int64_t a_rows() const { return ta ? k : m; }
  int64_t a_cols() const { return ta ? m : k; }
  int64_t b_rows() const { return tb ? n : k; }
  int64_t b_cols() const { return tb ? k : n; }
};

// out[N, OC] (row stride ld_out, 0: OC) = inp[N, IC] @ w[OC, IC]^T: A = w, B = inp, D = out.
inline ColumnMajorGemm linear_forward_gemm(int64_t N, int64_t IC, int64_t OC, int64_t ld_out = 0) {
  return {true, false, OC, N, IC, IC, IC, ld_out ? ld_out : OC};
}
// dinp[N, IC] = dout[N, OC] (row stride ld_dout, 0: OC) @ w[OC, IC]: A = w, B = dout, D = dinp.
inline ColumnMajorGemm linear_dinp_gemm(int64_t N, int64_t IC, int64_t OC, int64_t ld_dout = 0) {
  return {false, false, IC, N, OC, IC, ld_dout ? ld_dout : OC, IC};
}
// dw[OC, IC] (+)= dout[N, OC]^T (row stride ld_dout, 0: OC) @ inp[N, IC]: A = inp, B = dout, D = dw.
inline ColumnMajorGemm linear_dweight_gemm(int64_t N, int64_t IC, int64_t OC, int64_t ld_dout = 0) {
  return {false, true, IC, OC, N, IC, ld_dout ? ld_dout : OC, IC};
}

// What a cuBLASLt epilogue adds to a product (cublasLtEpilogue_t's names):
//   None         D = A B + beta C
//   Bias         D = A B + beta C + bias (bias: m values, broadcast over D's columns)
//   GeluAuxBias  aux = A B + bias; D = gelu(aux) (GPT-2's tanh approximation); beta must be 0
//   DGelu        D = (A B) * gelu'(aux) (aux: the forward's pre-activation, D's shape); beta 0
enum class Epilogue : uint8_t { None, Bias, GeluAuxBias, DGelu };

// The largest power of two, at most 256, that divides the address: cuBLASLt's alignment classes
// (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES). 256 for null.
inline uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && (a & (align - 1)) != 0) align >>= 1;
  return align;
}

inline const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::None: return "none";
    case Epilogue::Bias: return "bias";
    case Epilogue::GeluAuxBias: return "gelu+bias (aux)";
    case Epilogue::DGelu: return "dgelu";
  }
  return "?";
}

// Empty when cuBLASLt's documented rules allow `e` on `g` with an auxiliary matrix of leading
// dimension aux_ld (ignored without one) and beta; else the rule broken, in words.
inline std::string epilogue_problem(Epilogue e, const ColumnMajorGemm& g, int64_t aux_ld, float beta) {
  if (g.m < 1 || g.n < 1 || g.k < 1) return "every dimension must be at least 1";
  if (g.lda < g.a_rows() || g.ldb < g.b_rows() || g.ldd < g.m) return "a leading dimension is below its rows";
  const bool gelu = e == Epilogue::GeluAuxBias || e == Epilogue::DGelu;
  if (gelu) {
    if (beta != 0.0f) return std::string(epilogue_name(e)) + " takes no C (beta must be 0)";
    if (aux_ld < g.m) return "the auxiliary matrix's leading dimension is below D's rows";
    if (aux_ld % 8 != 0) return "the auxiliary matrix's leading dimension must be a multiple of 8";
  }
  return "";
}

}  // namespace zt::cuda
