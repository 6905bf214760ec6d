// Parity of every CUDA op (trainer/cuda/kernels.h, gemm.h) with the fp32 CPU reference
// (trainer/model/kernels.h; the LM head's loss and the embeddings restated from gpt2.cpp, where
// they are private), in fp32, bf16 and fp16, with the tolerances stated in cuda_test_util.h.
// The GPU sees inputs rounded to the storage dtype; the reference runs on the same rounded
// values in fp32. Label gpu: every test skips, saying why, without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "cuda/flash_attention.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda_test_util.h"
#include "model/flash_attention.h"
#include "model/kernels.h"

using namespace zt::cuda;
using namespace zt::cuda::test;
using zt::trainer::MatmulPrecision;
namespace ref = zt::model::kernels;

namespace {

class CudaKernels : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { ZT_REQUIRE_GPU(); }
  DType t() const { return GetParam(); }
  Tolerance tol() const { return tolerance_for(GetParam()); }
  Tolerance tol32() const { return tolerance_for(DType::F32); }
  std::string tag(const std::string& what) const { return what + " (" + name_of(t()) + ")"; }
  // Inputs as the GPU will hold them.
  std::vector<float> in(size_t n, uint64_t seed, float stddev = 1.0f) const { return rounded(normal(n, seed, stddev), t()); }
  static void sync() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
};

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) { return name_of(info.param); }

// An attention test's shape, and its text for messages (" B=2 T=17 C=48 H=3").
struct AttentionShape {
  int64_t B, T, C, H;
  std::string text() const {
    return " B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) + " H=" + std::to_string(H);
  }
};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaKernels, ::testing::Values(DType::F32, DType::BF16, DType::F16), dtype_param_name);

// ---- GEMMs ------------------------------------------------------------------------------------

TEST_P(CudaKernels, MatmulForward) {
  const int64_t N = 33, IC = 48, OC = 40;
  const auto x = in(N * IC, 1), w = in(OC * IC, 2, 0.2f), b = in(OC, 3);
  Blas blas(0);
  for (bool with_bias : {false, true}) {
    for (bool accumulate : {false, true}) {
      const auto out0 = in(N * OC, 4);  // what `out` held before (matters with accumulate)
      std::vector<float> want = out0;
      ref::matmul_forward(want.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, N, IC, OC, accumulate);
      DeviceBuffer dx = upload(x, t()), dw = upload(w, t()), db = upload(b, t()), dout = upload(out0, t());
      matmul_forward(blas, dout.get(), dx.get(), dw.get(), with_bias ? db.get() : nullptr, N, IC, OC, t(), nullptr,
                     accumulate);
      sync();
      EXPECT_TRUE(close(download(dout, N * OC, t()), want, tol(),
                        tag(std::string("matmul_forward bias=") + (with_bias ? "1" : "0") +
                            " accumulate=" + (accumulate ? "1" : "0"))));
    }
  }
}

// The matmul precision of fp32 GEMMs (torch.set_float32_matmul_precision): highest is true fp32;
// medium lets cuBLAS round the inputs to bf16 (CUBLAS_COMPUTE_32F_FAST_16BF, what PyTorch's
// "medium" asks for) and, as torch's contract says, to fall back to TF32 where it has no faster
// kernel: on the H100 with cuBLAS 13.0 it ran TF32 kernels (its product was 8.5x nearer the fp32
// one than the bf16-rounded inputs' product is; 2026-11-23). So medium is held to bf16 accuracy
// and highest to fp32's, nearer the exact product than the bf16-rounded one.
TEST(CudaMatmulPrecision, MediumIsWithinBf16OfTheProductAndHighestIsFp32) {
  ZT_REQUIRE_GPU();
  const int64_t N = 256, IC = 512, OC = 256;  // tensor-core shapes
  const auto x = normal(size_t(N * IC), 11), w = normal(size_t(OC * IC), 12, 0.05f);
  std::vector<float> exact(size_t(N * OC)), of_bf16(size_t(N * OC));
  ref::matmul_forward(exact.data(), x.data(), w.data(), nullptr, N, IC, OC, false);
  const auto xb = rounded(x, DType::BF16), wb = rounded(w, DType::BF16);
  ref::matmul_forward(of_bf16.data(), xb.data(), wb.data(), nullptr, N, IC, OC, false);
  auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
    return m;
  };
  for (MatmulPrecision p : {MatmulPrecision::Highest, MatmulPrecision::Medium}) {
    SCOPED_TRACE(std::string(zt::trainer::matmul_precision_name(p)));
    Blas blas(0);
    blas.set_matmul_precision(p);
    DeviceBuffer dx = upload(x, DType::F32), dw = upload(w, DType::F32), dout(size_t(N * OC) * 4);
    matmul_forward(blas, dout.get(), dx.get(), dw.get(), nullptr, N, IC, OC, DType::F32, nullptr, false);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const std::vector<float> got = download(dout, size_t(N * OC), DType::F32);
    const double to_exact = max_diff(got, exact), to_bf16 = max_diff(got, of_bf16);
    if (p == MatmulPrecision::Medium) {
      // No coarser than bf16 inputs: within twice the bf16-rounded product's own distance.
      EXPECT_LE(to_exact, 2 * max_diff(of_bf16, exact)) << "medium is less accurate than bf16 inputs";
      EXPECT_TRUE(close(got, exact, tolerance_for(DType::BF16), "medium vs the fp32 product"));
      std::printf("medium: %.3g from the fp32 product, %.3g from the bf16-rounded inputs' (%s)\n", to_exact, to_bf16,
                  to_bf16 < to_exact ? "bf16 kernels" : "finer than bf16: TF32 kernels");
    } else {
      EXPECT_LT(to_exact, to_bf16);
      EXPECT_TRUE(close(got, exact, tolerance_for(DType::F32), "highest vs the fp32 product"));
    }
  }
}

