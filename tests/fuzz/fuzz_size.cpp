// fuzz_size: the size parsers every flag and file goes through ("80GiB", "1.5 TiB", "70GB",
// "1e9"): parse_bytes, parse_size_i64 and `zt check --budget`'s list. The results must agree
// with each other: a size that parses as int64 parses as uint64 to the same bytes.
#include <cstdlib>

#include "fuzz_input.h"
#include "zt/check/check.h"
#include "zt/common/units.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zt;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string why;
  const auto u = parse_bytes(text, &why);
  const auto i = parse_size_i64(text, &why);
  if (i && (!u || *u != uint64_t(*i))) std::abort();  // the two must not disagree
  if (u) (void)format_bytes(double(*u));
  check::Budget b;
  (void)check::parse_budget(text, &b);
  return 0;
}
