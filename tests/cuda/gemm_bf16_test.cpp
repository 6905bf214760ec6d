// bf16 compute's GEMMs and kernels (trainer/cuda/gemm_bf16.h; kernels.h's cast_segments and the
// LayerNorm and cross-entropy with an output of another dtype) against the fp32 CPU reference on
// the same bf16 values, each GEMM both ways: fused on cuBLASLt's epilogues and unfused (cuBLAS and
// our kernels), with the way each took counted. Label gpu: every test skips, saying why, without a
// usable GPU.
//
// Tolerances (cuda_test_util.h): a product of bf16 inputs is exact in fp32 and the GEMMs accumulate
// in fp32, so an fp32 output differs from the reference on the same bf16 values by summation order
// alone: the fp32 tolerance (1e-4 / 1e-4). An output stored in bf16 (the GELU epilogue's output and
// pre-activation, the GELU input's gradient, the LayerNorm and cross-entropy outputs) gets bf16's
// (1e-2 / 1e-2). The casts are bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cuda/gemm_bf16.h"
#include "cuda/kernels.h"
#include "cuda_test_util.h"
#include "model/kernels.h"

using namespace zt::cuda;
using namespace zt::cuda::test;
namespace ref = zt::model::kernels;

namespace {

constexpr DType BF16 = DType::BF16;
void device_sync() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

class CudaGemmBf16 : public ::testing::TestWithParam<bool> {  // the parameter: fused epilogues
 protected:
  void SetUp() override { ZT_REQUIRE_GPU(); }
  bool fused() const { return GetParam(); }
  // Inputs as the GPU holds them: bf16 values.
  static std::vector<float> in(size_t n, uint64_t seed, float stddev = 1.0f) {
    return rounded(normal(n, seed, stddev), BF16);
  }
  // Expect every product to have gone the way asked (unfused: never cuBLASLt); fused, say which did.
  void check_routes(const LtMatmul& lt, Epilogue e) const {
    const LtMatmul::Routes& r = lt.routes();
    std::printf("%s epilogue: %lld fused on cuBLASLt, %lld unfused\n", epilogue_name(e),
                (long long)r.fused[int(e)], (long long)r.unfused[int(e)]);
    if (!r.first_refusal.empty()) std::printf("cuBLASLt refused %s\n", r.first_refusal.c_str());
    EXPECT_GT(r.fused[int(e)] + r.unfused[int(e)], 0);
    if (!fused()) {
      EXPECT_EQ(r.fused[int(e)], 0);
    }
  }
};

std::string route_name(const ::testing::TestParamInfo<bool>& info) { return info.param ? "fused" : "unfused"; }

}  // namespace

INSTANTIATE_TEST_SUITE_P(Routes, CudaGemmBf16, ::testing::Values(true, false), route_name);

// out = residual + inp @ w^T + bias (fp32 out, fp32 bias and residual): the residual apart from
// out, none, and out itself.
TEST_P(CudaGemmBf16, LinearForwardWithBiasAndResidual) {
  const int64_t N = 111, IC = 64, OC = 192;
  const auto x = in(N * IC, 1), w = in(OC * IC, 2, 0.2f);
  const auto b = normal(OC, 3), res = normal(N * OC, 4);
  Blas blas(0);
  DeviceBuffer ws(size_t(32) << 20);
  blas.set_workspace(ws.get(), ws.bytes());
  LtMatmul lt(blas);
  lt.set_fused(fused());
  DeviceBuffer dx = upload(x, BF16), dw = upload(w, BF16), db = DeviceBuffer::from(b), dres = DeviceBuffer::from(res);
  for (int residual : {0, 1, 2}) {  // none, another buffer, out itself
    std::vector<float> want(size_t(N * OC));
    if (residual) want = res;
    ref::matmul_forward(want.data(), x.data(), w.data(), b.data(), N, IC, OC, /*accumulate=*/residual != 0);
    DeviceBuffer dout = DeviceBuffer::from(residual == 2 ? res : std::vector<float>(size_t(N * OC), 9.0f));
    const float* r = residual == 0 ? nullptr : residual == 1 ? dres.as<float>() : dout.as<float>();
    linear_forward_bf16(lt, dout.as<float>(), r, dx.get(), dw.get(), db.as<float>(), N, IC, OC, nullptr);
    device_sync();
    EXPECT_TRUE(close(dout.to_vector<float>(size_t(N * OC)), want, tolerance_for(DType::F32),
                      "linear_forward_bf16, residual " + std::to_string(residual)));
    EXPECT_EQ(dres.to_vector<float>(size_t(N * OC)), res) << "the residual input was written";
  }
  check_routes(lt, Epilogue::Bias);
}