TEST_P(CudaKernels, MatmulBackward) {
  const int64_t N = 37, IC = 24, OC = 56;
  const auto x = in(N * IC, 11), w = in(OC * IC, 12, 0.2f), dy = in(N * OC, 13);
  const auto dinp0 = in(N * IC, 14), dw0 = normal(OC * IC, 15), db0 = normal(OC, 16);
  Blas blas(0);
  for (bool accumulate : {false, true}) {
    std::vector<float> want_dinp = dinp0, want_dw = dw0, want_db = db0;
    ref::matmul_backward(want_dinp.data(), want_dw.data(), want_db.data(), dy.data(), x.data(), w.data(), N, IC, OC,
                         accumulate);
    DeviceBuffer ddinp = upload(dinp0, t()), ddw = upload(dw0, DType::F32), ddb = upload(db0, DType::F32);
    DeviceBuffer ddy = upload(dy, t()), dx = upload(x, t()), dwt = upload(w, t());
    matmul_backward(blas, ddinp.get(), ddw.as<float>(), ddb.as<float>(), ddy.get(), dx.get(), dwt.get(), N, IC, OC, t(),
                    nullptr, accumulate);
    sync();
    const std::string acc = accumulate ? " accumulate" : "";
    EXPECT_TRUE(close(download(ddinp, N * IC, t()), want_dinp, tol(), tag("matmul_backward dinp" + acc)));
    EXPECT_TRUE(close(download(ddw, OC * IC, DType::F32), want_dw, tol32(), tag("matmul_backward dw (fp32)")));
    EXPECT_TRUE(close(download(ddb, OC, DType::F32), want_db, tol32(), tag("matmul_backward dbias (fp32)")));
  }
}

// ---- LayerNorm ---------------------------------------------------------------------------------

TEST_P(CudaKernels, LayerNormForwardAndBackward) {
  for (int64_t C : {int64_t(64), int64_t(257), int64_t(768)}) {  // below, across and above one block's threads
    const int64_t N = 19;
    const auto x = in(N * C, 21, 2.0f), w = in(C, 22), b = in(C, 23);
    std::vector<float> out(N * C), mean(N), rstd(N);
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    DeviceBuffer dx = upload(x, t()), dw = upload(w, t()), db = upload(b, t()), dout(N * C * 4), dmean(N * 4),
                 drstd(N * 4);
    layernorm_forward(dout.get(), dmean.as<float>(), drstd.as<float>(), dx.get(), dw.get(), db.get(), N, C, t(), nullptr);
    sync();
    const std::string c = " C=" + std::to_string(C);
    EXPECT_TRUE(close(download(dout, N * C, t()), out, tol(), tag("layernorm_forward out" + c)));
    EXPECT_TRUE(close(download(dmean, N, DType::F32), mean, tol32(), tag("layernorm_forward mean" + c)));
    EXPECT_TRUE(close(download(drstd, N, DType::F32), rstd, tol32(), tag("layernorm_forward rstd" + c)));

    // Backward with the reference's statistics, so only the backward is compared.
    const auto dy = in(N * C, 24), dinp0 = in(N * C, 25), dw0 = normal(C, 26), db0 = normal(C, 27);
    for (bool accumulate : {false, true}) {
      std::vector<float> want_dinp = dinp0, want_dw = dw0, want_db = db0;
      ref::layernorm_backward(want_dinp.data(), want_dw.data(), want_db.data(), dy.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), N, C, accumulate);
      DeviceBuffer ddinp = upload(dinp0, t()), ddw = upload(dw0, DType::F32), ddb = upload(db0, DType::F32);
      DeviceBuffer ddy = upload(dy, t()), m = upload(mean, DType::F32), r = upload(rstd, DType::F32);
      layernorm_backward(ddinp.get(), ddw.as<float>(), ddb.as<float>(), ddy.get(), dx.get(), dw.get(), m.as<float>(),
                         r.as<float>(), N, C, accumulate, t(), nullptr);
      sync();
      const std::string a = c + (accumulate ? " accumulate" : "");
      EXPECT_TRUE(close(download(ddinp, N * C, t()), want_dinp, tol(), tag("layernorm_backward dinp" + a)));
      EXPECT_TRUE(close(download(ddw, C, DType::F32), want_dw, tol32(), tag("layernorm_backward dw" + a)));
      EXPECT_TRUE(close(download(ddb, C, DType::F32), want_db, tol32(), tag("layernorm_backward db" + a)));
    }
  }
}

