// The vectorized CPU AdamW (optim/cpu_adam.h) against the reference zt::model::adamw_step.
// Stated tolerance: none. Every ISA (scalar, AVX2, AVX-512) must give p, m and v bit-identical to the
// reference for finite values, and NaN exactly where the reference has NaN, over 10 steps, with and
// without weight decay, on sizes that leave vector tails, on unaligned pointers and on any thread
// count. The fused bf16/fp16 output must equal converting the fp32 result with the converters below,
// which are written independently of the library's (bf16 by rounding in double, fp16 by the
// compiler's _Float16). ISAs this CPU lacks are skipped, with the reason printed.
#include <gtest/gtest.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype_bits.h"
#include "model/adamw.h"
#include "optim/cpu_adam.h"

namespace zt::optim {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 round to nearest even, by rounding to 8 significant bits in double (exact there). NaN: the
// top half with the quiet bit set, as zt::trainer::float_to_bf16 keeps it.
uint16_t ref_bf16(float f) {
  if (std::isnan(f)) return uint16_t((bits(f) >> 16) | 0x40);
  if (std::isinf(f) || f == 0.0f) return uint16_t(bits(f) >> 16);
  const double d = f;
  const int quantum = std::max(std::ilogb(d) - 7, -133);  // bf16 subnormals: quantum 2^-133
  const double r = std::ldexp(std::nearbyint(std::ldexp(d, -quantum)), quantum);
  const float rf = (float)r;  // exact, or +-inf past the largest bf16
  EXPECT_EQ(bits(rf) & 0xffffu, 0u);
  return uint16_t(bits(rf) >> 16);
}

// fp16 round to nearest even through the compiler's _Float16; NaN: sign | 0x7e00 (as
// zt::trainer::float_to_fp16 and PyTorch's c10::Half give).
#if defined(__clang__) && __clang_major__ < 15 && defined(__x86_64__)
// clang 14 (the sanitizer build's) has no _Float16 on x86: the F16C instruction rounds the same way.
__attribute__((target("f16c"))) uint16_t fp16_bits(float f) { return uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }
#else
uint16_t fp16_bits(float f) {
  const _Float16 h = (_Float16)f;
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
#endif
uint16_t ref_fp16(float f) {
  if (std::isnan(f)) return uint16_t(((bits(f) >> 16) & 0x8000u) | 0x7e00u);
  return fp16_bits(f);
}

uint16_t ref_low(LowDType t, float f) { return t == LowDType::BF16 ? ref_bf16(f) : ref_fp16(f); }

// Element-wise equality: the same bits, or NaN on both sides.
::testing::AssertionResult same_values(const char* what, const float* ours, const float* ref, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (std::isnan(ours[i]) && std::isnan(ref[i])) continue;
    if (bits(ours[i]) != bits(ref[i]))
      return ::testing::AssertionFailure() << what << "[" << i << "] of " << n << ": ours " << ours[i] << " (0x"
                                           << std::hex << bits(ours[i]) << "), reference " << std::dec << ref[i]
                                           << " (0x" << std::hex << bits(ref[i]) << ")";
  }
  return ::testing::AssertionSuccess();
}

struct Shard {
  std::vector<float> p, m, v;
};

// Weights ~ N(0, 0.5); m and v start at zero, as the optimizer's do.
Shard make_shard(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  Shard s{std::vector<float>(n), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  for (auto& x : s.p) x = normal(rng);
  return s;
}

// Gradients over seven decades, so moments, square roots and divisions cover a wide range.
std::vector<float> make_grads(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-5.0f, 2.0f);
  std::vector<float> g(n);
  for (auto& x : g) x = normal(rng) * std::pow(10.0f, decade(rng));
  return g;
}

void reference_step(Shard& s, const float* g, const AdamParams& hp, int64_t step) {
  model::adamw_step(s.p.data(), g, s.m.data(), s.v.data(), (int64_t)s.p.size(), hp.lr, hp.beta1, hp.beta2,
                    hp.eps, hp.weight_decay, step);
}

const AdamParams kGpt2{1e-3, 0.9, 0.999, 1e-8, 0.0};
const AdamParams kGpt2Decay{6e-4, 0.9, 0.95, 1e-8, 0.1};
const AdamParams kOdd{3e-2, 0.8, 0.99, 1e-6, 0.01};

const std::vector<int64_t> kSizes = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 1000, 4097,
                                     (1 << 16) + 17 /* the OpenMP path */, 200003};

