// The consolidated weights of a save (issue 5, R4), at the engine's level: rank threads with
// their engines, a save right after construction. The safetensors file holds the engine's
// weights in Hugging Face's layout (checked against the model's init, by a parser written
// here); the `device` and `streamed` gathers write the same bytes; the device gather needs
// the whole model's bytes of temporary device memory and runs out of it, with PyTorch's text,
// under a capacity where the streamed gather fits; the fault ckpt.gather_on_device forces it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "engine_ranks.h"
#include "model/gpt2.h"
#include "model/layout.h"
#include "zt/fail/failpoint.h"
#include "zt/memory/errors.h"

using namespace zt::trainer;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Two ranks, ZeRO-3, both offloads, bf16, every module sharded, consolidated weights on.
TrainConfig gather_config(const std::string& how) {
  TrainConfig c;
  c.model = "tiny";
  c.world_size = 2;
  c.seed = 5;
  c.precision = "bf16";
  c.zero.stage = 3;
  c.zero.offload_optimizer = true;
  c.zero.offload_param = true;
  c.zero.param_persistence_threshold = 0;
  c.save_safetensors = true;
  c.checkpoint_gather = how;
  return c;
}

struct Saved {
  std::vector<std::string> errors;
  ckpt::SaveReport report;  // rank 0's
  int64_t peak_reserved = 0;  // rank 0's device, over construction and the save
  std::vector<std::vector<uint16_t>> visited;  // rank 0: each module's weights, as gather_weights gives them
};

// Builds the engines and saves once (step 0) into dir.
Saved save_fresh(const TrainConfig& c, const zt::model::Config& mc, const std::string& dir, bool visit = false) {
  Saved out;
  std::mutex mu;
  out.errors = zt::test::run_ranks(c, mc, 1, 8, [&](int rank, ZeroEngine& e, Communicator& comm, RankRuntime& rt) {
    ckpt::SaveReport rep;
    ckpt::save(dir, c, {0, 0, 0}, e, comm, {}, &rep);
    if (visit)
      e.gather_weights(ZeroEngine::WeightsGather::Streamed, rank == 0, [&](const ZeroEngine::ModuleLayout& l, const void* v) {
        const auto* p = static_cast<const uint16_t*>(v);
        out.visited.emplace_back(p, p + l.numel);
      });
    if (rank == 0) {
      std::lock_guard lock(mu);
      out.report = rep;
      out.peak_reserved = rt.device_allocator()->stats().peak_reserved_bytes;
    }
  });
  return out;
}

bool all_ok(const std::vector<std::string>& errors) {
  for (auto& e : errors)
    if (!e.empty()) return false;
  return true;
}

}  // namespace