// ---- GELU --------------------------------------------------------------------------------------

TEST_P(CudaKernels, Gelu) {
  const int64_t n = 10007;
  const auto x = rounded(uniform(n, 31, -6.0f, 6.0f), t()), dy = in(n, 32);
  std::vector<float> want(n), want_d(n);
  ref::gelu_forward(want.data(), x.data(), n);
  ref::gelu_backward(want_d.data(), x.data(), dy.data(), n);
  DeviceBuffer dx = upload(x, t()), dout(n * 4), ddy = upload(dy, t());
  gelu_forward(dout.get(), dx.get(), n, t(), nullptr);
  gelu_backward(ddy.get(), dx.get(), ddy.get(), n, t(), nullptr);  // in place over dout, as the model does
  sync();
  EXPECT_TRUE(close(download(dout, n, t()), want, tol(), tag("gelu_forward")));
  EXPECT_TRUE(close(download(ddy, n, t()), want_d, tol(), tag("gelu_backward")));
}

// ---- attention ---------------------------------------------------------------------------------

TEST_P(CudaKernels, AttentionForwardAndBackward) {
  // T = 1; T odd; T above the block's 128 threads; one head of 64.
  for (AttentionShape s : {AttentionShape{1, 1, 32, 2}, AttentionShape{2, 17, 48, 3}, AttentionShape{1, 130, 64, 1}}) {
    const int64_t B = s.B, T = s.T, C = s.C, H = s.H;
    const std::string shape = s.text();
    const auto qkv = in(B * T * 3 * C, 41);
    std::vector<float> out(B * T * C), att(B * H * T * T);
    ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
    DeviceBuffer dqkv_in = upload(qkv, t()), dout(B * T * C * 4), datt(B * H * T * T * 4);
    attention_forward(dout.get(), datt.as<float>(), dqkv_in.get(), B, T, C, H, t(), nullptr);
    sync();
    EXPECT_TRUE(close(download(dout, B * T * C, t()), out, tol(), tag("attention_forward out" + shape)));
    EXPECT_TRUE(close(download(datt, B * H * T * T, DType::F32), att, tol32(), tag("attention_forward att" + shape)));

    // Backward from the reference's probabilities.
    const auto dy = in(B * T * C, 42);
    std::vector<float> want(B * T * 3 * C), scratch(B * H * T);
    ref::attention_backward(want.data(), scratch.data(), dy.data(), qkv.data(), att.data(), B, T, C, H);
    DeviceBuffer ddy = upload(dy, t()), ratt = upload(att, DType::F32), dscratch(B * H * T * T * 4);
    DeviceBuffer dqkv = upload(std::vector<float>(B * T * 3 * C, 123.0f), t());  // overwritten entirely
    attention_backward(dqkv.get(), dscratch.as<float>(), ddy.get(), dqkv_in.get(), ratt.as<float>(), B, T, C, H, t(),
                       nullptr);
    sync();
    EXPECT_TRUE(close(download(dqkv, B * T * 3 * C, t()), want, tol(), tag("attention_backward dqkv" + shape)));
  }
}