class CpuAdamIsaTest : public ::testing::TestWithParam<CpuAdamIsa> {
 protected:
  void SetUp() override {
    if (!cpu_adam_isa_supported(GetParam()))
      GTEST_SKIP() << "this CPU (or this build) has no " << cpu_adam_isa_name(GetParam())
                   << "; the best it runs is " << cpu_adam_isa_name(cpu_adam_best_isa());
    cpu_adam_force_isa(GetParam());
    ASSERT_STREQ(cpu_adam_isa(), cpu_adam_isa_name(GetParam()));
  }
  void TearDown() override { cpu_adam_unforce_isa(); }

  // Runs `steps` steps on ours and on the reference from the same start, checking after each.
  void expect_matches_reference(int64_t n, const AdamParams& hp, int steps, int offset = 0) {
    Shard ref = make_shard(n, 7 + (uint32_t)n);
    // Ours on buffers shifted by `offset` floats, so no vector load is aligned.
    std::vector<float> p(n + offset), m(n + offset, 0.0f), v(n + offset, 0.0f), g(n + offset);
    std::memcpy(p.data() + offset, ref.p.data(), n * 4);
    for (int step = 1; step <= steps; step++) {
      const std::vector<float> grads = make_grads(n, 1000u * step + (uint32_t)n);
      std::memcpy(g.data() + offset, grads.data(), n * 4);
      reference_step(ref, grads.data(), hp, step);
      cpu_adamw_step(p.data() + offset, g.data() + offset, m.data() + offset, v.data() + offset, n, hp, step);
      ASSERT_TRUE(same_values("p", p.data() + offset, ref.p.data(), n)) << "n=" << n << " step " << step;
      ASSERT_TRUE(same_values("m", m.data() + offset, ref.m.data(), n)) << "n=" << n << " step " << step;
      ASSERT_TRUE(same_values("v", v.data() + offset, ref.v.data(), n)) << "n=" << n << " step " << step;
    }
  }
};

TEST_P(CpuAdamIsaTest, MatchesTheReferenceBitForBitWithoutWeightDecay) {
  for (int64_t n : kSizes) expect_matches_reference(n, kGpt2, 10);
}

TEST_P(CpuAdamIsaTest, MatchesTheReferenceBitForBitWithWeightDecay) {
  for (int64_t n : kSizes) expect_matches_reference(n, kGpt2Decay, 10);
  for (int64_t n : {int64_t(5), int64_t(1001), int64_t(70001)}) expect_matches_reference(n, kOdd, 10);
}

TEST_P(CpuAdamIsaTest, MatchesTheReferenceOnUnalignedPointers) {
  for (int offset : {1, 2, 3, 5})
    for (int64_t n : {int64_t(37), int64_t(1029), int64_t(70001)})
      expect_matches_reference(n, kGpt2Decay, 3, offset);
}

