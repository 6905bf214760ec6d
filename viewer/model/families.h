// viewer/model/families.h: which family a tensor belongs to, read from its name.
//
// Owns the one place where tensor names are classified (parameters, gradients, optimizer
// state, activations, buffers). The trace stores names, not roles, so every panel that
// colours or groups by role asks this function instead of matching names itself.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zt::viewer {

enum class Family : uint8_t { Parameters = 0, Gradients, OptimizerState, Activations, Buffers };
inline constexpr int kFamilyCount = 5;

Family classify_tensor(std::string_view name);
std::string_view to_string(Family);

// A name with the numbers that vary between otherwise identical tensors hidden, so that
// "offload.buffer[epoch 1]" and "offload.buffer[epoch 2]" group together: digits inside
// [...] become "*". Layer indices outside brackets are kept ("block3.grad" stays itself).
std::string leak_group_name(std::string_view name);
// Every run of digits becomes "#": "block3.grad[shard]" -> "block#.grad[shard]". Tensors
// sharing a pattern are siblings that should live on the same device.
std::string sibling_pattern(std::string_view name);

}  // namespace zt::viewer