// The fp32 attention that CudaModelPasses runs (gemm.h: strided-batched cuBLAS GEMMs around the
// causal softmax rows), against the same CPU reference, with the masked half poisoned first.
TEST(CudaAttentionOnBlas, ForwardAndBackwardMatchTheReference) {
  ZT_REQUIRE_GPU();
  Blas blas(0);
  const Tolerance tol = tolerance_for(DType::F32);
  // T = 1; T odd; T above the row kernel's 128 threads; several sequences and heads of 64.
  for (AttentionShape s : {AttentionShape{1, 1, 32, 2}, AttentionShape{2, 17, 48, 3}, AttentionShape{1, 130, 64, 1},
                            AttentionShape{3, 200, 256, 4}}) {
    const int64_t B = s.B, T = s.T, C = s.C, H = s.H;
    const std::string shape = s.text();
    const auto qkv = normal(B * T * 3 * C, 61);
    std::vector<float> out(B * T * C), att(B * H * T * T);
    ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
    DeviceBuffer dqkv_in = upload(qkv, DType::F32);
    DeviceBuffer dout = upload(std::vector<float>(B * T * C, 77.0f), DType::F32);
    DeviceBuffer datt = upload(std::vector<float>(B * H * T * T, std::nanf("")), DType::F32);
    attention_forward(blas, dout.as<float>(), datt.as<float>(), dqkv_in.as<float>(), B, T, C, H, nullptr);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    EXPECT_TRUE(close(download(dout, B * T * C, DType::F32), out, tol, "blas attention_forward out" + shape));
    EXPECT_TRUE(close(download(datt, B * H * T * T, DType::F32), att, tol, "blas attention_forward att" + shape));

    const auto dy = normal(B * T * C, 62);
    std::vector<float> want(B * T * 3 * C), scratch(B * H * T);
    ref::attention_backward(want.data(), scratch.data(), dy.data(), qkv.data(), att.data(), B, T, C, H);
    DeviceBuffer ddy = upload(dy, DType::F32), ratt = upload(att, DType::F32);
    DeviceBuffer dscratch = upload(std::vector<float>(B * H * T * T, std::nanf("")), DType::F32);
    DeviceBuffer dqkv = upload(std::vector<float>(B * T * 3 * C, 123.0f), DType::F32);  // overwritten entirely
    attention_backward(blas, dqkv.as<float>(), dscratch.as<float>(), ddy.as<float>(), dqkv_in.as<float>(),
                       ratt.as<float>(), B, T, C, H, nullptr);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    EXPECT_TRUE(close(download(dqkv, B * T * 3 * C, DType::F32), want, tol, "blas attention_backward dqkv" + shape));
  }
}

