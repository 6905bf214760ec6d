// The device memory outside PyTorch's caching allocator (train/outside_memory.h, issue 41): the CUDA context
// and NCCL's buffers, each a documented size; taken from the simulated GPU before anything else, so the OOM
// message's "free" and "this process has X memory in use" count them and "allocated" does not.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "../test_util.h"
#include "model/config.h"
#include "train/model_shape.h"
#include "train/outside_memory.h"
#include "train/trainer.h"
#include "zero/ds_memory.h"

namespace {

using zt::trainer::TrainConfig;

TEST(ZeroOutsideMemory, ContextSizesAreTheMeasuredOnes) {
  EXPECT_EQ(zt::trainer::cuda_context_bytes("none"), 0u);
  EXPECT_EQ(zt::trainer::cuda_context_bytes("lazy"), 287047680u);
  EXPECT_EQ(zt::trainer::cuda_context_bytes("eager"), 666632192u);
  EXPECT_EQ(zt::trainer::cuda_context_bytes("1GiB"), uint64_t(1) << 30);
  std::string why;
  EXPECT_FALSE(zt::trainer::cuda_context_bytes("lazzy", &why));
  EXPECT_NE(why.find("not none, lazy, eager or a size"), std::string::npos) << why;
  // One ring channel's buffers: LL 512 KiB, LL128 4,915,200 B, Simple 4 MiB (NCCL's defaults).
  EXPECT_EQ(zt::trainer::kNcclChannelBytes, 9633792u);
}

TEST(ZeroOutsideMemory, NcclBuffersOnlyWithMoreThanOneRank) {
  TrainConfig c;
  c.cuda_context = "lazy";
  c.nccl_channels = 4;
  c.world_size = 1;
  auto t = zt::trainer::outside_allocator_terms(c);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].name, "cuda_context");
  c.world_size = 8;
  t = zt::trainer::outside_allocator_terms(c);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[1].name, "nccl_buffers");
  EXPECT_EQ(t[1].bytes, 4 * zt::trainer::kNcclChannelBytes);
  EXPECT_EQ(zt::trainer::outside_allocator_bytes(c), 287047680u + 4 * zt::trainer::kNcclChannelBytes);
  EXPECT_EQ(zt::trainer::describe_outside(c), "CUDA context 273.75 MiB (lazy) + NCCL buffers 36.75 MiB (4 channels)");
  // A real GPU has its own; the CPU none.
  c.device = "cpu";
  EXPECT_TRUE(zt::trainer::outside_allocator_terms(c).empty());
}

TEST(ZeroOutsideMemory, BadSettingsAreRefused) {
  TrainConfig c;
  c.cuda_context = "lazzy";
  EXPECT_NE(zt::trainer::validate(c).message().find("cuda_context"), std::string::npos);
  c.cuda_context = "lazy";
  c.nccl_channels = 65;
  EXPECT_NE(zt::trainer::validate(c).message().find("nccl_channels 65"), std::string::npos);
  c.nccl_channels = 0;
  c.device_memory = 200ull << 20;  // below the context
  EXPECT_NE(zt::trainer::validate(c).message().find("does not fit the GPU"), std::string::npos)
      << zt::trainer::validate(c).message();
  c.device_memory = 80ull << 30;
  EXPECT_TRUE(zt::trainer::validate(c).ok()) << zt::trainer::validate(c).message();
  c.device = "cpu";
  EXPECT_NE(zt::trainer::validate(c).message().find("charges the simulated GPU"), std::string::npos);
}

// "of which X is free" and "this process has X memory in use", in bytes as PyTorch prints them (MiB/GiB).
double figure(const std::string& msg, const std::string& before) {
  std::smatch m;
  const std::regex re(before + "([0-9.]+) (GiB|MiB)");
  if (!std::regex_search(msg, m, re)) return -1;
  return std::stod(m[1]) * (m[2] == "GiB" ? 1024.0 : 1.0);  // MiB
}

// The same set-up OOM (stage 2's whole fp32 gradient partition: ds_memory_zero12_test) with and without a
// context of 64 MiB: the same request and allocated bytes, 64 MiB less free, 64 MiB more in the process.
TEST(ZeroOutsideMemory, TheOomMessageCountsTheContextInFreeAndProcessMemory) {
  const zt::model::Config mc = *zt::model::preset("1.5B");
  const auto mods = zt::trainer::module_parameters(&mc, zt::trainer::shape_of(mc, "1.5B"), true);
  const auto d = zt::trainer::ds12_partition(mods, 8, 0);
  auto run = [&](const std::string& ctx) {
    TrainConfig c;
    c.virtual_mode = true;
    c.model = "1.5B";
    c.data_samples = 1000;
    c.steps = 1;
    c.world_size = 8;
    c.zero.stage = 2;
    c.precision = "fp16";
    c.micro_batch = 1;
    c.seq_len = 64;
    c.attention = "flash";
    c.quiet = true;
    c.device_memory = uint64_t(2 * d.total + 7 * d.partition);
    c.cuda_context = ctx;
    zt::trainer::TrainSummary s;
    return zt::trainer::train(c, nullptr, nullptr, &s);
  };
  const zt::Status without = run("none"), with = run("64MiB");
  ASSERT_FALSE(without.ok());
  ASSERT_FALSE(with.ok());
  const std::string a = without.message(), b = with.message();
  EXPECT_NE(b.find("Tried to allocate 744.00 MiB"), std::string::npos) << b;
  EXPECT_NE(a.find("3.63 GiB is allocated by PyTorch"), std::string::npos) << a;
  EXPECT_NE(b.find("3.63 GiB is allocated by PyTorch"), std::string::npos) << b;
  EXPECT_NEAR(figure(a, "of which ") - figure(b, "of which "), 64.0, 0.02) << a << "\n" << b;
  // (printed in GiB to two decimals: 64 MiB give or take 10 MiB of rounding)
  EXPECT_NEAR(figure(b, "this process has ") - figure(a, "this process has "), 64.0, 10.5) << a << "\n" << b;
}

}  // namespace
