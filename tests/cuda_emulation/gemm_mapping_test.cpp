// trainer/cuda/gemm_mapping.h on the CPU: each linear layer's row-major GEMM, mapped to the
// column-major product cuBLAS / cuBLASLt compute (bf16 compute's products, gemm_bf16.cpp), run
// through a plain column-major GEMM that reads A, B and D only through the mapping's op flags and
// leading dimensions, equals model/kernels.h's matmul_forward / matmul_backward (the CPU
// reference); the stored shapes the mapping gives cuBLASLt's matrix layouts cover exactly the
// tensors' elements; the epilogues' shape rules and the alignment classes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../test_util.h"
#include "cuda/gemm_mapping.h"
#include "model/kernels.h"

namespace {

using zt::cuda::ColumnMajorGemm;

// D = op(A) op(B) + beta D, column-major, as cuBLAS defines it; counts the largest index read in A and B.
void column_major_gemm(const ColumnMajorGemm& g, const std::vector<float>& A, const std::vector<float>& B, float beta,
                       std::vector<float>& D, int64_t* max_a = nullptr, int64_t* max_b = nullptr) {
  int64_t ma = -1, mb = -1;
  for (int64_t j = 0; j < g.n; ++j)
    for (int64_t i = 0; i < g.m; ++i) {
      double s = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const int64_t ai = g.ta ? p + i * g.lda : i + p * g.lda;
        const int64_t bi = g.tb ? j + p * g.ldb : p + j * g.ldb;
        ma = std::max(ma, ai);
        mb = std::max(mb, bi);
        s += double(A.at(size_t(ai))) * double(B.at(size_t(bi)));
      }
      float& d = D.at(size_t(i + j * g.ldd));
      d = float(s + double(beta) * d);
    }
  if (max_a) *max_a = ma;
  if (max_b) *max_b = mb;
}

// Within fp32 summation-order differences (the reference sums in float, this in double): 1e-5 of the
// value plus 1e-5 of the tensor's largest (a cancelling sum keeps its terms' absolute error). A
// wrong transpose, stride or operand moves values by their own size.
void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float largest = 0;
  for (float w : want) largest = std::max(largest, std::fabs(w));
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= 1e-5f * (std::fabs(want[i]) + largest)) && bad++ < 3)
      ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << ", want " << want[i];
  EXPECT_EQ(bad, 0u) << what;
}

struct Shape {
  int64_t N, IC, OC;
};

}  // namespace