// The flash attention kernels against model/flash_attention.h (the same algorithm and roundings
// as loops on the CPU) and against the fp32 reference. Against their twin the kernels differ only
// by the order of fp32 sums inside the tensor cores, and by a bf16 rounding of P or dS that such a
// difference can tip: 1e-2 of the tensor's largest value (a guess, not yet measured on a GPU);
// against the fp32 reference, the CPU twin's own bounds (tests/trainer/model/flash_attention_test).
// Head sizes 16, 32 and 64; one token, one full tile, partial tiles, several heads.
TEST(CudaFlashAttention, MatchesItsCpuTwinAndTheFp32Reference) {
  ZT_REQUIRE_GPU();
  const Tolerance twin{0.0, 1e-2}, fwd_ref{0.0, 1.5e-2}, bwd_ref{0.0, 3e-2};
  for (AttentionShape s : {AttentionShape{1, 1, 32, 2}, AttentionShape{1, 64, 32, 2}, AttentionShape{2, 100, 128, 2},
                            AttentionShape{2, 130, 64, 2}, AttentionShape{1, 200, 192, 3}}) {
    const int64_t B = s.B, T = s.T, C = s.C, H = s.H, N = B * T;
    const std::string shape = s.text();
    ASSERT_EQ(flash_attention_unsupported(B, T, C, H), "") << shape;
    const auto qkv = normal(N * 3 * C, 71, 1.5f);
    const auto dy = normal(N * C, 72);
    std::vector<float> out(N * C), lse(B * H * T), dsum(B * H * T), dqkv(N * 3 * C);
    zt::model::flash_attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, H);
    zt::model::flash_attention_backward(dqkv.data(), dsum.data(), dy.data(), qkv.data(), out.data(), lse.data(), B, T,
                                        C, H);
    std::vector<float> ref_out(N * C), att(B * H * T * T), scratch(B * H * T), ref_dqkv(N * 3 * C);
    ref::attention_forward(ref_out.data(), att.data(), qkv.data(), B, T, C, H);
    ref::attention_backward(ref_dqkv.data(), scratch.data(), dy.data(), qkv.data(), att.data(), B, T, C, H);

    DeviceBuffer d_qkv = upload(qkv, DType::F32), d_dy = upload(dy, DType::F32);
    DeviceBuffer d_out = upload(std::vector<float>(N * C, std::nanf("")), DType::F32);  // every value written
    DeviceBuffer d_lse = upload(std::vector<float>(B * H * T, std::nanf("")), DType::F32);
    flash_attention_forward(d_out.as<float>(), d_lse.as<float>(), d_qkv.as<float>(), B, T, C, H, nullptr);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const auto got_out = download(d_out, N * C, DType::F32);
    EXPECT_TRUE(close(got_out, out, twin, "flash forward out vs its CPU twin" + shape));
    EXPECT_TRUE(close(download(d_lse, B * H * T, DType::F32), lse, twin, "flash forward lse vs its CPU twin" + shape));
    EXPECT_TRUE(close(got_out, ref_out, fwd_ref, "flash forward out vs the fp32 reference" + shape));

    // The backward from the CPU twin's forward results, so both sides start from the same values.
    DeviceBuffer c_out = upload(out, DType::F32), c_lse = upload(lse, DType::F32);
    DeviceBuffer d_dsum = upload(std::vector<float>(B * H * T, std::nanf("")), DType::F32);
    DeviceBuffer d_dqkv = upload(std::vector<float>(N * 3 * C, 123.0f), DType::F32);  // overwritten entirely
    flash_attention_backward(d_dqkv.as<float>(), d_dsum.as<float>(), d_dy.as<float>(), d_qkv.as<float>(),
                             c_out.as<float>(), c_lse.as<float>(), B, T, C, H, nullptr);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const auto got = download(d_dqkv, N * 3 * C, DType::F32);
    for (int part = 0; part < 3; ++part) {  // dq, dk, dv: each against its own scale
      std::vector<float> g, want, r;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c) {
          const size_t i = size_t(n * 3 * C + part * C + c);
          g.push_back(got[i]), want.push_back(dqkv[i]), r.push_back(ref_dqkv[i]);
        }
      const std::string what = std::string("flash backward d") + "qkv"[part];
      EXPECT_TRUE(close(g, want, twin, what + " vs its CPU twin" + shape));
      double r_max = 0, g_max = 0, all_max = 0;
      for (size_t i = 0; i < r.size(); ++i) r_max = std::max(r_max, double(std::fabs(r[i])));
      for (float x : g) g_max = std::max(g_max, double(std::fabs(x)));
      for (float x : ref_dqkv) all_max = std::max(all_max, double(std::fabs(x)));
      if (r_max > 0)
        EXPECT_TRUE(close(g, r, bwd_ref, what + " vs the fp32 reference" + shape));
      else  // one key (T = 1): q and k get no gradient; measured against dqkv's scale instead of 0
        EXPECT_LE(g_max, 1e-4 * all_max) << what << " should vanish" << shape;
    }
    EXPECT_TRUE(close(download(d_dsum, B * H * T, DType::F32), dsum, Tolerance{1e-5, 1e-6}, "flash dsum" + shape));
  }
}

// Shapes the kernels do not take are refused with the reason, before any launch.
TEST(CudaFlashAttention, RefusesHeadSizesItHasNoKernelFor) {
  EXPECT_NE(flash_attention_unsupported(1, 64, 256, 2).find("head size C / H = 128"), std::string::npos);
  EXPECT_NE(flash_attention_unsupported(1, 64, 48, 1).find("16, 32 or 64"), std::string::npos);
  EXPECT_EQ(flash_attention_unsupported(8, 1024, 768, 12), "");  // GPT-2 124M
  EXPECT_THROW(flash_attention_forward(nullptr, nullptr, nullptr, 1, 64, 256, 2, nullptr), std::invalid_argument);
}

// ---- cross-entropy -----------------------------------------------------------------------------

namespace {
// The LM head's loss (gpt2.cpp run_head): per row, log(sum exp(x - max)) + max - x[target], the
// sum in double; and its gradient (softmax - onehot) * dscale.
void cross_entropy_reference(std::vector<float>& losses, std::vector<float>& dlogits, const std::vector<float>& logits,
                             const std::vector<int32_t>& targets, int64_t N, int64_t V, float dscale) {
  losses.assign(N, 0);
  dlogits.assign(N * V, 0);
  for (int64_t r = 0; r < N; ++r) {
    const float* row = logits.data() + r * V;
    float maxv = -INFINITY;
    for (int64_t i = 0; i < V; ++i) maxv = std::max(maxv, row[i]);
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(row[i] - maxv);
    losses[r] = float(std::log(sum) + maxv - row[targets[r]]);
    const float inv = float(1.0 / sum) * dscale;
    for (int64_t i = 0; i < V; ++i) dlogits[r * V + i] = std::exp(row[i] - maxv) * inv;
    dlogits[r * V + targets[r]] -= dscale;
  }
}
}  // namespace

