// fuzz_torch_snapshot: a PyTorch memory snapshot from elsewhere (`zt import snapshot.pickle`):
// the restricted pickle reader, the snapshot's checks and the caching allocator's replay, with
// rows going nowhere (check_torch_snapshot). Any bytes must give a Value or one line, in time and
// memory linear in the input; a pickle that names code is refused, never run. Also checked: an
// error is one line that is not empty, and nothing the pickle reader refuses passes as a snapshot.
#include <cstdlib>

#include "fuzz_input.h"
#include "zt/db/pickle.h"
#include "zt/db/torch_snapshot.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zt::db;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const pickle::Result r = pickle::parse(bytes);
  if (!r.ok() && (r.error.empty() || r.error.find('\n') != std::string::npos)) std::abort();
  if (r.ok() && r.offset > size) std::abort();
  const zt::Status s = check_torch_snapshot(bytes);
  if (!s && (s.message().empty() || s.message().find('\n') != std::string::npos)) std::abort();
  if (s && !r.ok()) std::abort();  // a snapshot is a pickle first
  return 0;
}
