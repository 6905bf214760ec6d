// inject/failpoint/catalog.h: the fault catalog, the one list of failpoint names (issue 9).
// Every site the trainer evaluates is here with the bug report it comes from and what it
// does; `zt faults` prints this table, and a spec naming anything else is refused.
#pragma once

#include <string_view>
#include <vector>

namespace zt::fail {

struct CatalogEntry {
  const char* name;       // "zero.norm_on_device"
  const char* report;     // "R2 R5", or "-" for generic sites
  const char* site;       // where it is evaluated
  const char* mechanism;  // what happens for real when its `return` fires (and what the arg means)
};

const std::vector<CatalogEntry>& catalog();
const CatalogEntry* find_fault(std::string_view name);

}  // namespace zt::fail
