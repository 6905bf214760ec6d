// probe/src/interpose/aligned.h: the aligned allocation hooks' way to the allocator behind them.
//
// Owns: the choice of real function for posix_memalign, aligned_alloc and memalign. dlsym may
// find none of a name (an allocator preloaded before the C library's that lacks memalign, say):
// the call then goes to one of the other two, which return the same kind of block (freed by
// free), with the alignment checked as the missing function would have; with none of the three
// it fails as on exhaustion (ENOMEM), never through a null pointer.
// Header-only and free of hooks, so that a unit test can call it with functions missing.
#pragma once

#include <errno.h>

#include <cstddef>

namespace zt::probe::interpose {

using posix_memalign_fn = int (*)(void**, size_t, size_t);
using aligned_alloc_fn = void* (*)(size_t, size_t);

struct AlignedReal {
  posix_memalign_fn posix_memalign = nullptr;
  aligned_alloc_fn aligned_alloc = nullptr;
  aligned_alloc_fn memalign = nullptr;
};

namespace detail {
inline bool power_of_two(size_t v) { return v != 0 && (v & (v - 1)) == 0; }
// Any of the three, for an alignment that is a power of two and at least sizeof(void*).
inline int any_aligned(const AlignedReal& r, void** out, size_t align, size_t n) {
  if (r.posix_memalign) return r.posix_memalign(out, align, n);
  const aligned_alloc_fn f = r.memalign ? r.memalign : r.aligned_alloc;
  void* p = f ? f(align, n) : nullptr;
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
// memalign and aligned_alloc accept any alignment glibc rounds up to a power of two.
inline size_t round_alignment(size_t align) {
  size_t a = sizeof(void*);
  while (a < align && a != 0) a <<= 1;
  return a == 0 ? align : a;
}
}  // namespace detail

// posix_memalign's contract: EINVAL for an alignment that is not a power of two multiple of
// sizeof(void*), ENOMEM when no memory, *out untouched on failure.
inline int real_posix_memalign(const AlignedReal& r, void** out, size_t align, size_t n) {
  if (r.posix_memalign) return r.posix_memalign(out, align, n);
  if (!detail::power_of_two(align) || align % sizeof(void*) != 0) return EINVAL;
  void* p = nullptr;
  const int rc = detail::any_aligned(r, &p, align, n);
  if (rc == 0) *out = p;
  return rc;
}

// aligned_alloc's and memalign's: the block, or null with errno set.
inline void* real_aligned_alloc(const AlignedReal& r, size_t align, size_t n, bool memalign) {
  const aligned_alloc_fn own = memalign ? r.memalign : r.aligned_alloc;
  if (own) return own(align, n);
  void* p = nullptr;
  const int rc = detail::any_aligned(r, &p, detail::round_alignment(align), n);
  if (rc != 0) {
    errno = rc;
    return nullptr;
  }
  return p;
}

}  // namespace zt::probe::interpose
