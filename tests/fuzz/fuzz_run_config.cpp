// fuzz_run_config: `zt train --config run.yaml` before anything trains: the YAML loader (alias
// cycles and bombs, keys that are lists, values of every type), validate() and the checks of the
// inputs (model, shape, batch and sequence sizes). A bad file is one line naming it.
#include "fuzz_input.h"
#include "train/train_config.h"
#include "train/trainer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zt;
  fuzz::Input in(data, size);
  trainer::TrainConfig cfg;
  std::vector<std::string> keys;
  if (!trainer::load_train_config_text(in.rest(), "run.yaml", &cfg, &keys)) return 0;
  // The files a config names are not this target's subject (a fuzzer would find /dev/zero).
  cfg.data.clear();
  cfg.checkpoint_dir.clear();
  cfg.resume = false;
  cfg.save_every = 0;
  if (!trainer::validate(cfg)) return 0;
  (void)trainer::to_json(cfg);
  (void)trainer::optimizer_modules(cfg);
  (void)trainer::check_inputs(cfg);
  return 0;
}
