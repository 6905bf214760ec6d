// fuzz_deepspeed: `zt train --ds-config ds.json`: the DeepSpeed JSON reader (every number in
// its range, refused with its key and the file), then validate() of the settings it made.
#include "fuzz_input.h"
#include "train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zt;
  fuzz::Input in(data, size);
  trainer::TrainConfig cfg;
  cfg.world_size = 1 + in.byte() % 4;
  std::vector<std::string> warnings;
  if (trainer::load_deepspeed_config_text(in.rest(), "ds.json", &cfg, &warnings)) {
    (void)trainer::validate(cfg);
    (void)trainer::to_json(cfg);
  }
  return 0;
}
