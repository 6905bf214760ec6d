// fuzz_failpoint_spec: `--fault SPEC`, ZT_FAULTS and a scenario's faults: the fail-rs style spec
// parser ("name=[p%][cnt*]action(arg)->..." with conditions), then the specs evaluated at their
// sites for a few positions (conditions with any modulus, probabilities, counts). Specs that
// sleep, pause or panic are parsed only: running them is their purpose.
#include "fuzz_input.h"
#include "zt/fail/failpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zt;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<fail::Spec> specs;
  if (!fail::parse_specs(text, &specs)) return 0;
  for (const auto& s : specs)
    for (const auto& t : s.terms)
      if (t.action != fail::Action::Return && t.action != fail::Action::Off && t.action != fail::Action::Yield)
        return 0;
  fuzz::Quiet quiet;
  fail::Scope scope(specs, 7);
  for (const auto& s : specs)
    for (int64_t step : {int64_t(-1), int64_t(0), int64_t(3), int64_t(1) << 40}) {
      fail::Context ctx;
      ctx.rank = int(step & 3), ctx.step = step, ctx.micro = step, ctx.epoch = step;
      (void)fail::eval(s.name, ctx);
    }
  return 0;
}