// The file holds the model's weights (a fresh engine's are its init, rounded to bf16) under
// Hugging Face's names and shapes, Conv1D weights transposed: read by a minimal parser written
// here, by our reader, and compared with what the engine's gather hands over.
TEST(CheckpointWeights, SafetensorsHoldTheEngineWeightsInHuggingFaceLayout) {
  zt::test::TempDir tmp;
  const TrainConfig c = gather_config("streamed");
  const zt::model::Config mc = *zt::model::preset("tiny");
  const std::string dir = tmp.file("ck");
  Saved s = save_fresh(c, mc, dir, /*visit=*/true);
  ASSERT_TRUE(all_ok(s.errors)) << s.errors[0] << " | " << s.errors[1];
  const std::string d = dir + "/step000000";
  ASSERT_TRUE(ckpt::verify_checkpoint(dir, "step000000", nullptr).ok());

  std::vector<float> init(size_t(zt::model::num_params(mc)));
  zt::model::init_params(mc, c.seed, init.data());
  const auto table = zt::model::param_table(mc);

  // A minimal parser: u64 N, JSON, data.
  const std::string bytes = slurp(d + "/model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const json header = json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header.size(), table.size() + 1);  // every tensor, the tied LM head left out, + metadata
  uint64_t covered = 0;
  for (const auto& p : table) {
    ASSERT_TRUE(header.contains(p.hf_name)) << p.hf_name;
    const json& e = header[p.hf_name];
    EXPECT_EQ(e["dtype"], "BF16");
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), p.hf_shape);
    const uint64_t b = e["data_offsets"][0], end = e["data_offsets"][1];
    ASSERT_EQ(end - b, uint64_t(p.numel) * 2) << p.hf_name;
    covered += end - b;
    const char* data = bytes.data() + 8 + n + b;
    const int64_t rows = p.shape[0], cols = p.shape.size() > 1 ? p.shape[1] : 1;
    for (int64_t i = 0; i < p.numel; ++i) {
      // HF element i: for Conv1D [in, out] it is ours [out = i % rows, in = i / rows].
      const int64_t ours = p.hf_transposed ? (i % rows) * cols + i / rows : i;
      uint16_t got;
      std::memcpy(&got, data + 2 * i, 2);
      ASSERT_EQ(got, float_to_bf16(init[size_t(p.offset + ours)])) << p.hf_name << " element " << i;
    }
  }
  EXPECT_EQ(covered, bytes.size() - 8 - n);

  // Our reader agrees, and the values equal what the engine's own gather hands over.
  ckpt::SafetensorsFile f;
  zt::Status st = ckpt::read_safetensors(d + "/model.safetensors", &f);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(s.visited.size(), zt::model::module_table(mc).size());
  for (const auto& p : table) {
    std::vector<float> v;
    ASSERT_TRUE(ckpt::read_tensor_f32(f, p.hf_name, &v).ok());
    const int64_t rows = p.shape[0], cols = p.shape.size() > 1 ? p.shape[1] : 1;
    for (int64_t i = 0; i < p.numel; i += 7) {
      const int64_t ours = p.hf_transposed ? (i % rows) * cols + i / rows : i;
      ASSERT_EQ(float_to_bf16(v[size_t(i)]), s.visited[size_t(p.module)][size_t(p.offset_in_module + ours)]) << p.hf_name;
    }
  }

  const json hf = json::parse(slurp(d + "/config.json"));
  EXPECT_EQ(hf["model_type"], "gpt2");
  EXPECT_EQ(hf["n_embd"], mc.width);
  EXPECT_EQ(hf["n_layer"], mc.layers);
  EXPECT_EQ(hf["n_head"], mc.heads);
  EXPECT_EQ(hf["n_positions"], mc.context);
  EXPECT_EQ(hf["vocab_size"], mc.vocab);
  EXPECT_EQ(hf["torch_dtype"], "bfloat16");
  const json man = json::parse(slurp(d + "/manifest.json"));
  EXPECT_EQ(man["weights"]["dtype"], "bf16");
  EXPECT_EQ(man["weights"]["gather"], "streamed");
  ASSERT_EQ(man["model_files"].size(), 2u);
  EXPECT_EQ(man["model_files"][0]["bytes"].get<int64_t>(), int64_t(bytes.size()));

  // zt ckpt consolidate from the shards' fp32 master weights: fp32 gives the init exactly,
  // bf16 the same bytes as the save's export.
  ckpt::ConsolidateReport rep;
  st = ckpt::consolidate(dir, "", tmp.file("out/fp32.safetensors"), DType::F32, &rep);
  ASSERT_FALSE(st.ok());  // out/ does not exist
  EXPECT_NE(st.message().find(tmp.file("out/fp32.safetensors.tmp")), std::string::npos) << st.message();
  fs::create_directory(tmp.file("out"));
  st = ckpt::consolidate(dir, "", tmp.file("out/fp32.safetensors"), DType::F32, &rep);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(rep.checkpoint, d);
  EXPECT_EQ(rep.params, zt::model::num_params(mc));
  EXPECT_EQ(rep.config_path, tmp.file("out/config.json"));
  EXPECT_TRUE(fs::exists(tmp.file("out/config.json")));
  ckpt::SafetensorsFile f32;
  ASSERT_TRUE(ckpt::read_safetensors(tmp.file("out/fp32.safetensors"), &f32).ok());
  std::vector<float> wte;
  ASSERT_TRUE(ckpt::read_tensor_f32(f32, "transformer.wte.weight", &wte).ok());
  EXPECT_EQ(wte, std::vector<float>(init.begin(), init.begin() + int64_t(wte.size())));
  ASSERT_TRUE(ckpt::consolidate(dir, "step000000", tmp.file("out/bf16.safetensors"), DType::BF16, &rep).ok());
  const std::string b16 = slurp(tmp.file("out/bf16.safetensors"));
  uint64_t n16 = 0;
  std::memcpy(&n16, b16.data(), 8);
  EXPECT_EQ(b16.substr(8 + n16), bytes.substr(8 + n));  // the same tensor bytes (the metadata differs)
}

