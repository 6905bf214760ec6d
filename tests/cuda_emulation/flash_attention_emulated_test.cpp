// The flash attention kernels' own text (trainer/cuda/flash_attention_kernels.cuh), compiled for
// the CPU against cuda_emulation.h and run on emulated blocks of 128 threads, against their CPU
// twin model/flash_attention.h. No GPU and no CUDA toolkit needed: this checks the kernels'
// indexing, masks, barriers, shuffles and WMMA layouts before they ever meet a GPU. Both sides
// round to bf16 at the same places and sum the products in the same order; what may differ is
// the order of the softmax's row sums (two threads a row) and of dsum (32 lanes), so the results
// agree to fp32 rounding, and P or dS rounded to bf16 may tip by one bf16 step where fp32 values
// sit on a rounding boundary.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../test_util.h"
#include "cuda_emulation.h"
#include "model/flash_attention.h"

namespace flash_emulated {
namespace {

inline unsigned char* dynamic_shared() {
  const uintptr_t p = reinterpret_cast<uintptr_t>(cuda_emulation::g_block->dynamic.data());
  return reinterpret_cast<unsigned char*>((p + 31) & ~uintptr_t(31));
}

#include "cuda/flash_attention_kernels.cuh"  // its "#pragma unroll" is nvcc's: -Wno-unknown-pragmas here

struct Shape {
  int B, T, C, H;
  std::string text() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) + " H=" + std::to_string(H);
  }
};

void PrintTo(const Shape& s, std::ostream* os) { *os << s.text(); }


// max |got - want| over max |want|.
double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, double(std::fabs(want[i])));
    const double e = std::fabs(double(got[i]) - double(want[i]));
    if (!(e <= worst)) worst = e;  // NaN wins
  }
  return scale > 0 ? worst / scale : worst;
}

template <int D>
void run_kernels(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout, std::vector<float>& out,
                 std::vector<float>& lse, std::vector<float>& dsum, std::vector<float>& dqkv) {
  const int tiles = (s.T + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt(float(D));
  const unsigned bh = unsigned(s.B * s.H);
  out.assign(size_t(s.B) * s.T * s.C, std::nanf(""));
  lse.assign(size_t(bh) * s.T, std::nanf(""));
  cuda_emulation::launch({bh, unsigned(tiles), 1}, kThreads, 0, [&] {
    flash_forward_kernel<D>(out.data(), lse.data(), qkv.data(), s.T, s.C, s.H, scale);
  });
  dsum.assign(size_t(bh) * s.T, std::nanf(""));
  const int64_t rows = int64_t(bh) * s.T;
  cuda_emulation::launch({unsigned((rows + 3) / 4), 1, 1}, kThreads, 0, [&] {
    flash_dsum_kernel(dsum.data(), dout.data(), out.data(), s.T, s.C, s.H, D, rows);
  });
  dqkv.assign(size_t(s.B) * s.T * 3 * s.C, 0.0f);  // the launcher's memset
  cuda_emulation::launch({bh, unsigned(tiles), 1}, kThreads, sizeof(BackwardShared<D>), [&] {
    flash_backward_kernel<D>(dqkv.data(), dout.data(), qkv.data(), lse.data(), dsum.data(), s.T, s.C, s.H, scale);
  });
}

// Ten times the largest difference measured on these shapes (1.6e-6 of the tensor's scale, dk of
// the last shape); the runs are deterministic (blocks one at a time, fixed seeds).
constexpr double kTolerance = 2e-5;

class FlashKernelsEmulated : public ::testing::TestWithParam<Shape> {};

TEST_P(FlashKernelsEmulated, MatchTheirCpuTwin) {
  const Shape s = GetParam();
  const size_t N = size_t(s.B) * s.T;
  const auto qkv = zt::test::normal_values(N * 3 * s.C, 31, 1.5f);
  const auto dout = zt::test::normal_values(N * s.C, 32, 1.0f);
  std::vector<float> out, lse, dsum, dqkv;
  switch (s.C / s.H) {
    case 16: run_kernels<16>(s, qkv, dout, out, lse, dsum, dqkv); break;
    case 32: run_kernels<32>(s, qkv, dout, out, lse, dsum, dqkv); break;
    case 64: run_kernels<64>(s, qkv, dout, out, lse, dsum, dqkv); break;
    default: FAIL() << "no kernel for head size " << s.C / s.H;
  }
  std::vector<float> want_out(N * s.C), want_lse(size_t(s.B) * s.H * s.T), want_dsum(want_lse.size());
  std::vector<float> want_dqkv(N * 3 * s.C);
  zt::model::flash_attention_forward(want_out.data(), want_lse.data(), qkv.data(), s.B, s.T, s.C, s.H);
  // The backward from the kernels' own forward results, as the trainer runs it.
  zt::model::flash_attention_backward(want_dqkv.data(), want_dsum.data(), dout.data(), qkv.data(), out.data(),
                                      lse.data(), s.B, s.T, s.C, s.H);
  EXPECT_LE(rel_error(out, want_out), kTolerance) << s.text() << ": out";
  EXPECT_LE(rel_error(lse, want_lse), kTolerance) << s.text() << ": lse";
  EXPECT_LE(rel_error(dsum, want_dsum), kTolerance) << s.text() << ": dsum";
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got, want;
    for (size_t n = 0; n < N; ++n)
      for (int c = 0; c < s.C; ++c) {
        got.push_back(dqkv[n * 3 * s.C + part * s.C + c]);
        want.push_back(want_dqkv[n * 3 * s.C + part * s.C + c]);
      }
    EXPECT_LE(rel_error(got, want), kTolerance) << s.text() << ": d" << "qkv"[part];
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashKernelsEmulated,
                         ::testing::Values(Shape{1, 1, 32, 2},     // one token, head size 16
                                           Shape{2, 17, 32, 2},    // a partial tile, two sequences
                                           Shape{1, 64, 64, 1},    // exactly one tile, head size 64
                                           Shape{1, 130, 64, 2},   // three tiles, the last partial, head size 32
                                           Shape{1, 150, 128, 2}));  // three tiles, head size 64, two heads

}  // namespace
}  // namespace flash_emulated