TEST_P(CudaKernels, CrossEntropy) {
  const int64_t N = 13, V = 1000;  // V above one block's threads
  const auto logits = in(N * V, 51, 3.0f);
  std::vector<int32_t> targets(N);
  for (int64_t r = 0; r < N; ++r) targets[r] = int32_t((r * 389 + 7) % V);
  targets[0] = 0;
  targets[1] = int32_t(V - 1);
  const float dscale = 1.0f / float(N);
  std::vector<float> want_loss, want_d;
  cross_entropy_reference(want_loss, want_d, logits, targets, N, V, dscale);

  DeviceBuffer dlog = upload(logits, t()), dtgt = DeviceBuffer::from(targets), dloss(N * 4), dgrad(N * V * 4);
  cross_entropy_forward(dloss.as<float>(), dlog.get(), dtgt.as<int32_t>(), N, V, t(), nullptr);
  sync();
  EXPECT_TRUE(close(download(dloss, N, DType::F32), want_loss, tol32(), tag("cross_entropy_forward losses")));
  EXPECT_TRUE(close(download(dlog, N * V, t()), logits, {0, 0}, tag("cross_entropy_forward leaves logits intact")));

  // Into a separate buffer, then in place (dlogits == logits) as the LM head does.
  cross_entropy_forward_backward(dloss.as<float>(), dgrad.get(), dlog.get(), dtgt.as<int32_t>(), N, V, dscale, t(),
                                 nullptr);
  sync();
  EXPECT_TRUE(close(download(dgrad, N * V, t()), want_d, tol(), tag("cross_entropy dlogits")));
  EXPECT_TRUE(close(download(dloss, N, DType::F32), want_loss, tol32(), tag("cross_entropy_forward_backward losses")));
  cross_entropy_forward_backward(dloss.as<float>(), dlog.get(), dlog.get(), dtgt.as<int32_t>(), N, V, dscale, t(),
                                 nullptr);
  sync();
  EXPECT_TRUE(close(download(dlog, N * V, t()), want_d, tol(), tag("cross_entropy dlogits in place")));
  EXPECT_TRUE(close(download(dloss, N, DType::F32), want_loss, tol32(), tag("cross_entropy losses in place")));
}

// The LM head as CudaModelPasses runs it: logits rows V = 1001 (odd) apart by a stride of 1024, the
// padding poisoned with NaN (nothing may read it): the GEMM into the strided buffer, the loss and
// its gradient in place, and both backward GEMMs reading it; against the same ops unpadded.
TEST(CudaLmHead, PaddedLogitsRowStrideGivesTheUnpaddedResults) {
  ZT_REQUIRE_GPU();
  const int64_t N = 19, C = 48, V = 1001, ld = 1024;
  const Tolerance tol = tolerance_for(DType::F32);
  const auto x = normal(N * C, 71), w = normal(V * C, 72, 0.2f);
  std::vector<int32_t> targets(N);
  for (int64_t r = 0; r < N; ++r) targets[r] = int32_t((r * 389 + 5) % V);
  std::vector<float> logits(N * V), want_loss, want_d;
  ref::matmul_forward(logits.data(), x.data(), w.data(), nullptr, N, C, V, false);
  const float dscale = 0.25f;
  cross_entropy_reference(want_loss, want_d, logits, targets, N, V, dscale);
  std::vector<float> want_dx(N * C, 0.0f), want_dw(V * C, 0.0f);
  ref::matmul_backward(want_dx.data(), want_dw.data(), nullptr, want_d.data(), x.data(), w.data(), N, C, V, false);

  Blas blas(0);
  DeviceBuffer dx = upload(x, DType::F32), dw = upload(w, DType::F32), dt = DeviceBuffer::from(targets);
  DeviceBuffer dlog = upload(std::vector<float>(N * ld, std::nanf("")), DType::F32), dloss(N * 4);
  DeviceBuffer ddx = upload(std::vector<float>(N * C, 5.0f), DType::F32), ddw = upload(std::vector<float>(V * C, 0.0f), DType::F32);
  matmul_forward(blas, dlog.get(), dx.get(), dw.get(), nullptr, N, C, V, DType::F32, nullptr, false, ld);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const std::vector<float> got = download(dlog, N * ld, DType::F32);
  std::vector<float> rows(N * V);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t i = 0; i < V; ++i) rows[r * V + i] = got[r * ld + i];
  EXPECT_TRUE(close(rows, logits, tol, "strided logits"));
  cross_entropy_forward_backward(dloss.as<float>(), dlog.get(), dlog.get(), dt.as<int32_t>(), N, V, dscale, DType::F32,
                                 nullptr, ld);
  matmul_backward(blas, ddx.get(), ddw.as<float>(), nullptr, dlog.get(), dx.get(), dw.get(), N, C, V, DType::F32,
                  nullptr, false, ld);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  EXPECT_TRUE(close(download(dloss, N, DType::F32), want_loss, tol, "strided losses"));
  EXPECT_TRUE(close(download(ddx, N * C, DType::F32), want_dx, tol, "strided dinp"));
  EXPECT_TRUE(close(download(ddw, V * C, DType::F32), want_dw, tol, "strided dw"));
  // A stride below the row, or beside a bias, is refused.
  EXPECT_THROW(matmul_forward(blas, dlog.get(), dx.get(), dw.get(), nullptr, N, C, V, DType::F32, nullptr, false, V - 1),
               std::invalid_argument);
  EXPECT_THROW(matmul_forward(blas, dlog.get(), dx.get(), dw.get(), dw.get(), N, C, V, DType::F32, nullptr, false, ld),
               std::invalid_argument);
}