TEST(GemmMapping, LinearLayersMatchTheCpuReference) {
  namespace k = zt::model::kernels;
  for (const Shape s : {Shape{5, 3, 7}, Shape{37, 64, 192}, Shape{1, 1, 1}, Shape{12, 256, 64}}) {
    SCOPED_TRACE(std::to_string(s.N) + " x " + std::to_string(s.IC) + " -> " + std::to_string(s.OC));
    const auto inp = zt::test::normal_values(size_t(s.N * s.IC), 1);
    const auto w = zt::test::normal_values(size_t(s.OC * s.IC), 2);
    const auto dout = zt::test::normal_values(size_t(s.N * s.OC), 3);
    const auto dw0 = zt::test::normal_values(size_t(s.OC * s.IC), 4);

    // forward: out = inp @ w^T, A = w, B = inp; the stored shapes are w's and inp's elements exactly.
    std::vector<float> want(size_t(s.N * s.OC)), got(want.size(), 0.0f);
    k::matmul_forward(want.data(), inp.data(), w.data(), nullptr, s.N, s.IC, s.OC);
    const ColumnMajorGemm f = zt::cuda::linear_forward_gemm(s.N, s.IC, s.OC);
    int64_t max_a = 0, max_b = 0;
    column_major_gemm(f, w, inp, 0.0f, got, &max_a, &max_b);
    expect_near_all(got, want, "forward");
    EXPECT_EQ(f.a_rows() - 1 + (f.a_cols() - 1) * f.lda, int64_t(w.size()) - 1);
    EXPECT_EQ(max_a, int64_t(w.size()) - 1);
    EXPECT_EQ(f.b_rows() - 1 + (f.b_cols() - 1) * f.ldb, int64_t(inp.size()) - 1);
    EXPECT_EQ(max_b, int64_t(inp.size()) - 1);
    EXPECT_EQ(f.m, s.OC);  // the bias epilogue's vector: one value per output channel

    // forward into rows ld_out apart: the first OC of each row, the padding untouched.
    const int64_t ld = s.OC + 5;
    std::vector<float> padded(size_t(s.N * ld), -7.0f);
    column_major_gemm(zt::cuda::linear_forward_gemm(s.N, s.IC, s.OC, ld), w, inp, 0.0f, padded);
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t o = 0; o < ld; ++o) {
        const float v = padded[size_t(n * ld + o)];
        if (o < s.OC)
          EXPECT_EQ(v, got[size_t(n * s.OC + o)]);  // the same sums as the unpadded product
        else
          EXPECT_EQ(v, -7.0f);
      }

    // dinp = dout @ w: A = w, B = dout.
    std::vector<float> dinp_want(size_t(s.N * s.IC)), dinp(dinp_want.size(), 0.0f), unused_dw(w.size());
    k::matmul_backward(dinp_want.data(), unused_dw.data(), nullptr, dout.data(), inp.data(), w.data(), s.N, s.IC, s.OC);
    const ColumnMajorGemm d = zt::cuda::linear_dinp_gemm(s.N, s.IC, s.OC);
    column_major_gemm(d, w, dout, 0.0f, dinp, &max_a, &max_b);
    expect_near_all(dinp, dinp_want, "dinp");
    EXPECT_EQ(d.a_rows() - 1 + (d.a_cols() - 1) * d.lda, int64_t(w.size()) - 1);
    EXPECT_EQ(d.b_rows() - 1 + (d.b_cols() - 1) * d.ldb, int64_t(dout.size()) - 1);
    EXPECT_EQ(d.m, s.IC);  // the DGELU epilogue's aux matrix: the forward's [N, IC] pre-activation
    EXPECT_EQ(d.n, s.N);

    // dw += dout^T @ inp: A = inp, B = dout (op T), beta 1.
    std::vector<float> dw_want = dw0, dw = dw0;
    k::matmul_backward(nullptr, dw_want.data(), nullptr, dout.data(), inp.data(), w.data(), s.N, s.IC, s.OC);
    const ColumnMajorGemm g = zt::cuda::linear_dweight_gemm(s.N, s.IC, s.OC);
    column_major_gemm(g, inp, dout, 1.0f, dw, &max_a, &max_b);
    expect_near_all(dw, dw_want, "dweight");
    EXPECT_EQ(g.a_rows() - 1 + (g.a_cols() - 1) * g.lda, int64_t(inp.size()) - 1);
    EXPECT_EQ(g.b_rows() - 1 + (g.b_cols() - 1) * g.ldb, int64_t(dout.size()) - 1);

    // The LM head's padded gradient rows: dout rows ld apart, dinp over the padded width, dw over the real one.
    std::vector<float> dout_padded(size_t(s.N * ld), 0.0f);
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t o = 0; o < s.OC; ++o) dout_padded[size_t(n * ld + o)] = dout[size_t(n * s.OC + o)];
    std::vector<float> w_padded(size_t(ld * s.IC), 0.0f);
    std::copy(w.begin(), w.end(), w_padded.begin());
    std::vector<float> dinp_p(dinp_want.size(), 0.0f), dw_p = dw0;
    column_major_gemm(zt::cuda::linear_dinp_gemm(s.N, s.IC, ld, ld), w_padded, dout_padded, 0.0f, dinp_p);
    column_major_gemm(zt::cuda::linear_dweight_gemm(s.N, s.IC, s.OC, ld), inp, dout_padded, 1.0f, dw_p);
    expect_near_all(dinp_p, dinp_want, "dinp over the padded width");
    expect_near_all(dw_p, dw_want, "dweight from padded rows");
  }
}

TEST(GemmMapping, EpilogueRulesAndAlignments) {
  using zt::cuda::Epilogue;
  using zt::cuda::epilogue_problem;
  const ColumnMajorGemm fc = zt::cuda::linear_forward_gemm(111, 64, 256);  // GPT-2's fc: OC = 4C
  EXPECT_EQ(epilogue_problem(Epilogue::GeluAuxBias, fc, 256, 0.0f), "");
  EXPECT_EQ(epilogue_problem(Epilogue::Bias, fc, 0, 1.0f), "");  // a residual C is fine with a bias
  EXPECT_NE(epilogue_problem(Epilogue::GeluAuxBias, fc, 256, 1.0f).find("beta must be 0"), std::string::npos);
  EXPECT_NE(epilogue_problem(Epilogue::GeluAuxBias, fc, 260, 0.0f).find("multiple of 8"), std::string::npos);
  EXPECT_NE(epilogue_problem(Epilogue::DGelu, zt::cuda::linear_dinp_gemm(111, 256, 64), 248, 0.0f).find("below D's rows"),
            std::string::npos);
  EXPECT_EQ(epilogue_problem(Epilogue::DGelu, zt::cuda::linear_dinp_gemm(111, 256, 64), 256, 0.0f), "");
  EXPECT_NE(epilogue_problem(Epilogue::Bias, zt::cuda::linear_forward_gemm(0, 64, 64), 0, 0.0f), "");
  ColumnMajorGemm bad = fc;
  bad.ldd = fc.m - 1;
  EXPECT_NE(epilogue_problem(Epilogue::None, bad, 0, 0.0f), "");

  alignas(256) static char buf[1024];
  EXPECT_EQ(zt::cuda::alignment_of(buf), 256u);
  EXPECT_EQ(zt::cuda::alignment_of(buf + 2), 2u);
  EXPECT_EQ(zt::cuda::alignment_of(buf + 48), 16u);
  EXPECT_EQ(zt::cuda::alignment_of(buf + 512), 256u);
  EXPECT_EQ(zt::cuda::alignment_of(buf + 129), 1u);
  EXPECT_EQ(zt::cuda::alignment_of(nullptr), 256u);
}
