// A program for the issue-40 tests of losses in the host recording path, run under
// libzt_probe.so. Usage: zt_probe_edge_workload unseen-free
//   unseen-free  maps 2 MiB + 4 KiB, unmaps it by a raw syscall (no hook sees it), maps the same
//                address again and unmaps that normally: one free the probe never saw.
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

int unseen_free_mode() {
  const size_t len = (2u << 20) + 4096;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 3;
  memset(p, 1, len);
  if (syscall(SYS_munmap, p, len) != 0) return 3;  // past the hooks
  void* q = mmap(p, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (q != p) {
    fprintf(stderr, "the address did not come back (%p, then %p)\n", p, q);
    return 5;
  }
  memset(q, 2, len);
  munmap(q, len);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "unseen-free") return unseen_free_mode();
  fprintf(stderr, "usage: %s unseen-free\n", argv[0]);
  return 2;
}