// out = gelu(pre), pre = inp @ w^T + bias, all bf16: GPT-2's fc.
TEST_P(CudaGemmBf16, LinearGeluForward) {
  const int64_t N = 111, IC = 64, OC = 256;
  const auto x = in(N * IC, 5), w = in(OC * IC, 6, 0.2f), b = in(OC, 7);
  Blas blas(0);
  DeviceBuffer ws(size_t(32) << 20);
  blas.set_workspace(ws.get(), ws.bytes());
  LtMatmul lt(blas);
  lt.set_fused(fused());
  std::vector<float> pre(size_t(N * OC)), want(pre.size());
  ref::matmul_forward(pre.data(), x.data(), w.data(), b.data(), N, IC, OC);
  ref::gelu_forward(want.data(), pre.data(), int64_t(pre.size()));
  DeviceBuffer dx = upload(x, BF16), dw = upload(w, BF16), db = upload(b, BF16);
  DeviceBuffer dout(pre.size() * 2), dpre(pre.size() * 2);
  linear_gelu_forward_bf16(lt, dout.get(), dpre.get(), dx.get(), dw.get(), db.get(), N, IC, OC, nullptr);
  device_sync();
  EXPECT_TRUE(close(download(dpre, pre.size(), BF16), pre, tolerance_for(BF16), "pre-activation"));
  EXPECT_TRUE(close(download(dout, pre.size(), BF16), want, tolerance_for(BF16), "gelu output"));
  check_routes(lt, Epilogue::GeluAuxBias);
}

// dinp = dout @ w (fp32 out), and through the GELU: (dout @ w) * gelu'(pre) (bf16 out); dw += dout^T inp.
TEST_P(CudaGemmBf16, LinearBackward) {
  const int64_t N = 111, IC = 256, OC = 64;  // GPT-2's MLP projection: IC = 4C
  const auto dout = in(N * OC, 8), w = in(OC * IC, 9, 0.2f), x = in(N * IC, 10), pre = in(N * IC, 11);
  const auto dw0 = normal(OC * IC, 12);
  Blas blas(0);
  DeviceBuffer ws(size_t(32) << 20);
  blas.set_workspace(ws.get(), ws.bytes());
  LtMatmul lt(blas);
  lt.set_fused(fused());
  DeviceBuffer ddout = upload(dout, BF16), dw = upload(w, BF16), dx = upload(x, BF16), dpre = upload(pre, BF16);
  std::vector<float> dinp(size_t(N * IC)), dweight = dw0;
  ref::matmul_backward(dinp.data(), dweight.data(), nullptr, dout.data(), x.data(), w.data(), N, IC, OC);
  DeviceBuffer dinp32(dinp.size() * 4), dinp16(dinp.size() * 2), ddw = DeviceBuffer::from(dw0);
  linear_dinp_bf16(lt, dinp32.get(), DType::F32, ddout.get(), dw.get(), nullptr, N, IC, OC, nullptr);
  linear_dinp_bf16(lt, dinp16.get(), BF16, ddout.get(), dw.get(), dpre.get(), N, IC, OC, nullptr);
  linear_dweight_bf16(blas, ddw.as<float>(), ddout.get(), dx.get(), N, IC, OC, nullptr);
  device_sync();
  EXPECT_TRUE(close(dinp32.to_vector<float>(dinp.size()), dinp, tolerance_for(DType::F32), "dinp"));
  std::vector<float> dgelu(dinp.size());
  ref::gelu_backward(dgelu.data(), pre.data(), dinp.data(), int64_t(dinp.size()));
  EXPECT_TRUE(close(download(dinp16, dinp.size(), BF16), dgelu, tolerance_for(BF16), "dinp through the GELU"));
  EXPECT_TRUE(close(ddw.to_vector<float>(dweight.size()), dweight, tolerance_for(DType::F32), "dweight (accumulated)"));
  check_routes(lt, Epilogue::DGelu);
  // A GELU epilogue is refused where its aux matrix cannot be laid out (leading dimension 12: not a multiple of 8).
  EXPECT_THROW(linear_gelu_forward_bf16(lt, dinp16.get(), dinp16.get(), dx.get(), dw.get(), dpre.get(), 2, 8, 12, nullptr),
               std::invalid_argument);
}

