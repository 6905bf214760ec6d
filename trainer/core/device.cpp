#include "device.h"

#include <charconv>

#include "core/backend.h"

namespace zt::trainer {

std::optional<DeviceRef> parse_device(std::string_view text) {
  DeviceRef ref;
  std::string_view kind = text, index;
  if (auto colon = text.find(':'); colon != std::string_view::npos) {
    kind = text.substr(0, colon);
    index = text.substr(colon + 1);
  }
  if (kind == "cpu") ref.type = DeviceType::Cpu;
  else if (kind == "sim") ref.type = DeviceType::Sim;
  else if (kind == "cuda") ref.type = DeviceType::Cuda;
  else return std::nullopt;
  if (!index.empty()) {
    if (ref.type == DeviceType::Cpu) return std::nullopt;
    auto [p, ec] = std::from_chars(index.data(), index.data() + index.size(), ref.index);
    if (ec != std::errc() || p != index.data() + index.size() || ref.index < 0) return std::nullopt;
  }
  return ref;
}

Device::Device(DeviceType type, int index, int rank, probe::Recorder* rec, probe::DeviceId trace_id,
               StorageAllocator* memory, StorageAllocator* pinned, DeviceOps* ops)
    : type_(type),
      index_(index),
      rank_(rank),
      label_(type == DeviceType::Cpu ? std::string("cpu") : "cuda:" + std::to_string(index)),
      rec_(rec),
      trace_id_(trace_id),
      memory_(memory),
      pinned_(pinned),
      ops_(ops ? ops : &host_ops()) {}

}  // namespace zt::trainer
