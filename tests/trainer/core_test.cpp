// Devices, dtypes, tensors, the copy engine and the device guard.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "../test_util.h"
#include "core/backend.h"
#include "core/tensor.h"
#include "train/rank_runtime.h"
#include "zt/db/trace_reader.h"
#include "zt/memory/numa.h"

using namespace zt::trainer;

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 lies exactly between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3*2^-8 ties between 1+2^-7 (odd) and 1+2^-6 (even): goes up to 1+2^-6.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(3.4e38f))));
}

TEST(DType, Fp16RoundTripsAndSaturates) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f /*smallest normal*/, 5.9604645e-08f /*smallest subnormal*/})
    EXPECT_EQ(fp16_to_float(float_to_fp16(f)), f) << f;
  EXPECT_TRUE(std::isinf(fp16_to_float(float_to_fp16(70000.0f))));
  EXPECT_EQ(fp16_to_float(float_to_fp16(1e-9f)), 0.0f);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::nanf("")))));
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp16_to_float(float_to_fp16(0.1f)), 0.0999755859375f);
}

// A gradient partition landing on the host: widened and summed in one pass, the same values as
// convert() and the same sum, bit for bit, as sum_squares() (n spans several chunks and a tail).
TEST(HostOps, WidenAndSumSquaresIsConvertThenSumSquares) {
  const int64_t n = 3 * (int64_t{1} << 16) + 123;
  std::vector<float> src(static_cast<size_t>(n));
  uint64_t state = 7;
  for (auto& v : src) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = float(int64_t(state >> 33) % 20001 - 10000) * 1e-3f;
  }
  for (DType t : {DType::BF16, DType::F16, DType::F32}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    std::vector<uint16_t> low(static_cast<size_t>(n));
    const void* in = src.data();
    if (t != DType::F32) {
      host_ops().convert(low.data(), t, src.data(), DType::F32, n);
      in = low.data();
    }
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), -1.0f);
    host_ops().convert(want.data(), DType::F32, in, t, n);
    const double sum = widen_and_sum_squares(got.data(), in, t, n);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), size_t(n) * sizeof(float)));
    EXPECT_EQ(sum, host_ops().sum_squares(want.data(), n));
    EXPECT_GT(sum, 0.0);
    // With no destination: the same sum, nothing written.
    EXPECT_EQ(widen_and_sum_squares(nullptr, in, t, n), sum);
  }
  float dst = 0;
  int32_t token = 1;
  EXPECT_THROW(widen_and_sum_squares(&dst, &token, DType::I32, 1), std::invalid_argument);
}

TEST(DeviceNames, ParseAndLabel) {
  EXPECT_EQ(parse_device("sim:3")->index, 3);
  EXPECT_EQ(parse_device("sim")->type, DeviceType::Sim);
  EXPECT_EQ(parse_device("cuda:1")->type, DeviceType::Cuda);
  EXPECT_EQ(parse_device("cpu")->type, DeviceType::Cpu);
  EXPECT_FALSE(parse_device("cpu:1"));
  EXPECT_FALSE(parse_device("gpu:0"));
  EXPECT_FALSE(parse_device("sim:x"));
  Device sim(DeviceType::Sim, 1, 1, nullptr, 0, nullptr);
  EXPECT_EQ(sim.label(), "cuda:1");  // users see cuda:N, as the bug reports do
}

class TensorTrace : public ::testing::Test {
 protected:
  zt::test::TempDir dir;
  std::unique_ptr<zt::probe::Recorder> rec;
  std::unique_ptr<RankRuntime> rt;
  void SetUp() override {
    zt::probe::RecorderOptions o;
    o.path = dir.file("t.db");
    o.crash_handlers = false;
    ASSERT_TRUE(zt::probe::Recorder::open(o, &rec).ok());
    RuntimeOptions ro;
    ro.rank = 1;
    ro.world_size = 2;
    ro.device_capacity = 64ull << 20;
    rt = std::make_unique<RankRuntime>(ro, rec.get());
  }
  std::unique_ptr<zt::db::TraceReader> close_and_read() {
    rt.reset();
    EXPECT_TRUE(rec->close().ok());
    std::unique_ptr<zt::db::TraceReader> r;
    EXPECT_TRUE(zt::db::TraceReader::open(dir.file("t.db"), &r).ok());
    return r;
  }
  static std::vector<std::vector<std::string>> rows(zt::db::TraceReader& r, const std::string& sql) {
    zt::db::QueryResult q;
    zt::Status s = r.query(sql, &q);
    EXPECT_TRUE(s.ok()) << s.message();
    return q.rows;
  }
};