// The LM head's products: dout rows ld apart (the padded vocab), dinp over the padded width.
TEST_P(CudaGemmBf16, PaddedRowsOfTheHead) {
  const int64_t N = 37, C = 64, V = 251, ld = 256;
  const auto g = in(N * V, 13), x = in(N * C, 14), w = in(V * C, 15, 0.2f);
  std::vector<float> g_padded(size_t(N * ld), 0.0f), w_padded(size_t(ld * C), 0.0f);
  for (int64_t n = 0; n < N; ++n) std::copy_n(g.begin() + n * V, V, g_padded.begin() + n * ld);
  std::copy(w.begin(), w.end(), w_padded.begin());
  std::vector<float> dx(size_t(N * C)), dw(size_t(V * C), 0.0f);
  ref::matmul_backward(dx.data(), dw.data(), nullptr, g.data(), x.data(), w.data(), N, C, V);
  Blas blas(0);
  LtMatmul lt(blas);
  DeviceBuffer dg = upload(g_padded, BF16), dxin = upload(x, BF16), dwp = upload(w_padded, BF16);
  DeviceBuffer ddx(dx.size() * 4), ddw = DeviceBuffer::from(std::vector<float>(dw.size(), 0.0f));
  linear_dinp_bf16(lt, ddx.get(), DType::F32, dg.get(), dwp.get(), nullptr, N, C, ld, nullptr, ld);
  linear_dweight_bf16(blas, ddw.as<float>(), dg.get(), dxin.get(), N, C, V, nullptr, ld);
  device_sync();
  EXPECT_TRUE(close(ddx.to_vector<float>(dx.size()), dx, tolerance_for(DType::F32), "dinp over the padded vocab"));
  EXPECT_TRUE(close(ddw.to_vector<float>(dw.size()), dw, tolerance_for(DType::F32), "dweight from padded rows"));
}

// cast_segments: fp32 to bf16, fp16 and fp32 in one launch, bit for bit as the host rounds.
TEST(CudaBf16Kernels, CastSegmentsRoundAsTheHost) {
  ZT_REQUIRE_GPU();
  auto src = normal(5000, 21, 3.0f);
  src[0] = 1.0f + 1.0f / 256;  // a bf16 tie
  src[1] = std::numeric_limits<float>::quiet_NaN();
  src[2] = std::numeric_limits<float>::infinity();
  src[3] = 3.3e38f;     // near bf16's largest finite value
  src[102] = 70000.0f;  // fp16's overflow
  DeviceBuffer dsrc = DeviceBuffer::from(src), a(5000 * 2), b(300 * 2), c(17 * 4);
  const CastSegment segs[] = {{dsrc.as<float>(), a.get(), 5000, BF16},
                              {dsrc.as<float>() + 100, b.get(), 300, DType::F16},
                              {dsrc.as<float>() + 7, c.get(), 17, DType::F32},
                              {dsrc.as<float>(), nullptr, 0, BF16}};
  cast_segments(segs, 4, nullptr);
  device_sync();
  std::vector<uint16_t> want_a(5000), want_b(300);
  zt::trainer::from_float(BF16, src.data(), want_a.data(), 5000);
  zt::trainer::from_float(DType::F16, src.data() + 100, want_b.data(), 300);
  std::vector<uint16_t> got_a = a.to_vector<uint16_t>(5000), got_b = b.to_vector<uint16_t>(300);
  got_a[1] &= 0xffc0u, want_a[1] &= 0xffc0u;  // NaN: a NaN, its payload is not compared
  EXPECT_EQ(got_a, want_a);
  EXPECT_EQ(got_b, want_b);
  const std::vector<float> got_c = c.to_vector<float>(17);
  EXPECT_EQ(std::memcmp(got_c.data(), src.data() + 7, 17 * 4), 0);
  CastSegment too_many[kMaxCastSegments + 1];
  EXPECT_THROW(cast_segments(too_many, kMaxCastSegments + 1, nullptr), std::invalid_argument);
  const CastSegment null_dst{dsrc.as<float>(), nullptr, 3, BF16};
  EXPECT_THROW(cast_segments(&null_dst, 1, nullptr), std::invalid_argument);
}