TEST_P(CpuAdamIsaTest, ResultDoesNotDependOnTheThreadCount) {
  const int64_t n = 300007;
  const int saved = omp_get_max_threads();
  Shard ref = make_shard(n, 3);
  std::vector<std::vector<float>> grads;
  for (int step = 1; step <= 3; step++) grads.push_back(make_grads(n, 50u + step));
  for (int step = 1; step <= 3; step++) reference_step(ref, grads[step - 1].data(), kGpt2Decay, step);
  // Both schedules (cpu_adam.h): the dynamic one's 16Ki-element chunks, 19 of them here, the last
  // one short, taken by whichever thread is free.
  struct Unforce {  // the default schedule again for later tests, however this one ends
    ~Unforce() { cpu_adam_unforce_schedule(); }
  } unforce;
  for (CpuAdamSchedule sched : {CpuAdamSchedule::Static, CpuAdamSchedule::Dynamic}) {
    cpu_adam_force_schedule(sched);
    ASSERT_EQ(cpu_adam_active_schedule(), sched);
    for (int threads : {1, 2, 3, 7}) {
      omp_set_num_threads(threads);
      Shard s = make_shard(n, 3);
      std::vector<uint16_t> low(size_t(n) + 16);
      uint16_t* out = low.data() + ((32 - (reinterpret_cast<uintptr_t>(low.data()) & 31)) & 31) / 2;
      for (int step = 1; step <= 3; step++)
        cpu_adamw_step(s.p.data(), grads[step - 1].data(), s.m.data(), s.v.data(), n, kGpt2Decay, step, out,
                       LowDType::BF16);
      const char* name = cpu_adam_schedule_name(sched);
      EXPECT_TRUE(same_values("p", s.p.data(), ref.p.data(), n)) << threads << " threads, " << name;
      EXPECT_TRUE(same_values("m", s.m.data(), ref.m.data(), n)) << threads << " threads, " << name;
      EXPECT_TRUE(same_values("v", s.v.data(), ref.v.data(), n)) << threads << " threads, " << name;
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; i++) wrong += out[i] != ref_low(LowDType::BF16, ref.p[size_t(i)]);
      EXPECT_EQ(wrong, 0) << "bf16 outputs, " << threads << " threads, " << name;
    }
  }
  omp_set_num_threads(saved);
}

TEST(CpuAdam, SchedulesAreNamedAndDynamicUnlessForced) {
  EXPECT_STREQ(cpu_adam_schedule_name(CpuAdamSchedule::Static), "static");
  EXPECT_STREQ(cpu_adam_schedule_name(CpuAdamSchedule::Dynamic), "dynamic");
  const char* env = std::getenv("ZT_CPU_ADAM_SCHEDULE");
  const bool env_static = env && std::string(env) == "static";
  if (!env_static) {
    EXPECT_EQ(cpu_adam_active_schedule(), CpuAdamSchedule::Dynamic);
  }
  cpu_adam_force_schedule(CpuAdamSchedule::Static);
  EXPECT_EQ(cpu_adam_active_schedule(), CpuAdamSchedule::Static);
  cpu_adam_unforce_schedule();
  EXPECT_EQ(cpu_adam_active_schedule(), env_static ? CpuAdamSchedule::Static : CpuAdamSchedule::Dynamic);
}

// The output 32-byte aligned (written with non-temporal stores where the ISA has them) and one
// element off (plain stores): the same values either way.
TEST_P(CpuAdamIsaTest, FusedLowOutputIsTheConvertedResult) {
  for (bool aligned : {true, false})
  for (LowDType low : {LowDType::BF16, LowDType::F16}) {
    for (int64_t n : {int64_t(1), int64_t(13), int64_t(16), int64_t(47), int64_t(4099), int64_t(70001)}) {
      SCOPED_TRACE(aligned ? "32-byte aligned output" : "output one element off 32 bytes");
      Shard ref = make_shard(n, 11), s = make_shard(n, 11);
      std::vector<uint16_t> buf(size_t(n) + 18, 0xabcd);  // room to align, and one guard element past the end
      uint16_t* out = buf.data() + ((32 - (reinterpret_cast<uintptr_t>(buf.data()) & 31)) & 31) / 2 + (aligned ? 0 : 1);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(out) % 32 == 0, aligned);
      for (int step = 1; step <= 5; step++) {
        const std::vector<float> g = make_grads(n, 77u * step);
        reference_step(ref, g.data(), kGpt2Decay, step);
        cpu_adamw_step(s.p.data(), g.data(), s.m.data(), s.v.data(), n, kGpt2Decay, step, out, low);
        // The fused output changes nothing in fp32.
        ASSERT_TRUE(same_values("p", s.p.data(), ref.p.data(), n));
        ASSERT_TRUE(same_values("m", s.m.data(), ref.m.data(), n));
        for (int64_t i = 0; i < n; i++)
          ASSERT_EQ(out[i], ref_low(low, s.p[i])) << (low == LowDType::BF16 ? "bf16" : "fp16") << " n=" << n
                                                  << " i=" << i << " p=" << s.p[i];
        ASSERT_EQ(out[n], 0xabcd) << "wrote past the end";
      }
    }
  }
}