// ---- embeddings --------------------------------------------------------------------------------

TEST_P(CudaKernels, Embedding) {
  const int64_t V = 50, ctx = 9, C = 40, B = 3, T = 7, N = B * T;
  const auto wte = in(V * C, 61), wpe = in(ctx * C, 62), dx = in(N * C, 63);
  std::vector<int32_t> tokens(N);
  for (int64_t n = 0; n < N; ++n) tokens[n] = int32_t((n * 7) % 5 == 0 ? 3 : (n * 13) % V);  // token 3 repeats
  // Reference (gpt2.cpp embed_forward / embed_backward).
  std::vector<float> want_x(N * C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) want_x[n * C + c] = wte[tokens[n] * C + c] + wpe[(n % T) * C + c];
  std::vector<float> dwte0 = normal(V * C, 64), dwpe0 = normal(ctx * C, 65);
  std::vector<float> want_dwte = dwte0, want_dwpe = dwpe0;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t n = 0; n < N; ++n) want_dwte[tokens[n] * C + c] += dx[n * C + c];
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c) want_dwpe[t * C + c] += dx[(b * T + t) * C + c];

  DeviceBuffer dtok = DeviceBuffer::from(tokens), dte = upload(wte, t()), dpe = upload(wpe, t()), dxo(N * C * 4);
  embedding_forward(dxo.get(), dtok.as<int32_t>(), dte.get(), dpe.get(), B, T, C, t(), nullptr);
  DeviceBuffer ddx = upload(dx, t()), ddwte = upload(dwte0, DType::F32), ddwpe = upload(dwpe0, DType::F32);
  embedding_backward(ddwte.as<float>(), ddwpe.as<float>(), dtok.as<int32_t>(), ddx.get(), B, T, C, t(), nullptr);
  sync();
  EXPECT_TRUE(close(download(dxo, N * C, t()), want_x, tol(), tag("embedding_forward")));
  // The same additions in the same order as the reference: equal to the bit in every dtype (the
  // fp32 gradients add dx values that are exact in fp32).
  EXPECT_TRUE(close(download(ddwte, V * C, DType::F32), want_dwte, {0, 0}, tag("embedding_backward dwte")));
  EXPECT_TRUE(close(download(ddwpe, ctx * C, DType::F32), want_dwpe, {0, 0}, tag("embedding_backward dwpe")));
}

// ---- the engine's elementwise ops and reductions -----------------------------------------------

TEST_P(CudaKernels, ScaleInPlaceAndColumnSums) {
  const int64_t rows = 1001, cols = 70;
  const auto x = in(rows * cols, 71);
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] * 0.37f;
  DeviceBuffer d = upload(x, t());
  scale_inplace(d.get(), t(), rows * cols, 0.37f, nullptr);
  sync();
  EXPECT_TRUE(close(download(d, x.size(), t()), want, tol(), tag("scale_inplace")));

  std::vector<float> sums0 = normal(cols, 72), want_sums = sums0;
  ref::column_sums_accumulate(want_sums.data(), x.data(), rows, cols);
  DeviceBuffer dx = upload(x, t()), ds = upload(sums0, DType::F32);
  column_sums_accumulate(ds.as<float>(), dx.get(), rows, cols, t(), nullptr);
  sync();
  EXPECT_TRUE(close(download(ds, cols, DType::F32), want_sums, tol32(), tag("column_sums_accumulate")));
}

