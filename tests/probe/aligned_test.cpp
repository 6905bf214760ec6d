// Issue 40: posix_memalign, aligned_alloc and memalign called through pointers never checked
// after dlsym. probe/src/interpose/aligned.h picks the real function the hooks call; here with
// functions missing, as behind an allocator that lacks some of them.
#include <gtest/gtest.h>

#include <errno.h>
#include <malloc.h>
#include <stdlib.h>

#include <cstdint>

#include "interpose/aligned.h"

using namespace zt::probe::interpose;

namespace {

int g_calls = 0;
int counting_posix_memalign(void** out, size_t align, size_t n) {
  ++g_calls;
  return posix_memalign(out, align, n);
}
void* counting_memalign(size_t align, size_t n) {
  ++g_calls;
  return memalign(align, n);
}

bool aligned_to(const void* p, size_t a) { return p && reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

TEST(AlignedReal, NoneFoundFailsAsExhaustionNeverThroughNull) {
  const AlignedReal none;
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(real_posix_memalign(none, &p, 64, 100), ENOMEM);
  EXPECT_EQ(p, reinterpret_cast<void*>(0x1)) << "*out is left alone on failure";
  errno = 0;
  EXPECT_EQ(real_aligned_alloc(none, 64, 100, false), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(real_aligned_alloc(none, 64, 100, true), nullptr);
  EXPECT_EQ(errno, ENOMEM);
}

TEST(AlignedReal, AMissingOneGoesToAnotherWithItsOwnRules) {
  AlignedReal only_posix;
  only_posix.posix_memalign = counting_posix_memalign;
  g_calls = 0;
  void* a = real_aligned_alloc(only_posix, 4096, 1000, false);
  EXPECT_TRUE(aligned_to(a, 4096));
  void* m = real_aligned_alloc(only_posix, 24, 100, true);  // memalign rounds 24 up to 32
  EXPECT_TRUE(aligned_to(m, 32));
  EXPECT_EQ(g_calls, 2);
  free(a);
  free(m);

  AlignedReal only_memalign;
  only_memalign.memalign = counting_memalign;
  g_calls = 0;
  void* p = nullptr;
  EXPECT_EQ(real_posix_memalign(only_memalign, &p, 256, 1000), 0);
  EXPECT_TRUE(aligned_to(p, 256));
  free(p);
  EXPECT_EQ(real_posix_memalign(only_memalign, &p, 24, 100), EINVAL) << "not a power of two";
  EXPECT_EQ(real_posix_memalign(only_memalign, &p, 2, 100), EINVAL) << "below sizeof(void*)";
  EXPECT_EQ(g_calls, 1);
}