// With lr = 0 and zero gradients and moments, p comes out as it went in (p * 1 - 0 * 0), so the
// fused output is the conversion of arbitrary bit patterns: every sign/exponent/top-7-mantissa
// combination with the low bits at and around the bf16 and fp16 rounding points (ties, just above,
// just below), and random ones. Covers subnormals, overflow to inf, inf and NaN.
std::vector<float> conversion_patterns() {
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000,
                           0x5000, 0x7fff, 0x8000, 0x8001, 0x9000, 0xa000, 0xffff};
  std::vector<float> x;
  std::mt19937 rng(5);
  for (uint32_t hi = 0; hi < 0x10000; hi++) {
    for (uint32_t lo : lows) x.push_back(from_bits((hi << 16) | lo));
    x.push_back(from_bits((hi << 16) | (rng() & 0xffff)));
  }
  return x;
}

void expect_converts_patterns(const std::vector<float>& x, LowDType low) {
  const int64_t n = (int64_t)x.size();
  std::vector<float> p = x, g(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  std::vector<uint16_t> out(n);
  AdamParams hp = kGpt2Decay;
  hp.lr = 0.0;
  cpu_adamw_step(p.data(), g.data(), m.data(), v.data(), n, hp, 1, out.data(), low);
  int64_t failures = 0;
  for (int64_t i = 0; i < n && failures < 10; i++) {
    if (!std::isnan(x[i]) && bits(p[i]) != bits(x[i])) {
      ++failures;
      ADD_FAILURE() << "lr = 0 moved p[" << i << "] from 0x" << std::hex << bits(x[i]) << " to 0x" << bits(p[i]);
    }
    const uint16_t want = ref_low(low, p[i]);
    if (out[i] != want) {
      ++failures;
      ADD_FAILURE() << (low == LowDType::BF16 ? "bf16" : "fp16") << " of 0x" << std::hex << bits(p[i]) << ": got 0x"
                    << out[i] << ", want 0x" << want;
    }
  }
}

TEST_P(CpuAdamIsaTest, FusedConversionRoundsToNearestEvenOnEveryExponent) {
  const std::vector<float> x = conversion_patterns();
  expect_converts_patterns(x, LowDType::BF16);
  expect_converts_patterns(x, LowDType::F16);
}

// All 2^32 float bit patterns through the fused conversion (about 15 minutes per ISA on 2 cores,
// the checking converters being slow): skipped, saying so, unless ZT_EXHAUSTIVE_TESTS=1:
// ZT_EXHAUSTIVE_TESTS=1 ctest -R AllFloatBitPatterns
TEST_P(CpuAdamIsaTest, FusedConversionOfAllFloatBitPatterns) {
  if (const char* e = std::getenv("ZT_EXHAUSTIVE_TESTS"); !e || std::string(e) != "1")
    GTEST_SKIP() << "every float bit pattern, about 15 min per ISA on 2 cores: ZT_EXHAUSTIVE_TESTS=1 runs it";
  const int64_t chunk = int64_t(1) << 24;
  std::vector<float> x(chunk);
  for (int64_t base = 0; base < (int64_t(1) << 32); base += chunk) {
    for (int64_t i = 0; i < chunk; i++) x[i] = from_bits(uint32_t(base + i));
    expect_converts_patterns(x, LowDType::BF16);
    expect_converts_patterns(x, LowDType::F16);
    if (HasFailure()) return;
  }
}

TEST_P(CpuAdamIsaTest, NanAndInfPropagateLikeTheReference) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {inf, -inf, nan, -nan, 0.0f, -0.0f, 1e-40f /* subnormal */, 3e38f};
  for (int64_t n : {int64_t(29), int64_t(70001)}) {
    Shard ref = make_shard(n, 21);
    std::vector<float> g0 = make_grads(n, 22);
    // A special value in each array at scattered positions, in the vector body and in the tail.
    std::mt19937 rng(23);
    for (int k = 0; k < 24; k++) {
      const float sv = specials[k % 8];
      const int64_t i = k < 4 ? n - 1 - k : (int64_t)(rng() % n);
      switch (k % 4) {
        case 0: ref.p[i] = sv; break;
        case 1: g0[i] = sv; break;
        case 2: ref.m[i] = sv; break;
        case 3: ref.v[i] = std::fabs(sv); break;  // v is a mean of squares; -0 and NaN sign aside
      }
    }
    Shard s = ref;
    std::vector<uint16_t> out(n);
    for (int step = 1; step <= 3; step++) {
      std::vector<float> g = step == 1 ? g0 : make_grads(n, 24u + step);
      if (step > 1) g[n / 2] = (step == 2) ? inf : nan;
      reference_step(ref, g.data(), kGpt2Decay, step);
      const LowDType low = step == 2 ? LowDType::F16 : LowDType::BF16;
      cpu_adamw_step(s.p.data(), g.data(), s.m.data(), s.v.data(), n, kGpt2Decay, step, out.data(), low);
      ASSERT_TRUE(same_values("p", s.p.data(), ref.p.data(), n)) << "step " << step;
      ASSERT_TRUE(same_values("m", s.m.data(), ref.m.data(), n)) << "step " << step;
      ASSERT_TRUE(same_values("v", s.v.data(), ref.v.data(), n)) << "step " << step;
      int64_t nans = 0;
      for (int64_t i = 0; i < n; i++) {
        ASSERT_EQ(out[i], ref_low(low, s.p[i])) << "i=" << i;
        nans += std::isnan(s.p[i]);
      }
      EXPECT_GT(nans, 0) << "the specials should have made some weights NaN";
    }
  }
}