TEST_P(CudaKernels, SquaredNorm) {
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(1000003)}) {
    const auto x = in(size_t(n), 81, 3.0f);
    double want = 0;
    for (float v : x) want += double(v) * double(v);
    DeviceBuffer dx = upload(x, t()), out(8), scratch(kSquaredNormBlocks * 8);
    squared_norm(out.as<double>(), scratch.as<double>(), dx.get(), t(), n, nullptr);
    double got = -1;
    out.download(&got, 8);
    // Products of fp32 values are exact in fp64; only the order of the fp64 sums differs (a
    // missing block or element would be off by more than 1e-7 here).
    EXPECT_NEAR(got, want, 1e-10 * std::max(1.0, want)) << tag("squared_norm n=" + std::to_string(n));
    squared_norm(out.as<double>(), scratch.as<double>(), dx.get(), t(), n, nullptr, /*accumulate=*/true);
    out.download(&got, 8);
    EXPECT_NEAR(got, 2 * want, 2e-10 * std::max(1.0, want)) << tag("squared_norm accumulate");
  }
}

// Casts: every pair, bit for bit against the CPU's conversions (core/dtype.h), NaN as NaN.
TEST(CudaCast, EveryPairMatchesTheCpuBitForBit) {
  ZT_REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> src = {0.0f, -0.0f, 1.0f, -2.5f, 1.0f + 1.0f / 256.0f, 1.0f + 3.0f / 256.0f,  // bf16 ties
                            65504.0f, 65519.0f, 65520.0f, 1e5f, 6e-8f, 1e-8f, 3.0e-5f, 3.4e38f, -3.4e38f,
                            1.0e-40f, inf, -inf, std::numeric_limits<float>::quiet_NaN()};
  const auto more = normal(4093, 91, 100.0f);
  src.insert(src.end(), more.begin(), more.end());
  const size_t n = src.size();
  for (DType from : {DType::F32, DType::BF16, DType::F16}) {
    for (DType to : {DType::F32, DType::BF16, DType::F16}) {
      const std::vector<float> in_vals = rounded(src, from);
      std::vector<float> want = rounded(in_vals, to);
      DeviceBuffer din = upload(in_vals, from), dout(n * 4);
      cast(dout.get(), to, din.get(), from, int64_t(n), nullptr);
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      const std::vector<float> got = download(dout, n, to);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        const bool same = std::isnan(want[i]) ? std::isnan(got[i]) : std::memcmp(&got[i], &want[i], 4) == 0;
        if (!same && bad++ < 5)
          ADD_FAILURE() << name_of(from) << " -> " << name_of(to) << " [" << i << "] " << in_vals[i] << ": got "
                        << got[i] << ", want " << want[i];
      }
      EXPECT_EQ(bad, 0u) << name_of(from) << " -> " << name_of(to);
    }
  }
}

// The same inputs give the same bits twice (no atomics; fixed reduction orders).
TEST(CudaDeterminism, BackwardPassesRepeatBitForBit) {
  ZT_REQUIRE_GPU();
  const int64_t B = 2, T = 33, C = 64, H = 4, N = B * T;
  const auto qkv = normal(B * T * 3 * C, 101), dy = normal(N * C, 102), x = normal(N * C, 103);
  std::vector<float> out(N * C), att(B * H * T * T);
  ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  auto run = [&] {
    DeviceBuffer dqkv_in = upload(qkv, DType::BF16), ddy = upload(dy, DType::BF16), ratt = upload(att, DType::F32);
    DeviceBuffer scratch(B * H * T * T * 4), dqkv(B * T * 3 * C * 2);
    attention_backward(dqkv.get(), scratch.as<float>(), ddy.get(), dqkv_in.get(), ratt.as<float>(), B, T, C, H,
                       DType::BF16, nullptr);
    DeviceBuffer dx = upload(x, DType::F32), sums = upload(std::vector<float>(C, 0.0f), DType::F32);
    column_sums_accumulate(sums.as<float>(), dx.get(), N, C, DType::F32, nullptr);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<uint16_t> a(B * T * 3 * C);
    dqkv.download(a.data(), a.size() * 2);
    std::vector<float> s = sums.to_vector<float>(C);
    return std::make_pair(a, s);
  };
  EXPECT_EQ(run(), run());
}
