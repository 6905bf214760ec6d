#include "families.h"

#include <array>
#include <cctype>

#include "zt/db/names.h"

namespace zt::viewer {
namespace {
bool has(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
}  // namespace

Family classify_tensor(std::string_view raw) {
  std::string lower(raw);
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  std::string_view n = lower;
  // Order matters: "grad.bucket" is a gradient even though it is a buffer by shape, and
  // "block3.master" is optimizer state (fp32 master weights live with Adam's moments under
  // offload), not a parameter.
  if (has(n, "adam") || has(n, "exp_avg") || has(n, "master") || has(n, "optim") || has(n, "momentum") ||
      has(n, ".m[") || has(n, ".v["))
    return Family::OptimizerState;
  // ipg: DeepSpeed's gradient bucket; allreduce_bucket: its flattened copy for the all-reduce
  if (has(n, "grad") || has(n, "ipg") || has(n, "allreduce_bucket")) return Family::Gradients;
  // What autograd keeps, as the trainer names it (trainer/zero/ds_memory.h): block3.ln_1.out,
  // block3.attn.qkv, block3.mlp.fc, block3.residual, block4.input, final_ln.rstd, lm_head.log_softmax.
  if (has(n, ".act") || has(n, "activation") || has(n, "hidden") || has(n, "logits") || has(n, "attn_out") ||
      has(n, ".ln_") || has(n, ".attn.") || has(n, ".mlp.") || has(n, ".residual") || has(n, ".input") ||
      has(n, "log_softmax") || has(n, "scratch") || has(n, "_out") || has(n, "final_ln.mean") || has(n, "final_ln.rstd") ||
      has(n, "final_ln.out"))
    return Family::Activations;
  if (has(n, "gathered") || has(n, "param") || has(n, "weight") || has(n, ".bias") || has(n, ".shard") ||
      has(n, "embed") || has(n, ".persistent"))
    return Family::Parameters;
  return Family::Buffers;
}

std::string_view to_string(Family f) {
  static constexpr std::array<std::string_view, kFamilyCount> names{"parameters", "gradients", "optimizer state",
                                                                     "activations", "buffers/other"};
  return names[static_cast<size_t>(f)];
}

std::string leak_group_name(std::string_view name) { return db::tensor_group(name); }

std::string sibling_pattern(std::string_view name) {
  std::string out;
  bool in_digits = false;
  for (char c : name) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      if (!in_digits) out += '#';
      in_digits = true;
      continue;
    }
    in_digits = false;
    out += c;
  }
  return out;
}

}  // namespace zt::viewer