// cpu_adamw_step_grads on bf16/fp16 (and scaled fp32) gradients must equal the engine's two-pass
// way bit for bit: widen into an fp32 buffer (core/dtype_bits.h's converters), multiply by the
// scale there, then cpu_adamw_step. The gradients include specials (inf, NaN, subnormals, zeros) in
// the vector body and the tail, and both paths run on the same ISA, on pointers shifted by an odd
// number of elements.
TEST_P(CpuAdamIsaTest, LowPrecisionGradientsEqualWideningThenScalingThenTheFp32Step) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (GradDType gt : {GradDType::BF16, GradDType::F16, GradDType::F32}) {
    for (float scale : {1.0f, 0.37f, 1.0f / 65536.0f, 3.0f}) {
      // Every fused output (none, bf16 by pairs where the ISA has them, fp16), in turn by scale.
      const LowDType out_t = scale == 1.0f ? LowDType::BF16 : scale == 3.0f ? LowDType::None : LowDType::F16;
      for (int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(33), int64_t(4099), int64_t(70001)}) {
        const int offset = 3;
        Shard two = make_shard(n, 31 + uint32_t(n)), one = two;
        std::vector<uint16_t> low(n + offset), out_two(n), out_one(n);
        std::vector<float> g32(n + offset), widened(n);
        for (int step = 1; step <= 3; step++) {
          std::vector<float> g = make_grads(n, 900u * step + uint32_t(n));
          if (n > 4) g[0] = inf, g[n / 2] = -0.0f, g[n - 1] = 1e-41f, g[n - 2] = step == 3 ? nan : -inf;
          for (int64_t i = 0; i < n; i++) {
            if (gt == GradDType::F32) {
              g32[i + offset] = g[i];
              widened[i] = g[i];
            } else {
              low[i + offset] = ref_low(gt == GradDType::BF16 ? LowDType::BF16 : LowDType::F16, g[i]);
              widened[i] = gt == GradDType::BF16 ? trainer::bits::bf16_to_float(low[i + offset])
                                                 : trainer::bits::fp16_to_float(low[i + offset]);
            }
            if (scale != 1.0f) widened[i] *= scale;
          }
          cpu_adamw_step(two.p.data(), widened.data(), two.m.data(), two.v.data(), n, kGpt2Decay, step,
                         out_two.data(), out_t);
          const void* gp = gt == GradDType::F32 ? static_cast<const void*>(g32.data() + offset) : low.data() + offset;
          cpu_adamw_step_grads(one.p.data(), gp, gt, scale, one.m.data(), one.v.data(), n, kGpt2Decay, step,
                               out_one.data(), out_t);
          const std::string at = std::string(gt == GradDType::BF16 ? "bf16" : gt == GradDType::F16 ? "fp16" : "fp32") +
                                 " scale " + std::to_string(scale) + " n=" + std::to_string(n) + " step " +
                                 std::to_string(step);
          ASSERT_TRUE(same_values("p", one.p.data(), two.p.data(), n)) << at;
          ASSERT_TRUE(same_values("m", one.m.data(), two.m.data(), n)) << at;
          ASSERT_TRUE(same_values("v", one.v.data(), two.v.data(), n)) << at;
          ASSERT_EQ(out_one, out_two) << at;
        }
      }
    }
  }
}

