// zt/db/names.h: how tensor names in a trace are grouped, one rule for every reader.
// Owns: the grouping of names that differ only by indices in brackets, so that
// "offload.buffer[epoch 12]" and "offload.buffer[epoch 13]" count as one kind of buffer
// ("offload.buffer[epoch *]") while "block3.grad" stays itself. Used by the viewer's leak
// view and by zt check's evidence.
#pragma once

#include <string>
#include <string_view>

namespace zt::db {

// Every run of digits inside [...] becomes '*'.
std::string tensor_group(std::string_view name);

}  // namespace zt::db
