#include "zt/fail/catalog.h"

#include <cstdint>

namespace zt::fail {

namespace {

// A decimal integer of at least 0 that fits int64, as written: digits only (no sign, no spaces),
// so what the spec says is what the site reads.
bool whole_number(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;  // 18 digits always fit int64
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

// The arguments the trainer's sites read (trainer/zero/engine.cpp, trainer/train/trainer.cpp).
bool leak_variant(std::string_view a) { return a == "pinned" || a == "pow2" || a == "fork"; }
bool module_index(std::string_view a) {
  int64_t v = 0;
  return whole_number(a, &v) && v <= INT32_MAX;
}
bool percentage(std::string_view a) {
  int64_t v = 0;
  return whole_number(a, &v) && v <= 100;
}
bool step_count(std::string_view a) {
  int64_t v = 0;
  return whole_number(a, &v) && v >= 1;
}

}  // namespace

const std::vector<CatalogEntry>& catalog() {
  static const std::vector<CatalogEntry> entries = {
      {"zero.norm_on_device", "R2 R5", "ZeRO optimizer step, global norm",
       "the global gradient norm stays on the device (DeepSpeed 0.14.1-0.14.2); with clipping on and the norm over "
       "the threshold, unscale_and_clip_grads multiplies the host fp32 partitions by a device scalar and the device "
       "guard raises. Never fires its error when clipping is off or the norm is under the threshold."},
      {"zero.grad_partition_stays_on_device", "R2", "ZeRO optimizer step, fp32 gradient partitions",
       "one module's fp32 gradient partition is left on the device instead of offloaded at the accumulation "
       "boundary (arg: module index, default the last module); CPU AdamW, handed it beside the host master "
       "weights and moments, meets the device guard (the clip's host scalar does not: PyTorch lets a 0-dim CPU "
       "tensor meet a CUDA tensor)",
       "module index", "N", "an integer of at least 0, a module of the model (default the last module)", module_index},
      {"optim.device_only_kernels", "R5", "ZeRO optimizer step, Adam",
       "the optimizer's kernels accept only device tensors (an 8-bit or paged AdamW): it constructs fine and its "
       "first step on offloaded host partitions raises 'Expected a cuda device, but got: cpu'"},
      {"optim.cpu_adam_error", "-", "ZeRO optimizer step, CPU AdamW of a module",
       "a module's CPU AdamW is handed a step count of 0 (an optimizer state whose step was lost; a stand-in for "
       "any failure inside the optimizer step, no memory runs out) and its own check raises; the engine records the "
       "kernel's error (error row cpu_adam_error) and the run ends. [call=N]: the Nth module AdamW of the run; under "
       "the delayed or overlapped update it raises on the background thread and the rank thread meets the error at "
       "its next wait for the update"},
      {"ckpt.gather_on_device", "R4", "checkpoint save, consolidated weights",
       "the save gathers the whole model's 16-bit weights on the device at once (the `device` gather strategy) "
       "instead of streaming one module at a time to the host"},
      {"host.epoch_leak", "R1", "epoch boundary",
       "offload buffers are re-created at each epoch boundary without releasing the old ones; arg: pinned "
       "(default: the pinned fp32 partitions), pow2 (re-created through a pinned cache that rounds every request "
       "up to a power of two and never returns it), fork (data-loader workers re-created by fork, each touching "
       "a copy of the offloaded heap)",
       "variant", "pinned|pow2|fork", "pinned, pow2 or fork (default pinned)", leak_variant},
      {"data.parallel_drop", "R1", "data preprocessing",
       "parallel preprocessing (num_proc > 1) silently drops documents; arg: percent dropped (default 50)",
       "percentage", "0..100", "an integer from 0 to 100, the percent of the data dropped (default 50)", percentage},
      {"config.max_iters", "R1", "training plan",
       "the config sets max_iters instead of max_epochs: training stops after arg optimizer steps (default 32)",
       "step count", "N>=1", "an integer of at least 1, the optimizer steps kept (default 32)", step_count},
      {"comm.hang", "-", "collectives",
       "this rank stops inside a collective and never returns; the other ranks' watchdog ends the run with a line "
       "naming the collective, its sequence number and the timeout (--comm-timeout, 10 min by default as in PyTorch)"},
      {"comm.rank_exit", "-", "collectives",
       "this rank exits before entering a collective; the others wait for it until the watchdog times out"},
      {"ckpt.torn_write", "-", "checkpoint save",
       "the save stops after the shards are written and before the manifest: a torn checkpoint directory is left "
       "behind (the run fails there)"},
      {"ckpt.between_writes", "-", "checkpoint save, between every write",
       "evaluated at every boundary between two writes of a save (the Nth evaluation is the Nth boundary: use "
       "[call=N]); with panic it kills the process there, for crash tests"},
  };
  return entries;
}

const CatalogEntry* find_fault(std::string_view name) {
  for (const auto& e : catalog())
    if (name == e.name) return &e;
  return nullptr;
}

std::string return_arg_problem(const CatalogEntry& e, std::string_view arg) {
  if (arg.empty()) return {};  // return, return(): the site's default
  const std::string a(arg);
  if (!e.arg || !e.arg_ok)
    return std::string(e.name) + ": takes no argument, got '" + a + "' (write return, not return(" + a + "))";
  if (e.arg_ok(arg)) return {};
  return std::string(e.name) + ": " + e.arg + " '" + a + "' is not allowed; it takes " + e.arg_allowed;
}

}  // namespace zt::fail