// Out of place (the engine's AdamW during backward): the outputs are bit for bit the in-place step's,
// and the inputs are left as they were, on every gradient type and fused output, on 64-byte aligned
// outputs (the non-temporal stores) and on outputs shifted off that alignment (ordinary stores), with
// one thread and with the OpenMP split.
TEST_P(CpuAdamIsaTest, OutOfPlaceIsTheInPlaceStepAndLeavesItsInputs) {
  auto aligned = [](std::vector<float>& buf, int shift) {  // 64-byte aligned, then `shift` floats on
    return buf.data() + ((64 - (reinterpret_cast<uintptr_t>(buf.data()) & 63)) & 63) / 4 + shift;
  };
  const int saved = omp_get_max_threads();
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    for (int shift : {0, 1})
      for (GradDType gt : {GradDType::F32, GradDType::BF16})
        for (float scale : {1.0f, 0.25f})
          for (int64_t n : {int64_t(17), int64_t(4099), int64_t(70001)}) {
            const LowDType out_t = gt == GradDType::F32 && scale == 1.0f ? LowDType::None : LowDType::BF16;
            Shard a = make_shard(n, 77 + uint32_t(n));
            for (auto& x : a.m) x = 0.01f;
            for (auto& x : a.v) x = 0.02f;
            const std::vector<float> g = make_grads(n, 5u + uint32_t(n));
            std::vector<uint16_t> g16(n);
            for (int64_t i = 0; i < n; i++) g16[i] = ref_bf16(g[i]);
            const void* gp = gt == GradDType::F32 ? static_cast<const void*>(g.data()) : g16.data();
            std::vector<float> pb(n + 32), mb(n + 32), vb(n + 32);
            float* po = aligned(pb, shift);
            float* mo = aligned(mb, shift);
            float* vo = aligned(vb, shift);
            std::vector<uint16_t> low_in(n), low_out(n);
            const Shard before = a;
            cpu_adamw_step_grads_into(a.p.data(), a.m.data(), a.v.data(), po, mo, vo, gp, gt, scale, n, kGpt2Decay,
                                      4, low_out.data(), out_t);
            const std::string at = "n=" + std::to_string(n) + " shift " + std::to_string(shift) + " scale " +
                                   std::to_string(scale) + " " + std::to_string(threads) + " threads";
            ASSERT_TRUE(same_values("p_in", a.p.data(), before.p.data(), n)) << at;
            ASSERT_TRUE(same_values("m_in", a.m.data(), before.m.data(), n)) << at;
            ASSERT_TRUE(same_values("v_in", a.v.data(), before.v.data(), n)) << at;
            cpu_adamw_step_grads(a.p.data(), gp, gt, scale, a.m.data(), a.v.data(), n, kGpt2Decay, 4, low_in.data(),
                                 out_t);
            ASSERT_TRUE(same_values("p", po, a.p.data(), n)) << at;
            ASSERT_TRUE(same_values("m", mo, a.m.data(), n)) << at;
            ASSERT_TRUE(same_values("v", vo, a.v.data(), n)) << at;
            if (out_t != LowDType::None) {
              ASSERT_EQ(low_out, low_in) << at;
            }
          }
  }
  omp_set_num_threads(saved);
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuAdamIsaTest,
                         ::testing::Values(CpuAdamIsa::Scalar, CpuAdamIsa::Avx2, CpuAdamIsa::Avx512),
                         [](const ::testing::TestParamInfo<CpuAdamIsa>& info) {
                           return std::string(cpu_adam_isa_name(info.param));
                         });