// LayerNorm with fp32 input and parameters, bf16 output (statistics fp32); the cross-entropy of
// fp32 logits with its gradient written in bf16 to a buffer of its own, its padding untouched.
TEST(CudaBf16Kernels, LayerNormAndCrossEntropyWithBf16Outputs) {
  ZT_REQUIRE_GPU();
  const int64_t N = 37, C = 64;
  const auto x = normal(N * C, 31, 2.0f, 0.5f), w = normal(C, 32), b = normal(C, 33);
  std::vector<float> want(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  ref::layernorm_forward(want.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  DeviceBuffer dx = DeviceBuffer::from(x), dw = DeviceBuffer::from(w), db = DeviceBuffer::from(b);
  DeviceBuffer dout(want.size() * 2), dmean(size_t(N) * 4), drstd(size_t(N) * 4);
  layernorm_forward(dout.get(), BF16, dmean.as<float>(), drstd.as<float>(), dx.get(), dw.get(), db.get(), N, C,
                    DType::F32, nullptr);
  device_sync();
  EXPECT_TRUE(close(download(dout, want.size(), BF16), want, tolerance_for(BF16), "layernorm (bf16 out)"));
  EXPECT_TRUE(close(drstd.to_vector<float>(size_t(N)), rstd, tolerance_for(DType::F32), "rstd"));

  const int64_t V = 251, ld = 256;
  std::vector<float> logits(size_t(N * ld), 0.0f);
  const auto vals = normal(N * V, 34, 3.0f);
  for (int64_t n = 0; n < N; ++n) std::copy_n(vals.begin() + n * V, V, logits.begin() + n * ld);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) targets[size_t(n)] = int32_t((n * 37) % V);
  const float dscale = 0.5f / float(N);
  std::vector<float> loss(static_cast<size_t>(N)), grad(size_t(N * ld), 0.0f);
  for (int64_t n = 0; n < N; ++n) {  // gpt2.cpp's head, restated
    const float* row = logits.data() + n * ld;
    float m = -INFINITY;
    for (int64_t i = 0; i < V; ++i) m = std::max(m, row[i]);
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(double(row[i]) - m);
    loss[size_t(n)] = float(std::log(sum) + m - row[targets[size_t(n)]]);
    for (int64_t i = 0; i < V; ++i)
      grad[size_t(n * ld + i)] = float(std::exp(double(row[i]) - m) / sum) * dscale - (i == targets[size_t(n)] ? dscale : 0);
  }
  std::vector<uint16_t> sentinel(size_t(N * ld), 0x7777u);  // 0x7777: a bf16 that must stay in the padding
  DeviceBuffer dlogits = DeviceBuffer::from(logits), dgrad = DeviceBuffer::from(sentinel),
               dtargets = DeviceBuffer::from(targets), dloss(size_t(N) * 4);
  cross_entropy_forward_backward(dloss.as<float>(), dgrad.get(), BF16, dlogits.get(), dtargets.as<int32_t>(), N, V,
                                 dscale, DType::F32, nullptr, ld);
  device_sync();
  EXPECT_TRUE(close(dloss.to_vector<float>(size_t(N)), loss, tolerance_for(DType::F32), "losses"));
  const std::vector<uint16_t> got = dgrad.to_vector<uint16_t>(size_t(N * ld));
  std::vector<float> got_grad(got.size());
  zt::trainer::to_float(BF16, got.data(), got_grad.data(), got.size());
  size_t padding_written = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = V; i < ld; ++i) {
      padding_written += got[size_t(n * ld + i)] != 0x7777u;
      got_grad[size_t(n * ld + i)] = 0.0f;
    }
  EXPECT_EQ(padding_written, 0u);
  EXPECT_TRUE(close(got_grad, grad, tolerance_for(BF16), "dlogits (bf16)"));
  EXPECT_THROW(cross_entropy_forward_backward(dloss.as<float>(), dlogits.get(), BF16, dlogits.get(),
                                              dtargets.as<int32_t>(), N, V, dscale, DType::F32, nullptr, ld),
               std::invalid_argument);  // not in place across dtypes
}
