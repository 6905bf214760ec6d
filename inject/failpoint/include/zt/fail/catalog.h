// inject/failpoint/catalog.h: the fault catalog, the one list of failpoint names (issue 9).
// Every site the trainer evaluates is here with the bug report it comes from, what it does,
// and the argument its `return` passes to the site (what it is, the values allowed, and a
// check of one as written); `zt faults` prints this table, and a spec naming anything else,
// or giving a site an argument it does not take, is refused when it is parsed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace zt::fail {

struct CatalogEntry {
  const char* name;       // "zero.norm_on_device"
  const char* report;     // "R2 R5", or "-" for generic sites
  const char* site;       // where it is evaluated
  const char* mechanism;  // what happens for real when its `return` fires (and what the arg means)
  // The argument of `return(ARG)`, as the site reads it. arg: what it is ("variant",
  // "percentage"), nullptr when the site takes none; arg_syntax: short form for the table
  // ("pinned|pow2|fork"); arg_allowed: the values allowed and the default, in words;
  // arg_ok: whether ARG as written (never empty: no argument is always the default) is one.
  const char* arg = nullptr;
  const char* arg_syntax = nullptr;
  const char* arg_allowed = nullptr;
  bool (*arg_ok)(std::string_view arg) = nullptr;
};

const std::vector<CatalogEntry>& catalog();
const CatalogEntry* find_fault(std::string_view name);

// Empty when `return(arg)` is allowed at this fault (an empty arg, `return` or `return()`, is
// the site's default); else one line naming the fault, the argument and what is allowed:
// "host.epoch_leak: variant 'bogus' is not allowed; it takes pinned, pow2 or fork (default pinned)".
std::string return_arg_problem(const CatalogEntry& e, std::string_view arg);

}  // namespace zt::fail