TEST(CpuAdam, ChoosesTheWidestIsaThisCpuRuns) {
  std::printf("CPU Adam ISAs: scalar yes, avx2 %s, avx512 %s; active: %s\n",
              cpu_adam_isa_supported(CpuAdamIsa::Avx2) ? "yes" : "no",
              cpu_adam_isa_supported(CpuAdamIsa::Avx512) ? "yes" : "no", cpu_adam_isa());
  EXPECT_TRUE(cpu_adam_isa_supported(CpuAdamIsa::Scalar));
  const CpuAdamIsa best = cpu_adam_best_isa();
  EXPECT_TRUE(cpu_adam_isa_supported(best));
  const CpuAdamIsa widest = cpu_adam_isa_supported(CpuAdamIsa::Avx512) ? CpuAdamIsa::Avx512
                            : cpu_adam_isa_supported(CpuAdamIsa::Avx2) ? CpuAdamIsa::Avx2
                                                                         : CpuAdamIsa::Scalar;
  EXPECT_EQ(best, widest);
  if (std::getenv("ZT_CPU_ADAM_ISA") == nullptr) {
    EXPECT_STREQ(cpu_adam_isa(), cpu_adam_isa_name(best));
  }
  for (CpuAdamIsa isa : {CpuAdamIsa::Avx2, CpuAdamIsa::Avx512}) {
    if (!cpu_adam_isa_supported(isa)) {
      EXPECT_THROW(cpu_adam_force_isa(isa), std::invalid_argument);
    }
  }
  cpu_adam_force_isa(CpuAdamIsa::Scalar);
  EXPECT_STREQ(cpu_adam_isa(), "scalar");
  cpu_adam_unforce_isa();
  if (std::getenv("ZT_CPU_ADAM_ISA") == nullptr) {
    EXPECT_EQ(cpu_adam_active_isa(), best);
  }
}

TEST(CpuAdam, RejectsBadArgumentsAndDoesNothingOnAnEmptyShard) {
  float p = 1.0f, g = 1.0f, m = 0.0f, v = 0.0f;
  EXPECT_THROW(cpu_adamw_step_grads(&p, &g, GradDType(7), 1.0f, &m, &v, 1, kGpt2, 1), std::invalid_argument);
  EXPECT_EQ(p, 1.0f);
  EXPECT_THROW(cpu_adamw_step(&p, &g, &m, &v, 1, kGpt2, 0), std::invalid_argument);
  EXPECT_THROW(cpu_adamw_step(&p, &g, &m, &v, 1, kGpt2, 1, nullptr, LowDType::BF16), std::invalid_argument);
  cpu_adamw_step(nullptr, nullptr, nullptr, nullptr, 0, kGpt2, 1);
  EXPECT_EQ(p, 1.0f);
  // A low_out given with LowDType::None is not written.
  uint16_t out = 0x1234;
  cpu_adamw_step(&p, &g, &m, &v, 1, kGpt2, 1, &out, LowDType::None);
  EXPECT_EQ(out, 0x1234);
  EXPECT_NEAR(p, 1.0f - 1e-3f, 1e-7f);
}

}  // namespace
}  // namespace zt::optim