TEST_F(TensorTrace, CopyEngineRecordsTransfersAndPlacements) {
  {
    Tensor h = Tensor::empty("w", {256}, DType::F32, rt->host(), /*pinned=*/true);
    for (int i = 0; i < 256; ++i) h.f32()[i] = float(i) * 0.5f;
    Tensor d = copy_to(h, rt->accelerator(), false, "w.dev", DType::BF16);
    EXPECT_EQ(d.device().label(), "cuda:1");
    EXPECT_EQ(d.bytes(), 512u);
    Tensor back = copy_to(d, rt->host(), /*pinned=*/false, "w.back", DType::F32);
    for (int i = 0; i < 256; ++i) ASSERT_EQ(back.f32()[i], float(i) * 0.5f);  // exact in bf16
    Tensor d2 = copy_to(d, rt->accelerator(), false, "w.dev2");
  }
  auto r = close_and_read();
  auto t = rows(*r, "SELECT kind, bytes, src_device, dst_device, coalesce(pinned, '-'), name FROM transfer_v ORDER BY id");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0], (std::vector<std::string>{"H2D", "1024", "cpu", "cuda:1", "1", "w.dev"}));
  EXPECT_EQ(t[1], (std::vector<std::string>{"D2H", "512", "cuda:1", "cpu", "0", "w.back"}));
  EXPECT_EQ(t[2], (std::vector<std::string>{"D2D", "512", "cuda:1", "cuda:1", "-", "w.dev2"}));
  auto p = rows(*r, "SELECT tensor, device, why FROM placement_v WHERE tensor = 'w.dev' ORDER BY id");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], (std::vector<std::string>{"w.dev", "cuda:1", "created"}));
  EXPECT_EQ(p[1], (std::vector<std::string>{"w.dev", "cuda:1", "moved"}));
  EXPECT_EQ(p[2], (std::vector<std::string>{"w.dev", "cuda:1", "freed"}));
  // Every tensor's storage is a named block, freed at the end.
  auto a = rows(*r, "SELECT count(*), sum(t_free IS NULL) FROM allocation_v WHERE level = 'block' AND name LIKE 'w%'");
  EXPECT_EQ(a[0], (std::vector<std::string>{"4", "0"}));
  auto k = rows(*r, "SELECT memory_kind FROM allocation_v WHERE level = 'block' AND name = 'w'");
  EXPECT_EQ(k[0][0], "pinned_host");
}

TEST_F(TensorTrace, DeviceGuardThrowsPyTorchsMessageAndRecordsIt) {
  Tensor grad = Tensor::zeros("fp32_partitioned_groups_flat[0].grad", {16}, DType::F32, rt->host());
  Tensor scale = Tensor::zeros("combined_scale", {1}, DType::F32, rt->accelerator());
  try {
    check_same_device("unscale_and_clip_grads", {&scale, &grad}, 7);
    FAIL() << "no exception";
  } catch (const DeviceMismatchError& e) {
    EXPECT_STREQ(e.what(),
                 "Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cpu!");
    EXPECT_EQ(e.tensors.size(), 2u);
  }
  // The host operand first (R2's partition left on the GPU meets a host scale): the accelerator is
  // still named first, as in PyTorch's text.
  try {
    check_same_device("unscale_and_clip_grads", {&grad, &scale}, 7);
    FAIL() << "no exception";
  } catch (const DeviceMismatchError& e) {
    EXPECT_STREQ(e.what(),
                 "Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cpu!");
  }
  EXPECT_NO_THROW(check_same_device("same", {&grad, &grad}));
  grad.reset();
  scale.reset();
  auto r = close_and_read();
  auto e = rows(*r, "SELECT kind, site, step, message, tensors FROM error ORDER BY id");
  ASSERT_EQ(e.size(), 2u);  // both guards' errors
  EXPECT_EQ(e[1][4], "[\"fp32_partitioned_groups_flat[0].grad@cpu\",\"combined_scale@cuda:1\"]");
  EXPECT_EQ(e[0][0], "device_mismatch");
  EXPECT_EQ(e[0][1], "unscale_and_clip_grads");
  EXPECT_EQ(e[0][2], "7");
  EXPECT_EQ(e[0][4], "[\"combined_scale@cuda:1\",\"fp32_partitioned_groups_flat[0].grad@cpu\"]");
}