// Both strategies write the same bytes where both fit. The device gather holds every module at
// once (the model's bytes), the streamed one a module at a time; under a capacity where the
// streamed gather fits, the device gather runs out of memory with PyTorch's message (R4).
TEST(CheckpointWeights, DeviceGatherRunsOutOfMemoryWhereStreamedFitsAndBothWriteTheSameBytes) {
  // A GPT-2 shape whose blocks are just under 1 MiB in bf16, so the caching allocator serves
  // them from 2 MiB segments and the difference between the strategies shows in segments.
  const zt::model::Config mc{256, 64, 4, 4, 192};
  ASSERT_TRUE(zt::model::validate(mc).ok());
  zt::test::TempDir tmp;
  std::map<std::string, Saved> runs;
  for (const char* how : {"streamed", "device"}) {
    runs[how] = save_fresh(gather_config(how), mc, tmp.file(how));
    ASSERT_TRUE(all_ok(runs[how].errors)) << how << ": " << runs[how].errors[0];
    EXPECT_EQ(runs[how].report.gather, how);
  }
  EXPECT_EQ(slurp(tmp.file("streamed/step000000/model.safetensors")), slurp(tmp.file("device/step000000/model.safetensors")));

  // Temporary device bytes, from the module table: a module's whole padded bf16 parameters,
  // plus its shard copied host->device before the all-gather (offload_param).
  // Streamed: the largest module with its shard. Device: every module gathered so far, plus the
  // shard of the one being gathered.
  int64_t streamed = 0, device = 0, gathered = 0;
  for (const auto& m : zt::model::module_table(mc)) {
    const int64_t padded = (m.numel + 1) / 2 * 2, whole = padded * 2, shard = padded / 2 * 2;
    streamed = std::max(streamed, whole + shard);
    gathered += whole;
    device = std::max(device, gathered + shard);
  }
  EXPECT_EQ(runs["streamed"].report.peak_temp_device_bytes, streamed);
  EXPECT_EQ(runs["device"].report.peak_temp_device_bytes, device);
  EXPECT_GT(device, 3 * streamed / 2);
  ASSERT_GT(runs["device"].peak_reserved, runs["streamed"].peak_reserved);

  // The capacity the streamed save needed: it fits again; the device save does not.
  for (const char* how : {"streamed", "device"}) {
    TrainConfig c = gather_config(how);
    c.device_memory = uint64_t(runs["streamed"].peak_reserved);
    Saved s = save_fresh(c, mc, tmp.file(std::string("small-") + how));
    if (std::string(how) == "streamed") {
      EXPECT_TRUE(all_ok(s.errors)) << s.errors[0];
      continue;
    }
    const std::string& e = s.errors[0].empty() ? s.errors[1] : s.errors[0];
    EXPECT_NE(e.find("CUDA out of memory. Tried to allocate"), std::string::npos) << e;
    EXPECT_NE(e.find("has a total capacity of " + zt::memory::pytorch_format_size(c.device_memory)), std::string::npos) << e;
    EXPECT_NE(e.find("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(tmp.file("small-device/step000000")));  // nothing committed
    EXPECT_FALSE(fs::exists(tmp.file("small-device/latest")));
  }
}

TEST(CheckpointWeights, FaultGatherOnDeviceForcesTheDeviceStrategy) {
  zt::test::TempDir tmp;
  std::vector<zt::fail::Spec> specs;
  ASSERT_TRUE(zt::fail::parse_specs("ckpt.gather_on_device=return", &specs).ok());
  zt::fail::Scope scope(specs, 1);
  Saved s = save_fresh(gather_config("streamed"), *zt::model::preset("tiny"), tmp.file("ck"));
  ASSERT_TRUE(all_ok(s.errors)) << s.errors[0];
  EXPECT_EQ(s.report.gather, "device");
  EXPECT_TRUE(s.report.gather_forced_by_fault);
  EXPECT_EQ(zt::fail::fired_count("ckpt.gather_on_device"), 2);  // once per rank
  const json man = json::parse(slurp(tmp.file("ck/step000000/manifest.json")));
  EXPECT_EQ(man["weights"]["gather"], "device");
}

// With every module under the persistence threshold nothing is sharded, so there is no gather for
// the fault to force: it is not evaluated (its fault row claimed a gather that never happened).
TEST(CheckpointWeights, FaultGatherOnDeviceDoesNothingWithoutShards) {
  zt::test::TempDir tmp;
  std::vector<zt::fail::Spec> specs;
  ASSERT_TRUE(zt::fail::parse_specs("ckpt.gather_on_device=return", &specs).ok());
  zt::fail::Scope scope(specs, 1);
  TrainConfig c = gather_config("streamed");
  c.zero.param_persistence_threshold = int64_t(1) << 40;  // every module kept whole
  Saved s = save_fresh(c, *zt::model::preset("tiny"), tmp.file("ck"));
  ASSERT_TRUE(all_ok(s.errors)) << s.errors[0];
  EXPECT_FALSE(s.report.gather_forced_by_fault);
  EXPECT_EQ(zt::fail::fired_count("ckpt.gather_on_device"), 0);
}
