// fuzz_checkpoint: the readers of a checkpoint directory (`zt train --resume`, `zt ckpt info`,
// `zt ckpt consolidate`) with one file of a real checkpoint replaced by the input: the manifest,
// rank 0's shard or the consolidated weights (the manifest then names the new file's size and
// checksum, so the shard and safetensors parsers are reached, not only the checksum), or
// `latest`; and the safetensors reader on a file of its own. A bad file is refused naming it,
// and the newest complete checkpoint is used where there is one.
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/file_io.h"
#include "ckpt/safetensors.h"
#include "fuzz_input.h"
#include "train/trainer.h"

namespace {
using namespace zt;
using namespace zt::trainer;
using nlohmann::json;

struct Base {
  std::string dir, tag, manifest, shard_file, shard, weights, latest;
};

// A real checkpoint of a tiny GPT-2 on two ranks, saved after one step with its weights.
const Base& base() {
  static const Base b = [] {
    Base b;
    b.dir = fuzz::scratch_dir() + "/ckpt";
    std::filesystem::remove_all(b.dir);
    TrainConfig c;
    c.model = "custom";
    c.shape = ModelShape{"fuzz", 8, 1, 2, 2, 32, false, 256, 16, true, 0, 0, 0, 0};
    c.steps = 1;
    c.world_size = 2;
    c.micro_batch = 1;
    c.seq_len = 8;
    c.device_memory = 64ull << 20;
    c.checkpoint_dir = b.dir;
    c.save_every = 1;
    c.save_safetensors = true;
    c.quiet = true;
    TrainSummary sum;
    if (Status s = train(c, nullptr, nullptr, &sum); !s) {
      std::fprintf(stderr, "fuzz_checkpoint: the base checkpoint: %s\n", s.message().c_str());
      std::abort();
    }
    b.latest = fuzz::read_file(b.dir + "/latest");
    b.tag = b.latest.substr(0, b.latest.find('\n'));
    b.manifest = fuzz::read_file(b.dir + "/" + b.tag + "/manifest.json");
    const json m = json::parse(b.manifest);
    b.shard_file = m.at("files").at(0).at("name").get<std::string>();
    b.shard = fuzz::read_file(b.dir + "/" + b.tag + "/" + b.shard_file);
    b.weights = fuzz::read_file(b.dir + "/" + b.tag + "/" + ckpt::kWeightsFile);
    return b;
  }();
  return b;
}

// The manifest with `list`[0] naming `bytes` (its size and checksum).
std::string manifest_for(const Base& b, const char* list, const std::string& bytes) {
  json m = json::parse(b.manifest);
  ckpt::ChecksumKind kind;
  const std::string key = m.at("checksum").get<std::string>();
  ckpt::parse_checksum(key, &kind);
  m[list][0]["bytes"] = int64_t(bytes.size());
  m[list][0][key] = ckpt::hex64(ckpt::checksum_of(kind, bytes.data(), bytes.size()));
  return m.dump(1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const Base& b = base();
  const std::string tagdir = b.dir + "/" + b.tag;
  const uint8_t mode = in.byte() % 5;
  const uint8_t reader = in.byte() % 4;  // one reader an input: a million inputs run
  const std::string bytes = in.rest();
  fuzz::Quiet quiet;
  if (mode == 4) {  // the safetensors reader alone
    const std::string path = fuzz::scratch_dir() + "/alone.safetensors";
    fuzz::write_file(path, bytes);
    ckpt::SafetensorsFile f;
    if (ckpt::read_safetensors(path, &f)) {
      std::vector<float> v;
      for (const auto& t : f.tensors) (void)ckpt::read_tensor_f32(f, t.name, &v);
    }
    return 0;
  }
  fuzz::write_file(tagdir + "/manifest.json", mode == 0 ? bytes
                                              : mode == 1 ? manifest_for(b, "files", bytes)
                                              : mode == 2 ? manifest_for(b, "model_files", bytes)
                                                          : b.manifest);
  fuzz::write_file(tagdir + "/" + b.shard_file, mode == 1 ? bytes : b.shard);
  fuzz::write_file(tagdir + "/" + ckpt::kWeightsFile, mode == 2 ? bytes : b.weights);
  fuzz::write_file(b.dir + "/latest", mode == 3 ? bytes : b.latest);

  switch (reader) {
    case 0: {  // zt train --resume
      ckpt::Selected sel;
      (void)ckpt::select_checkpoint(b.dir, &sel, true);
      break;
    }
    case 1: {  // zt ckpt info
      std::string text;
      (void)ckpt::describe_checkpoints(b.dir, &text);
      break;
    }
    default: {  // zt ckpt consolidate: every shard read module by module, or the weights file
      ckpt::ConsolidateReport rep;
      (void)ckpt::consolidate(b.dir, reader == 2 ? "" : b.tag, fuzz::scratch_dir() + "/out/model.safetensors",
                              reader == 2 ? DType::F32 : DType::BF16, &rep);
      break;
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::filesystem::create_directories(zt::fuzz::scratch_dir() + "/out");
  (void)base();
  return 0;
}