// TrainConfig::pinned_numa interleave on the simulated GPU: pinned host tensors come from
// interleaved mappings and pageable ones do not; under a host cap the one host memory both share
// is interleaved as a whole. The tensors hold what is written to them.
TEST(PinnedPlacement, PinnedHostTensorsAreInterleavedWhenAsked) {
  if (!zt::memory::interleave_refusal().empty())
    GTEST_SKIP() << "NUMA policy calls refused: " << zt::memory::interleave_refusal();
  for (size_t cap : {size_t(0), size_t(64) << 20}) {
    SCOPED_TRACE(cap ? "host cap" : "no host cap");
    RuntimeOptions ro;
    ro.device_capacity = 64ull << 20;
    ro.host_capacity = cap;
    ro.pinned_placement = zt::memory::PagePlacement::Interleave;
    RankRuntime rt(ro, nullptr);
    Tensor pinned = Tensor::empty("adam.m[h.0]", {100000}, DType::F32, rt.host(), /*pinned=*/true);
    Tensor pageable = Tensor::empty("batch", {1000}, DType::F32, rt.host(), /*pinned=*/false);
    EXPECT_EQ(zt::memory::placement_of(pinned.raw()), zt::memory::PagePlacement::Interleave);
    EXPECT_EQ(zt::memory::placement_of(pageable.raw()),
              cap ? zt::memory::PagePlacement::Interleave : zt::memory::PagePlacement::Local);
    for (int64_t i = 0; i < 100000; ++i) pinned.f32()[i] = float(i);
    EXPECT_EQ(pinned.f32()[99999], 99999.0f);
    EXPECT_NE(rt.pinned_allocator().source().describe().find("interleaved"), std::string::npos);
  }
  RuntimeOptions local;
  local.device_capacity = 64ull << 20;
  RankRuntime rt(local, nullptr);
  Tensor pinned = Tensor::empty("adam.m[h.0]", {100000}, DType::F32, rt.host(), /*pinned=*/true);
  EXPECT_EQ(zt::memory::placement_of(pinned.raw()), zt::memory::PagePlacement::Local);
}

// ZT_CUDA_SYNC's values: CUDA's four schedules, by name; anything else is refused.
TEST(CudaSyncSetting, ParsesTheFourSchedulesOnly) {
  CudaSync s = CudaSync::Spin;
  ASSERT_TRUE(parse_cuda_sync("blocking", &s));
  EXPECT_EQ(s, CudaSync::Blocking);
  ASSERT_TRUE(parse_cuda_sync("yield", &s));
  EXPECT_EQ(s, CudaSync::Yield);
  ASSERT_TRUE(parse_cuda_sync("spin", &s));
  EXPECT_EQ(s, CudaSync::Spin);
  ASSERT_TRUE(parse_cuda_sync("auto", &s));
  EXPECT_EQ(s, CudaSync::Auto);
  for (const char* bad : {"", "Blocking", "block", "auto ", "1"}) EXPECT_FALSE(parse_cuda_sync(bad, &s)) << bad;
  EXPECT_EQ(s, CudaSync::Auto);  // untouched by a refusal
}
