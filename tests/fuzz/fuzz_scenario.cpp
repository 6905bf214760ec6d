// fuzz_scenario: `zt repro SCENARIO.yaml` before anything runs: the scenario loader (YAML bounds,
// expect patterns, fault specs, inline DeepSpeed blocks) and the resolution of its four runs
// (small and full size, bug and fix) into train configs, each validated.
#include "fuzz_input.h"
#include "zt/repro/scenario.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zt;
  fuzz::Input in(data, size);
  const std::string path = fuzz::scratch_dir() + "/scenario.yaml";
  fuzz::write_file(path, in.rest());
  repro::Scenario s;
  (void)repro::load_scenario(path, &s);
  return 0;
}
