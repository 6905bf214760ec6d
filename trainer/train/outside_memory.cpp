#include "train/outside_memory.h"

#include "zt/common/units.h"

namespace zt::trainer {

std::optional<uint64_t> cuda_context_bytes(const std::string& spec, std::string* why) {
  if (spec.empty() || spec == "none") return 0;
  if (spec == "lazy") return kCudaContextLazyBytes;
  if (spec == "eager") return kCudaContextEagerBytes;
  std::string w;
  if (auto b = parse_bytes(spec, &w)) return b;
  if (why) *why = "'" + spec.substr(0, 40) + "' is not none, lazy, eager or a size (" + w + ")";
  return std::nullopt;
}

std::vector<OutsideTerm> outside_allocator_terms(const TrainConfig& c) {
  std::vector<OutsideTerm> out;
  if (c.device == "cpu" || c.device == "cuda") return out;
  const uint64_t ctx = cuda_context_bytes(c.cuda_context).value_or(0);
  if (ctx) {
    std::string where = "the CUDA context at the first CUDA call (driver, runtime and the kernels loaded): ";
    if (c.cuda_context == "lazy")
      where += "CUDA_MODULE_LOADING=LAZY, 287,047,680 bytes as PyTorch's pull request 86509 measured it";
    else if (c.cuda_context == "eager")
      where += "every module loaded at start, 666,632,192 bytes as PyTorch's pull request 86509 measured it";
    else
      where += "as the run gives it (cuda_context " + c.cuda_context + ")";
    out.push_back({"cuda_context", ctx, where});
  }
  if (c.world_size > 1 && c.nccl_channels > 0)
    out.push_back({"nccl_buffers", uint64_t(c.nccl_channels) * kNcclChannelBytes,
                   std::to_string(c.nccl_channels) +
                       " NCCL ring channels, each with one connection's LL, LL128 and Simple buffers "
                       "(512 KiB + 4,915,200 B + NCCL_BUFFSIZE 4 MiB, NCCL's defaults)"});
  return out;
}

uint64_t outside_allocator_bytes(const TrainConfig& c) {
  uint64_t sum = 0;
  for (const OutsideTerm& t : outside_allocator_terms(c)) sum += t.bytes;
  return sum;
}

std::string describe_outside(const TrainConfig& c) {
  std::string s;
  for (const OutsideTerm& t : outside_allocator_terms(c)) {
    if (!s.empty()) s += " + ";
    if (t.name == "cuda_context")
      s += "CUDA context " + format_bytes(double(t.bytes)) +
           (c.cuda_context == "lazy" || c.cuda_context == "eager" ? " (" + c.cuda_context + ")" : std::string());
    else
      s += "NCCL buffers " + format_bytes(double(t.bytes)) + " (" + std::to_string(c.nccl_channels) + " channels)";
  }
  return s;
}

}  // namespace zt::trainer
